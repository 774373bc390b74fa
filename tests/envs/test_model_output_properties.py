"""Generated model output, shaped like tool calls: parsing never raises and never runs anything, what it returns
can be stored as JSON, and an environment answers every such message with an observation or a recorded failure.

Arbitrary text and JSON are tests/envs/test_calls.py's; these messages come from a grammar of the call syntaxes the
parser reads (Python call lists, bare calls, <tool_call> blocks, code fences), with names, arguments and values that
are valid, odd or hostile (calls, attributes, comprehensions and lambdas in place of literals).
"""

from __future__ import annotations

import json
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from coevolve.records import Provenance, ToolCall
from envs.calls import parse_tool_calls
from envs.workplace.environment import WorkplaceEnvironment
from envs.workplace.explorer import make_task
from envs.workplace.tools import BY_NAME
from envs.workplace.world import APPS
from tests.envs.test_workplace_apps import STATE

# A file a message tries to create or read: nothing the parser does may touch it.
SENTINEL = Path("/tmp/coevolve-model-output-sentinel")
HOSTILE = [
    f"__import__('pathlib').Path('{SENTINEL}').touch()",
    f"open('{SENTINEL}', 'w')",
    "exec('x = 1')",
    "eval('1 + 1')",
    "(lambda: 1)()",
    "[x for x in range(10**9)]",
    "os.system('true')",
    "10**10**10",
    "a.b.c",
    "f'{1}'",
    "*args",
    "**{'a': 1}",
    "...",
    "b'\\x00'",
    "1j",
    "{1, 2}",
    "float('nan')",
    "1e999",
    "-" * 50 + "1",
    "(" * 200 + "1" + ")" * 200,
]
literals = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats()
    | st.text(max_size=12)
    | st.sampled_from(["True", "None", "'x'", '"y"', "'\\n'", "'\\u00e9'"]),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=5), children, max_size=3),
    max_leaves=8,
).map(repr)
values = literals | st.sampled_from(HOSTILE)
names = st.sampled_from([*BY_NAME, "ls", "cd", "mkdir", "__import__", "print", "os.system", "a.b", "_", "x1"])
arguments = st.lists(
    st.tuples(st.sampled_from(["", "a", "to", "date", "message_id", "subject", "__class__"]), values), max_size=4
).map(lambda pairs: ", ".join(f"{key}={value}" if key else value for key, value in pairs))
calls = st.builds("{}({})".format, names, arguments)
call_lists = st.lists(calls, min_size=1, max_size=4).map(", ".join)
messages = st.one_of(
    call_lists.map("[{}]".format),
    calls,
    call_lists.map("```python\n[{}]\n```".format),
    st.builds(
        lambda name, args: f'<tool_call>{{"name": {json.dumps(name)}, "arguments": {args}}}</tool_call>',
        names,
        st.sampled_from(["{}", '{"a": 1}', '{"a": [1, {"b": null}]}', "[1]", '"x"', "{", "null"]),
    ),
    st.builds("{} {} {}".format, st.text(max_size=20), call_lists.map("[{}]".format), st.text(max_size=20)),
)


@settings(max_examples=300, deadline=None)
@given(messages)
def test_a_message_shaped_like_calls_parses_to_storable_calls_or_an_error_and_runs_nothing(text: str) -> None:
    SENTINEL.unlink(missing_ok=True)
    calls, error = parse_tool_calls(text)
    assert not SENTINEL.exists()
    assert isinstance(calls, list) and (error is None or isinstance(error, str))
    if error is not None:
        assert calls == [] and error
    for call in calls:
        assert isinstance(call, ToolCall) and isinstance(call.name, str) and call.name
        json.dumps(call.arguments, allow_nan=True)  # stored with the episode as it is


@settings(max_examples=60, deadline=None)
@given(st.lists(messages, min_size=1, max_size=4))
def test_a_workplace_episode_answers_every_message_and_ends_in_a_score(texts: list[str]) -> None:
    task = make_task(
        [ToolCall("search_contacts", {"company": "Brightline"})], STATE, list(APPS), Provenance(origin="seed")
    )
    env = WorkplaceEnvironment(tool_list="names")
    env.reset(task)
    for text in texts:
        outcome = env.step(text)
        assert isinstance(outcome.observations, list)
        if outcome.done:
            break
    reward, success, details = env.score()
    assert 0.0 <= reward <= 1.0 and isinstance(success, bool) and isinstance(details, dict)
    assert not SENTINEL.exists()
