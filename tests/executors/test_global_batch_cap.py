"""A job without automatic plans that gives ``global_batch`` among its malleable options is
never sized past the point where every rank still gets a sample of it: ``spec_from_options``
caps its ``max_nodes`` at ``global_batch // ranks_per_node`` (the rule of
:attr:`malleparsl.plans.PlanOptions.max_batch_nodes`) and refuses a ``min_nodes`` above it.
Before, only jobs with a ``memory_profile`` were capped; the controller grew the others onto
nodes whose ranks trained nothing.
"""

from __future__ import annotations

import pytest

from malleparsl.allocator import make_policy
from malleparsl.controller import Controller
from malleparsl.errors import SpecError
from malleparsl.executors.planning import LinearPlaceholderAdvisor, spec_from_options
from malleparsl.plans import MemoryProfile

PROF = MemoryProfile(params=70_000, act_per_sample=1e5, act_ckpt_per_sample=1e4)


def test_global_batch_caps_max_nodes_of_a_job_without_plans() -> None:
    job = {"job_id": "a", "max_nodes": 8, "global_batch": 6}
    assert (spec_from_options(job, ranks_per_node=2).max_nodes,
            spec_from_options(job, ranks_per_node=1).max_nodes,
            spec_from_options(job, ranks_per_node=4).max_nodes) == (3, 6, 1)
    assert spec_from_options({**job, "max_nodes": 2}, ranks_per_node=2).max_nodes == 2
    assert spec_from_options({**job, "min_nodes": 3}, ranks_per_node=2).min_nodes == 3
    # a fixed plan turns automatic plans off, not the cap
    fixed = {**job, "plan": "ckpt", "memory_profile": PROF.as_dict()}
    assert spec_from_options(fixed, ranks_per_node=2).max_nodes == 3
    # with automatic plans the spec carries the same cap (the profiler's view had it alone)
    auto = {**job, "memory_profile": PROF.as_dict()}
    assert spec_from_options(auto, ranks_per_node=2).max_nodes == 3


def test_the_controller_gives_a_capped_job_no_more_nodes_than_its_batch_feeds() -> None:
    """Old code: the placeholder's linear curve up to max_nodes=8 got all 8 idle nodes, 10 of
    16 ranks with nothing to train."""
    ctl = Controller(policy=make_policy("milp"), advisor=LinearPlaceholderAdvisor())
    ctl.add_nodes([f"n{i}" for i in range(8)], now_s=0)
    ctl.submit(spec_from_options({"job_id": "a", "max_nodes": 8, "global_batch": 6,
                                  "total_samples": 1e9}, ranks_per_node=2), now_s=0)
    ctl.replan(now_s=0)
    assert ctl.allocation.size("a") == 3


def test_min_nodes_past_the_cap_is_refused_naming_global_batch_ranks_and_size() -> None:
    with pytest.raises(SpecError, match=r"^min_nodes=4 is too large: 4 node\(s\) x "
                       r"ranks_per_node=2 = 8 ranks exceed global_batch=6 \(every rank needs a "
                       r"sample: at most 3 node\(s\)\); lower min_nodes or raise global_batch"):
        spec_from_options({"job_id": "a", "min_nodes": 4, "max_nodes": 8, "global_batch": 6},
                          ranks_per_node=2)
    with pytest.raises(SpecError, match=r"1 node\(s\) x ranks_per_node=4 = 4 ranks exceed "
                       r"global_batch=3 .*at most 0 node"):
        spec_from_options({"job_id": "a", "global_batch": 3}, ranks_per_node=4)


@pytest.mark.parametrize("bad", [0, -4, 2.5, "64", True])
def test_a_global_batch_that_is_no_sample_count_is_refused(bad) -> None:  # noqa: ANN001
    with pytest.raises(SpecError, match=r"global_batch must be an integer >= 1"):
        spec_from_options({"job_id": "a", "max_nodes": 4, "global_batch": bad})
