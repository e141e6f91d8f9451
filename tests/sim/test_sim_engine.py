"""The simulator's semantics on hand-computed cases, conservation, and every policy running."""

import math

import numpy as np
import pytest

from malleparsl.allocator.base import JobView
from malleparsl.controller import CurveAdvisor
from malleparsl.errors import SpecError, UnknownNameError
from malleparsl.model import JobSpec, ScalingCurve
from malleparsl.sim.engine import SimOptions, simulate
from malleparsl.sim.result import compare
from malleparsl.sim.setups import make_setup, register_setup, setup_names
from malleparsl.sim.workloads import poisson_jobs, synthetic_fragments
from malleparsl.traces import trace_from_fragments

LINEAR = ScalingCurve((1, 2), (10.0, 20.0), name="linear")


def job(jid, *, total=math.inf, submit=0.0, lo=1, hi=2, up=10.0, down=5.0, curve=LINEAR):
    return JobSpec(jid, min_nodes=lo, max_nodes=hi, rescale_up_s=up, rescale_down_s=down,
                   total_samples=total, submit_s=submit, curve=curve)


TWO = trace_from_fragments([("n1", 0, 1000), ("n2", 0, 500)])


def test_static_pays_grow_on_start_and_shrink_on_preemption():
    r = simulate(TWO, [job("a")], policy="static")
    # 2 nodes from t=10 (after the 10 s grow pause) to 500, then 1 node from 505 to 1000
    assert r.samples == pytest.approx(20 * 490 + 10 * 495)
    assert (r.rescales, r.preemptions) == (2, 1)
    assert r.pause_s == pytest.approx(15) and r.preempt_pause_s == pytest.approx(5)
    assert r.preempt_cost_samples == pytest.approx(5 * 10)
    assert r.used_node_s == pytest.approx(r.idle_node_s) == pytest.approx(1500)


def test_upper_bound_pays_nothing():
    r = simulate(TWO, [job("a")], policy="upper-bound")
    assert r.samples == pytest.approx(20 * 500 + 10 * 500)
    assert r.pause_s == 0


def test_job_finishes_at_its_total_and_frees_its_nodes():
    r = simulate(TWO, [job("a", total=1000), job("b", submit=0)], policy="static",
                 options=SimOptions(max_active=1))
    # a: 2 nodes from 10 s at 20/s -> done at 60; b starts at 60, pays 10 s, then 2 nodes
    assert r.jobs_done == 1
    jobs = r.jobs.set_index("job")
    assert jobs.loc["a", "finish_s"] == pytest.approx(60)
    assert jobs.loc["b", "start_s"] == pytest.approx(60)
    assert jobs.loc["b", "samples"] == pytest.approx(20 * (500 - 70) + 10 * (1000 - 505))
    assert r.samples == pytest.approx(1000 + jobs.loc["b", "samples"])


def test_completion_times_when_every_job_finishes():
    r = simulate(TWO, [job("a", total=1000), job("b", total=2000)], policy="static",
                 options=SimOptions(max_active=1))
    # a: done at 60 (see above); b starts at 60, pays 10 s, 2 nodes at 20/s -> done at 170
    row = r.summary()
    assert row["mean_jct_h"] == pytest.approx((60 + 170) / 2 / 3600)
    assert row["last_finish_h"] == pytest.approx(170 / 3600)
    open_ended = simulate(TWO, [job("a", total=1000), job("b")], policy="static",
                          options=SimOptions(max_active=1)).summary()
    assert open_ended["last_finish_h"] is None  # b never finishes: no makespan
    assert open_ended["mean_jct_h"] == pytest.approx(60 / 3600)


def test_concurrency_cap_admits_in_submission_order():
    jobs = [job(f"j{i}", submit=float(i)) for i in range(4)]
    trace = trace_from_fragments([(f"n{i}", 0, 100) for i in range(8)])
    r = simulate(trace, jobs, policy="static", options=SimOptions(max_active=2))
    started = r.jobs.dropna(subset=["start_s"])["job"].tolist()
    assert started == ["j0", "j1"]


def test_jobs_before_the_window_arrive_at_its_start_and_after_it_never():
    trace = trace_from_fragments([("n1", 0, 100)], start_s=0, end_s=100).window(50, 100)
    r = simulate(trace, [job("early", submit=0), job("late", submit=500)], policy="upper-bound")
    assert r.jobs_submitted == 1
    assert r.samples == pytest.approx(10 * 50)


@pytest.fixture(scope="module")
def workload():
    frags = synthetic_fragments(n_nodes=16, duration_s=4 * 3600, seed=1)
    trace = trace_from_fragments(frags, start_s=0, end_s=4 * 3600)
    jobs = poisson_jobs(n_jobs=8, mean_interarrival_s=900, seed=2, max_nodes=8,
                        hours_at_one_node=(0.5, 2))
    return trace, jobs


