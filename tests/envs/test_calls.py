"""Specification of envs.calls.parse_tool_calls: accepted syntaxes, no-call texts, errors, robustness."""

from __future__ import annotations

import json
import subprocess
import sys

from hypothesis import given, settings
from hypothesis import strategies as st

from coevolve.records import ToolCall
from envs.bfcl.prompts import split_reasoning
from envs.calls import parse_tool_calls


def test_python_call_list_is_parsed_in_order():
    calls, error = parse_tool_calls("[mkdir(dir_name='x'), cd(folder='y')]")
    assert error is None
    assert calls == [ToolCall("mkdir", {"dir_name": "x"}), ToolCall("cd", {"folder": "y"})]


def test_bare_call_without_brackets_is_one_call():
    assert parse_tool_calls("ls(a=True)") == ([ToolCall("ls", {"a": True})], None)


def test_positional_arguments_are_kept_under_pos_keys():
    calls, _ = parse_tool_calls("sort('report.txt', 3)")
    assert calls[0].arguments == {"__pos0": "report.txt", "__pos1": 3}


def test_literal_containers_and_negative_numbers_are_accepted():
    calls, error = parse_tool_calls("[f(a=-1.5, b=[1, 2], c={'k': None}, d=(1, 2))]")
    assert error is None
    assert calls[0].arguments == {"a": -1.5, "b": [1, 2], "c": {"k": None}, "d": [1, 2]}


def test_hermes_tool_call_blocks_are_all_parsed():
    text = (
        '<tool_call>{"name": "mkdir", "arguments": {"dir_name": "a"}}</tool_call>\n'
        '<tool_call>{"name": "cd", "arguments": {"folder": "a"}}</tool_call>'
    )
    calls, error = parse_tool_calls(text)
    assert error is None
    assert [c.name for c in calls] == ["mkdir", "cd"]


def test_openai_tool_calls_accept_string_or_object_arguments():
    text = json.dumps(
        {
            "tool_calls": [
                {"function": {"name": "mkdir", "arguments": json.dumps({"dir_name": "a"})}},
                {"function": {"name": "cd", "arguments": {"folder": "a"}}},
            ]
        }
    )
    calls, error = parse_tool_calls(text)
    assert error is None
    assert calls == [ToolCall("mkdir", {"dir_name": "a"}), ToolCall("cd", {"folder": "a"})]


def test_json_list_of_name_and_arguments_is_parsed():
    calls, error = parse_tool_calls('[{"name": "ls", "arguments": {"a": false}}]')
    assert (calls, error) == ([ToolCall("ls", {"a": False})], None)


def test_call_list_inside_prose_or_code_fence_is_found():
    assert parse_tool_calls("Sure: [ls(a=True)] is next")[0] == [ToolCall("ls", {"a": True})]
    assert parse_tool_calls("```python\n[pwd()]\n```")[0] == [ToolCall("pwd", {})]


def test_texts_without_tool_call_syntax_call_nothing():
    for text in ["done", "[]", "", "   ", "I finished the task.", "{}", "42", '{"answer": 1}']:
        assert parse_tool_calls(text) == ([], None), text


def test_non_literal_arguments_are_an_error_and_nothing_runs():
    calls, error = parse_tool_calls("[rm(file_name=__import__('os').getcwd())]")
    assert calls == []
    assert error.startswith("unparseable tool call")


def test_broken_call_syntax_is_an_error():
    for text in ["[mkdir(dir_name='x')", "mkdir(dir_name=x)", "<tool_call>{bad json</tool_call>", "[ls(), 3]"]:
        calls, error = parse_tool_calls(text)
        assert calls == [] and error and error.startswith("unparseable tool call"), text


def test_unknown_tool_is_reported_when_allowed_is_given():
    assert parse_tool_calls("[foo(a=1)]", allowed={"ls"}) == ([], "unknown tool: foo")
    assert parse_tool_calls("[ls()]", allowed={"ls"}) == ([ToolCall("ls", {})], None)


