"""Every record type the pipeline passes between stages.

Records are plain dataclasses with JSON-friendly fields so that any stage can be called and
tested without Prefect, and so that storage/ can persist them without special cases.
`to_dict` / `from_dict` round-trip every record through plain JSON values.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

FinishReason = Literal["done", "max_steps", "length", "error"]


def canonical_json(value: Any) -> str:
    """JSON with sorted keys and no whitespace: the input of every content digest."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


def digest(value: Any) -> str:
    return hashlib.sha256(canonical_json(value).encode()).hexdigest()


def normal_value(value: Any) -> Any:
    """A call argument as task comparison sees it: strings lowercased with single spaces, 1.0 == 1."""
    if isinstance(value, str):
        return " ".join(value.lower().split())
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, (list, tuple)):
        return [normal_value(v) for v in value]
    if isinstance(value, dict):
        return {k: normal_value(v) for k, v in sorted(value.items())}
    return value


@dataclass(frozen=True)
class ToolCall:
    """One parsed tool call: a method name and literal keyword arguments."""

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)

    def render(self) -> str:
        """Python-call syntax, e.g. ``mkdir(dir_name='temp')``: the format the policy emits."""
        args = ", ".join(f"{k}={v!r}" for k, v in self.arguments.items())
        return f"{self.name}({args})"

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "arguments": dict(self.arguments)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ToolCall:
        return cls(name=data["name"], arguments=dict(data.get("arguments") or {}))


@dataclass(frozen=True)
class Message:
    """One chat message. role is system, user, assistant or tool."""

    role: str
    content: str


@dataclass(frozen=True)
class Provenance:
    """Why a task exists: its origin, the round that made it, and the evidence it came from."""

    # The seed explorer ("seed"), a signal kind's name (coevolve/signals/), the random control ("random"), or a
    # held-out split ("heldout", "official").
    origin: str
    round: int = 0
    parent_trajectory_id: str | None = None
    signal_id: str | None = None