def _standalone(name):
    try:
        make_setup(name)
    except SpecError:  # a building block that needs options (e.g. the JPA's "jpa" wrapper)
        return False
    return True


PUBLIC = [n for n in setup_names() if not n.startswith("_") and _standalone(n)]


@pytest.mark.parametrize("name", PUBLIC)
def test_every_policy_runs_and_conserves_node_seconds(workload, name):
    trace, jobs = workload
    r = simulate(trace, jobs, policy=name)
    assert r.used_node_s <= r.idle_node_s * (1 + 1e-9)
    assert r.samples >= 0 and r.replans > 0
    assert np.all(r.events["used_nodes"] <= r.events["idle_nodes"])
    done = r.jobs.dropna(subset=["finish_s"])
    assert (done["samples"] >= 0).all()
    assert r.jobs_done == len(done)


def test_no_policy_beats_the_bound_when_curves_are_concave():
    frags = synthetic_fragments(n_nodes=12, duration_s=3 * 3600, seed=4)
    trace = trace_from_fragments(frags, start_s=0, end_s=3 * 3600)
    jobs = poisson_jobs(n_jobs=8, mean_interarrival_s=600, seed=5, max_nodes=8,
                        shapes=("amdahl", "saturating"), hours_at_one_node=(1e6, 1e6))
    results = [simulate(trace, jobs, policy=n) for n in PUBLIC]
    rows = compare(results)
    bound = next(r for r in rows if r["policy"] == "upper-bound")
    assert bound["pct_of_upper_bound"] == pytest.approx(100)
    for row in rows:
        assert row["pct_of_upper_bound"] <= 100 + 1e-6, row["policy"]


def test_static_never_grows_a_running_job():
    trace = trace_from_fragments([("n1", 0, 100), ("n2", 50, 100)])
    r = simulate(trace, [job("a")], policy="static")
    assert r.sizes["nodes"].tolist() == [1]
    assert r.samples == pytest.approx(10 * 90)


class _Recorder(CurveAdvisor):
    """A learning advisor stand-in: plans with a fixed guess, records what it is told."""

    def __init__(self):
        self.rates, self.pauses, self.registered = [], [], []

    def register(self, spec, now_s):
        self.registered.append(spec)

    def observe(self, job_id, n_nodes, samples_per_s, now_s):
        self.rates.append((job_id, n_nodes, samples_per_s))

    def observe_rescale(self, job_id, kind, pause_s):
        self.pauses.append((job_id, kind, pause_s))

    def views(self, snapshot, jobs, allocation):
        guess = ScalingCurve((1,), (1.0,))
        return [JobView(js.spec, guess, allocation.nodes_of(js.spec.job_id)) for js in jobs]


def test_hidden_curves_feed_noisy_rates_and_real_pauses_to_the_advisor():
    rec = _Recorder()
    register_setup("_test-recorder", lambda: (make_setup("upper-bound")[0], rec, True))
    trace = trace_from_fragments(
        [("n1", 0, 4000)] + [("n2", t, t + 400) for t in range(0, 4000, 500)]
    )
    r = simulate(trace, [job("a", hi=1, up=7.0)], policy="_test-recorder",
                 options=SimOptions(noise=0.05, warmup_s=30, observe_every_s=100, seed=3))
    assert all(s.curve is None for s in rec.registered)  # the advisor never sees the curve
    assert len(rec.rates) >= 5
    rel = np.array([v / 10.0 - 1 for _, _, v in rec.rates])
    assert np.all(np.abs(rel) < 0.25) and rel.std() > 0
    assert r.pause_s == 0  # upper-bound pays nothing, so no pause is reported
    with pytest.raises(UnknownNameError, match="static"):
        make_setup("no-such-policy")


def _recording(record):
    """The upper-bound policy, calling ``record(snapshot)`` at each plan: what a policy sees."""
    base = type(make_setup("upper-bound")[0])

    class Recording(base):
        def allocate(self, snapshot, jobs):
            record(snapshot)
            return super().allocate(snapshot, jobs)

    return Recording()


