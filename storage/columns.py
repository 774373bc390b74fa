"""How the pipeline's records become the warehouse's Arrow columns and back: the tables' schemas and conversions.

`trajectory_tables` turns a batch of `Trajectory` records into the rows of ``trajectories`` and
``steps`` column by column (no per-row Python dicts); `tool_call_counts` sums the batch's tool calls
and failed calls per tool, the small table `v_tool_failure_rates` reads instead of every observation.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import asdict
from itertools import accumulate
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from coevolve.records import ToolCall, Trajectory

# A tool call as typed columns: the method name, and each argument's value as its JSON literal
# (arguments of one call mix strings, numbers, lists and objects; a literal keeps each exact).
CALL_TYPE = pa.struct([("name", pa.string()), ("arguments", pa.map_(pa.string(), pa.string()))])

# A segment of an episode (coevolve.records.Segment): a token sequence trained on its own.
SEGMENT_TYPE = pa.struct([
    ("prompt_ids", pa.list_(pa.int32())), ("completion_ids", pa.list_(pa.int32())),
    ("completion_mask", pa.list_(pa.int8())), ("logprobs", pa.list_(pa.float64())),
])  # fmt: skip

# Columns of every table's files; run_id and round of partitioned tables are in the path instead.
SCHEMAS: dict[str, pa.Schema] = {
    "trajectories": pa.schema([
        ("trajectory_id", pa.string()), ("task_id", pa.string()), ("sample", pa.int32()), ("reward", pa.float64()),
        ("success", pa.bool_()), ("finish_reason", pa.string()), ("num_steps", pa.int32()),
        ("tool_sequence", pa.list_(pa.string())), ("prompt_ids", pa.list_(pa.int32())),
        ("completion_ids", pa.list_(pa.int32())), ("completion_mask", pa.list_(pa.int8())),
        ("logprobs", pa.list_(pa.float64())), ("duration_s", pa.float64()),
        # Added within layout 3: files written before it lack the column; `conform` reads them as one segment.
        ("later_segments", pa.list_(SEGMENT_TYPE)),
    ]),
    "steps": pa.schema([
        ("trajectory_id", pa.string()), ("step_index", pa.int32()), ("step_number", pa.int32()), ("turn", pa.int32()),
        ("model_text", pa.string()), ("calls", pa.list_(CALL_TYPE)), ("tool_names", pa.list_(pa.string())),
        ("observations", pa.list_(pa.string())), ("error", pa.string()), ("completion_tokens", pa.int32()),
    ]),
    "signals": pa.schema([
        ("signal_id", pa.string()), ("kind", pa.string()), ("trajectory_id", pa.string()), ("task_id", pa.string()),
        ("evidence", pa.string()),
    ]),
    "candidates": pa.schema([
        ("task_id", pa.string()), ("signal_key", pa.string()), ("signal_id", pa.string()), ("origin", pa.string()),
        ("accepted", pa.bool_()), ("reason", pa.string()), ("task", pa.string()),
    ]),
    "evaluations": pa.schema([
        ("split", pa.string()), ("task_id", pa.string()), ("success", pa.bool_()), ("reward", pa.float64()),
        ("trajectory_id", pa.string()),
    ]),
    "tool_call_counts": pa.schema([("tool_name", pa.string()), ("calls", pa.int64()), ("failed_calls", pa.int64())]),
    "pool_membership": pa.schema([("position", pa.int32()), ("task_id", pa.string())]),
    # Added within layout 3 (a warehouse made before it gets its empty file when next opened for writing).
    "task_difficulty": pa.schema([
        ("task_id", pa.string()), ("origin", pa.string()), ("played", pa.int32()), ("recent_played", pa.int32()),
        ("recent_successes", pa.int32()), ("last_round", pa.int32()), ("prior_mean", pa.float64()),
        ("alpha", pa.float64()), ("beta", pa.float64()), ("estimate", pa.float64()),
    ]),
    "tasks": pa.schema([
        ("task_id", pa.string()), ("environment", pa.string()), ("origin", pa.string()), ("round", pa.int32()),
        ("parent_trajectory_id", pa.string()), ("signal_id", pa.string()), ("content_hash", pa.string()),
        ("task", pa.string()), ("tools", pa.list_(pa.string())),
    ]),
}  # fmt: skip
# Columns added to a table within a layout version, and the value a file without them holds.
_ADDED_COLUMNS: dict[str, dict[str, Any]] = {"trajectories": {"later_segments": []}}


# Tables added within layout 3, newest last: a warehouse opened for writing gets any it lacks.
ADDED_TABLES: tuple[str, ...] = ("task_difficulty",)


def conform(table: str, rows: pa.Table, schema: pa.Schema | None = None) -> pa.Table:
    """``rows`` of ``table`` read from a file, cast to ``schema`` (the table's): a column added to the
    table after the file was written gets the value such a file means (e.g. no later segments)."""
    schema = SCHEMAS[table] if schema is None else schema
    for name, value in _ADDED_COLUMNS.get(table, {}).items():
        if name in schema.names and name not in rows.column_names:
            type_ = schema.field(name).type
            rows = rows.append_column(name, pa.array([value] * rows.num_rows, type_))
    return rows.select(schema.names).cast(schema)


# Every argument value is stored as its JSON literal, exactly as json.dumps writes it; strings, most
# arguments, go through the encoder's C function for string literals (what json.dumps calls for them).
_str_literal = json.encoder.encode_basestring_ascii


def _literal(value: Any) -> str:
    if type(value) is str:
        return _str_literal(value)
    return json.dumps(value, default=str)


def _offsets(counts: Iterable[int]) -> pa.Array:
    return pa.array(list(accumulate(counts, initial=0)), pa.int32())


def _tool_calls(calls: list[ToolCall]) -> pa.Array:
    """Calls as one Arrow array of CALL_TYPE: name, and each argument's value as its JSON literal."""
    arguments = [c.arguments for c in calls]
    values = [_str_literal(v) if type(v) is str else _literal(v) for a in arguments for v in a.values()]
    mapped = pa.MapArray.from_arrays(
        _offsets(len(a) for a in arguments),
        pa.array([k for a in arguments for k in a], pa.string()),
        pa.array(values, pa.string()),
    )
    return pa.StructArray.from_arrays([pa.array([c.name for c in calls], pa.string()), mapped], fields=list(CALL_TYPE))


def read_calls(calls: list[dict[str, Any]] | None) -> list[ToolCall]:
    return [ToolCall(c["name"], {k: json.loads(v) for k, v in (c["arguments"] or [])}) for c in calls or []]


def _lists(counts: list[int], values: pa.Array, type_: pa.DataType) -> pa.Array:
    return pa.ListArray.from_arrays(_offsets(counts), values, type=type_)


def trajectory_tables(trajs: list[Trajectory]) -> tuple[pa.Table, pa.Table]:
    """The Arrow tables of trajectories and their steps (one row per step), as the files hold them.

    Built column by column: the steps' nested columns from flat value lists and offsets, so no
    column passes through per-row Python dicts.
    """
    heads = list({t.trajectory_id: t for t in trajs}.values())
    ids = [t.trajectory_id for t in heads]
    steps = [s for t in heads for s in t.steps]
    calls = [c for s in steps for c in s.calls]
    call_counts = [len(s.calls) for s in steps]
    call_array = _tool_calls(calls)
    names = call_array.field(0)
    per_trajectory = [len(t.steps) for t in heads]
    step_calls = iter(call_counts)
    tool_counts = [sum(next(step_calls) for _ in range(n)) for n in per_trajectory]

    def tokens(attr: str, type_: pa.DataType) -> pa.Array:
        return pa.array([getattr(t, attr) for t in heads], pa.list_(type_))  # nested lists convert in C++

    trajectories = pa.Table.from_arrays(
        [
            pa.array(ids, pa.string()), pa.array([t.task_id for t in heads], pa.string()),
            pa.array([t.sample for t in heads], pa.int32()), pa.array([float(t.reward) for t in heads], pa.float64()),
            pa.array([bool(t.success) for t in heads], pa.bool_()),
            pa.array([t.finish_reason for t in heads], pa.string()), pa.array(per_trajectory, pa.int32()),
            _lists(tool_counts, names, pa.list_(pa.string())), tokens("prompt_ids", pa.int32()),
            tokens("completion_ids", pa.int32()), tokens("completion_mask", pa.int8()),
            tokens("logprobs", pa.float64()), pa.array([float(t.duration_s) for t in heads], pa.float64()),
            pa.array([[asdict(s) for s in t.later_segments] for t in heads], pa.list_(SEGMENT_TYPE)),
        ],
        schema=SCHEMAS["trajectories"],
    )  # fmt: skip
    step_table = pa.Table.from_arrays(
        [
            pa.array([tid for tid, n in zip(ids, per_trajectory, strict=True) for _ in range(n)], pa.string()),
            pa.array([i for n in per_trajectory for i in range(n)], pa.int32()),
            pa.array([s.index for s in steps], pa.int32()), pa.array([s.turn for s in steps], pa.int32()),
            pa.array([s.model_text for s in steps], pa.string()),
            _lists(call_counts, call_array, pa.list_(CALL_TYPE)), _lists(call_counts, names, pa.list_(pa.string())),
            pa.array([s.observations for s in steps], pa.list_(pa.string())),
            pa.array([s.error for s in steps], pa.string()), pa.array([s.completion_tokens for s in steps], pa.int32()),
        ],
        schema=SCHEMAS["steps"],
    )  # fmt: skip
    return trajectories, step_table


# A tool call failed when its observation is an error: text starting with 'error' in any case (after
# spaces), or a JSON/dict result whose first key is "error". RE2, as in DuckDB's regexp_matches.
FAILED_OBSERVATION = r"""^\p{Zs}*(?i:error)|^\s*\{\s*["']error["']"""


def tool_call_counts(steps: pa.Table) -> pa.Table:
    """Calls and failed calls per tool in a batch of steps (``observations[i]`` answers ``tool_names[i]``)."""
    names, observations = steps.column("tool_names").combine_chunks(), steps.column("observations").combine_chunks()
    if pc.all(pc.equal(pc.list_value_length(names), pc.list_value_length(observations))).as_py() is not False:
        flat_names, flat_observations = pc.list_flatten(names), pc.list_flatten(observations)
    else:  # a step with more or fewer observations than calls: pair them by position, as unnest does
        pairs = [
            (name, obs[i] if i < len(obs) else None)
            for call_names, obs in zip(names.to_pylist(), observations.to_pylist(), strict=True)
            for i, name in enumerate(call_names or [])
        ]
        flat_names = pa.array([n for n, _ in pairs], pa.string())
        flat_observations = pa.array([o for _, o in pairs], pa.string())
    failed = pc.fill_null(pc.match_substring_regex(flat_observations, FAILED_OBSERVATION), False)
    calls = pa.table({"tool_name": flat_names, "failed": pc.cast(failed, pa.int64())}).filter(pc.is_valid(flat_names))
    grouped = calls.group_by("tool_name").aggregate([("failed", "count"), ("failed", "sum")])
    return pa.Table.from_arrays(
        [grouped.column("tool_name"), grouped.column("failed_count"), grouped.column("failed_sum")],
        schema=SCHEMAS["tool_call_counts"],
    ).sort_by("tool_name")
