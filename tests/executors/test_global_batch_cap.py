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


def test_a_numpy_integer_batch_from_a_sweeps_grid_is_a_batch() -> None:
    """A grid built with numpy (``np.arange``, ``np.int64``) gives numpy integers: they are
    sample counts (the options were refused before with 'must be an integer')."""
    np = pytest.importorskip("numpy")
    job = {"job_id": "a", "max_nodes": 8, "global_batch": np.int64(6)}
    assert spec_from_options(job, ranks_per_node=2).max_nodes == 3
    auto = {**job, "memory_profile": PROF.as_dict()}
    assert spec_from_options(auto, ranks_per_node=2).max_nodes == 3


@pytest.mark.parametrize("bad", [0, -4, 2.5, "64", True])
def test_a_global_batch_that_is_no_sample_count_is_refused(bad) -> None:  # noqa: ANN001
    with pytest.raises(SpecError, match=r"global_batch must be an integer >= 1"):
        spec_from_options({"job_id": "a", "max_nodes": 4, "global_batch": bad})


# ---- learnt while running: a job without the option -------------------------------------
def _running(advisor=None, nodes=8, **spec):  # noqa: ANN001, ANN003, ANN202
    ctl = Controller(policy=make_policy("milp"), advisor=advisor or LinearPlaceholderAdvisor())
    ctl.add_nodes([f"n{i}" for i in range(nodes)], now_s=0)
    ctl.submit(spec_from_options({"job_id": "a", "max_nodes": 8, "total_samples": 1e9, **spec},
                                 ranks_per_node=2), now_s=0)
    ctl.replan(now_s=0)
    return ctl


def test_a_cap_learnt_while_running_bounds_every_later_decision(caplog) -> None:
    """Old code: no way to lower a running job's bound; it kept all 8 nodes."""
    import logging

    caplog.set_level(logging.WARNING, logger="malleparsl.controller")
    ctl = _running()
    assert ctl.allocation.size("a") == 8  # without the option the controller cannot know
    assert ctl.cap_nodes("a", 3, why="its loop splits global_batch=6")
    ctl.replan(now_s=1)
    assert ctl.allocation.size("a") == 3 and ctl.jobs["a"].node_cap == 3
    assert ctl.jobs["a"].spec.max_nodes == 8  # the submitted spec is kept
    # said once, with the reason; the same cap changes nothing and says nothing
    assert not ctl.cap_nodes("a", 3, why="again")
    said = [r.getMessage() for r in caplog.records]
    assert said == ["job 'a': max_nodes 8 -> 3 from now on: its loop splits global_batch=6"]
    ctl.add_nodes(["m0", "m1"], now_s=2)
    ctl.replan(now_s=2)
    assert ctl.allocation.size("a") == 3
    assert not [r for r in caplog.records if "invalid allocation" in r.getMessage()]


def test_a_learnt_cap_follows_the_latest_batch_up_to_the_specs_max_nodes(caplog) -> None:
    """A loop whose second phase splits a larger batch (6 samples over 2 ranks a node, then
    12, then 64): the cap rises with it, to the spec's max_nodes at most, and each change is
    said once (a drop as a warning, a rise as info). Old code: a learnt cap only went down, so
    the job stayed at 3 of 8 nodes for the rest of its run."""
    import logging

    caplog.set_level(logging.INFO, logger="malleparsl.controller")
    ctl = _running()
    sizes = []
    for cap, changed in ((3, True), (3, False), (6, True), (32, True), (32, False), (4, True)):
        assert ctl.cap_nodes("a", cap, why=f"batch {2 * cap}") is changed
        ctl.replan(now_s=len(sizes))
        sizes.append(ctl.allocation.size("a"))
    assert sizes == [3, 3, 6, 8, 8, 4]
    assert ctl.jobs["a"].node_cap == 4
    said = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert said == [("WARNING", "job 'a': max_nodes 8 -> 3 from now on: batch 6"),
                    ("INFO", "job 'a': max_nodes 3 -> 6 from now on: batch 12"),
                    ("INFO", "job 'a': max_nodes 6 -> 8 from now on: batch 64"),
                    ("WARNING", "job 'a': max_nodes 8 -> 4 from now on: batch 8")]


