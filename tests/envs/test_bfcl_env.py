"""Specification of envs.bfcl.environment.BfclEnvironment: prompts, step semantics, checking, isolation, robustness."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from coevolve.config import EnvironmentConfig
from coevolve.records import Provenance, Task, ToolCall
from envs.base import Environment
from envs.bfcl.environment import INSTRUCTION, BfclEnvironment
from envs.bfcl.official import official_tasks
from envs.registry import make_environment

FS_CONFIG = {"GorillaFileSystem": {"root": {"alex": {"type": "directory", "contents": {}}}}}


def test_environment_implements_the_protocol():
    """Every abstract method of `Environment` has an implementation of BFCL's own, and the registry builds it."""

    def owner(name: str) -> type:
        return next(cls for cls in BfclEnvironment.__mro__ if name in vars(cls))

    assert Environment.__abstractmethods__ and not BfclEnvironment.__abstractmethods__
    assert [name for name in sorted(Environment.__abstractmethods__) if owner(name) is Environment] == []
    # What makes it BFCL besides the contract: bfcl-eval's prompts and its official categories.
    assert {owner(name) for name in ("conversation", "official_tasks", "official_overall")} == {BfclEnvironment}
    assert type(make_environment(EnvironmentConfig(name="bfcl"))) is BfclEnvironment


def test_reset_returns_tool_list_with_instruction_and_first_user_turn(fs_task):
    messages = BfclEnvironment().reset(fs_task)
    assert [m.role for m in messages] == ["system", "user"]
    assert "mkdir(dir_name: string) - Create a new directory in the current directory" in messages[0].content
    assert "post_tweet" not in messages[0].content
    assert INSTRUCTION in messages[0].content
    assert messages[1].content == fs_task.turns[0]


def test_calls_produce_a_tool_message_and_the_turn_continues(fs_task):
    env = BfclEnvironment()
    env.reset(fs_task)
    out = env.step("[mkdir(dir_name='temp'), ls()]")
    assert [c.name for c in out.calls] == ["mkdir", "ls"]
    assert out.observations[0] == "None"
    assert out.messages[0].role == "tool"
    assert out.messages[0].content.splitlines()[1].startswith("ls -> {")
    assert not out.turn_ended and not out.done


def test_message_without_calls_ends_the_turn_and_brings_the_next_user_turn(fs_task):
    env = BfclEnvironment()
    env.reset(fs_task)
    env.step("[mkdir(dir_name='temp'), mv(source='notes.txt', destination='temp')]")
    out = env.step("done")
    assert out.turn_ended and not out.done
    assert out.messages[-1].role == "user" and out.messages[-1].content == fs_task.turns[1]


def test_expert_play_scores_success(fs_task):
    env = BfclEnvironment()
    env.reset(fs_task)
    env.step("[mkdir(dir_name='temp'), mv(source='notes.txt', destination='temp')]")
    env.step("done")
    env.step("[cd(folder='temp'), cat(file_name='notes.txt')]")
    out = env.step("done")
    assert out.done
    assert env.score()[:2] == (1.0, True)


def test_missing_state_change_fails_the_turn_with_bfcl_error_type(fs_task):
    env = BfclEnvironment()
    env.reset(fs_task)
    env.step("[mkdir(dir_name='temp')]")
    out = env.step("done")
    assert out.done  # a failed turn ends the episode early
    reward, success, details = env.score()
    assert (reward, success) == (0.0, False)
    assert details["turn"] == 0 and details["error_type"] == "multi_turn:instance_state_mismatch"


def test_missing_reference_result_is_a_response_mismatch(fs_task):
    env = BfclEnvironment(stop_on_failure=False)
    env.reset(fs_task)
    env.step("[mkdir(dir_name='temp'), mv(source='notes.txt', destination='temp')]")
    env.step("done")
    env.step("[cd(folder='temp')]")
    env.step("done")
    assert env.score()[2]["error_type"] == "multi_turn:execution_response_mismatch"


def test_no_call_in_a_turn_with_a_reference_is_an_empty_turn(fs_task):
    env = BfclEnvironment()
    env.reset(fs_task)
    env.step("I cannot do that.")
    assert env.score()[2]["error_type"] == "multi_turn:empty_turn_model_response"


def test_read_only_calls_in_a_turn_with_empty_reference_pass_as_in_bfcl_pipeline(make_task):
    task = make_task(["Do nothing.", "List files."], [[], [ToolCall("ls", {})]])
    env = BfclEnvironment()
    env.reset(task)
    env.step("[pwd()]")
    env.step("done")
    env.step("[ls()]")
    env.step("done")
    assert env.score()[:2] == (1.0, True)


def test_state_changes_in_a_turn_with_empty_reference_fail_the_next_turn(make_task):
    task = make_task(["Do nothing.", "List files."], [[], [ToolCall("ls", {})]])
    env = BfclEnvironment(stop_on_failure=False)
    env.reset(task)
    env.step("[mkdir(dir_name='extra')]")
    env.step("done")
    env.step("[ls()]")
    env.step("done")
    details = env.score()[2]
    assert details["turn"] == 1 and details["error_type"] == "multi_turn:instance_state_mismatch"


