"""`milp` reaches the published model's optimum: DP oracle, brute force and `milp-node` agree."""

import math

import pytest
from allocator_cases import brute_force, instances, shaped_curve
from hypothesis import HealthCheck, given, settings

from malleparsl.allocator import ClusterSnapshot, JobView, make_policy
from malleparsl.allocator.objective import (
    allocation_objective,
    best_count_objective,
    feasibility_problems,
)
from malleparsl.model import JobSpec

FAST = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _score(policy, snap, jobs):
    alloc = policy.allocate(snap, jobs)
    assert feasibility_problems(snap, jobs, alloc) == []
    return allocation_objective(snap, jobs, alloc)


def _close(a, b):
    return a == pytest.approx(b, rel=2e-6, abs=1e-6)  # mip_gap is 1e-6 of the bound


@FAST
@given(instances(max_jobs=3, max_nodes=5))
def test_dp_oracle_equals_brute_force_on_tiny_instances(inst):
    snap, jobs = inst
    best, _ = brute_force(snap, jobs)
    dp, counts = best_count_objective(snap, jobs)
    assert _close(dp, best)
    assert sum(counts.values()) <= len(snap.nodes)


@FAST
@given(instances(max_jobs=3, max_nodes=5))
def test_milp_matches_brute_force_on_tiny_instances(inst):
    snap, jobs = inst
    best, _ = brute_force(snap, jobs)
    assert _close(_score(make_policy("milp"), snap, jobs), best)


@FAST
@given(instances(max_jobs=4, max_nodes=9))
def test_milp_and_milp_node_reach_the_same_optimum(inst):
    snap, jobs = inst
    dp, _ = best_count_objective(snap, jobs)
    node = make_policy("milp-node", time_limit_s=30)
    assert _close(_score(node, snap, jobs), dp)
    assert node.last_result is None or node.last_result.status == "optimal"
    assert _close(_score(make_policy("milp"), snap, jobs), dp)
    assert _close(_score(make_policy("milp", reduce=False), snap, jobs), dp)


@settings(max_examples=8, deadline=None)
@given(instances(max_jobs=3, max_nodes=7))
def test_cbc_reaches_the_same_optimum(inst):
    snap, jobs = inst
    dp, _ = best_count_objective(snap, jobs)
    assert _close(_score(make_policy("milp", solver="cbc", reduce=False), snap, jobs), dp)
    assert _close(_score(make_policy("milp-node", solver="cbc"), snap, jobs), dp)


@settings(max_examples=15, deadline=None)
@given(instances(max_jobs=12, max_nodes=40))
def test_milp_matches_the_dp_oracle_on_larger_random_instances(inst):
    snap, jobs = inst
    dp, _ = best_count_objective(snap, jobs)
    assert _close(_score(make_policy("milp"), snap, jobs), dp)


@FAST
@given(instances(max_jobs=4, max_nodes=9))
def test_heuristics_are_feasible_and_never_beat_the_optimum(inst):
    snap, jobs = inst
    dp, _ = best_count_objective(snap, jobs)
    for name in ("greedy", "equal-share"):
        assert _score(make_policy(name), snap, jobs) <= dp + 1e-6 * max(1.0, abs(dp))


@pytest.mark.parametrize("shape", ["saturating", "drop-at-two", "peaked", "jumpy"])
def test_shapes_get_their_best_size_on_an_empty_cluster(shape):
    """One job, no rescale costs: it should get the size with the highest rate (smallest on ties)."""
    curve = shaped_curve(shape, 10.0, 6)
    job = JobSpec("j", max_nodes=6, curve=curve)
    snap = ClusterSnapshot(now_s=0, nodes=tuple(f"n{i}" for i in range(8)))
    alloc = make_policy("milp").allocate(snap, [JobView(job, curve)])
    want = max(range(0, 7), key=lambda k: (curve.rate(k), -k))
    assert alloc.size("j") == want
    if shape == "drop-at-two":
        assert alloc.size("j") != 2


def test_milp_keeps_every_node_of_a_growing_job():
    """Counts to nodes preserves placement: a grower keeps all it held (no migration)."""
    curve = shaped_curve("linear", 100.0, 8)
    snap = ClusterSnapshot(now_s=0, nodes=tuple(f"n{i}" for i in range(8)))
    a = JobView(JobSpec("a", max_nodes=8, curve=curve), curve, frozenset({"n5", "n6"}))
    b = JobView(
        JobSpec("b", max_nodes=8, curve=curve, rescale_down_s=1e6), curve, frozenset({"n0"})
    )
    alloc = make_policy("milp").allocate(snap, [a, b])
    assert {"n5", "n6"} <= alloc.nodes_of("a") and "n0" in alloc.nodes_of("b")
    assert alloc.size("a") + alloc.size("b") == 8
    assert not math.isnan(allocation_objective(snap, [a, b], alloc))