def test_a_learnt_cap_never_lifts_a_job_past_the_cap_its_global_batch_option_set() -> None:
    ctl = Controller(policy=make_policy("equal-share"), advisor=LinearPlaceholderAdvisor())
    ctl.add_nodes([f"n{i}" for i in range(8)], now_s=0)
    ctl.submit(spec_from_options({"job_id": "a", "max_nodes": 8, "global_batch": 10,
                                  "total_samples": 1e9}, ranks_per_node=2), now_s=0)
    assert not ctl.cap_nodes("a", 40, why="batch 80")  # the option's cap (5) stays
    assert ctl.cap_nodes("a", 2, why="batch 4") and ctl.cap_nodes("a", 40, why="batch 80")
    ctl.replan(now_s=1)
    assert ctl.jobs["a"].node_cap is None and ctl.allocation.size("a") == 5


def test_a_learnt_cap_keeps_min_nodes_and_narrows_an_advisors_view() -> None:
    ctl = _running(min_nodes=4)
    assert ctl.cap_nodes("a", 1, why="batch 2") and ctl.jobs["a"].node_cap == 4
    ctl.replan(now_s=1)
    assert ctl.allocation.size("a") == 4
    assert not _running(max_nodes=2).cap_nodes("a", 3, why="above its max_nodes")

    class Pinned(LinearPlaceholderAdvisor):  # an advisor that pins the job at 6 (a probe)
        def views(self, snapshot, jobs, allocation):  # noqa: ANN001, ANN202
            import dataclasses

            return [dataclasses.replace(v, min_nodes=6, max_nodes=6)
                    for v in super().views(snapshot, jobs, allocation)]

    ctl = _running(advisor=Pinned())
    assert ctl.allocation.size("a") == 6
    ctl.cap_nodes("a", 3, why="batch 6")
    ctl.replan(now_s=1)
    assert ctl.allocation.size("a") == 3


@pytest.mark.parametrize("policy", ["equal-share", "greedy", "hold", "milp-horizon", "jpa"])
def test_every_policy_shrinks_a_running_job_to_its_learnt_cap(policy, caplog) -> None:
    """The job holds 8 nodes when the cap comes (with the JPA after probing and growing)."""
    import logging

    from malleparsl.executors.planning import build_policy

    caplog.set_level(logging.ERROR, logger="malleparsl.controller")
    pol, adv = build_policy(policy, {}, None)
    ctl = Controller(policy=pol, advisor=adv)
    ctl.add_nodes([f"n{i}" for i in range(8)], now_s=0)
    ctl.submit(spec_from_options({"job_id": "a", "max_nodes": 8, "total_samples": 1e9},
                                 ranks_per_node=2), now_s=0)
    for t in range(0, 200, 10):  # a job that scales: 100 n^0.8 samples/s
        ctl.replan(now_s=t)
        if n := ctl.allocation.size("a"):
            ctl.observe("a", n_nodes=n, samples_per_s=100.0 * n ** 0.8, now_s=t + 5)
    assert ctl.allocation.size("a") == 8
    ctl.cap_nodes("a", 3, why="batch 6")
    for t in range(200, 300, 10):
        ctl.replan(now_s=t)
        assert ctl.allocation.size("a") == 3
    assert not [r for r in caplog.records if "invalid allocation" in r.getMessage()]


def test_a_batch_smaller_than_one_nodes_ranks_is_refused_with_a_fix_that_exists() -> None:
    """Old code: '...; lower min_nodes or raise global_batch', with min_nodes=1 (no smaller
    one exists)."""
    with pytest.raises(SpecError, match=r"at most 0 node\(s\)\); global_batch=3 has fewer "
                       r"samples than one node's 4 ranks, .*raise global_batch to at least 4 "
                       r"or run fewer ranks per node$") as e:
        spec_from_options({"job_id": "a", "global_batch": 3}, ranks_per_node=4)
    assert "lower min_nodes" not in str(e.value)


def test_a_plain_resource_specification_gets_the_value_checks_at_submit():
    """@malleable_app checks values at decoration; a job submitted with a plain
    resource_specification skipped them (torch_threads=-1 was torch's RuntimeError on the
    ranks, once the job held its nodes). Names it does not know pass: its function may read
    them from ctx.options, and no extra_options list says which."""
    from malleparsl.executors.planning import spec_from_options

    with pytest.raises(SpecError, match="torch_threads"):
        spec_from_options({"job_id": "t", "max_nodes": 2, "torch_threads": -1})
    with pytest.raises(SpecError, match="ckpt_interval_s"):
        spec_from_options({"job_id": "t", "ckpt_interval_s": "x"})
    assert spec_from_options({"job_id": "t", "max_nodes": 2, "my_lr_scale": 3}).max_nodes == 2
