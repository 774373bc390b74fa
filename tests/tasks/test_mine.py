"""Signal mining: each signal as the method defines it, checked against a plain reference."""

from collections import defaultdict

import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from coevolve.config import SignalConfig
from coevolve.errors import DataError
from coevolve.records import Signal, Step, ToolCall, Trajectory
from coevolve.signals.rare import Rare, RareSettings, patterns
from storage.warehouse import Warehouse
from tasks.mine import count_by_kind, mine_signals, mine_warehouse, select_for_synthesis


def frame(rows):
    return pl.DataFrame(
        [
            {
                "trajectory_id": f"run/r{r}/{t}/s{s}",
                "run_id": "run",
                "round": r,
                "task_id": t,
                "sample": s,
                "reward": float(reward),
                "success": reward > 0.5,
                "finish_reason": "done",
                "tool_sequence": list(seq),
            }
            for r, t, s, reward, seq in rows
        ],
        schema_overrides={"tool_sequence": pl.List(pl.String)},
    )


def only(kind, **kw):
    return SignalConfig(enabled=[kind], **kw)


def test_boundary_marks_every_sample_of_a_mixed_group():
    rows = [(0, "a", 0, 1, ["ls"]), (0, "a", 1, 0, ["ls"]), (0, "b", 0, 1, ["ls"]), (0, "b", 1, 1, ["ls"])]
    signals = mine_signals(frame(rows), 0, "run", only("boundary"))
    assert sorted(s.trajectory_id for s in signals) == ["run/r0/a/s0", "run/r0/a/s1"]
    assert signals[0].evidence["group_rewards"] == [1.0, 0.0]


def test_a_reward_of_exactly_one_half_is_neither_a_pass_nor_a_fail_of_a_boundary():
    rows = [(0, "a", 0, 1.0, ["ls"]), (0, "a", 1, 0.5, ["ls"]), (0, "b", 0, 0.5, ["ls"]), (0, "b", 1, 0.0, ["ls"])]
    assert mine_signals(frame(rows), 0, "run", only("boundary")) == []


def test_boundary_evidence_lists_the_groups_rewards_in_sample_order():
    """Samples 0-11: their trajectory ids sort s0, s1, s10, s11, s2, ... but the evidence follows the sample numbers."""
    rewards = [float(s % 3 == 0) for s in range(12)]
    signals = mine_signals(frame([(0, "a", s, r, ["ls"]) for s, r in enumerate(rewards)]), 0, "run", only("boundary"))
    assert len(signals) == 12 and all(s.evidence == {"group_rewards": rewards} for s in signals)


def test_forgetting_needs_an_earlier_pass_and_a_current_fail():
    rows = [(0, "a", 0, 1, ["ls"]), (1, "a", 0, 0, ["ls"]), (0, "b", 0, 0, ["ls"]), (1, "b", 0, 0, ["ls"])]
    signals = mine_signals(frame(rows), 1, "run", only("forgetting"))
    assert [s.trajectory_id for s in signals] == ["run/r1/a/s0"]
    assert signals[0].evidence == {"window": [1.0], "score": 0.0}


def test_forgetting_window_forgets_passes_older_than_w():
    rows = [(0, "a", 0, 1, [])] + [(r, "a", 0, 0, []) for r in range(1, 4)]
    assert mine_signals(frame(rows), 3, "run", only("forgetting", forgetting_window=2)) == []
    assert len(mine_signals(frame(rows), 3, "run", only("forgetting", forgetting_window=3))) == 1


def test_rare_waits_for_n_min_then_marks_rare_sequences():
    common = [(0, "a", s, 1, ["ls", "cd"]) for s in range(19)]
    rows = common + [(0, "b", 0, 0, ["mv", "cd"])]
    assert mine_signals(frame(rows), 0, "run", only("rare", rare_min_total=21)) == []
    signals = mine_signals(frame(rows), 0, "run", only("rare", rare_min_total=20, rare_theta=6))
    assert [s.trajectory_id for s in signals] == ["run/r0/b/s0"]
    assert signals[0].evidence == {"pattern": "mv>cd", "count": 1, "total": 20}