def test_overlong_and_deeply_nested_input_is_an_error_not_a_crash():
    assert parse_tool_calls("[" * 100_000)[1] is not None
    assert parse_tool_calls("f(a=" + "[" * 5000 + "]" * 5000 + ")")[1] is not None


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=300))
def test_parser_never_raises_on_arbitrary_text(text):
    calls, error = parse_tool_calls(text)
    assert isinstance(calls, list)
    assert error is None or isinstance(error, str)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(json_values, st.sampled_from(["{}", "<tool_call>{}</tool_call>", '{{"tool_calls": [{}]}}', "[{}]"]))
def test_parser_never_raises_on_arbitrary_json(value, wrapper):
    text = wrapper.format(json.dumps(value))
    calls, error = parse_tool_calls(text)
    assert all(isinstance(c, ToolCall) for c in calls)
    assert error is None or isinstance(error, str)


# --- the output syntax of each bfcl-eval handler family (prompt_style 'bfcl') ----------------------
def test_qwen_fc_tool_call_blocks_after_reasoning_are_parsed():
    reply = (
        "<think>\nfirst cd\n</think>\n\n"
        '<tool_call>\n{"name": "cd", "arguments": {"folder": "doc"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "ls", "arguments": {"a": true}}\n</tool_call>'
    )
    _, answer = split_reasoning(reply)
    assert parse_tool_calls(answer) == ([ToolCall("cd", {"folder": "doc"}), ToolCall("ls", {"a": True})], None)


def test_qwen_prompting_python_list_after_reasoning_is_parsed():
    _, answer = split_reasoning("<think>\nplan\n</think>\n\n[cd(folder='doc'), ls(a=True)]")
    assert parse_tool_calls(answer) == ([ToolCall("cd", {"folder": "doc"}), ToolCall("ls", {"a": True})], None)


def test_llama_json_calls_separated_by_semicolons_are_parsed():
    reply = '<|python_tag|>{"name": "cd", "parameters": {"folder": "doc"}}; {"name": "ls", "parameters": {"a": true}}'
    assert parse_tool_calls(reply) == ([ToolCall("cd", {"folder": "doc"}), ToolCall("ls", {"a": True})], None)


def test_llama_calls_as_a_python_literal_are_parsed_without_evaluating_anything():
    reply = "[{'name': 'cd', 'parameters': {'folder': 'a;b'}}, {'name': 'ls', 'parameters': {'a': True}}]"
    assert parse_tool_calls(reply) == ([ToolCall("cd", {"folder": "a;b"}), ToolCall("ls", {"a": True})], None)
    calls, error = parse_tool_calls("{'name': 'cd', 'parameters': {'folder': __import__('os').getcwd()}}")
    assert calls == [] and error is None  # not a literal: no call, and nothing ran


def test_generic_chat_python_call_list_is_parsed():
    assert parse_tool_calls("```\n[mv(source='a', destination='b')]\n```") == (
        [ToolCall("mv", {"source": "a", "destination": "b"})],
        None,
    )


def test_bracketed_reading_takes_call_lists_with_a_missing_bracket_as_bfcls_prompting_decoder_does():
    for text in ("cd(folder='a'), ls(a=True)", "[cd(folder='a'), ls(a=True)", "```\ncd(folder='a'), ls(a=True)]\n```"):
        assert parse_tool_calls(text, bracketed=True) == (
            [ToolCall("cd", {"folder": "a"}), ToolCall("ls", {"a": True})],
            None,
        )
    assert parse_tool_calls("[cd(folder='a'), ls(a=True)")[1] is not None  # the compact style's reading stays strict


def test_output_the_compiler_warns_about_is_read_without_a_warning_in_the_log():
    """``1and 2`` is a SyntaxWarning (invalid decimal literal) to the compiler on every parse: a run's log
    would fill with ``<unknown>:1: SyntaxWarning`` lines. In a fresh process, as in a run (pytest resets the
    warning filters a module sets on import), parsing it prints nothing and the verdicts stay what they were."""
    script = (
        "from envs.calls import parse_tool_calls as p\n"
        "print(p('[f(a=1and 2)]'))\n"
        'print(p(\'{"name": "f", "arguments": {"a": 1and 2}}\'))\n'
    )
    done = subprocess.run([sys.executable, "-W", "default", "-c", script], capture_output=True, text=True, check=True)
    assert done.stderr == ""
    assert done.stdout.splitlines() == [
        "([], 'unparseable tool call: f: argument is not a literal (ValueError)')",
        "([], None)",
    ]
