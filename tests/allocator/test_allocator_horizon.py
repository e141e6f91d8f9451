"""`milp-horizon`: growth is weighed against how long the new nodes will really stay idle."""

import pytest
from allocator_cases import brute_force, horizon_score, instances, shaped_curve
from hypothesis import HealthCheck, given, settings

from malleparsl.allocator import ClusterSnapshot, JobView, make_policy
from malleparsl.allocator.objective import allocation_objective, feasibility_problems
from malleparsl.allocator.placement import node_horizons
from malleparsl.model import JobSpec, ScalingCurve

CURVE = shaped_curve("linear", 100.0, 8)  # 100 samples/s per node


def _one_job_holding_a_node(rescale_up_s=25.0):
    spec = JobSpec("j", max_nodes=8, rescale_up_s=rescale_up_s, curve=CURVE)
    return JobView(spec, CURVE, frozenset({"held"}))


@pytest.mark.parametrize("solver", ["highs", "cbc"])
def test_declines_a_node_that_leaves_before_the_growth_repays_the_pause(solver):
    """Issue 7: the idle period ends in 20 s; growing earns 100/s * 20 s = 2,000 samples but
    the 25 s pause costs 25 s * 100/s = 2,500: stay at one node."""
    snap = ClusterSnapshot(now_s=1000.0, nodes=("held", "short"), node_end_s={"short": 1020.0})
    alloc = make_policy("milp-horizon", solver=solver).allocate(snap, [_one_job_holding_a_node()])
    assert alloc.nodes_of("j") == {"held"}


@pytest.mark.parametrize("solver", ["highs", "cbc"])
def test_grows_onto_a_node_that_stays_long(solver):
    snap = ClusterSnapshot(now_s=1000.0, nodes=("held", "long"), node_end_s={"long": 1600.0})
    alloc = make_policy("milp-horizon", solver=solver).allocate(snap, [_one_job_holding_a_node()])
    assert alloc.nodes_of("j") == {"held", "long"}


def test_plain_milp_would_not_grow_and_horizon_tips_it_only_when_it_pays():
    """With Tfwd = 10 s plain milp never repays a 25 s pause for +100/s; 26 s of stay does."""
    job = _one_job_holding_a_node()
    plain = make_policy("milp")
    hz = make_policy("milp-horizon")
    for end, grows in [(1020.0, False), (1024.0, False), (1026.0, True)]:
        snap = ClusterSnapshot(now_s=1000.0, nodes=("held", "x"), node_end_s={"x": end})
        assert plain.allocate(snap, [job]).size("j") == 1
        assert hz.allocate(snap, [job]).size("j") == (2 if grows else 1), end


def test_growth_takes_the_long_lived_node_and_shrink_releases_the_short_lived_one():
    snap = ClusterSnapshot(
        now_s=0.0,
        nodes=("a", "b", "c", "short", "long"),
        node_end_s={"short": 15.0, "long": 900.0, "a": 900.0, "b": 5.0, "c": 900.0},
    )
    grower = JobView(JobSpec("g", max_nodes=1, curve=CURVE), CURVE)
    shrinker_spec = JobSpec("s", max_nodes=2, curve=CURVE)  # holds 3, may keep 2
    shrinker = JobView(shrinker_spec, CURVE, frozenset({"a", "b", "c"}))
    alloc = make_policy("milp-horizon").allocate(snap, [grower, shrinker])
    assert alloc.nodes_of("g") == {"long"}
    assert alloc.nodes_of("s") == {"a", "c"}


def test_default_horizon_makes_unknown_nodes_attractive_when_asked():
    job = _one_job_holding_a_node()
    snap = ClusterSnapshot(now_s=0.0, nodes=("held", "x"))
    assert make_policy("milp-horizon").allocate(snap, [job]).size("j") == 1
    long_default = make_policy("milp-horizon", default_horizon_s=300.0)
    assert long_default.allocate(snap, [job]).size("j") == 2
    capped = make_policy("milp-horizon", default_horizon_s=300.0, horizon_cap_s=20.0)
    assert capped.allocate(snap, [job]).size("j") == 1


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(instances(max_jobs=3, max_nodes=5, with_ends=True))
def test_nested_horizon_model_is_optimal_for_its_objective_on_tiny_instances(inst):
    snap, jobs = inst
    hz = node_horizons(snap)
    alloc = make_policy("milp-horizon", max_levels=8, mip_gap=1e-7).allocate(snap, jobs)
    assert feasibility_problems(snap, jobs, alloc) == []
    best, _ = brute_force(snap, jobs, score=lambda s, j, a: horizon_score(s, j, a, hz))
    assert horizon_score(snap, jobs, alloc, hz) == pytest.approx(best, rel=1e-6, abs=1e-6)