def test_rare_bigrams_fire_on_a_rare_pair_inside_common_tools():
    rows = [(0, "a", s, 1, ["ls", "cd", "mv"]) for s in range(19)] + [(0, "b", 0, 1, ["cd", "ls", "mv"])]
    signals = mine_signals(frame(rows), 0, "run", only("rare", rare_min_total=1, rare_theta=10, pattern="tool_bigrams"))
    assert [s.trajectory_id for s in signals] == ["run/r0/b/s0"]


def test_trajectories_without_tool_calls_are_never_rare():
    rows = [(0, "a", s, 1, ["ls"]) for s in range(30)] + [(0, "b", 0, 0, [])]
    assert mine_signals(frame(rows), 0, "run", only("rare", rare_min_total=1)) == []


def test_disabled_signals_are_not_mined():
    rows = [(0, "a", 0, 1, ["ls"]), (0, "a", 1, 0, ["ls"])]
    assert count_by_kind(mine_signals(frame(rows), 0, "run", SignalConfig(enabled=[]))) == {
        "forgetting": 0,
        "boundary": 0,
        "rare": 0,
    }


def test_selection_interleaves_kinds_and_spreads_tasks():
    rows = [(0, t, s, s % 2, ["ls"]) for t in "ab" for s in range(4)]
    signals = mine_signals(frame(rows), 0, "run", only("boundary"))
    picked = select_for_synthesis(signals, 2)
    assert {s.task_id for s in picked} == {"a", "b"}


def reference_windows(rows, round_, window):
    """Per task played in ``round_``: its last ``window`` scores before the round, oldest first (round, then sample)."""
    history = sorted((r, s, reward, t) for r, t, s, reward, _seq in rows if r < round_)
    played = {t for r, t, *_ in rows if r == round_}
    return {t: [reward for _r, _s, reward, task in history if task == t][-window:] for t in played}


def reference_signals(rows, round_, config):
    """Row-by-row reading of the definitions, for comparison."""
    out = set()
    by_task = defaultdict(list)
    for r, t, s, reward, _seq in sorted(rows):
        by_task[t].append((r, s, reward))
    windows = reference_windows(rows, round_, config.forgetting_window)
    for r, t, s, reward, _seq in rows:
        if r != round_:
            continue
        history = windows[t]
        if history and max(history) >= 0.5 and reward < 0.5:
            out.add(("forgetting", t, s))
        group = [x[2] for x in by_task[t] if x[0] == round_]
        if any(g > 0.5 for g in group) and any(g < 0.5 for g in group):
            out.add(("boundary", t, s))
    upto = [row for row in rows if row[0] <= round_]
    if len(upto) >= config.rare_min_total:
        counts = defaultdict(int)
        for row in upto:
            if row[4]:
                counts[">".join(row[4])] += 1
        for r, t, s, _reward, seq in rows:
            p = ">".join(seq)
            if r == round_ and seq and 0 < counts[p] / len(upto) < config.rare_theta / 100:
                out.add(("rare", t, s))
    return out


row_strategy = st.tuples(
    st.integers(0, 4),
    st.sampled_from(["a", "b", "c"]),
    st.integers(0, 3),
    st.sampled_from([0.0, 1.0, 0.5, 0.25]),
    st.lists(st.sampled_from(["ls", "cd", "mv"]), max_size=3),
)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(row_strategy, min_size=1, max_size=40, unique_by=lambda r: (r[0], r[1], r[2])),
    st.integers(0, 4),
    st.integers(1, 4),
)
def test_polars_signals_match_the_row_by_row_reference(rows, round_, window):
    config = SignalConfig(forgetting_window=window, rare_min_total=3, rare_theta=20)
    signals = mine_signals(frame(rows), round_, "run", config)
    got = {(s.kind, s.task_id, int(s.trajectory_id.rsplit("/s", 1)[1])) for s in signals}
    assert got == reference_signals(rows, round_, config)
    windows = reference_windows(rows, round_, window)
    assert all(s.evidence["window"] == windows[s.task_id] for s in signals if s.kind == "forgetting")


