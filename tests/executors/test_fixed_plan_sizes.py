"""A job run with a *fixed* FSDP2 plan (``plan="fsdp"``, no automatic plans) is given only
node counts whose ranks split its ``global_batch`` evenly: ``ctx.steps`` refuses an uneven
split (FSDP2's collectives are inside every pass, so every rank must run as many), and the
size is the controller's choice, not the user's. ``spec_from_options`` narrows the job's bounds
to the counts that split it and lists them in ``meta["sizes"]`` where some count in between
does not; the controller puts them in the job's views (``JobView.sizes``). Before, the
controller gave such a job 3 nodes of a batch of 64 and the job failed in ``ctx.steps``.
"""

from __future__ import annotations

import logging

import pytest

from malleparsl.allocator import make_policy
from malleparsl.controller import Controller
from malleparsl.errors import SpecError
from malleparsl.executors.planning import LinearPlaceholderAdvisor, build_policy, spec_from_options
from malleparsl.model import JobSpec

FSDP_64 = {"job_id": "a", "plan": "fsdp", "max_nodes": 4, "global_batch": 64,
           "total_samples": 1e9}


def _steps_at(n_ranks: int, **options) -> None:  # noqa: ANN003
    """Every rank of a segment of ``n_ranks`` starts the loop (``ctx.steps``) of the job."""
    pytest.importorskip("torch")
    from malleparsl.apps.context import TrainContext

    contexts = [TrainContext(rank=r, world_size=n_ranks, local_world_size=1,
                             options={"torch_threads": 1, **options}) for r in range(n_ranks)]
    try:
        for c in contexts:
            next(c.steps(3, dataset_size=640))
        assert sum(c.local_batch for c in contexts) == options["global_batch"]
        assert len({c.local_batch for c in contexts}) == 1  # even split
    finally:
        for c in contexts:
            c.close()


@pytest.mark.parametrize("policy", ["milp", "equal-share", "greedy", "hold", "milp-horizon",
                                    "bftrainer-heuristic", "jpa"])
def test_the_controller_never_sizes_a_fixed_fsdp_job_where_its_batch_does_not_split(
        policy, caplog) -> None:  # noqa: ANN001
    """3 idle nodes, a batch of 64, one rank per node: the job gets 2 (or 4 once there are 4),
    never 3, and its ranks start training there. Old code: 3 nodes, then ctx.steps' SpecError
    'global_batch=64 over 3 ranks does not: run another plan or size'."""
    caplog.set_level(logging.ERROR, logger="malleparsl.controller")
    pol, adv = build_policy(policy, {}, None)
    ctl = Controller(policy=pol, advisor=adv)
    ctl.add_nodes(["n0", "n1", "n2"], now_s=0)
    ctl.submit(spec_from_options(FSDP_64), now_s=0)
    seen = set()
    for t in range(0, 200, 10):
        ctl.replan(now_s=t)
        if n := ctl.allocation.size("a"):
            seen.add(n)
            ctl.observe("a", n_nodes=n, samples_per_s=100.0 * n ** 0.8, now_s=t + 5)
    assert seen and seen <= {1, 2}, seen
    _steps_at(ctl.allocation.size("a") or max(seen), plan="fsdp", global_batch=64)
    ctl.add_nodes(["n3"], now_s=200)
    for t in range(200, 400, 10):
        ctl.replan(now_s=t)
        if n := ctl.allocation.size("a"):
            seen.add(n)
            ctl.observe("a", n_nodes=n, samples_per_s=100.0 * n ** 0.8, now_s=t + 5)
    assert 3 not in seen
    assert not [r for r in caplog.records if "invalid allocation" in r.getMessage()]


def test_a_job_losing_a_node_is_snapped_to_a_size_its_batch_splits_at() -> None:
    """4 nodes, one lost: 3 does not split 64, the job continues at 2 (old code: at 3)."""
    ctl = Controller(policy=make_policy("milp"), advisor=LinearPlaceholderAdvisor())
    ctl.add_nodes([f"n{i}" for i in range(4)], now_s=0)
    ctl.submit(spec_from_options(FSDP_64), now_s=0)
    ctl.replan(now_s=0)
    assert ctl.allocation.size("a") == 4
    ctl.remove_nodes(["n3"], now_s=1)
    ctl.replan(now_s=1)
    assert ctl.allocation.size("a") == 2