def test_irrelevance_check_fails_calls_in_a_turn_with_empty_reference(make_task):
    task = make_task(["Do nothing.", "List files."], [[], [ToolCall("ls", {})]])
    env = BfclEnvironment(irrelevance_check=True)
    env.reset(task)
    env.step("[pwd()]")
    env.step("done")
    assert env.score()[2]["error_type"] == "multi_turn:irrelevance_error:decoder_success"


def test_unknown_and_private_tools_are_error_observations_not_exceptions(fs_task):
    env = BfclEnvironment()
    env.reset(fs_task)
    out = env.step("[foo(a=1), _load_scenario(scenario={}), post_tweet(content='x')]")
    assert all(o.startswith("Error during execution") for o in out.observations)
    assert "unknown tool 'foo'" in out.observations[0]


def test_bad_arguments_are_error_observations(fs_task):
    env = BfclEnvironment()
    env.reset(fs_task)
    out = env.step("[mkdir(nope=1), ls(True, 2, 3), power(base=2, exponent=10**9)]")
    assert all(o.startswith("Error during execution") for o in out.observations)


def test_positional_arguments_are_mapped_to_parameter_names(fs_task):
    env = BfclEnvironment()
    env.reset(fs_task)
    out = env.step("[cat('notes.txt')]")
    assert out.observations == ['{"file_content": "alpha beta\\ngamma"}']


def test_unparseable_message_ends_the_turn_with_an_error(fs_task):
    env = BfclEnvironment()
    env.reset(fs_task)
    out = env.step("[mkdir(dir_name=temp)]")
    assert out.error and out.turn_ended and out.calls == []


def test_turn_ends_after_max_steps_per_turn(fs_task):
    env = BfclEnvironment(max_steps_per_turn=2)
    env.reset(fs_task)
    assert not env.step("[mkdir(dir_name='temp')]").turn_ended
    out = env.step("[mv(source='notes.txt', destination='temp')]")
    assert out.turn_ended and [m.role for m in out.messages] == ["tool", "user"]


def test_observations_are_cut_to_max_observation_chars(fs_task):
    env = BfclEnvironment(max_observation_chars=20)
    env.reset(fs_task)
    out = env.step("[ls(a=True)]")
    assert out.messages[0].content == "ls -> " + out.observations[0][:20]
    assert len(out.observations[0]) > 20  # the full result is kept for checking


def test_two_environments_on_the_same_task_do_not_share_state(fs_task):
    first, second = BfclEnvironment(), BfclEnvironment()
    first.reset(fs_task)
    second.reset(fs_task)
    first.step("[mkdir(dir_name='temp'), rm(file_name='notes.txt')]")
    assert second.execute([ToolCall("ls", {})]) == ['{"current_directory_content": ["notes.txt", "docs"]}']
    assert first.state() != second.state()


def test_default_list_arguments_never_leak_between_episodes(make_task, twitter_config):
    task = make_task(["Post."], [[ToolCall("post_tweet", {"content": "a"})]], twitter_config, ["TwitterAPI"])
    env = BfclEnvironment()
    env.reset(task)
    env.execute(
        [ToolCall("post_tweet", {"content": "a"}), ToolCall("mention", {"tweet_id": 0, "mentioned_usernames": ["bob"]})]
    )
    env.reset(task)
    result = env.execute([ToolCall("post_tweet", {"content": "a"})])
    assert '"mentions": []' in result[0]


def test_execute_state_and_tool_names(fs_task):
    env = BfclEnvironment()
    env.reset(fs_task)
    before = env.state()
    assert env.execute([ToolCall("pwd", {})]) == ['{"current_working_directory": "/alex"}']
    assert env.state() == before
    env.execute([ToolCall("touch", {"file_name": "new.txt"})])
    assert env.state() != before
    assert "mkdir" in env.tool_names() and "post_tweet" not in env.tool_names()


def test_score_before_the_end_is_a_failure(fs_task):
    env = BfclEnvironment()
    env.reset(fs_task)
    assert env.score()[:2] == (0.0, False)


def test_long_context_entries_load_long_context_state():
    base = official_tasks("multi_turn_base", limit=1)[0]
    long_ = official_tasks("multi_turn_long_context", limit=1)[0]
    env = BfclEnvironment()
    env.reset(long_)
    assert env._model["GorillaFileSystem"].long_context is True
    env.reset(base)
    assert env._model["GorillaFileSystem"].long_context is False


def test_miss_func_hides_functions_until_the_reveal_turn():
    task = official_tasks("multi_turn_miss_func", limit=1)[0]  # 'sort' is revealed in turn 3
    messages = BfclEnvironment().reset(task)
    assert "\nsort(" not in messages[0].content
    assert task.turns[3].startswith("sort(file_name: string)")


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.text(max_size=120) | st.sampled_from(["[ls()]", "done", "[cd(folder='docs')]", "[rm('x')]"]), max_size=6
    )
)
def test_step_never_raises_on_arbitrary_messages(texts):
    task = Task(
        "bfcl",
        FS_CONFIG,
        ["GorillaFileSystem"],
        ["a", "b"],
        [[ToolCall("ls", {})], [ToolCall("pwd", {})]],
        Provenance("seed"),
    )
    env = BfclEnvironment(max_steps_per_turn=2)
    env.reset(task)
    for text in texts:
        out = env.step(text)
        assert isinstance(out.observations, list)
    reward, success, details = env.score()
    assert reward in (0.0, 1.0) and isinstance(details, dict)