@pytest.mark.parametrize("window", [1, 2, 3, 5])
def test_the_forgetting_window_is_exactly_the_last_w_scores_before_the_round(window):
    """A pass W+1 scores back is out of the window, a pass W scores back is in; the evidence is the window itself."""
    older = [(0, "a", 0, 1.0, [])] + [(1 + i // 2, "a", i % 2, 0.0, []) for i in range(window)]
    recent = [(0, "b", 0, 0.0, []), (1, "b", 0, 1.0, [])] + [(2 + i, "b", 0, 0.0, []) for i in range(window - 1)]
    current = 2 + window
    rows = older + recent + [(current, "a", 0, 0.0, []), (current, "b", 0, 0.0, [])]
    signals = mine_signals(frame(rows), current, "run", only("forgetting", forgetting_window=window))
    assert [(s.task_id, s.evidence) for s in signals] == [("b", {"window": [1.0] + [0.0] * (window - 1), "score": 0.0})]


# --- mining straight from the warehouse's files ---------------------------------------------------


def write_run(root, rows):
    """A warehouse holding ``rows`` (round, task, sample, reward, tools) as trajectories of run 'run'."""
    wh = Warehouse(root)
    by_round = defaultdict(list)
    for r, t, s, reward, seq in rows:
        steps = [Step(turn=0, index=0, model_text="", calls=[ToolCall(name, {}) for name in seq],
                      observations=["ok" for _ in seq], completion_tokens=1)]  # fmt: skip
        by_round[r].append(Trajectory(run_id="run", round=r, task_id=t, sample=s, steps=steps, prompt_ids=[1],
                                      completion_ids=[2], completion_mask=[1], logprobs=[0.0], reward=float(reward),
                                      success=reward > 0.5, finish_reason="done", duration_s=0.1))  # fmt: skip
    for _round, trajs in sorted(by_round.items()):
        # Two files per round, so the scan reads several files of a partition.
        wh.write_trajectories(trajs[::2])
        wh.write_trajectories(trajs[1::2])
    return wh


CONFIGS = [
    SignalConfig(forgetting_window=2, rare_min_total=3, rare_theta=20),
    SignalConfig(forgetting_window=1, rare_min_total=1, rare_theta=40, pattern="tool_bigrams"),
    SignalConfig(enabled=["rare"], rare_min_total=10**6),
]


@settings(max_examples=15, deadline=None)
@given(st.lists(row_strategy, min_size=1, max_size=40, unique_by=lambda r: (r[0], r[1], r[2])), st.integers(0, 3))
def test_mining_the_warehouse_files_equals_mining_its_frame(tmp_path_factory, rows, round_):
    wh = write_run(tmp_path_factory.mktemp("wh") / "warehouse", rows)
    frame_ = wh.trajectory_frame("run", upto_round=round_)
    for config in CONFIGS:
        expected = mine_signals(frame_, round_, "run", config)
        assert mine_warehouse(wh, "run", round_, config) == expected
        # The frame may hold later rounds: they are ignored.
        assert mine_signals(wh.trajectory_frame("run"), round_, "run", config) == expected


def test_a_run_without_trajectories_mines_nothing(tmp_path):
    wh = write_run(tmp_path / "warehouse", [(0, "a", 0, 1, ["ls"])])
    assert mine_warehouse(wh, "other", 0, SignalConfig()) == []
    assert mine_warehouse(wh, "run", 1, SignalConfig()) == []


def test_signal_records_are_plain_signals():
    rows = [(0, "a", s, s % 2, ["ls", "cd"] if s else ["mv"]) for s in range(4)] + [(1, "a", 0, 0, ["mv"])]
    signals = mine_signals(frame(rows), 1, "run", SignalConfig(rare_min_total=1, rare_theta=50))
    assert {s.kind for s in signals} == {"forgetting", "rare"}
    for s in signals:
        built = Signal(s.run_id, s.round, s.kind, s.trajectory_id, s.task_id, s.evidence)
        assert type(s) is Signal and s == built and vars(s) == vars(built)
        assert s.signal_id == f"{s.kind}:{s.trajectory_id}"


def test_a_damaged_trajectory_file_fails_mining_with_a_data_error(tmp_path):
    wh = write_run(tmp_path / "warehouse", [(0, "a", s, s % 2, ["ls"]) for s in range(4)])
    path = sorted((tmp_path / "warehouse" / "tables" / "trajectories").rglob("run_id=run/round=0/*.parquet"))[0]
    path.write_bytes(b"not a parquet file" * 10)
    with pytest.raises(DataError, match="damaged"):
        mine_warehouse(wh, "run", 0, SignalConfig())


def test_rare_compares_exactly_a_pattern_at_theta_percent_never_fires():
    """11 of 1000 is exactly 1.1 percent: 11/1000 < 1.1/100 holds in floats (0.011 < 0.011000000000000001)."""
    rows = [(0, f"t{i}", 0, 0, ["touch"] if i < 11 else ["ls"]) for i in range(1000)]
    rows.append((0, "u", 0, 0, ["cd"]))  # 1 of 1001: rare either way
    config = only("rare", rare_theta=1.1, rare_min_total=1)
    at_theta = mine_signals(frame(rows[:1000]), 0, "run", config)
    assert [s.evidence["pattern"] for s in at_theta] == []
    below = mine_signals(frame(rows), 0, "run", config)
    assert {s.evidence["pattern"] for s in below} == {"cd", "touch"}  # 11/1001 is below 1.1 percent


def _patterns(kind, sequences):
    lazy = pl.LazyFrame({"tool_sequence": sequences}, schema={"tool_sequence": pl.List(pl.String)})
    return patterns(lazy, kind).collect()["patterns"].to_list()


def test_a_trajectorys_tool_sequence_pattern_is_its_whole_sequence_and_none_without_a_tool_call():
    sequences = [["ls", "cd", "ls"], ["cd"], []]
    assert _patterns("tool_sequence", sequences) == [["ls>cd>ls"], ["cd"], []]


def test_a_trajectorys_bigram_patterns_are_its_distinct_consecutive_pairs_in_order_and_a_lone_tool_is_its_own():
    sequences = [["ls", "cd", "mv", "ls", "cd"], ["cd"], []]
    assert _patterns("tool_bigrams", sequences) == [["ls>cd", "cd>mv", "mv>ls"], ["cd"], []]


def test_an_unknown_action_pattern_is_refused_with_the_known_ones():
    with pytest.raises(
        ValueError, match=r"unknown action pattern 'tool_set'; use one of \('tool_sequence', 'tool_bigrams'\)"
    ):
        _patterns("tool_set", [["ls"]])


def test_rare_bigrams_count_earlier_trajectories_not_their_bigrams_in_the_total():
    """19 earlier trajectories with two bigrams each and this round's one: N is 20 trajectories, not 39 bigrams."""
    rows = [(0, "a", s, 1, ["ls", "cd", "mv"]) for s in range(19)] + [(1, "b", 0, 1, ["cd", "ls", "mv"])]
    config = only("rare", rare_min_total=20, rare_theta=10, pattern="tool_bigrams")
    signals = mine_signals(frame(rows), 1, "run", config)
    assert [(s.trajectory_id, s.evidence) for s in signals] == [
        ("run/r1/b/s0", {"pattern": "cd>ls", "count": 1, "total": 20})
    ]
    assert mine_signals(frame(rows), 1, "run", only("rare", rare_min_total=21, pattern="tool_bigrams")) == []


def test_rare_refuses_an_unknown_action_pattern_in_its_settings_with_the_known_ones():
    rare = Rare()
    settings = RareSettings.model_construct(pattern="tool_set")
    with pytest.raises(
        ValueError, match=r"^unknown action pattern 'tool_set'; use one of \('tool_sequence', 'tool_bigrams'\)$"
    ):
        rare.history_plans(frame([(0, "a", 0, 1, ["ls"])]).lazy(), frame([(1, "a", 0, 1, ["ls"])]), settings)


def test_the_forgetting_window_follows_round_and_sample_whatever_the_row_order():
    rows = [
        (2, "a", 0, 0.0, []),
        (0, "a", 1, 0.3, []),
        (0, "a", 0, 1.0, []),
        (1, "a", 0, 0.2, []),
        (3, "a", 0, 0.0, []),
    ]
    assert mine_signals(frame(rows), 3, "run", only("forgetting", forgetting_window=3)) == []
    [signal] = mine_signals(frame(rows), 3, "run", only("forgetting", forgetting_window=4))
    assert signal.evidence == {"window": [1.0, 0.3, 0.2, 0.0], "score": 0.0}


def test_a_trajectory_with_several_rare_bigrams_is_marked_once_with_the_first_by_text():
    rows = [(0, "a", s, 1, ["ls"]) for s in range(30)] + [(0, "b", 0, 0, ["mv", "cd", "ls"])]
    signals = mine_signals(frame(rows), 0, "run", only("rare", rare_min_total=1, pattern="tool_bigrams"))
    assert [(s.trajectory_id, s.evidence) for s in signals] == [
        ("run/r0/b/s0", {"pattern": "cd>ls", "count": 1, "total": 31})
    ]
