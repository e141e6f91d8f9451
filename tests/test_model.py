"""The domain model: curves, specs, allocations and plans, including the bad-input errors."""

import math

import pytest

from malleparsl.errors import SpecError
from malleparsl.model import Allocation, JobSpec, ScalingCurve


def test_curve_interpolates_through_origin_and_is_flat_past_last_point():
    c = ScalingCurve((1, 4), (10.0, 25.0))
    assert c.rate(0) == 0 and c.rate(0.5) == 5.0
    assert c.rate(2) == pytest.approx(15.0)
    assert c.rate(100) == 25.0
    assert list(c.rates_upto(5)) == pytest.approx([0, 10, 15, 20, 25, 25])


@pytest.mark.parametrize(
    ("nodes", "rates", "fragment"),
    [
        ((2, 1), (1.0, 2.0), "strictly increasing"),
        ((1, 1), (1.0, 2.0), "strictly increasing"),
        ((1, 2), (1.0, -2.0), ">= 0"),
        ((1, 2), (1.0, math.nan), "finite"),
        ((1,), (1.0, 2.0), "entries"),
        ((), (), "at least one"),
        ((0, 1), (3.0, 4.0), "rate at 0 nodes"),
    ],
)
def test_bad_curves_are_rejected_with_the_reason(nodes, rates, fragment):
    with pytest.raises(SpecError, match=fragment):
        ScalingCurve(nodes, rates, name="resnet")


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"min_nodes": 4, "max_nodes": 2}, "min_nodes \\(4\\) > max_nodes \\(2\\)"),
        ({"min_nodes": 0}, "min_nodes must be an integer >= 1"),
        ({"rescale_up_s": -1}, "rescale_up_s must be >= 0"),
        ({"rescale_down_s": math.nan}, "rescale_down_s must be finite"),
        ({"total_samples": 0}, "total_samples must be > 0"),
        ({"weight": math.inf}, "weight must be finite"),
    ],
)
def test_bad_job_specs_name_the_job_and_field(kwargs, fragment):
    with pytest.raises(SpecError, match=fragment) as err:
        JobSpec("trial-7", **{"max_nodes": 8, **kwargs})
    assert "trial-7" in str(err.value)


def test_allocation_rejects_a_node_assigned_twice():
    with pytest.raises(SpecError, match="assigned twice"):
        Allocation({"a": {"n1"}, "b": {"n1", "n2"}})


def test_plan_between_allocations():
    old = Allocation({"a": {"n1", "n2"}, "b": {"n3"}, "c": {"n4"}})
    new = Allocation({"a": {"n1"}, "b": {"n3", "n2"}, "d": {"n4"}})
    plan = old.plan_to(new)
    assert plan.shrink == {"a": frozenset({"n2"})}
    assert plan.grow == {"b": frozenset({"n2"})}
    assert plan.stop == {"c": frozenset({"n4"})}
    assert plan.start == {"d": frozenset({"n4"})}
    assert old.plan_to(old).empty
