"""Bounded decisions: the exact one-pool programme, and time-limited solves that stay good.

No timings are asserted (they flake under load): the programme must reach the solver's optimum,
and a solve stopped by its time limit must return a valid allocation worth at least its warm
start (the reduction's feasible choice, a fast heuristic).
"""

import itertools
import random

import numpy as np
import pytest
from allocator_cases import instances
from hypothesis import given, settings

import malleparsl.allocator.milp as milp
from malleparsl.allocator import ClusterSnapshot, JobView, make_policy
from malleparsl.allocator.countmodel import build_options
from malleparsl.allocator.knapsack import solve_one_pool
from malleparsl.allocator.objective import allocation_objective, feasibility_problems
from malleparsl.allocator.placement import node_horizons
from malleparsl.allocator.reduction import net_use, reduce_options
from malleparsl.allocator.solvers import SolveResult
from malleparsl.model import JobSpec, ScalingCurve


def _instance(n_jobs=10, n_nodes=96, seed=3, held=6):
    rng = random.Random(seed)
    nodes = tuple(f"n{i}" for i in range(n_nodes))
    free = list(nodes)
    rng.shuffle(free)
    jobs = []
    for i in range(n_jobs):
        curve = ScalingCurve.amdahl(
            rate1=rng.uniform(50, 500), parallel_fraction=rng.uniform(0.8, 0.99), max_nodes=32
        )
        spec = JobSpec(
            f"j{i}", min_nodes=rng.randint(1, 2), max_nodes=32, rescale_up_s=rng.uniform(5, 20),
            rescale_down_s=rng.uniform(5, 15), curve=curve,
        )
        cur = {free.pop() for _ in range(rng.randint(0, held))}
        jobs.append(JobView(spec, curve, frozenset(cur)))
    return ClusterSnapshot(now_s=0, nodes=nodes), jobs


def _brute(table, n_jobs):
    rows_of = [np.flatnonzero(table.job == j) for j in range(n_jobs)]
    use = net_use(table)
    best = -np.inf
    for pick in itertools.product(*rows_of):
        idx = list(pick)
        if np.all(use[idx].sum(axis=0) <= table.free):
            best = max(best, float(table.value[idx].sum()))
    return best


@settings(max_examples=60, deadline=None)
@given(instances(max_jobs=3, max_nodes=7))
def test_one_pool_programme_equals_brute_force_over_the_options(inst):
    snap, jobs = inst
    if not jobs or not snap.nodes:
        return
    table = build_options(snap, jobs, node_horizons(snap))
    chosen = solve_one_pool(table, len(jobs))
    assert chosen is not None
    assert sorted(table.job[chosen].tolist()) == list(range(len(jobs)))
    assert np.all(net_use(table)[chosen].sum(axis=0) <= table.free)
    assert float(table.value[chosen].sum()) == pytest.approx(_brute(table, len(jobs)), rel=1e-9)


@settings(max_examples=30, deadline=None)
@given(instances(max_jobs=10, max_nodes=30))
def test_programme_and_solver_reach_the_same_optimum(inst):
    snap, jobs = inst
    a = make_policy("milp").allocate(snap, jobs)
    b = make_policy("milp", dp=False, time_limit_s=30).allocate(snap, jobs)
    assert feasibility_problems(snap, jobs, a) == []
    va, vb = allocation_objective(snap, jobs, a), allocation_objective(snap, jobs, b)
    assert va == pytest.approx(vb, rel=1e-6, abs=1e-6)


def test_programme_refuses_nested_pools():
    snap, jobs = _instance(n_jobs=4, n_nodes=20)
    ends = {n: float(5 + 10 * (i % 4)) for i, n in enumerate(snap.nodes)}
    snap = ClusterSnapshot(now_s=0, nodes=snap.nodes, node_end_s=ends)
    table = build_options(snap, jobs, node_horizons(snap), horizon_aware=True, max_levels=4)
    assert table.levels.size > 1
    assert solve_one_pool(table, len(jobs)) is None
    assert solve_one_pool(build_options(snap, jobs, node_horizons(snap)), len(jobs), max_cells=1) is None