def test_spec_lists_the_sizes_a_fixed_fsdp_plan_splits_the_batch_at() -> None:
    spec = spec_from_options({"job_id": "a", "plan": "fsdp", "max_nodes": 8, "global_batch": 48},
                             ranks_per_node=2)  # 2n ranks split 48 when n divides 24
    assert (spec.min_nodes, spec.max_nodes, spec.meta["sizes"]) == (1, 8, (1, 2, 3, 4, 6, 8))
    for plan in ("fsdp+ckpt", "fsdp@mb=4", "fsdp+ckpt@mb=2"):
        assert spec_from_options({"job_id": "a", "plan": plan, "max_nodes": 8,
                                  "global_batch": 48}, ranks_per_node=2).meta["sizes"] == (
            1, 2, 3, 4, 6, 8)
    # no hole left: the bounds alone say it (1..2 of a batch of 64 at most 3 nodes)
    spec = spec_from_options({**FSDP_64, "max_nodes": 3})
    assert (spec.min_nodes, spec.max_nodes, dict(spec.meta)) == (1, 2, {})
    # a min_nodes that does not split is raised to the first that does
    spec = spec_from_options({**FSDP_64, "min_nodes": 3, "max_nodes": 5})
    assert (spec.min_nodes, spec.max_nodes) == (4, 4)
    # plans that take any split are not narrowed
    for plan in ("dp", "zero1", "ckpt@mb=4", "auto"):
        spec = spec_from_options({**FSDP_64, "plan": plan})
        assert (spec.min_nodes, spec.max_nodes, dict(spec.meta)) == (1, 4, {})


def test_a_fixed_fsdp_job_no_size_of_which_splits_its_batch_is_refused_at_submit() -> None:
    with pytest.raises(SpecError, match=r"plan 'fsdp' needs global_batch=63 to split evenly "
                       r"over the ranks, and no size from min_nodes=1 to max_nodes=8 node\(s\) "
                       r"of ranks_per_node=2 rank\(s\) does; .*or run another plan"):
        spec_from_options({"job_id": "a", "plan": "fsdp", "max_nodes": 8, "global_batch": 63},
                          ranks_per_node=2)


@pytest.mark.parametrize("options", [{}, {"global_batch": 64}, {"memory_profile": {
    "params": 1000, "act_per_sample": 1.0, "act_ckpt_per_sample": 1.0}, "global_batch": 64}])
@pytest.mark.parametrize(("plan", "why"), [
    ("fsdpp", r"; valid"), ("zero7", r"; valid"), ("FSDP", r"; valid"),
    ("fsdp@mb=0", r" \(plan 'fsdp@mb=0': write 'fsdp@mb=N' with an integer N >= 1\); valid"),
    (3, r" \(plan must be a string like 'zero1@mb=8', got 3\); valid")])
def test_a_misspelt_fixed_plan_is_refused_at_submit_with_or_without_global_batch(
        options, plan, why) -> None:  # noqa: ANN001
    """Old code: without global_batch the spec was built and every rank refused the plan once
    the job held its nodes; with it, an UnknownNameError (no SpecError) came out."""
    with pytest.raises(SpecError, match=rf"^malleable option plan={plan!r} is not an execution "
                       rf"plan{why} plans: 'auto', 'dp', 'ckpt', 'zero1', 'zero1\+ckpt', "
                       r"'fsdp', 'fsdp\+ckpt', each optionally with '@mb=N'"):
        spec_from_options({"job_id": "a", "max_nodes": 4, "plan": plan, **options})


def test_plans_that_parse_are_accepted_at_submit_as_before() -> None:
    for plan in (None, "auto", "dp", " zero1 ", "fsdp+ckpt@mb=8"):
        assert spec_from_options({"job_id": "a", "max_nodes": 4, "plan": plan}).max_nodes == 4


def test_ctx_steps_says_to_name_global_batch_when_the_options_do_not() -> None:
    """Without the option the controller cannot know the batch: the error says to give it.
    Old code: '... does not: run another plan or size' (the size is not the user's choice)."""
    from malleparsl.plans import UnevenSplitError

    with pytest.raises(UnevenSplitError, match=r"global_batch=64 over 3 ranks does not: pass "
                       r"global_batch=64 in the app's malleable options \(e.g. "
                       r"@malleable_app\(global_batch=64, ...\)\)") as e:
        _steps_at_with_batch(3, plan="fsdp")
    assert e.value.global_batch == 64  # what the executor re-sizes the job with
    with pytest.raises(SpecError, match=r"over 3 ranks does not: run another plan or size") as e:
        _steps_at(3, plan="fsdp", global_batch=64)  # the option given: not a controller's size
    assert not isinstance(e.value, UnevenSplitError)  # the controller knew: no re-run


def _steps_at_with_batch(n_ranks: int, **options) -> None:  # noqa: ANN003
    """As :func:`_steps_at`, the batch (64) given to ``ctx.steps`` only."""
    pytest.importorskip("torch")
    from malleparsl.apps.context import TrainContext

    ctx = TrainContext(rank=0, world_size=n_ranks, local_world_size=1,
                       options={"torch_threads": 1, **options})
    try:
        next(ctx.steps(3, global_batch=64, dataset_size=640))
    finally:
        ctx.close()


