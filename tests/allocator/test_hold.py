"""The ``hold`` policy: value over holding time, exact counts, admission, objectives."""

import itertools
import math

import numpy as np
import pytest
from hold_oracle import best_counts

from malleparsl.allocator import ClusterSnapshot, JobView, make_policy
from malleparsl.allocator.priority import priority_weights
from malleparsl.allocator.value_table import hold_value_table
from malleparsl.controller import Controller
from malleparsl.errors import SpecError
from malleparsl.model import JobSpec, ScalingCurve

LIN = ScalingCurve((1, 2, 4, 8), (10.0, 20.0, 40.0, 80.0))
SAT = ScalingCurve((1, 2, 4, 8), (10.0, 15.0, 18.0, 19.0))


def view(jid, curve=LIN, *, current=(), hi=8, lo=1, total=math.inf, remaining=None, submit=0.0):
    spec = JobSpec(
        jid,
        min_nodes=lo,
        max_nodes=hi,
        rescale_up_s=20.0,
        rescale_down_s=10.0,
        total_samples=total,
        submit_s=submit,
        curve=curve,
    )
    return JobView(spec, curve, frozenset(current), remaining_samples=remaining)


def snap(n, ends=None, now=0.0):
    nodes = tuple(f"n{i}" for i in range(n))
    return ClusterSnapshot(now_s=now, nodes=nodes, node_end_s=ends or {})


def test_grows_onto_long_lived_nodes_but_not_onto_short_ones():
    pol = make_policy("hold")
    j = view("a", current={"n0"})
    assert pol.allocate(snap(4), [j]).size("a") == 4  # default 600 s: 30 s gain repays 20 s
    short = {f"n{i}": 5.0 for i in range(1, 4)}  # the free nodes go in 5 s
    assert pol.allocate(snap(4, short), [j]).size("a") == 1


def test_a_job_about_to_finish_does_not_grow():
    # 50 samples left: done in 5 s at 1 node; growing (20 s pause) cannot pay
    j = view("a", current={"n0"}, total=1e6, remaining=50.0)
    assert make_policy("hold").allocate(snap(4), [j]).size("a") == 1


def test_admission_starts_as_many_jobs_as_pay_for_their_start():
    jobs = [view(f"j{i}", SAT, hi=8, submit=i) for i in range(5)]
    sizes = make_policy("hold").allocate(snap(4), jobs).sizes()
    # a saturating curve: four jobs at one node each beat one at four
    assert sorted(sizes.values()) == [1, 1, 1, 1]


def test_best_counts_is_exact_against_brute_force():
    rng = np.random.default_rng(3)
    for _ in range(30):
        n = int(rng.integers(1, 7))
        jobs = [view(f"j{i}") for i in range(3)]
        opts = []
        for _j in jobs:
            sizes = np.array(sorted(set([0, *rng.integers(1, 6, size=3).tolist()])))
            opts.append((sizes, rng.normal(size=sizes.size)))
        got = best_counts(n, jobs, opts)
        best = max(
            sum(v[list(s).index(k)] for (s, v), k in zip(opts, ks))
            for ks in itertools.product(*[s for s, _ in opts])
            if sum(ks) <= n
        )
        mine = sum(v[list(s).index(got[j.job_id])] for (s, v), j in zip(opts, jobs))
        assert mine == pytest.approx(best)


def test_hold_values_pay_starts_and_preemption_exposure():
    j = view("a", total=math.inf)
    (v,) = hold_value_table([j], 2, free_h=100.0, own_h=[100.0], prio=np.ones(1))
    # start at k nodes: r(k) * 100 - 20 r(k) (pause) - 10 r(k) (nodes go before the job ends)
    assert v.tolist() == pytest.approx([0.0, 700.0, 1400.0])


def test_jct_objective_gives_contended_nodes_to_the_shortest_job():
    long = view("long", SAT, total=1e7, hi=4, submit=0)
    short = view("short", SAT, total=1e4, hi=4, submit=1)
    w = priority_weights([long, short], "jct")
    assert w[1] > w[0] and w.mean() == pytest.approx(1.0)
    got = make_policy("hold-jct").allocate(snap(1), [long, short]).sizes()
    assert got == {"short": 1}
    assert make_policy("hold").allocate(snap(1), [long, short]).sizes() == {"long": 1}


def test_unpredictable_jobs_get_mlfq_levels_by_borda_count():
    a = JobView(JobSpec("a", max_nodes=4, curve=SAT), SAT, attained_samples=0.0)
    b = JobView(JobSpec("b", max_nodes=4, curve=SAT), SAT, attained_samples=1e9)
    w = priority_weights([a, b], "jct")
    assert w[0] > w[1]
    assert priority_weights([a, b], "throughput").tolist() == [1.0, 1.0]
    mix = priority_weights([a, b], "mix", 0.5)
    assert 1.0 < mix[0] < w[0]


def test_controller_passes_remaining_samples():
    c = Controller(policy=make_policy("hold"), max_active=None)
    c.add_nodes(["n0"], now_s=0)
    c.submit(JobSpec("j", max_nodes=2, total_samples=100.0, curve=LIN), now_s=0)
    c.replan(now_s=0)
    c.report_progress("j", samples_done=60.0)
    (v,) = c.advisor.views(c.snapshot(1.0), c.active_jobs, c.allocation)
    assert (v.remaining_samples, v.attained_samples) == (40.0, 60.0)


def test_bad_options_are_refused():
    with pytest.raises(SpecError, match="objective"):
        make_policy("hold", objective="fastest")
    with pytest.raises(SpecError, match="jct_weight"):
        make_policy("hold", objective="mix", jct_weight=2.0)


def test_a_stopped_job_whose_last_samples_take_less_than_its_pause_is_started():
    """50 samples left (5 s at one node, under the 20 s pause): the pause is due whenever it
    starts, so leaving it stopped only withholds the user's result (regression: never started)."""
    j = view("a", total=1e6, remaining=50.0)
    assert make_policy("hold").allocate(snap(4), [j]).size("a") >= 1
    assert make_policy("hold", objective="jct").allocate(snap(4), [j]).size("a") >= 1
