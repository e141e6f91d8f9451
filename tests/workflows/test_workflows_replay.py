"""Trace replay for the demo: compression, consistent per-node events, cycling, slice choice;
and the recorder's node-seconds and the report drawn from samples."""

import json

import pandas as pd
import pytest
from malleparsl.workflows.replay import TraceReplay, compress, pick_slice

from malleparsl.errors import SpecError
from malleparsl.traces import IdleTrace, load_trace


def frags(rows):
    return pd.DataFrame(rows, columns=["node", "start_s", "end_s", "known_end"])


def trace_of(rows, t0=0.0, t1=1000.0):
    f = frags(rows)
    return IdleTrace(f, tuple(sorted(set(f["node"]))), t0, t1, "t")


def drain(src, times):
    out = []
    for t in times:
        out += [(round(e.time_s - 100.0, 6), e.kind, e.node) for e in src.poll(100.0 + t)]
    return out


def test_compress_scales_time_drops_short_fragments_and_closes_short_gaps():
    tr = trace_of([("a", 0, 300, False), ("a", 330, 900, False), ("b", 100, 150, False)])
    c = compress(tr, speed=10, min_fragment_s=10, min_gap_s=5)
    assert c.values.tolist() == [["a", 0.0, 90.0, False]]  # a's 3 s gap closed, b too short


def test_replay_emits_events_on_the_callers_clock():
    src = TraceReplay(fragments=frags([("a", 0, 10, False), ("b", 5, 20, True)]))
    ev = drain(src, [0, 4, 6, 11, 30])
    assert ev == [(0, "idle", "a"), (5, "idle", "b"), (10, "taken", "a"), (20, "taken", "b")]
    assert src.log[1].end_s == pytest.approx(100 + 20)  # a known end is announced


def test_a_node_comes_back_only_after_the_minimum_gap_and_never_twice():
    f = frags([("a", 0, 10, False), ("a", 12, 40, False), ("a", 42, 60, False)])
    src = TraceReplay(fragments=f, min_gap_s=5)
    ev = drain(src, [0, 10, 12, 14, 15, 16, 43, 44, 50, 70])
    assert ev == [(0, "idle", "a"), (10, "taken", "a"), (15, "idle", "a"), (40, "taken", "a"),
                  (45, "idle", "a"), (60, "taken", "a")]


def test_cycling_replays_the_window_so_a_long_run_keeps_getting_nodes():
    src = TraceReplay(fragments=frags([("a", 0, 30, False), ("b", 10, 60, False)]), cycle_s=60,
                      min_gap_s=5)
    ev = drain(src, [0, 10, 30, 60, 70, 90, 125])
    # b is open at the window end, so it simply stays idle across the cycle boundary
    assert ev == [(0, "idle", "a"), (10, "idle", "b"), (30, "taken", "a"), (60, "idle", "a"),
                  (90, "taken", "a"), (120, "idle", "a")]
    src.close()
    assert src.poll(1000) == []


def test_pick_slice_is_deterministic_and_starts_with_idle_nodes():
    trace = load_trace("summit").window(0, 200_000)
    a = pick_slice(trace, nodes=3, window_s=1800, speed=30, seed=4, candidates=40)
    b = pick_slice(trace, nodes=3, window_s=1800, speed=30, seed=4, candidates=40)
    assert a.nodes == b.nodes and a.start_s == b.start_s and len(a.nodes) == 3
    c = compress(a, speed=30)
    assert (c["start_s"] <= 0).sum() >= 1 and c["end_s"].max() <= 60 + 1e-6


def test_pick_slice_explains_an_impossible_request():
    tr = trace_of([("a", 0, 10, False)])
    with pytest.raises(SpecError, match="fewer nodes"):
        pick_slice(tr, nodes=5, window_s=100, speed=1, candidates=5)


def test_recorder_node_seconds_and_report_from_synthetic_samples(tmp_path):
    from malleparsl.workflows.report_html import throughput_series, write_report
    from malleparsl.workflows.results import TrialRow, TrialsTable
    from malleparsl.workflows.runner import TrialEvent
    from malleparsl.workflows.timeline import Recorder, Sample

    rec = Recorder()
    ab = frozenset({"a", "b"})
    rec.samples = [
        Sample(0.0, ab, ab, {"s-t0-r0": ("a",)}, {"s-t0-r0": 0.0}, {"s-t0-r0": 100.0}),
        Sample(1.0, ab, ab, {"s-t0-r0": ("a", "b")}, {"s-t0-r0": 100.0}, {"s-t0-r0": 180.0}),
        Sample(3.0, ab, ab, {}, {}, {}),
    ]
    assert rec.node_seconds() == (pytest.approx(1.0), pytest.approx(1 + 4))
    t, rate, bound = throughput_series(rec.samples)
    assert rate.tolist() == [100.0, 0.0] and bound.tolist() == [200.0, 200.0]
    table = TrialsTable([TrialRow(stage="s", trial_id="t0", job_id="s-t0-r0",
                                  metrics={"accuracy": 0.97}, status="stopped")])
    events = [TrialEvent(0.0, "submitted", "s", "t0", 0, "s-t0-r0")]
    paths = write_report(tmp_path, samples=rec.samples, table=table, events=events,
                         summary={"trials": 1, "best_accuracy": 0.97})
    for name in ("html", "summary", "trials", "best", "nodes_timeline", "trial_sizes",
                 "throughput", "accuracies"):
        assert paths[name].stat().st_size > 0, name
    assert json.loads(paths["summary"].read_text())["best_accuracy"] == 0.97
