"""Trace replay for the demo: compression, consistent per-node events, cycling, slice choice;
and the recorder's node-seconds and the report drawn from samples."""

import json

import pandas as pd
import pytest

from malleparsl.errors import SpecError
from malleparsl.traces import IdleTrace, load_trace
from malleparsl.workflows.replay import compress, demo_source, pick_slice


def frags(rows):
    return pd.DataFrame(rows, columns=["node", "start_s", "end_s", "known_end"])


def trace_of(rows, t0=0.0, t1=1000.0):
    f = frags(rows)
    return IdleTrace(f, tuple(sorted(set(f["node"]))), t0, t1, "t")


def test_compress_scales_time_drops_short_fragments_and_closes_short_gaps():
    tr = trace_of([("a", 0, 300, False), ("a", 330, 900, False), ("b", 100, 150, False)])
    c = compress(tr, speed=10, min_fragment_s=10, min_gap_s=5)
    assert c.values.tolist() == [["a", 0.0, 90.0, False]]  # a's 3 s gap closed, b too short


def test_demo_source_replays_the_compressed_slice_consistently():
    """Through the simulator's TraceNodeSource: per node, idle and taken alternate, a node is
    back no sooner than the minimum gap, and nodes open at the window's end stay."""
    trace = load_trace("summit").window(0, 300_000)
    sl = pick_slice(trace, nodes=4, window_s=3000, speed=30, seed=1, candidates=40)
    src = demo_source(sl, speed=30, min_gap_s=15)
    events = []
    for t in range(0, 200, 1):
        events += src.poll(1000.0 + t)
    assert events and {e.kind for e in events} <= {"idle", "taken"}
    state, last_taken = {}, {}
    for e in sorted(events, key=lambda e: (e.time_s, e.kind != "taken")):
        if e.kind == "idle":
            assert not state.get(e.node), f"{e.node} idle twice"
            assert e.time_s - last_taken.get(e.node, -1e9) >= 15 - 1e-6
        else:
            assert state.get(e.node), f"{e.node} taken while not idle"
            last_taken[e.node] = e.time_s
        state[e.node] = e.kind == "idle"
    assert any(state.values()), "a node must stay idle after the window"
    assert sum(1 for e in events if e.time_s == 1000.0 and e.kind == "idle") >= 2


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
    assert rec.node_seconds() == (pytest.approx(2 + 4), pytest.approx(1 + 4))  # offered, used
    t, rate, bound = throughput_series(rec.samples)
    assert rate.tolist() == [100.0, 0.0] and bound.tolist() == [200.0, 200.0]
    t, rate, bound = throughput_series(rec.samples, bin_s=10)  # one bin: 100 samples in 3 s
    assert rate.tolist() == pytest.approx([100 / 3]) and bound.tolist() == [200.0]
    table = TrialsTable([TrialRow(stage="s", trial_id="t0", job_id="s-t0-r0",
                                  metrics={"accuracy": 0.97}, status="stopped")])
    events = [TrialEvent(0.0, "submitted", "s", "t0", 0, "s-t0-r0")]
    paths = write_report(tmp_path, samples=rec.samples, table=table, events=events,
                         summary={"trials": 1, "best_accuracy": 0.97})
    for name in ("html", "summary", "trials", "best", "nodes_timeline", "trial_sizes",
                 "throughput", "accuracies"):
        assert paths[name].stat().st_size > 0, name
    assert json.loads(paths["summary"].read_text())["best_accuracy"] == 0.97


def test_recorder_counts_a_node_for_the_stopping_job_still_on_it():
    """A job told to stop keeps its workers until its ranks return; the job launched onto the
    same node meanwhile waits, so the node is not counted twice."""
    from types import SimpleNamespace as NS

    from malleparsl.workflows.timeline import Recorder

    snap = NS(nodes=frozenset({"a", "b"}), jobs={
        "new": NS(nodes=("a", "b"), state="running", samples=None, samples_per_s=None),
        "old": NS(nodes=("a",), state="stopping", samples=None, samples_per_s=None)})
    ex = NS(ready_nodes=lambda: {"a", "b"}, control=object(), snapshot=lambda: snap)
    s = Recorder(executor=ex).sample()
    assert s.running == {"old": ("a",), "new": ("b",)} and s.used == {"a", "b"}


@pytest.mark.parametrize("quick", [True, False])
def test_demo_slice_has_nodes_joining_or_leaving_while_trials_train(quick):
    """The demo's window once had its quick nodes idle throughout (the only departures in its
    last seconds): nothing for a running job to grow into or shrink from. Now nodes join or
    leave after the pilots are up and well before the window ends."""
    from malleparsl.workflows.demo import PILOT_START_S, DemoSettings, make_source

    s = DemoSettings(quick=quick)
    src, info = make_source(s)
    f = src.trace.fragments
    end = 0.8 * s.expected_wall_s
    joins = f["start_s"][(f["start_s"] > PILOT_START_S) & (f["start_s"] < end)]
    leaves = f["end_s"][(f["end_s"] > PILOT_START_S) & (f["end_s"] < end)]
    assert len(joins) + len(leaves) >= 2, f
    assert len(leaves) >= 1, f  # a shrink needs a node taken back mid-run
    assert info["mean_idle_nodes"] >= 0.5 * s.nodes
