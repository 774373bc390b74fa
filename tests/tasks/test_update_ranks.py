"""The update stage on several ranks: real torchrun processes with gloo ranks, TRL's GRPOTrainer, the DuckDB warehouse.

Four groups of four are stored for round 0; the same stored groups are trained in-process (one rank)
and under ``torchrun --standalone --nproc_per_node 2`` (two ranks), which read them from the warehouse.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from prefect import flow

from agent.chat import ChatFormat
from agent.checkpoints import TRAINER_STATE_SUBDIR
from agent.transformers_engine import load_policy
from coevolve.config import PipelineConfig
from coevolve.errors import ConfigError
from coevolve.optional import optional_module
from coevolve.records import Message, Trajectory
from coevolve.stages import UpdateInput
from tasks.common import open_warehouse
from tasks.training.grpo_groups import group_round, step_trajectories
from tasks.training.launch import RankFailedError, launch_command, launch_dir, launch_update, processes_for
from tasks.update import grpo_update, update_stage
from tests.tasks import test_update as single_rank_tests
from tests.tasks.test_update import BAD, GOOD, GROUP_SIZE, _completion_logprobs

# torch-backed packages, imported when a test that runs here first reads them
safetensors_torch = optional_module("safetensors.torch")
transformers = optional_module("transformers")

# The single-rank tests' tiny policy, shared as this module's fixture too.
policy_dir = single_rank_tests.policy_dir

REWARDS = {
    "t-a": [1.0, 0.0, 1.0, 0.0],
    "t-b": [0.0, 1.0, 0.0, 0.0],
    "t-c": [1.0, 1.0, 0.0, 0.0],
    "t-d": [0.0, 0.0, 0.0, 1.0],
}
# Each task asks something else, so each group's gradient reaches weights (its prompt's token rows) that
# the others' barely touch: a group trained twice, skipped or split shows in the weights.
QUERIES = {
    "t-a": "make a folder temp",
    "t-b": "go into the docs folder",
    "t-c": "create the file notes.txt",
    "t-d": "list what is here",
}
STEPS = 2
# Largest |difference| allowed between a weight trained on two ranks and the same weight trained on one.
# Both runs add the same per-token gradient terms in another order: DDP all-reduces two partial sums
# (each normalised by the global token count, TRL's "dapo" loss) where one rank accumulates four
# micro-batches, and the micro-batches hold other rows (TRL shuffles each rank's rows). So float32
# gradients differ by rounding, about 1e-7 relative, more where a coordinate's terms nearly cancel; Adam
# turns that into weight differences well below its step size (lr = 3e-3). Measured here: 1.9e-6 at most
# over the 23,072 weights after 2 steps. The bound leaves 10x that for other CPUs' kernels, and stays 600x
# below what leaving one group out does to the weights (1.2e-2, checked by the test itself).
WEIGHT_TOLERANCE = 2e-5


def _config(state_dir: Path, **training) -> PipelineConfig:
    return PipelineConfig(
        run_id="test",
        state_dir=state_dir,
        seed=3,
        rollout={"group_size": GROUP_SIZE, "temperature": 0.9},
        training={"learning_rate": 3e-3, "batches_per_round": 1, "updates_per_batch": STEPS, **training},
    )


def _groups(policy_dir: Path, rewards_by_task: dict[str, list[float]] = REWARDS, step: int = 0) -> list[Trajectory]:
    """One group per task: the good message where the reward is 1, the bad one elsewhere; samples of step ``step``."""
    chat = ChatFormat(load_policy(policy_dir)[1])
    out = []
    for task_id, rewards in rewards_by_task.items():
        prompt = chat.prompt_ids([Message("user", QUERIES[task_id])])
        for sample, reward in enumerate(rewards, start=step * GROUP_SIZE):
            message = chat.generated_ids(GOOD if reward > 0 else BAD)
            out.append(
                Trajectory(
                    run_id="test",
                    round=0,
                    task_id=task_id,
                    sample=sample,
                    steps=[],
                    prompt_ids=prompt,
                    completion_ids=message,
                    completion_mask=[1] * len(message),
                    logprobs=_completion_logprobs(policy_dir, prompt, message, 0.9),
                    reward=reward,
                    success=reward > 0,
                    finish_reason="done",
                )
            )
    return out


def _store(config: PipelineConfig, trajectories: list[Trajectory]) -> None:
    with open_warehouse(config) as wh:
        wh.write_trajectories(trajectories)


def _weights(checkpoint: Path) -> dict:
    return safetensors_torch.load_file(checkpoint / "model.safetensors")


@pytest.fixture(scope="module")
def stored(policy_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[PipelineConfig, list[Trajectory]]:
    """Round 0 of run 'test' in a fresh warehouse: four groups of four with reward variance."""
    config = _config(tmp_path_factory.mktemp("state"), num_processes=2)
    trajectories = _groups(policy_dir)
    _store(config, trajectories)
    return config, trajectories


@pytest.fixture(scope="module")
def two_ranks(policy_dir: Path, stored) -> tuple[dict, Path]:
    config, trajectories = stored
    out = config.checkpoint_dir(1)
    return launch_update(policy_dir, group_round(trajectories, GROUP_SIZE), config, 0, out), out


@pytest.fixture(scope="module")
def one_rank(policy_dir: Path, stored, tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, Path]:
    config, trajectories = stored
    out = tmp_path_factory.mktemp("one-rank") / "round-001"
    return grpo_update(policy_dir, trajectories, config.with_overrides({"training": {"num_processes": 1}}), out), out


@pytest.mark.slow
def test_two_ranks_train_every_group_once_per_step_on_exactly_one_rank(two_ranks):
    stats, _ = two_ranks
    per_rank = stats["rank_task_ids"]
    assert stats["processes"] == 2 and stats["steps"] == STEPS and stats["groups"] == 4
    assert sorted(per_rank) == ["0", "1"]
    assert len(per_rank["0"]) == len(per_rank["1"]) == 2  # whole groups, an even share each
    assert set(per_rank["0"]).isdisjoint(per_rank["1"])
    assert sorted(per_rank["0"] + per_rank["1"]) == sorted(REWARDS)


@pytest.mark.slow
def test_two_rank_weights_match_one_rank_weights_within_rounding(two_ranks, one_rank, policy_dir, stored, tmp_path):
    (two_stats, two_out), (one_stats, one_out) = two_ranks, one_rank
    assert one_stats["task_ids"] == sorted(REWARDS) and one_stats["steps"] == two_stats["steps"] == STEPS
    two, one, start = _weights(two_out), _weights(one_out), _weights(policy_dir)
    assert two.keys() == one.keys()
    assert max((two[k] - one[k]).abs().max().item() for k in one) <= WEIGHT_TOLERANCE
    # The bound is tight enough to see a missing group, and the update moved the weights far beyond it.
    config, trajectories = stored
    three = tmp_path / "without-t-d"
    grpo_update(policy_dir, [t for t in trajectories if t.task_id != "t-d"], config, three)
    assert max((_weights(three)[k] - one[k]).abs().max().item() for k in one) > 100 * WEIGHT_TOLERANCE
    assert max((one[k] - start[k]).abs().max().item() for k in one) > 100 * WEIGHT_TOLERANCE


@pytest.mark.slow
def test_two_ranks_leave_one_complete_checkpoint_and_a_log_per_rank_in_the_run_folder(two_ranks, stored):
    config, _ = stored
    _, out = two_ranks
    assert sorted(p.name for p in out.parent.iterdir()) == [out.name]  # no staging folder left behind
    transformers.AutoModelForCausalLM.from_pretrained(out)
    work = launch_dir(config, 0)
    assert (work / "rank-0.log").is_file() and (work / "rank-1.log").is_file()
    assert not list(work.glob("*.error.json"))
    launcher_log = (work / "launcher.log").read_text().splitlines()
    assert launcher_log[0] == "round 0 step 0: update on 2 of 2 requested ranks (4 informative groups)"
    assert launcher_log[1].startswith("$ ") and "--nproc_per_node 2" in launcher_log[1]


# Step 1 of round 0 draws the same four tasks again, with other rewards.
STEP_ONE_REWARDS = {
    "t-a": [0.0, 1.0, 1.0, 1.0],
    "t-b": [1.0, 0.0, 0.0, 1.0],
    "t-c": [0.0, 1.0, 0.0, 0.0],
    "t-d": [1.0, 1.0, 0.0, 0.0],
}


@pytest.mark.slow
def test_a_second_step_on_two_ranks_resumes_the_first_steps_state_and_reads_only_its_own_batch(
    two_ranks, one_rank, policy_dir, stored, tmp_path
):
    config, _ = stored
    (first_stats, two_first), (_, one_first) = two_ranks, one_rank
    assert first_stats["global_step"] == STEPS and first_stats["optimizer_resumed_from"] is None
    state = two_first / TRAINER_STATE_SUBDIR
    assert sorted(p.name for p in state.iterdir()) == [
        "optimizer.pt",
        "rng_state_0.pth",
        "rng_state_1.pth",
        "scheduler.pt",
        "trainer_state.json",
    ]
    step_one = _groups(policy_dir, STEP_ONE_REWARDS, step=1)
    _store(config, step_one)  # round 0 now holds each task's episodes of steps 0 and 1
    batch = group_round(step_trajectories(step_one, 1, GROUP_SIZE), GROUP_SIZE)
    two = launch_update(
        two_first, batch, config, 0, tmp_path / "two", reference_checkpoint=policy_dir, step=1, resume_from=state
    )
    assert two["global_step"] == 2 * STEPS and two["optimizer_resumed_from"] == str(state)
    one_config = config.with_overrides({"training": {"num_processes": 1}})
    one = grpo_update(one_first, step_one, one_config, tmp_path / "one", reference_checkpoint=policy_dir)
    assert one["global_step"] == 2 * STEPS
    two_weights, one_weights = _weights(tmp_path / "two"), _weights(tmp_path / "one")
    assert max((two_weights[k] - one_weights[k]).abs().max().item() for k in one_weights) <= WEIGHT_TOLERANCE


@pytest.mark.slow
def test_a_failing_rank_fails_the_update_with_its_error_and_the_end_of_its_log(policy_dir, stored, tmp_path):
    # Rank 1 trains t-c and t-d; a token id outside the vocabulary in t-d breaks that rank's forward pass only.
    _, trajectories = stored
    config = _config(tmp_path, num_processes=2)
    broken = [
        dataclasses.replace(t, completion_ids=[10**6, *t.completion_ids[1:]]) if t.task_id == "t-d" else t
        for t in trajectories
    ]
    _store(config, broken)
    with pytest.raises(RankFailedError, match=r"Rank 1 of 2 failed the update: IndexError") as failure:
        launch_update(policy_dir, group_round(broken, GROUP_SIZE), config, 0, config.checkpoint_dir(1))
    assert failure.value.rank == 1 and failure.value.log_path == launch_dir(config, 0) / "rank-1.log"
    log_end = "\n".join(failure.value.log_path.read_text().splitlines()[-5:])
    assert log_end in str(failure.value)  # the rank's own log, quoted
    assert not config.checkpoint_dir(1).exists()


@pytest.mark.slow
def test_an_update_that_diverges_on_two_ranks_fails_naming_the_rate_and_saves_no_checkpoint(policy_dir, tmp_path):
    """Each rank checks the weights after its optimizer steps, with the counts summed across ranks so that both
    stop together: at the highest rate on outsized weights the update fails with the divergence's advice, and no
    checkpoint exists."""
    scaled = single_rank_tests._scaled_policy(policy_dir, tmp_path / "scaled", 1e3)
    trajectories = _groups(scaled)
    config = _config(tmp_path / "state", num_processes=2, learning_rate=0.1, updates_per_batch=2)
    _store(config, trajectories)
    with pytest.raises(RankFailedError, match=r"DivergedUpdateError: .*training.learning_rate \(now 0.1;"):
        launch_update(scaled, group_round(trajectories, GROUP_SIZE), config, 0, config.checkpoint_dir(1))
    assert not config.checkpoint_dir(1).exists()


@pytest.mark.slow
def test_lora_on_two_ranks_saves_the_adapter_and_merged_weights_that_match_one_rank(policy_dir, stored, tmp_path):
    config, trajectories = stored
    lora = config.with_overrides({"state_dir": str(tmp_path), "training": {"use_lora": True, "lora_rank": 4}})
    _store(lora, trajectories)
    stats = launch_update(policy_dir, group_round(trajectories, GROUP_SIZE), lora, 0, tmp_path / "two")
    grpo_update(policy_dir, trajectories, lora, tmp_path / "one")
    assert stats["processes"] == 2 and stats["steps"] == STEPS
    assert (tmp_path / "two" / "adapter" / "adapter_config.json").is_file()
    two, one = _weights(tmp_path / "two"), _weights(tmp_path / "one")
    assert two.keys() == one.keys()
    assert max((two[k] - one[k]).abs().max().item() for k in one) <= WEIGHT_TOLERANCE


@pytest.mark.slow
def test_the_update_stage_with_two_processes_launches_ranks_and_records_what_each_trained(
    policy_dir, stored, tmp_path, prefect_api
):

    _, trajectories = stored
    config = _config(tmp_path, num_processes=2, kl_reference="round")
    _store(config, trajectories)

    @flow
    def update_round() -> dict:
        return update_stage(config, UpdateInput(round_=0, checkpoint=str(policy_dir))).model_dump(mode="json")

    output = update_round()
    assert (
        output["checkpoint"] == str(config.checkpoint_dir(1))
        and (config.checkpoint_dir(1) / "model.safetensors").is_file()
    )
    assert output["stats"]["processes"] == 2 and output["stats"]["launcher"] == "torchrun"
    assert sorted(t for ids in output["stats"]["rank_task_ids"].values() for t in ids) == sorted(REWARDS)
    assert output["trained_on"]["count"] == len(trajectories)


def test_ranks_take_the_largest_count_that_shares_the_groups_evenly():
    assert processes_for(4, 2) == 2
    assert processes_for(6, 4) == 3
    assert processes_for(7, 2) == 1
    assert processes_for(1, 8) == 1


def test_torchrun_starts_the_ranks_unless_accelerate_is_named(tmp_path):
    spec = tmp_path / "spec.json"
    torchrun = launch_command(_config(tmp_path, num_processes=2), 2, spec)
    assert torchrun[1:6] == ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    accelerate_file = Path(__file__).resolve().parents[2] / "deployments" / "accelerate" / "ddp.yaml"
    accelerate = launch_command(_config(tmp_path, launcher="accelerate", accelerate_config=accelerate_file), 4, spec)
    assert accelerate[1:5] == ["-m", "accelerate.commands.launch", "--config_file", str(accelerate_file)]
    assert accelerate[accelerate.index("--num_processes") + 1] == "4"


def test_launcher_accelerate_without_a_config_file_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="accelerate_config"):
        launch_command(_config(tmp_path, launcher="accelerate"), 2, tmp_path / "spec.json")
