"""BFTrainer-compatible accounting: the original replayer's step log, reproduced row by row."""

import math
from pathlib import Path

import pandas as pd
import pytest

from malleparsl.allocator import ClusterSnapshot, JobView, make_policy
from malleparsl.data import load_jobset
from malleparsl.errors import SpecError
from malleparsl.model import JobSpec, ScalingCurve
from malleparsl.sim.bftrainer import STEP_COLUMNS, node_events, simulate_bftrainer, steps_match
from malleparsl.sim.engine import SimOptions, simulate
from malleparsl.sim.result import JOB_COLUMNS
from malleparsl.traces import load_trace, trace_from_fragments

REF = Path("bftrainer-reference") / "shufflenet10_n64_equal_share_steps.csv"
ORIGIN = pd.Timestamp("2021-02-10 00:08:52")  # the Summit trace's time origin


def test_reproduces_the_original_replayer_step_log_row_by_row(reference_data):
    jobs = load_jobset("shufflenet-10")
    full = load_trace("summit", nodes="0:64")
    tr = full.window(jobs[0].submit_s, full.end_s)
    res = simulate(
        tr,
        jobs,
        policy="bftrainer-heuristic",
        options=SimOptions(semantics="bftrainer", max_active=10),
        history=full,
    )
    ref = pd.read_csv(reference_data / REF)
    assert list(ref.columns) == STEP_COLUMNS
    ref["evtTime"] = (pd.to_datetime(ref["evtTime"]) - ORIGIN).dt.total_seconds()
    assert len(res.steps) == len(ref) == 562
    assert steps_match(res.steps, ref, rtol=1e-6) == []
    # the README's totals: every job completes, the last event 150,190 s after the start
    assert res.samples == pytest.approx(10 * 1.3e8, rel=1e-9)
    assert res.jobs_done == 10
    assert res.steps["evtTime"].iloc[-1] - tr.start_s == 150_190


def test_step_log_check_reports_a_changed_cell(reference_data):
    ref = pd.read_csv(reference_data / REF).head(3)
    other = ref.copy()
    other.loc[1, "PreCost"] *= 1 + 1e-5
    assert steps_match(other, ref) == [
        f"row 2 PreCost: {other.loc[1, 'PreCost']} != {ref.loc[1, 'PreCost']}"
    ]


LIN = ScalingCurve((1, 2, 4), (10.0, 20.0, 40.0))


def spec(jid, *, submit=0.0, total=math.inf, lo=1, hi=4):
    return JobSpec(
        jid,
        min_nodes=lo,
        max_nodes=hi,
        rescale_up_s=5.0,
        rescale_down_s=2.0,
        total_samples=total,
        submit_s=submit,
        curve=LIN,
    )


def test_hand_computed_accounting():
    # n1 idle 0-100, n2 idle 50-100: events at 50 (join) and the tail to 100
    tr = trace_from_fragments([("n1", 0, 100), ("n2", 50, 100)])
    r = simulate_bftrainer(tr, [spec("a")], policy="bftrainer-heuristic")
    # [0, 50): 1 node at 10/s minus the start-up cost 5 s x 10/s; grow at 50 costs 5 x 10
    # (old rate), charged in the interval after it; [50, 100): 2 nodes at 20/s
    assert r.steps["Thr"].tolist() == [500 - 50]
    assert r.steps["ReScost"].tolist() == [50]
    assert r.samples == pytest.approx(450 + 50 * 20 - 50)


def test_completion_frees_nodes_only_at_the_next_event_and_clips_progress():
    tr = trace_from_fragments([("n1", 0, 1000), ("n2", 100, 1000), ("n3", 400, 1000)])
    jobs = [spec("a", total=600.0), spec("b", submit=10.0, total=1e9)]
    r = simulate_bftrainer(tr, jobs, policy="bftrainer-heuristic")
    # a: 1 node, 0-100: 1000 - 50 start-up = 950 >= 600: done, clipped, detected at t=100;
    # b, submitted at 10, waits for the event at 100
    first = r.steps.iloc[0]
    assert first["Thr"] == pytest.approx(600)
    assert r.jobs.set_index("job").loc["a", "finish_s"] == 100
    assert r.jobs.set_index("job").loc["b", "start_s"] == 100


def test_preemption_costs_once_per_job():
    tr = trace_from_fragments([("n1", 0, 100), ("n2", 0, 60), ("n3", 0, 60), ("n4", 0, 100)])
    r = simulate_bftrainer(tr, [spec("a")], policy="bftrainer-heuristic")
    row = r.steps.iloc[0]
    assert (row["Nleft"], row["Npre"]) == (2, 1)
    assert row["PreCost"] == pytest.approx(2.0 * 40.0)  # rescale_down_s x rate before (4 nodes)
    # the lost nodes were in use until they went: 4 x 60 + 2 x 40 node-seconds
    assert r.used_node_s == pytest.approx(320.0)


def test_node_events_drop_non_changes():
    tr = trace_from_fragments([("n1", 0, 50), ("n1", 50, 80), ("n2", 20, 90)])
    tr = tr.window(0, 100)
    initial, ev = node_events(tr)
    assert initial == ["n1"]
    assert [(t, left, joined) for t, left, joined in ev] == [
        (20.0, [], ["n2"]),
        (80.0, ["n1"], []),
        (90.0, ["n2"], []),
    ]


def test_heuristic_share_must_exceed_the_minimum():
    jobs = [JobView(spec(f"j{i}"), LIN) for i in range(3)]
    snap = ClusterSnapshot(now_s=0, nodes=("a", "b", "c", "d", "e"))
    # q = 5 // 3 = 1 is not > min 1: nothing from the share; leftovers first come first served
    assert make_policy("bftrainer-heuristic").allocate(snap, jobs).sizes() == {"j0": 4, "j1": 1}
    assert make_policy("equal-share").allocate(snap, jobs).sizes() == {"j0": 3, "j1": 1, "j2": 1}


def test_unknown_semantics_is_refused():
    with pytest.raises(SpecError, match="semantics"):
        SimOptions(semantics="bftrainerx")


def test_job_table_has_the_shared_columns_and_progress():
    # progress = sum of samples / total_samples over jobs: needs total_samples in the job table
    tr = trace_from_fragments([("n1", 0, 1000), ("n2", 100, 1000)])
    jobs = [spec("a", total=600.0), spec("b", submit=10.0, total=1e9)]
    r = simulate_bftrainer(tr, jobs, policy="bftrainer-heuristic")
    d = simulate(tr, jobs, policy="bftrainer-heuristic")
    assert list(r.jobs.columns) == list(d.jobs.columns) == JOB_COLUMNS
    done = r.jobs.set_index("job")["samples"]
    assert done["a"] == 600.0 and 0 < done["b"] < 1e9
    assert r.progress == pytest.approx(1.0 + done["b"] / 1e9)
    assert r.summary()["progress"] > 1.0