@settings(max_examples=25, deadline=None)
@given(instances(max_jobs=5, max_nodes=12))
def test_without_known_ends_milp_horizon_equals_milp(inst):
    snap, jobs = inst
    a = make_policy("milp").allocate(snap, jobs)
    b = make_policy("milp-horizon", mip_gap=1e-7).allocate(snap, jobs)
    assert allocation_objective(snap, jobs, b) == pytest.approx(
        allocation_objective(snap, jobs, a), rel=1e-6, abs=1e-6
    )


def test_many_horizon_levels_are_rounded_down_and_stay_feasible():
    nodes = tuple(f"n{i}" for i in range(60))
    ends = {n: 5.0 + 7.0 * i for i, n in enumerate(nodes)}
    snap = ClusterSnapshot(now_s=0.0, nodes=nodes, node_end_s=ends)
    jobs = [
        JobView(JobSpec(f"j{i}", max_nodes=16, rescale_up_s=20, curve=CURVE), CURVE)
        for i in range(6)
    ]
    pol = make_policy("milp-horizon", max_levels=4)
    alloc = pol.allocate(snap, jobs)
    assert feasibility_problems(snap, jobs, alloc) == []
    used = alloc.used_nodes
    assert 30 <= len(used) <= 48  # 6 jobs x 8 useful nodes at most
    # the nodes left idle are the shortest-lived ones
    assert max(ends[n] for n in set(nodes) - used) < min(ends[n] for n in used)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(instances(max_jobs=3, max_nodes=5, with_ends=True))
def test_one_pool_horizon_model_is_feasible_and_close_to_the_nested_optimum(inst):
    """The default (one pool) model is an approximation: feasible, and never worse than
    keeping the current allocation under the horizon objective."""
    from malleparsl.allocator.placement import fallback_counts, place

    snap, jobs = inst
    hz = node_horizons(snap)
    alloc = make_policy("milp-horizon").allocate(snap, jobs)
    assert feasibility_problems(snap, jobs, alloc) == []
    keep = place(snap, jobs, fallback_counts(snap, jobs), horizons=hz)
    best, _ = brute_force(snap, jobs, score=lambda s, j, a: horizon_score(s, j, a, hz))
    mine = horizon_score(snap, jobs, alloc, hz)
    assert mine <= best + 1e-6 * max(1.0, abs(best))
    assert mine >= horizon_score(snap, jobs, keep, hz) - 1e-6 * max(1.0, abs(best))


def test_a_forced_losing_growth_takes_the_shortest_lived_pool_node():
    """j1 holds one node but needs two, and its rate falls at two: the longer the added node
    stays, the more it loses, so it takes the short-lived one ('s'), not the long one."""
    drop = ScalingCurve((1, 2), (1.0, 0.6), name="drop-at-two")
    snap = ClusterSnapshot(now_s=0.0, nodes=("held", "long", "s"),
                           node_end_s={"held": 900.0, "long": 900.0, "s": 20.0})
    j1 = JobView(JobSpec("j1", min_nodes=2, max_nodes=2, curve=drop), drop, frozenset({"held"}))
    alloc = make_policy("milp-horizon", max_levels=8).allocate(snap, [j1])
    assert alloc.nodes_of("j1") == {"held", "s"}


@pytest.mark.xfail(strict=True, reason="known: the nested count model values a forced, losing "
                   "growth at its level's lower horizon bound, but the only free node lives longer")
def test_nested_model_values_a_forced_losing_growth_at_the_node_it_will_get():
    drop = ScalingCurve((1, 2), (1.0, 0.6), name="drop-at-two")
    one = ScalingCurve((1,), (1.0,), name="linear")
    snap = ClusterSnapshot(now_s=0.0, nodes=("n0", "n1", "n2"), node_end_s={"n0": 30.0})
    jobs = [JobView(JobSpec("j0", max_nodes=1, curve=one), one, frozenset({"n1"})),
            JobView(JobSpec("j1", min_nodes=2, max_nodes=2, submit_s=1.0, curve=drop), drop,
                    frozenset({"n2"}))]
    hz = node_horizons(snap)
    alloc = make_policy("milp-horizon", max_levels=8, mip_gap=1e-7).allocate(snap, jobs)
    best, _ = brute_force(snap, jobs, score=lambda s, j, a: horizon_score(s, j, a, hz))
    assert horizon_score(snap, jobs, alloc, hz) == pytest.approx(best, rel=1e-6, abs=1e-6)