@dataclass(frozen=True)
class Task:
    """A pool entry: an executable task with one user message and a reference call sequence per turn.

    ``initial_config`` and ``involved_classes`` fully describe the environment's starting state.
    The id is derived from the content, so the same task synthesized twice has the same id.
    """

    environment: str
    initial_config: dict[str, Any]
    involved_classes: list[str]
    turns: list[str]
    reference: list[list[ToolCall]]
    provenance: Provenance
    description: str = ""

    @property
    def content_hash(self) -> str:
        return digest(
            {
                "environment": self.environment,
                "initial_config": self.initial_config,
                "involved_classes": self.involved_classes,
                "turns": self.turns,
                "reference": [[c.to_dict() for c in turn] for turn in self.reference],
            }
        )

    @property
    def task_id(self) -> str:
        return "t-" + self.content_hash[:16]

    @property
    def identity(self) -> str:
        """What the task is, apart from its wording: environment, initial state, classes and normalized calls.

        Two tasks with the same identity are the same exercise even when their queries, descriptions
        or provenance differ; the held-out and dev splits are sealed by it.
        """
        return digest(
            {
                "environment": self.environment,
                "initial_config": self.initial_config,
                "involved_classes": sorted(self.involved_classes),
                "calls": [[[c.name, normal_value(c.arguments)] for c in turn] for turn in self.reference],
            }
        )

    @property
    def tools(self) -> list[str]:
        """Distinct tool names of the reference, in first-use order."""
        seen: dict[str, None] = {}
        for turn in self.reference:
            for call in turn:
                seen.setdefault(call.name, None)
        return list(seen)

    @property
    def num_reference_calls(self) -> int:
        return sum(len(turn) for turn in self.reference)

    def to_dict(self) -> dict[str, Any]:
        return {
            "task_id": self.task_id,
            "environment": self.environment,
            "initial_config": self.initial_config,
            "involved_classes": list(self.involved_classes),
            "turns": list(self.turns),
            "reference": [[c.to_dict() for c in turn] for turn in self.reference],
            "provenance": asdict(self.provenance),
            "description": self.description,
            "content_hash": self.content_hash,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Task:
        return cls(
            environment=data["environment"],
            initial_config=data["initial_config"],
            involved_classes=list(data["involved_classes"]),
            turns=list(data["turns"]),
            reference=[[ToolCall.from_dict(c) for c in turn] for turn in data["reference"]],
            provenance=Provenance(**data["provenance"]),
            description=data.get("description", ""),
        )


@dataclass
class Step:
    """One model message in an episode and what the environment made of it."""

    turn: int
    index: int
    model_text: str
    calls: list[ToolCall] = field(default_factory=list)
    observations: list[str] = field(default_factory=list)
    error: str | None = None
    completion_tokens: int = 0


@dataclass
class Segment:
    """A run of consecutive steps of an episode whose prompts extend each other, as one token sequence.

    ``completion_ids`` holds every token after ``prompt_ids``: model tokens (mask 1, with their
    behaviour logprobs) and environment tokens (mask 0, logprob 0.0) interleaved.
    """

    prompt_ids: list[int]
    completion_ids: list[int]
    completion_mask: list[int]
    logprobs: list[float]


@dataclass
class Trajectory:
    """One episode of one task by the policy, with everything GRPO needs to train on it.

    The episode's tokens are one or more segments (tasks/rollout.py says when a new one starts): the
    first is ``prompt_ids`` .. ``logprobs``, the others are ``later_segments``, in step order.
    ``completion_ids`` holds every token after the prompt: model tokens (mask 1, with their
    behaviour logprobs) and environment tokens (mask 0, logprob 0.0) interleaved.
    """

    run_id: str
    round: int
    task_id: str
    sample: int
    steps: list[Step]
    prompt_ids: list[int]
    completion_ids: list[int]
    completion_mask: list[int]
    logprobs: list[float]
    reward: float
    success: bool
    finish_reason: str
    duration_s: float = 0.0
    later_segments: list[Segment] = field(default_factory=list)

    @property
    def trajectory_id(self) -> str:
        return f"{self.run_id}/r{self.round}/{self.task_id}/s{self.sample}"

    @property
    def segments(self) -> list[Segment]:
        """Every segment of the episode in step order, the first one included."""
        return [
            Segment(self.prompt_ids, self.completion_ids, self.completion_mask, self.logprobs),
            *self.later_segments,
        ]

    @property
    def tool_sequence(self) -> list[str]:
        return [call.name for step in self.steps for call in step.calls]

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["trajectory_id"] = self.trajectory_id
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Trajectory:
        steps = [Step(**{**s, "calls": [ToolCall.from_dict(c) for c in s.get("calls", [])]}) for s in data["steps"]]
        fields = {k: v for k, v in data.items() if k not in ("steps", "trajectory_id", "later_segments")}
        later = [Segment(**s) for s in data.get("later_segments") or []]
        return cls(steps=steps, later_segments=later, **fields)


@dataclass(frozen=True)
class Signal:
    """A failure signal on one trajectory, with the evidence that made it fire."""

    run_id: str
    round: int
    kind: str
    trajectory_id: str
    task_id: str
    evidence: dict[str, Any]

    @property
    def signal_id(self) -> str:
        return f"{self.kind}:{self.trajectory_id}"


@dataclass(frozen=True)
class Verdict:
    """The validator's decision on one candidate task."""

    accepted: bool
    reason: str


@dataclass(frozen=True)
class Candidate:
    """A synthesized task with the signal it answers and, once validated, its verdict."""

    task: Task
    signal_id: str | None
    verdict: Verdict | None = None


@dataclass
class RoundSummary:
    """One row of the per-round table the main job prints and MLflow records."""

    run_id: str
    round: int
    pool_size: int
    rollouts: int
    success_rate: float
    signals: dict[str, int]
    accepted: int
    rejected: int
    heldout_success: float
    pool_digest: str = ""
    checkpoint: str = ""
    model_version: str = ""
    flow_run_id: str = ""
    durations_s: dict[str, float] = field(default_factory=dict)
    # Mechanism measurements (storage/mechanism.py); None / empty where not measured (summaries written before them).
    # Share of the round's rollout groups (one task's samples) whose rewards are not all equal.
    informative_groups: float | None = None
    # Share of the held-out split's distinct tool bigrams present in pool r, the pool the round trained on.
    heldout_coverage: float | None = None
    # Accepted candidates by the kind of signal they answer; "random" for the random control.
    accepted_by_kind: dict[str, int] = field(default_factory=dict)
    # Greedy success of the round's checkpoint on the first rollout.dev_eval_tasks dev tasks; None when not scored.
    dev_success: float | None = None
    # What the round played and trained (equal compute across ablation arms is read from these); None where
    # not recorded. Episodes (trajectories) and GRPO groups the round's rollouts played.
    episodes_played: int | None = None
    groups_played: int | None = None
    # Episodes played per informative group: the rollout cost of one group the update learns from.
    episodes_per_informative_group: float | None = None
    # Optimizer steps the round's update took (the sum of its training steps' "steps" statistics).
    optimizer_steps: int | None = None
    # Curriculum: episode-weighted mean |estimate - observed success| of the tasks the round played, the
    # estimates being the sampler's (task_difficulty of the round); None where the round has no estimates.
    calibration: float | None = None
    # Pool r's tasks by estimated success, storage.mechanism.DIFFICULTY_BINS -> count; empty without estimates.
    difficulty_histogram: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
