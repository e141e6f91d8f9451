"""``tie_seed`` of ``greedy`` and ``milp-node`` (as ``milp``'s): off gives today's answers, a
seed changes only which answer of equal value is taken."""

import pytest

from malleparsl.allocator import ClusterSnapshot, JobView, make_policy
from malleparsl.allocator.objective import allocation_objective
from malleparsl.errors import SpecError
from malleparsl.model import Allocation, JobSpec, ScalingCurve

LINEAR = ScalingCurve((1, 8), (100.0, 800.0))
CONCAVE = ScalingCurve((1, 2, 4, 8), (100.0, 180.0, 300.0, 420.0))


def _twins(curve, n_jobs=4):
    return [JobView(JobSpec(f"j{i}", max_nodes=8, curve=curve), curve) for i in range(n_jobs)]


@pytest.mark.parametrize("name", ["greedy", "milp-node"])
@pytest.mark.parametrize("curve", [LINEAR, CONCAVE])
def test_tie_seed_changes_only_which_equal_answer_is_taken(name, curve):
    snap = ClusterSnapshot(now_s=0.0, nodes=tuple(f"n{i}" for i in range(6)))
    jobs = _twins(curve)
    plain = make_policy(name).allocate(snap, jobs)
    assert make_policy(name, tie_seed=None).allocate(snap, jobs) == plain
    best = allocation_objective(snap, jobs, plain)
    seen = set()
    policy = make_policy(name, tie_seed=7)  # one generator: each decision a fresh order
    for _ in range(8):
        alloc = policy.allocate(snap, jobs)
        assert isinstance(alloc, Allocation)
        assert allocation_objective(snap, jobs, alloc) == pytest.approx(best)
        seen.add(tuple(sorted(alloc.sizes().items())))
    assert len(seen) > 1  # the old code refuses the option and has one answer only


def test_tie_seed_replays_the_same_answers_for_the_same_seed():
    snap = ClusterSnapshot(now_s=0.0, nodes=tuple(f"n{i}" for i in range(6)))
    jobs = _twins(CONCAVE)
    a, b = make_policy("greedy", tie_seed=3), make_policy("greedy", tie_seed=3)
    assert [a.allocate(snap, jobs) for _ in range(5)] == [b.allocate(snap, jobs) for _ in range(5)]


@pytest.mark.parametrize("name", ["greedy", "milp-node"])
def test_tie_seed_must_be_an_integer(name):
    with pytest.raises(SpecError):
        make_policy(name, tie_seed=1.5)
