"""Solvers and time limits: a slow solver never yields an empty map."""

import doctest
import random

import pytest

import malleparsl.allocator.heuristics as heuristics
import malleparsl.allocator.milp as milp
import malleparsl.allocator.milp_node as milp_node
from malleparsl.allocator import ClusterSnapshot, JobView, make_policy
from malleparsl.allocator.objective import allocation_objective, feasibility_problems
from malleparsl.allocator.placement import fallback_counts
from malleparsl.allocator.solvers import SolveResult, make_solver
from malleparsl.model import JobSpec, ScalingCurve


def _instance(n_jobs=12, n_nodes=96, seed=3):
    rng = random.Random(seed)
    nodes = tuple(f"n{i}" for i in range(n_nodes))
    free = list(nodes)
    rng.shuffle(free)
    jobs = []
    for i in range(n_jobs):
        curve = ScalingCurve.amdahl(
            rate1=rng.uniform(50, 500), parallel_fraction=0.95, max_nodes=16
        )
        spec = JobSpec(f"j{i}", max_nodes=16, rescale_up_s=15, rescale_down_s=10, curve=curve)
        cur = {free.pop() for _ in range(rng.randint(0, 6))}
        jobs.append(JobView(spec, curve, frozenset(cur)))
    return ClusterSnapshot(now_s=0, nodes=nodes), jobs


def test_solver_factories():
    assert make_solver("highs", time_limit_s=1).name == "HiGHS"
    assert "CBC" in make_solver("cbc", time_limit_s=0.2).name


@pytest.mark.parametrize("reduce", [True, False])
def test_milp_without_a_solution_is_never_empty(monkeypatch, reduce):
    snap, jobs = _instance()
    monkeypatch.setattr(milp, "solve", lambda *a, **k: SolveResult("none", 9.9, None, "timeout"))
    monkeypatch.setattr(milp, "_proved", lambda *a: False)
    pol = make_policy("milp", reduce=reduce, dp=False)  # the solver, not the exact programme
    alloc = pol.allocate(snap, jobs)
    assert pol.last_fallback
    assert feasibility_problems(snap, jobs, alloc) == []
    assert len(alloc.used_nodes) >= sum(len(j.current) for j in jobs) > 0
    if not reduce:  # no reduction incumbent: every job keeps the nodes it held
        for j in jobs:
            assert j.current <= alloc.nodes_of(j.job_id)


def test_milp_node_timeout_is_never_empty(monkeypatch):
    snap, jobs = _instance()
    monkeypatch.setattr(
        milp_node, "solve", lambda *a, **k: SolveResult("none", 9.9, None, "timeout")
    )
    pol = make_policy("milp-node")
    alloc = pol.allocate(snap, jobs)
    assert pol.last_fallback and alloc.assignment
    assert feasibility_problems(snap, jobs, alloc) == []
    keep = heuristics.place(snap, jobs, fallback_counts(snap, jobs))
    assert allocation_objective(snap, jobs, alloc) >= allocation_objective(snap, jobs, keep)


def test_milp_node_real_time_limit_gives_a_feasible_nonempty_answer():
    snap, jobs = _instance(n_jobs=20, n_nodes=128)
    pol = make_policy("milp-node", time_limit_s=0.05)
    alloc = pol.allocate(snap, jobs)
    assert alloc.assignment
    assert feasibility_problems(snap, jobs, alloc) == []
    assert pol.last_fallback or pol.last_result.status in ("feasible", "optimal")


def test_milp_cbc_and_highs_agree():
    snap, jobs = _instance()
    a = make_policy("milp", solver="cbc").allocate(snap, jobs)
    b = make_policy("milp").allocate(snap, jobs)
    assert allocation_objective(snap, jobs, a) == pytest.approx(allocation_objective(snap, jobs, b))


@pytest.mark.parametrize("module", [milp, heuristics])
def test_docstring_examples(module):
    assert doctest.testmod(module).failed == 0


def test_controller_doctest_uses_equal_share():
    import malleparsl.controller as controller

    assert doctest.testmod(controller).failed == 0


def test_equal_share_leftovers_go_first_come_first_served():
    curve = ScalingCurve((1, 8), (1.0, 8.0))
    jobs = [
        JobView(JobSpec("late", max_nodes=8, submit_s=5.0, curve=curve), curve),
        JobView(JobSpec("early", max_nodes=8, submit_s=1.0, curve=curve), curve),
        JobView(JobSpec("big", min_nodes=4, max_nodes=8, submit_s=2.0, curve=curve), curve),
    ]
    snap = ClusterSnapshot(now_s=0, nodes=tuple(f"n{i}" for i in range(8)))
    sizes = make_policy("equal-share").allocate(snap, jobs).sizes()
    # share 2: big (min 4) gets none of it; leftovers 4 go to the earliest job that can use them
    assert sizes == {"late": 2, "early": 6}


def test_greedy_never_does_worse_than_keeping_the_current_allocation():
    snap, jobs = _instance(seed=7)
    keep = heuristics.place(snap, jobs, fallback_counts(snap, jobs))
    alloc = make_policy("greedy").allocate(snap, jobs)
    assert allocation_objective(snap, jobs, alloc) >= allocation_objective(snap, jobs, keep)
    assert feasibility_problems(snap, jobs, alloc) == []