@pytest.mark.parametrize("events", [True, False])
def test_a_due_reading_is_an_event_even_when_the_trace_is_quiet(events):
    """The live loop replans on a rate reading; a replay with one fragment and no other event
    must not leave a probe waiting for the trace (readings at warm-up, then every 100 s)."""
    rec, times, plans = _Recorder(), [], []
    rec.observe = lambda job_id, n_nodes, samples_per_s, now_s: times.append(now_s)
    register_setup("_test-quiet",
                   lambda: (_recording(lambda snap: plans.append(snap.now_s)), rec, True))
    trace = trace_from_fragments([("n1", 0, 1000)])
    simulate(trace, [job("a", hi=1)], policy="_test-quiet",
             options=SimOptions(warmup_s=30, observe_every_s=100, reading_events=events))
    if events:  # a reading at warm-up, then every 100 s, and a replan on each
        assert times == pytest.approx([30.0 + 100 * k for k in range(10)])
        assert plans == pytest.approx([0.0, *times])
    else:  # the replay of sessions <= 23: nothing happens between 0 and the window's end
        assert times == [] and plans == [0.0]


@pytest.mark.parametrize("gap", [0.0, 5.0])
def test_a_reading_replans_no_sooner_than_observe_replan_s_after_the_last_replan(gap):
    """As in the live loop (``ControlOptions.observe_replan_s``): b's reading, due 2 s after
    a's, waits until ``gap`` has passed since the replan a's reading made."""
    rec, times, plans = _Recorder(), [], []
    rec.observe = lambda job_id, n_nodes, samples_per_s, now_s: times.append((job_id, now_s))
    register_setup("_test-gap",
                   lambda: (_recording(lambda snap: plans.append(snap.now_s)), rec, True))
    trace = trace_from_fragments([("n1", 0, 60), ("n2", 0, 60)])
    simulate(trace, [job("a", hi=1), job("b", hi=1, submit=2.0)], policy="_test-gap",
             options=SimOptions(warmup_s=30, observe_every_s=100, observe_replan_s=gap))
    b_at = 32.0 if gap == 0 else 35.0
    assert times == pytest.approx([("a", 30.0), ("b", b_at)])
    assert plans == pytest.approx([0.0, 2.0, 30.0, b_at])


def test_readings_that_could_never_stop_are_refused():
    with pytest.raises(SpecError, match="observe_every_s > 0 or observe_replan_s > 0"):
        SimOptions(observe_every_s=0, observe_replan_s=0)
    SimOptions(observe_every_s=0, observe_replan_s=0, reading_events=False)  # nothing to loop


def test_known_ends_reach_the_policy():
    seen = []
    register_setup("_test-probe",
                   lambda: (_recording(lambda snap: seen.append(dict(snap.node_end_s))), None, False))
    trace = trace_from_fragments([("n1", 0, 300), ("n2", 10, 200)])
    simulate(trace, [job("a")], policy="_test-probe", options=SimOptions(reveal_ends=1.0))
    assert seen[0] == {"n1": 300}
    assert seen[1] == {"n1": 300, "n2": 200}
    seen.clear()
    simulate(trace, [job("a")], policy="_test-probe", options=SimOptions(reveal_ends=0.0))
    # unknown ends are estimated (the prior before any fragment has ended), never missing
    assert set(seen[1]) == {"n1", "n2"} and all(e > 10 for e in seen[1].values())


def test_history_before_the_window_informs_the_first_estimates():
    seen = []
    base = make_setup("upper-bound")[0]

    class Probe(type(base)):
        def allocate(self, snapshot, jobs):
            seen.append(dict(snapshot.node_end_s))
            return super().allocate(snapshot, jobs)

    register_setup("_test-probe2", lambda: (Probe(), None, False))
    past = [(f"h{i}", i * 10.0, i * 10.0 + 2000.0) for i in range(40)]
    full = trace_from_fragments(past + [("n1", 5000, 6000)], start_s=0, end_s=6000)
    window = full.window(5000, 6000)
    simulate(window, [job("a", submit=5000)], policy="_test-probe2")
    assert seen[0]["n1"] == pytest.approx(5000 + 600)  # no history: the prior
    seen.clear()
    simulate(window, [job("a", submit=5000)], policy="_test-probe2", history=full)
    assert seen[0]["n1"] == pytest.approx(5000 + 2000, rel=0.03)  # E[L] of the past fragments


def test_event_log_integrates_to_the_samples_trained(workload):
    trace, jobs = workload
    r = simulate(trace, jobs, policy="greedy")
    t = np.r_[r.events["time_s"].to_numpy(), r.end_s]
    area = float((np.diff(t) * r.events["samples_per_s"].to_numpy()).sum())
    assert area == pytest.approx(r.samples, rel=1e-9)


def test_jobs_queued_behind_a_full_cap_do_not_trigger_replans():
    trace = trace_from_fragments([("n1", 0, 1000)])
    jobs = [job("a"), job("b", submit=100), job("c", submit=200)]
    capped = simulate(trace, jobs, policy="greedy", options=SimOptions(max_active=1))
    assert capped.replans == 1
    free = simulate(trace, jobs, policy="greedy", options=SimOptions(max_active=None))
    assert free.replans == 3
