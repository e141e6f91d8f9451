"""Bad input gets a clear ValueError naming the job and field; valid edge cases get an answer."""

import math

import pytest

from malleparsl.allocator import ClusterSnapshot, JobView, make_policy
from malleparsl.allocator.objective import feasibility_problems
from malleparsl.errors import SpecError, UnknownNameError
from malleparsl.model import JobSpec, ScalingCurve

POLICIES = ["milp", "milp-horizon", "milp-node", "greedy", "equal-share"]
CURVE = ScalingCurve((1, 2, 4), (10.0, 18.0, 30.0))
NODES = tuple(f"n{i}" for i in range(6))


def view(job_id="a", current=(), **kw):
    spec = JobSpec(job_id, **{"max_nodes": 4, "curve": CURVE, **kw})
    return JobView(spec, CURVE, frozenset(current))


# ---- bad specs and curves: rejected when built, naming the job and the field --------------
@pytest.mark.parametrize(
    ("kwargs", "pattern"),
    [
        ({"min_nodes": 3, "max_nodes": 2}, r"job 'a'.*min_nodes \(3\) > max_nodes \(2\)"),
        ({"rescale_up_s": -1.0}, r"job 'a'.*rescale_up_s must be >= 0"),
        ({"rescale_down_s": -0.5}, r"job 'a'.*rescale_down_s must be >= 0"),
        ({"rescale_up_s": math.nan}, r"job 'a'.*rescale_up_s must be finite"),
        ({"rescale_down_s": math.nan}, r"job 'a'.*rescale_down_s must be finite"),
        ({"weight": math.nan}, r"job 'a'.*weight must be finite"),
        ({"weight": -1.0}, r"job 'a'.*weight must be >= 0"),
        ({"total_samples": math.nan}, r"job 'a'.*total_samples must be finite"),
    ],
)
def test_bad_job_spec_names_job_and_field(kwargs, pattern):
    with pytest.raises(ValueError, match=pattern):
        JobSpec("a", curve=CURVE, **kwargs)


@pytest.mark.parametrize(
    ("nodes", "rates", "pattern"),
    [
        ((1, 1, 2), (1.0, 2.0, 3.0), "strictly increasing"),
        ((4, 2), (1.0, 2.0), "strictly increasing"),
        ((1, 2), (5.0, -1.0), r"rates must be >= 0"),
        ((1, 2), (5.0, math.nan), "finite"),
    ],
)
def test_bad_curve_is_rejected(nodes, rates, pattern):
    with pytest.raises(ValueError, match=pattern):
        ScalingCurve(nodes, rates, name="resnet")


def test_view_bounds_min_over_max_names_the_job():
    spec = JobSpec("a", max_nodes=4, curve=CURVE)
    with pytest.raises(SpecError, match=r"job 'a'.*min_nodes \(3\) > max_nodes \(2\)"):
        JobView(spec, CURVE, min_nodes=3, max_nodes=2)


# ---- bad inputs to allocate: every policy says what is wrong --------------------------------
@pytest.mark.parametrize("policy", POLICIES)
def test_unknown_node_in_current_allocation(policy):
    snap = ClusterSnapshot(now_s=0, nodes=NODES)
    with pytest.raises(SpecError, match=r"job 'a' holds unknown node\(s\) \['ghost'\]"):
        make_policy(policy).allocate(snap, [view("a", {"n0", "ghost"})])


@pytest.mark.parametrize("policy", POLICIES)
def test_node_assigned_twice(policy):
    snap = ClusterSnapshot(now_s=0, nodes=NODES)
    with pytest.raises(SpecError, match=r"node 'n1' is assigned twice, to jobs 'a' and 'b'"):
        make_policy(policy).allocate(snap, [view("a", {"n1"}), view("b", {"n1", "n2"})])


@pytest.mark.parametrize("policy", POLICIES)
def test_nan_node_end_and_duplicate_jobs(policy):
    snap = ClusterSnapshot(now_s=0, nodes=NODES, node_end_s={"n3": math.nan})
    with pytest.raises(SpecError, match=r"node_end_s\['n3'\] is NaN"):
        make_policy(policy).allocate(snap, [view("a")])
    snap = ClusterSnapshot(now_s=0, nodes=NODES)
    with pytest.raises(SpecError, match="job 'a' is listed twice"):
        make_policy(policy).allocate(snap, [view("a"), view("a")])


def test_bad_snapshot_values():
    with pytest.raises(SpecError, match="tfwd_s"):
        ClusterSnapshot(now_s=0, nodes=NODES, tfwd_s=math.nan)
    with pytest.raises(SpecError, match="more than once"):
        ClusterSnapshot(now_s=0, nodes=("n0", "n0"))


def test_bad_policy_options_list_the_valid_choices():
    with pytest.raises(
        UnknownNameError, match="unknown solver 'gurobi'; valid solvers are: cbc, highs"
    ):
        make_policy("milp", solver="gurobi")
    with pytest.raises(UnknownNameError, match="unknown policy 'milp2'.*equal-share.*milp-node"):
        make_policy("milp2")
    with pytest.raises(SpecError, match=r"time_limit_s must be .* > 0, got 0"):
        make_policy("milp-node", time_limit_s=0)
    with pytest.raises(SpecError, match="mip_gap"):
        make_policy("milp", mip_gap=2.0)
    with pytest.raises(SpecError, match="max_levels"):
        make_policy("milp-horizon", max_levels=0)
    with pytest.raises(TypeError):
        make_policy("milp", "highs")  # keyword-only


# ---- valid edge cases --------------------------------------------------------------------
@pytest.mark.parametrize("policy", POLICIES)
def test_zero_nodes_and_zero_jobs(policy):
    p = make_policy(policy)
    assert p.allocate(ClusterSnapshot(now_s=0, nodes=()), [view("a")]).assignment == {}
    assert p.allocate(ClusterSnapshot(now_s=0, nodes=NODES), []).assignment == {}


@pytest.mark.parametrize("policy", POLICIES)
def test_more_jobs_than_nodes(policy):
    snap = ClusterSnapshot(now_s=0, nodes=NODES[:3])
    jobs = [view(f"j{i}", submit_s=float(i)) for i in range(7)]
    alloc = make_policy(policy).allocate(snap, jobs)
    assert feasibility_problems(snap, jobs, alloc) == []
    assert 1 <= len(alloc.assignment) <= 3


@pytest.mark.parametrize("policy", POLICIES)
def test_minimum_that_cannot_be_met_gets_nothing(policy):
    snap = ClusterSnapshot(now_s=0, nodes=NODES[:3])
    big = view("big", min_nodes=4, max_nodes=8)
    small = view("small", max_nodes=2)
    alloc = make_policy(policy).allocate(snap, [big, small])
    assert alloc.size("big") == 0 and alloc.size("small") == 2


@pytest.mark.parametrize("policy", POLICIES)
def test_job_left_below_its_minimum_or_above_a_narrowed_maximum(policy):
    snap = ClusterSnapshot(now_s=0, nodes=NODES[:4])
    lost = view("lost", {"n0"}, min_nodes=2, max_nodes=4)  # lost a node to preemption
    spec = JobSpec("narrow", max_nodes=4, curve=CURVE)
    narrow = JobView(spec, CURVE, frozenset({"n1", "n2", "n3"}), max_nodes=1)
    alloc = make_policy(policy).allocate(snap, [lost, narrow])
    assert feasibility_problems(snap, [lost, narrow], alloc) == []
    assert alloc.size("narrow") <= 1 and alloc.size("lost") in (0, 2, 3)
