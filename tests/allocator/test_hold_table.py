"""The ``hold`` policy's table path (one value table, one programme) answers exactly as the
per-job reference (``hold_oracle``): the same values bit for bit, the same counts ties
included, and so the same simulation, job by job."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from hold_oracle import best_counts, hold_values, oracle_counts, oracle_table

from malleparsl.allocator import hold
from malleparsl.allocator.base import ClusterSnapshot, JobView
from malleparsl.allocator.costs import OLD_RATE, PAUSE
from malleparsl.allocator.hold import HoldPolicy
from malleparsl.allocator.objective import allowed_sizes
from malleparsl.allocator.value_table import best_counts_table, hold_value_table
from malleparsl.model import JobSpec, ScalingCurve

CURVES = [
    ScalingCurve((1, 2, 4, 8), (10.0, 20.0, 40.0, 80.0)),
    ScalingCurve((1, 2, 4, 8), (10.0, 15.0, 18.0, 19.0)),
    ScalingCurve((1, 2, 4), (7.0, 13.0, 21.0)),
    ScalingCurve((2, 3, 6), (5.0, 5.0, 9.0)),  # flat stretch: equal rates, zero growth value
]


def _random_jobs(rng: np.random.Generator, n_nodes: int, n_jobs: int) -> list[JobView]:
    nodes = [f"n{i}" for i in range(n_nodes)]
    free = list(nodes)
    rng.shuffle(free)
    jobs = []
    for i in range(n_jobs):
        lo = int(rng.integers(1, 3))
        hi = int(rng.integers(lo, 10))
        hold = int(rng.integers(0, 4)) if rng.random() < 0.5 else 0
        cur = frozenset(free[:hold])
        free = free[hold:]
        total = math.inf if rng.random() < 0.2 else float(rng.choice([50.0, 500.0, 5e4]))
        spec = JobSpec(
            f"j{i}",
            min_nodes=lo,
            max_nodes=hi,
            rescale_up_s=float(rng.choice([0.0, 20.0])),
            rescale_down_s=10.0,
            total_samples=total,
            weight=float(rng.choice([1.0, 0.5])),
            submit_s=float(i),
            curve=CURVES[int(rng.integers(len(CURVES)))],
        )
        # a narrowed view may leave a job holding more than its maximum or less than its minimum
        view_hi = int(rng.integers(lo, hi + 1)) if rng.random() < 0.2 else None
        rem = None if math.isinf(total) else float(total * rng.random())
        # plan holes: some jobs run only at a few sizes (a held count may be one they cannot)
        sizes = None
        if rng.random() < 0.3:
            sizes = tuple(int(k) for k in np.flatnonzero(rng.random(10) < 0.5) + 1) or (2,)
        jobs.append(JobView(spec, spec.curve, cur, max_nodes=view_hi, remaining_samples=rem,
                            sizes=sizes))
    return jobs


@pytest.mark.parametrize("costs", [PAUSE, OLD_RATE])
def test_value_table_equals_per_job_values_bit_for_bit(costs):
    rng = np.random.default_rng(7)
    for _ in range(200):
        n = int(rng.integers(1, 14))
        jobs = _random_jobs(rng, n, int(rng.integers(1, 7)))
        free_h = float(rng.choice([5.0, 100.0, 600.0, 1e5, math.inf]))  # inf: node_end_s=inf
        own = [float(rng.choice([3.0, 300.0, math.inf])) if j.current else free_h for j in jobs]
        prio = rng.random(len(jobs)) * 2
        table = hold_value_table(jobs, n, free_h, own, prio, costs)
        for row, j, o, w in zip(table, jobs, own, prio):
            sizes = allowed_sizes(j, n)
            ref = w * hold_values(j, sizes, free_h, o, costs)
            assert np.array_equal(row[sizes], ref)  # equal, not close
            assert np.all(np.isfinite(ref))  # no 0 * inf, no +-inf for the programme to add
            off = np.setdiff1d(np.arange(len(row)), sizes)
            assert np.all(row[off] == -np.inf)


@pytest.mark.parametrize("integer_values", [False, True])
def test_table_programme_returns_the_reference_counts_ties_included(integer_values):
    rng = np.random.default_rng(11)
    for _ in range(300):
        n = int(rng.integers(1, 16))
        jobs = _random_jobs(rng, n, int(rng.integers(1, 8)))
        s = min(max(j.hi for j in jobs), n)
        table = np.full((len(jobs), s + 1), -np.inf)
        values = []
        for row, j in zip(table, jobs):
            sizes = allowed_sizes(j, n)
            if integer_values:  # small integers: many exact ties between options and jobs
                v = rng.integers(-3, 4, size=sizes.size).astype(float)
            else:
                v = rng.normal(size=sizes.size)
            if not j.current:
                v[0] = 0.0  # a waiting job keeps 0 nodes for nothing
                if rng.random() < 0.3:
                    v[1:] = -np.abs(v[1:])  # ... and may gain nothing by starting
            row[sizes] = v
            values.append((sizes, v))
        assert best_counts_table(n, jobs, table) == best_counts(n, jobs, values)


def _use_oracle(monkeypatch, oracle: bool) -> None:
    """Run the policy on the per-job reference (``oracle``) or on the shipped table path."""
    if oracle:
        monkeypatch.setattr(hold, "hold_value_table", oracle_table)
        monkeypatch.setattr(hold, "best_counts_table", oracle_counts)
    else:
        monkeypatch.undo()


def test_uncapped_simulation_is_identical_on_both_paths(monkeypatch):
    """A small uncapped run with a queue (80 jobs, 512 nodes, 4 h): every job's start, finish
    and samples, and every size change, the same on the table path and the reference."""
    from malleparsl.data import load_jobset
    from malleparsl.sim.engine import SimOptions, simulate
    from malleparsl.traces import load_trace

    full = load_trace("summit", nodes="0:512")
    specs = load_jobset("imagenet", limit=80)
    t0 = min(j.submit_s for j in specs)
    tr = full.window(t0, t0 + 4 * 3600)
    for policy in ("hold-jct", "hold"):
        out = {}
        for fast in (True, False):
            _use_oracle(monkeypatch, not fast)
            out[fast] = simulate(
                tr, specs, policy=policy, options=SimOptions(max_active=None), history=full
            )
        a, b = out[True], out[False]
        assert a.jobs_done > 5 and len(a.sizes) > 50  # jobs queued, started, resized, finished
        pd.testing.assert_frame_equal(a.jobs, b.jobs, check_exact=True)
        pd.testing.assert_frame_equal(a.sizes, b.sizes, check_exact=True)
        assert a.samples == b.samples


def _both_paths(monkeypatch, snap, jobs, **options):
    out = []
    for fast in (True, False):
        _use_oracle(monkeypatch, not fast)
        out.append(HoldPolicy(**options).allocate(snap, jobs).sizes())
    monkeypatch.undo()
    return out


def test_flat_curve_under_infinite_horizons_keeps_the_running_job(monkeypatch):
    """Every end inf, total inf, a flat curve: growing gains 0 (not 0 * inf = NaN), shrinking
    to 0 loses the job's whole rate for ever, so the job keeps its node on both paths."""
    flat = ScalingCurve((1, 2, 3), (5.0, 5.0, 5.0))
    spec = JobSpec("a", max_nodes=3, rescale_up_s=10.0, rescale_down_s=10.0, curve=flat)
    nodes = ("n1", "n2", "n3")
    snap = ClusterSnapshot(now_s=0, nodes=nodes, node_end_s=dict.fromkeys(nodes, math.inf))
    jobs = [JobView(spec, flat, frozenset({"n1"}))]
    assert _both_paths(monkeypatch, snap, jobs) == [{"a": 1}, {"a": 1}]


@pytest.mark.parametrize("objective", ["throughput", "jct"])
def test_policy_paths_agree_with_infinite_horizons_and_totals(monkeypatch, objective):
    rng = np.random.default_rng(23)
    for _ in range(150):
        n = int(rng.integers(1, 14))
        jobs = _random_jobs(rng, n, int(rng.integers(1, 7)))
        nodes = tuple(f"n{i}" for i in range(n))
        ends = {x: float(rng.choice([30.0, 900.0, math.inf])) for x in nodes if rng.random() < 0.8}
        snap = ClusterSnapshot(now_s=0, nodes=nodes, node_end_s=ends)
        fast, ref = _both_paths(monkeypatch, snap, jobs, objective=objective)
        assert fast == ref