@pytest.mark.parametrize("plan", ["fsdp", "dp"])
@pytest.mark.parametrize(("bounds", "error"), [
    ({"min_nodes": 0}, r"min_nodes must be an integer >= 1, got 0"),
    ({"min_nodes": -2}, r"min_nodes must be an integer >= 1, got -2"),
    ({"min_nodes": "2"}, r"min_nodes must be an integer >= 1, got '2'"),
    ({"min_nodes": True}, r"min_nodes must be an integer >= 1, got True"),
    ({"max_nodes": 0}, r"max_nodes must be an integer >= 1, got 0"),
    ({"min_nodes": 3, "max_nodes": 2}, r"min_nodes \(3\) > max_nodes \(2\)"),
])
def test_a_fixed_plan_with_global_batch_checks_its_bounds_as_any_job(plan, bounds, error) -> None:  # noqa: ANN001
    """Bad bounds are the spec's own SpecError, as without a fixed plan. Old code: the fixed
    plan's sizes were worked out from int() of them first, so 0 or -2 (fsdp) raised
    ZeroDivisionError, '2' and True were silently taken as 2 and 1, and max_nodes=0 or
    min > max said 'plan 'dp' needs global_batch=64 to split evenly'."""
    with pytest.raises(SpecError, match=error):
        spec_from_options({**FSDP_64, "plan": plan, **bounds})
    with pytest.raises(SpecError, match=error):  # the same as without a fixed plan
        spec_from_options({**FSDP_64, "plan": "auto", **bounds})


@pytest.mark.parametrize("plan", ["fsdp", "auto"])
@pytest.mark.parametrize(("bounds", "error"), [
    ({"min_nodes": 0}, r"min_nodes must be an integer >= 1, got 0"),
    ({"min_nodes": 2.7}, r"min_nodes must be an integer >= 1, got 2.7"),
    ({"min_nodes": "x"}, r"min_nodes must be an integer >= 1, got 'x'"),
    ({"min_nodes": True}, r"min_nodes must be an integer >= 1, got True"),
    ({"max_nodes": "x"}, r"max_nodes must be an integer >= 1, got 'x'"),
    ({"max_nodes": None, "min_nodes": "x"}, r"min_nodes must be an integer >= 1, got 'x'"),
])
def test_a_job_with_a_memory_profile_checks_its_bounds_as_any_job(plan, bounds, error) -> None:  # noqa: ANN001
    """With a ``memory_profile`` (automatic plans, or a fixed plan that turns them off) the
    bounds are JobSpec's to check too. Old code: the memory branch took int() of the raw
    options first, so 2.7 and True were silently 2 and 1, 0 became the memory model's 1, and
    'x' was a bare ValueError."""
    from malleparsl.plans import MemoryProfile

    prof = MemoryProfile(params=70_000, act_per_sample=1e5, act_ckpt_per_sample=1e4)
    job = {**FSDP_64, "plan": plan, "memory_profile": prof.as_dict(), **bounds}
    with pytest.raises(SpecError, match=error):
        spec_from_options(job)


@pytest.mark.parametrize("sizes", [(2, 4), (1, 3, 2), (0, 1, 2), ("1", 2)])
def test_the_controller_refuses_meta_sizes_without_the_minimum_at_submit(sizes) -> None:  # noqa: ANN001
    """The JPA probes a new job at exactly ``min_nodes``, so that size must be runnable, as
    spec_from_options makes it. Old code: a spec with min_nodes=1 and sizes (2, 4) was taken,
    its probe at 1 never placed nor timed out, and under ``jpa`` the job got 0 nodes of 20
    idle for ever; malformed ones, (1, 3, 2) or (0, 1, 2), failed every later replan with
    JobView's SpecError."""
    ctl = Controller(policy=make_policy("milp"), advisor=LinearPlaceholderAdvisor())
    spec = JobSpec(job_id="x", min_nodes=1, max_nodes=4, total_samples=1e9,
                   meta={"sizes": sizes})
    with pytest.raises(SpecError, match=r"job 'x': meta\['sizes'\] must be strictly increasing "
                       r"node counts >= 1 that include min_nodes \(1\)"):
        ctl.submit(spec, now_s=0)
    assert not ctl.jobs


def test_a_job_of_meta_sizes_is_probed_and_sized_under_jpa() -> None:
    """The same job with min_nodes=2 (in its sizes) is probed at 2 and runs only at 2 or 4."""
    pol, adv = build_policy("jpa", {}, None)
    ctl = Controller(policy=pol, advisor=adv)
    ctl.add_nodes([f"n{i}" for i in range(20)], now_s=0)
    ctl.submit(JobSpec(job_id="x", min_nodes=2, max_nodes=4, total_samples=1e9,
                       meta={"sizes": (2, 4)}), now_s=0)
    seen = set()
    for t in range(0, 3000, 60):
        ctl.replan(now_s=t)
        if n := ctl.allocation.size("x"):
            seen.add(n)
            ctl.observe("x", n_nodes=n, samples_per_s=100.0 * n, now_s=t + 30)
    assert seen == {2, 4} and not adv.probe_requests()