@pytest.mark.parametrize("seed", range(4))
def test_time_limited_solve_is_valid_and_no_worse_than_its_warm_start(seed):
    snap, jobs = _instance(seed=seed)
    table = build_options(snap, jobs, node_horizons(snap))
    red = reduce_options(table, len(jobs), gap=1e-6)
    warm = float(table.value[red.incumbent].sum())  # what the solver is started from
    pol = make_policy("milp", dp=False, time_limit_s=1e-6)  # stops at once (or proves by bound)
    alloc = pol.allocate(snap, jobs)
    assert feasibility_problems(snap, jobs, alloc) == []
    assert allocation_objective(snap, jobs, alloc) >= warm - 1e-6 * abs(warm)
    best = allocation_objective(snap, jobs, make_policy("milp").allocate(snap, jobs))
    assert allocation_objective(snap, jobs, alloc) <= best + 1e-6 * abs(best)


@pytest.mark.parametrize("status", ["none", "feasible"])
def test_a_solver_that_gives_up_still_yields_the_warm_start(monkeypatch, status):
    snap, jobs = _instance(seed=11)
    table = build_options(snap, jobs, node_horizons(snap))
    warm = float(table.value[reduce_options(table, len(jobs), gap=1e-6).incumbent].sum())

    def bad_solve(prob, **kw):  # a "solution" of all zeros: infeasible, must be rejected
        for v in prob.variables():
            v.varValue = 0.0
        return SolveResult(status, 0.4, None, "time limit")

    monkeypatch.setattr(milp, "solve", bad_solve)
    monkeypatch.setattr(milp, "_proved", lambda *a: False)
    alloc = make_policy("milp", dp=False).allocate(snap, jobs)
    assert feasibility_problems(snap, jobs, alloc) == []
    assert allocation_objective(snap, jobs, alloc) >= warm - 1e-6 * abs(warm)


def test_nested_levels_under_a_tiny_time_limit_give_a_valid_allocation():
    snap, jobs = _instance(n_jobs=12, n_nodes=64, seed=5)
    ends = {n: float(20 + 50 * (i % 7)) for i, n in enumerate(snap.nodes)}
    snap = ClusterSnapshot(now_s=0, nodes=snap.nodes, node_end_s=ends)
    pol = make_policy("milp-horizon", max_levels=4, time_limit_s=1e-6)
    alloc = pol.allocate(snap, jobs)
    assert feasibility_problems(snap, jobs, alloc) == []
    assert pol.last_stats["kept"] <= pol.last_stats["options"]


@pytest.mark.parametrize("seed", range(3))
def test_programme_in_small_blocks_gives_the_same_optimum(monkeypatch, seed):
    import malleparsl.allocator.knapsack as knapsack

    snap, jobs = _instance(n_jobs=8, n_nodes=64, seed=seed)
    table = build_options(snap, jobs, node_horizons(snap))
    whole = solve_one_pool(table, len(jobs))
    monkeypatch.setattr(knapsack, "CHUNK_CELLS", 50)  # a few rows per block
    blocks = solve_one_pool(table, len(jobs))
    assert float(table.value[blocks].sum()) == pytest.approx(float(table.value[whole].sum()))


def test_solver_time_limit_fault_configuration_still_gives_a_valid_allocation():
    # what `bench faults` injects (executors/faults.py): no reduction, no programme, 1 us
    snap, jobs = _instance(seed=2)
    pol = make_policy("milp", time_limit_s=1e-6, reduce=False, dp=False)
    alloc = pol.allocate(snap, jobs)
    assert pol.last_result is not None  # the solver ran
    assert feasibility_problems(snap, jobs, alloc) == []
    assert len(alloc.used_nodes) >= sum(len(j.current) for j in jobs)
