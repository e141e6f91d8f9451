"""The per-plan performance model: fitting from measured steps, plan-aware curves, choice, and
the controller's plan profiler (what the allocator plans with, what the driver runs)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from malleparsl.allocator import make_policy
from malleparsl.allocator.base import AllocationPolicy
from malleparsl.controller import Controller
from malleparsl.errors import SpecError
from malleparsl.executors.planning import LinearPlaceholderAdvisor, spec_from_options
from malleparsl.jpa.plans import (
    JobPlans,
    PlanPerfModel,
    PlanProfiler,
    StepReading,
    fit_perf,
    plan_aware_curve,
)
from malleparsl.plans import (
    MemoryBudgetError,
    MemoryProfile,
    PlanOptions,
    min_nodes_for,
    node_budget,
    parse_plan,
    plan_memory,
    plan_options,
)

PROF = MemoryProfile(params=10_000_000, act_per_sample=2e6, act_ckpt_per_sample=2e5)
MIB = 2**20


def test_fit_recovers_the_true_coefficients_from_noise_free_steps() -> None:
    true = PlanPerfModel.default(PROF).scaled(compute=3.0, recompute=2.0, comm_byte=5.0)
    readings = [StepReading(parse_plan(p), n, 64, true.step_time(parse_plan(p), n=n, global_batch=64))
                for p in ("dp", "ckpt", "zero1", "dp@mb=8", "ckpt@mb=4") for n in (1, 2, 4, 8)
                if not (p == "zero1" and n == 1)]
    fit = fit_perf(readings, PlanPerfModel.default(PROF), prior_weight=1e-6)
    for p in ("dp", "ckpt@mb=16", "zero1+ckpt"):
        want = true.step_time(parse_plan(p), n=3, global_batch=64)
        assert fit.step_time(parse_plan(p), n=3, global_batch=64) == pytest.approx(want, rel=0.02)


def test_plan_aware_curve_is_best_feasible_plan_and_its_minimum_size() -> None:
    perf = PlanPerfModel.default(PROF)
    pc = plan_aware_curve(perf, global_batch=64, budget=160 * MIB, n_max=6)
    assert pc.min_nodes == 2 and pc.curve.rate(1) == 0.0  # one node: nothing fits
    assert pc.plans[2].zero  # two nodes: only with the optimizer state sharded
    dp_only = plan_aware_curve(perf, global_batch=64, budget=160 * MIB, n_max=6, bases=["dp"])
    assert dp_only.min_nodes is None  # plain data parallelism never fits 160 MiB


def test_job_plans_learn_measured_step_times() -> None:
    assert JobPlans(PlanOptions(PROF, 64, None)).choose(2).name == "dp"
    tight = JobPlans(PlanOptions(PROF, 64, 200 * MIB), warmup_obs=0)
    first = tight.choose(1)
    assert first.micro_batch is not None or first.checkpoint
    t0 = tight.prior.step_time(first, n=1, global_batch=64)
    tight.observe(first, 1, samples_per_s=64 / (5 * t0))  # 5x slower than the prior said
    assert tight.model.step_time(first, n=1, global_batch=64) == pytest.approx(5 * t0, rel=0.05)
    zero1 = parse_plan("zero1")  # another plan at another size: the balance of the terms moves
    before = tight.model.step_time(zero1, n=4, global_batch=64)
    for _ in range(3):
        tight.observe(zero1, 4, samples_per_s=64 / (3 * before))
    assert tight.model.step_time(zero1, n=4, global_batch=64) > 2 * before
    with pytest.raises(MemoryBudgetError, match="no execution plan fits"):
        JobPlans(PlanOptions(PROF, 64, 10 * MIB)).choose(1)


def test_ranks_on_one_node_share_its_budget() -> None:
    """Two ranks per node: a node holds two ranks' peaks, so a plan that fits one rank per
    node may not fit, and the minimum size is counted in nodes of two ranks."""
    budget = 200 * MIB
    one, two = PlanOptions(PROF, 64, budget), PlanOptions(PROF, 64, budget, ranks_per_node=2)
    assert two.feasible(1) == []  # 100 MiB a rank: not even ZeRO-1's 114 MiB of state
    # 160 MiB a rank (168 MB) at 2 ranks, by hand (MB): parameters 40, gradients 40, Adam 80
    # (40 sharded); DP's sync peak is 200, ZeRO-1's 160 (fwd/bwd 80 + 2 per sample kept, 0.2
    # checkpointed: the whole 32-sample local batch 144 or 86, micro-batches of 16: 152)
    roomy = PlanOptions(PROF, 64, 320 * MIB, ranks_per_node=2)
    mbs = ["", "@mb=16", "@mb=8", "@mb=4", "@mb=2", "@mb=1"]
    assert [p.name for p in roomy.feasible(1)] == [f"{b}{m}" for b in ("zero1", "zero1+ckpt")
                                                   for m in mbs]
    dp = parse_plan("dp")
    assert dp in one.feasible(4)  # 4 ranks of 16 samples, one per node
    assert dp not in two.feasible(2)  # the same 4 ranks, two per node: twice the node's need
    assert 2 * plan_memory(PROF, dp, n=4, global_batch=64).peak > budget
    assert min_nodes_for(PlanOptions(PROF, 64, 160 * MIB), 1, 8) == 2  # ZeRO-1 over 2 nodes
    # two ranks with twice the memory: ZeRO-1 over the node's own two ranks fits one node
    assert min_nodes_for(PlanOptions(PROF, 64, 320 * MIB, ranks_per_node=2), 1, 8) == 1
    with pytest.raises(MemoryBudgetError, match="2 rank.s. per node"):  # 80 MiB a rank: never
        min_nodes_for(PlanOptions(PROF, 64, 160 * MIB, ranks_per_node=2), 1, 8)
    spec = spec_from_options({"job_id": "r", "max_nodes": 4, "memory_profile": PROF.as_dict(),
                              "global_batch": 64, "node_memory_bytes": 320 * MIB},
                             ranks_per_node=2)
    assert spec.meta["plan_options"].ranks_per_node == 2 and spec.min_nodes == 1


def test_rank_memory_is_one_accelerators_and_the_node_holds_one_per_rank() -> None:
    """``rank_memory_bytes`` (what a facility's accelerator has) times the ranks per node is
    the node budget; a node budget that says otherwise is refused, naming both."""
    opts = {"job_id": "r", "max_nodes": 4, "memory_profile": PROF.as_dict(), "global_batch": 64}
    per_rank = plan_options({**opts, "rank_memory_bytes": 160 * MIB}, ranks_per_node=2)
    assert (per_rank.budget, per_rank.rank_budget) == (320 * MIB, 160 * MIB)
    assert per_rank == plan_options({**opts, "node_memory_bytes": 320 * MIB}, ranks_per_node=2)
    both = {**opts, "node_memory_bytes": 320 * MIB, "rank_memory_bytes": 160 * MIB}
    assert plan_options(both, ranks_per_node=2).budget == 320 * MIB  # they agree
    assert plan_options({**opts, "rank_memory_bytes": 160 * MIB}).budget == 160 * MIB
    # ZeRO-1 over the node's two ranks fits 160 MiB a rank (test above): one node is enough
    assert spec_from_options({**opts, "rank_memory_bytes": 160 * MIB},
                             ranks_per_node=2).min_nodes == 1
    # the old advice, one accelerator's memory as node_memory_bytes, halves each rank's share:
    # 80 MiB a rank fits no plan at any size
    with pytest.raises(MemoryBudgetError, match=r"fits 160.0 MiB per node \(80.0 MiB a rank\)"):
        spec_from_options({**opts, "node_memory_bytes": 160 * MIB}, ranks_per_node=2)
    with pytest.raises(SpecError, match=r"node_memory_bytes=.*\(320.0 MiB\) and rank_memory_bytes="
                       r".*\(160.0 MiB\) disagree: with ranks_per_node=4 .* = 640.0 MiB"):
        spec_from_options(both, ranks_per_node=4)
    for bad in (0, -1.0, True, "40GB", float("nan"), float("inf")):
        with pytest.raises(SpecError, match="rank_memory_bytes must be a number of bytes > 0"):
            node_budget({"rank_memory_bytes": bad})
        with pytest.raises(SpecError, match="node_memory_bytes must be a number of bytes > 0"):
            node_budget({"node_memory_bytes": bad})
    assert node_budget({}) is None and node_budget({"rank_memory_bytes": None}) is None
    assert PlanOptions(PROF, 64).rank_budget is None


def test_budget_options_are_checked_at_submit_and_take_any_real_number() -> None:
    """A bad or inconsistent budget is refused by spec_from_options even when the job has no
    automatic plans (a fixed plan, or no memory_profile): prepare() would refuse it only once
    the job held its nodes, on every rank. A NumPy integer is a number of bytes."""
    import numpy as np

    fixed = {"max_nodes": 2, "plan": "zero1", "memory_profile": PROF.as_dict(), "global_batch": 64}
    with pytest.raises(SpecError, match="disagree"):
        spec_from_options({**fixed, "node_memory_bytes": 320 * MIB,
                           "rank_memory_bytes": 100 * MIB}, ranks_per_node=2)
    with pytest.raises(SpecError, match="rank_memory_bytes must be a number of bytes > 0"):
        spec_from_options({"max_nodes": 2, "rank_memory_bytes": "40GB"})
    assert spec_from_options({"max_nodes": 2, "rank_memory_bytes": 40 * 2**30}).max_nodes == 2
    assert node_budget({"rank_memory_bytes": np.int64(160 * MIB)}, ranks_per_node=2) == 320 * MIB
    assert node_budget({"node_memory_bytes": np.float32(2.0**20)}) == 2.0**20


class Recording(AllocationPolicy):
    """The MILP, recording every view it is asked to plan with."""

    def __init__(self) -> None:
        self.inner = make_policy("milp")
        self.views: list = []

    def allocate(self, snapshot, jobs):  # noqa: ANN001, ANN201
        self.views.append({v.job_id: v for v in jobs})
        return self.inner.allocate(snapshot, jobs)


def test_the_allocator_plans_with_the_profilers_curve_and_the_driver_runs_its_plan() -> None:
    pol, prof = Recording(), PlanProfiler()
    ctl = Controller(policy=pol, advisor=LinearPlaceholderAdvisor(), plans=prof)
    ctl.add_nodes(["a", "b", "c"], now_s=0)
    opts = {"job_id": "big", "min_nodes": 1, "max_nodes": 3, "memory_profile": PROF.as_dict(),
            "global_batch": 64, "node_memory_bytes": 160 * MIB, "total_samples": 1e9}
    ctl.submit(spec_from_options(opts), now_s=0)
    ctl.submit(spec_from_options({"job_id": "small", "max_nodes": 1, "total_samples": 1e9}),
               now_s=0)
    plan = ctl.replan(now_s=0)
    seen = pol.views[-1]
    assert seen["small"].curve.name.endswith("linear-placeholder")  # no plans: passed through
    big, jp = seen["big"], prof.jobs["big"]
    handed = jp.curve(3, name="big")  # the model's own plan-aware curve
    assert big.lo == handed.min_nodes == 2  # ZeRO-1 needs 2
    # the advisor's scaling (the placeholder: n samples/s) over the best plan's cost over DP
    assert big.curve.rate(1) == 0.0 and jp.plan_cost(1) is None
    for n in (2, 3):
        assert jp.plan_cost(n) > 1.0  # DP does not fit 160 MiB: ZeRO-1 is slower than DP
        assert big.curve.rate(n) == pytest.approx(n / jp.plan_cost(n))
    assert len(ctl.allocation.nodes_of("big")) >= 2, plan
    assert ctl.plan_for("big", 2) == handed.plans[2] and handed.plans[2].zero
    assert ctl.plan_for("small", 2) is None
    # readings with their plan refit the model (the first, a warm-up, is dropped): the next
    # view carries the new plan costs
    cost = jp.plan_cost(3)
    ctl.observe("big", n_nodes=2, samples_per_s=10.0, now_s=1, plan=handed.plans[2])
    assert jp.version == 0
    ctl.observe("big", n_nodes=2, samples_per_s=10.0, now_s=1, plan=handed.plans[2])
    assert jp.version == 1
    for _ in range(2):  # another size: the balance of the terms (and the plan costs) moves
        ctl.observe("big", n_nodes=3, samples_per_s=11.0, now_s=1, plan=handed.plans[3])
    assert jp.version == 2 and jp.plan_cost(3) != pytest.approx(cost)
    ctl.replan(now_s=1)
    again = pol.views[-1]["big"]
    assert again.curve.rate(3) == pytest.approx(3 / jp.plan_cost(3))
    ctl.finish("big", now_s=2)
    assert "big" not in prof.jobs and ctl.plan_for("big", 2) is None


def test_with_the_job_profiling_advisor_plan_jobs_get_plan_aware_views_too() -> None:
    """The JPA learns per size from the same readings; a plan job's view is still the profiler's
    curve and minimum size (inside the JPA's probe bounds when it probes the job)."""
    from malleparsl.jpa import JobProfilingAdvisor, ProbeFirst

    jpa, prof = JobProfilingAdvisor(), PlanProfiler()
    rec = Recording()
    rec.inner = ProbeFirst(advisor=jpa, inner="milp")
    ctl = Controller(policy=rec, advisor=jpa, plans=prof)
    ctl.add_nodes([f"n{i}" for i in range(4)], now_s=0)
    opts = {"job_id": "big", "min_nodes": 1, "max_nodes": 4, "memory_profile": PROF.as_dict(),
            "global_batch": 64, "node_memory_bytes": 160 * MIB, "total_samples": 1e9}
    ctl.submit(spec_from_options(opts), now_s=0)
    ctl.replan(now_s=0)
    view = rec.views[-1]["big"]
    pc = prof.jobs["big"].curve(4, name="big")
    assert view.lo == pc.min_nodes == 2 and view.hi >= 2 and view.curve.rate(1) == 0.0
    n = len(ctl.allocation.nodes_of("big"))
    plan = ctl.plan_for("big", n)
    for t in range(1, 4):
        ctl.observe("big", n_nodes=n, samples_per_s=50.0, now_s=t, plan=plan)
    # the JPA saw them (1 warm-up dropped) as the rates plain DP would have had (ZeRO-1 is
    # slower), so the plan's penalty is not counted twice in the view
    obs = list(jpa.records["big"].obs[n])
    assert len(obs) == 2 and all(o > 50.0 for o in obs), obs
    ctl.replan(now_s=4)
    assert rec.views[-1]["big"].curve.rate(n) == pytest.approx(50.0, rel=0.05)


def test_bench_rows_predict_each_case_from_the_others() -> None:
    """``malleparsl bench plans``' performance-model lines: leave-one-out predictions from a
    model fitted like the live profiler's; noise-free steps of a known model come back close."""
    pytest.importorskip("typer")
    from malleparsl.apps.bench_plans import perf_model_rows

    prof = MemoryProfile(params=500_000, act_per_sample=4e4, act_ckpt_per_sample=1e4)
    true = PlanPerfModel.default(prof).scaled(compute=0.05, recompute=0.08, micro_batch=0.01)
    cases = [("dp", 1), ("dp@mb=512", 1), ("ckpt", 1), ("ckpt", 2), ("zero1", 2),
             ("zero1+ckpt@mb=256", 3)]
    rows = [{"set": "tuned", "plan": p, "n": n, "width": 256, "depth": 8, "global_batch": 4096,
             "samples_per_s": true.rate(parse_plan(p), n=n, global_batch=4096),
             "params": prof.params, "act_per_sample": prof.act_per_sample,
             "act_ckpt_per_sample": prof.act_ckpt_per_sample} for p, n in cases]
    rows.append({**rows[0], "width": 384})  # another shape alone: nothing to fit it on
    got = perf_model_rows(rows)
    assert [(r["plan"], r["n"]) for r in got] == cases and all(r["fitted_on"] == 5 for r in got)
    assert max(abs(r["rate_error"]) for r in got) < 0.15


def _grow_case(policy: AllocationPolicy, advisor, profiler) -> list[int]:  # noqa: ANN001
    """A job whose plain DP fits everywhere (no budget), told it scales linearly, measured
    scaling linearly: the sizes it is given over a few replans."""
    ctl = Controller(policy=policy, advisor=advisor, plans=profiler)
    ctl.add_nodes([f"n{i}" for i in range(4)], now_s=0)
    ctl.submit(spec_from_options({"job_id": "j", "max_nodes": 4, "memory_profile": PROF.as_dict(),
                                  "global_batch": 64, "curve": [[1, 100], [4, 400]],
                                  "total_samples": 1e12}), now_s=0)
    sizes = []
    for t in range(60):
        ctl.replan(now_s=t)
        n = len(ctl.allocation.nodes_of("j"))
        sizes.append(n)
        if n:
            ctl.observe("j", n_nodes=n, samples_per_s=100.0 * n, now_s=t + 0.5,
                        plan=ctl.plan_for("j", n))
    return sizes


def test_the_profiler_keeps_the_advisors_scaling_so_plan_jobs_grow() -> None:
    """The model adds plan penalties only: a linearly scaling DP job is not held at its first
    size by the prior's communication terms (regression: it stayed on 1 node of 4)."""
    plain = _grow_case(make_policy("milp"), LinearPlaceholderAdvisor(), None)
    with_plans = _grow_case(make_policy("milp"), LinearPlaceholderAdvisor(), PlanProfiler())
    assert plain[-1] == 4 and with_plans[-1] == 4, with_plans


def test_the_profiler_does_not_cancel_the_jpas_exploration() -> None:
    from malleparsl.jpa import JobProfilingAdvisor, ProbeFirst

    jpa = JobProfilingAdvisor()
    sizes = _grow_case(ProbeFirst(advisor=jpa, inner="milp"), jpa, PlanProfiler())
    assert max(sizes) == 4 and sizes[-1] == 4, sizes


def test_warm_up_readings_after_a_plan_or_size_change_do_not_set_the_scale() -> None:
    jp = JobPlans(PlanOptions(PROF, 64, None))
    dp = parse_plan("dp")
    t = jp.prior.step_time(dp, n=2, global_batch=64)
    jp.observe(dp, 2, samples_per_s=64 / (50 * t))  # a slow first step (start-up): dropped
    assert jp.version == 0 and jp.model is jp.prior
    jp.observe(dp, 2, samples_per_s=64 / (2 * t))
    assert jp.model.step_time(dp, n=2, global_batch=64) == pytest.approx(2 * t, rel=0.05)
    jp.observe(dp, 3, samples_per_s=1e-3)  # a new size: its first reading is a warm-up again
    jp.observe(parse_plan("ckpt"), 3, samples_per_s=1e-3)  # and a new plan
    assert jp.version == 1


def test_sizes_with_no_plan_are_out_of_the_view_and_bad_sizes_raise_clearly() -> None:
    """ZeRO-1 alone needs 2 ranks, with or without a budget; ``accum`` needs 2 samples a rank."""
    zero = {"job_id": "z", "max_nodes": 4, "memory_profile": PROF.as_dict(), "global_batch": 64,
            "plans": ["zero1"], "total_samples": 1e9}
    assert spec_from_options(zero).min_nodes == 2
    with pytest.raises(MemoryBudgetError, match=r"no plan among \['zero1'\] can run at 1 node"):
        PlanOptions(PROF, 64, None, ("zero1",)).leanest_need(1)
    with pytest.raises(MemoryBudgetError, match=r"\['zero1'\] can run at 1 node"):
        JobPlans(PlanOptions(PROF, 64, None, ("zero1",))).choose(1)
    acc = {"job_id": "a", "max_nodes": 8, "memory_profile": PROF.as_dict(), "global_batch": 4,
           "plans": ["accum"], "total_samples": 1e9}
    for policy in ("equal-share", "milp"):
        pol, prof = Recording(), PlanProfiler()
        pol.inner = make_policy(policy)
        ctl = Controller(policy=pol, advisor=LinearPlaceholderAdvisor(), plans=prof)
        ctl.add_nodes([f"n{i}" for i in range(8)], now_s=0)
        ctl.submit(spec_from_options(acc), now_s=0)
        ctl.submit(spec_from_options(zero), now_s=0)
        ctl.replan(now_s=0)
        assert pol.views[-1]["a"].hi == 3  # 4 samples over 4 ranks: 1 each, nothing to split
        assert pol.views[-1]["z"].lo == 2
        n_a, n_z = (len(ctl.allocation.nodes_of(j)) for j in "az")
        assert 1 <= n_a <= 3 and n_z >= 2
        assert ctl.plan_for("a", n_a).micro_batch and ctl.plan_for("z", n_z).zero
    # a plan runs at 1..3 nodes, but min_nodes=4 leaves no size: refused at submit, not at launch
    with pytest.raises(MemoryBudgetError, match=r"runs at any size from 4 to max_nodes=8.*1\.\.3"):
        spec_from_options({**acc, "min_nodes": 4})


def test_fsdp_is_chosen_where_it_is_the_only_plan_that_fits() -> None:
    """140 MiB a node, SGD with momentum (one optimizer state), ZeRO-1 on gloo (1.3 parameter
    copies besides): DP needs 160 MB (parameters, gradients, momentum, sync buffer), ZeRO-1
    more; FSDP2 over 2 ranks holds 60 MB of shards and 80 MB more at a checkpoint (the whole
    plain parameters and momentum, gathered on rank 0), so it is the plan from 2 nodes on, and
    only where the global batch splits evenly. Where DP fits as well, DP is chosen. FSDP2 is
    among the default families (a job that lists none gets it).

    With Adam (two states) the same job runs on FSDP2 from 2 nodes too: its checkpoints are
    written and read sharded, 1.5 units beyond the shards (while they gathered the plain state
    on rank 0, 5 w P and a unit over 2 ranks, above DP's whole peak, it needed 8 nodes)."""
    from malleparsl.plans import FAMILIES

    prof = MemoryProfile(params=10_000_000, act_per_sample=2e6, act_ckpt_per_sample=2e5,
                         unit_params=500_000, opt_states=1, zero_overhead=1.3)
    with_fsdp = FAMILIES
    no_fsdp = tuple(b for b in FAMILIES if not b.startswith("fsdp"))
    assert {"fsdp", "fsdp+ckpt"} <= set(FAMILIES)
    assert plan_aware_curve(PlanPerfModel.default(prof), global_batch=64, budget=140 * MIB,
                            n_max=8, bases=no_fsdp).min_nodes is None  # without FSDP2: none fits
    assert plan_aware_curve(PlanPerfModel.default(prof), global_batch=64, budget=140 * MIB,
                            n_max=8).min_nodes == 2  # the default families
    jp = JobPlans(PlanOptions(prof, 64, 140 * MIB, with_fsdp))
    pc = jp.curve(8)
    assert pc.min_nodes == 2 and pc.curve.rate(1) == 0.0
    assert all(pc.plans[n].fsdp for n in (2, 4, 8)) and jp.choose(2).fsdp
    assert 3 not in pc.plans and jp.plan_cost(3) is None  # 64 samples do not split over 3
    assert jp.plan_cost(2) > 1.0  # slower than DP would be
    assert jp.cost_vs_dp(jp.choose(2), 2) == jp.plan_cost(2)
    assert min_nodes_for(PlanOptions(prof, 64, 140 * MIB, with_fsdp), 1, 8) == 2
    roomy = JobPlans(PlanOptions(prof, 64, 160 * MIB, with_fsdp))
    assert any(p.fsdp for p in roomy.opts.feasible(2)) and not roomy.choose(2).fsdp
    adam = replace(prof, opt_states=2, zero_overhead=0.0)
    assert min_nodes_for(PlanOptions(adam, 64, 140 * MIB, with_fsdp), 1, 8) == 2
    two = plan_memory(adam, parse_plan("fsdp@mb=4"), n=2, global_batch=64)
    assert two.checkpoint == 1.5 * 2e6 and two.peak == pytest.approx(100e6)  # the step's peak
    assert two.peak < plan_memory(adam, parse_plan("dp@mb=4"), n=2, global_batch=64).peak
    # live: the profiler hands the allocator that curve and the driver that plan
    pol, profiler = Recording(), PlanProfiler()
    ctl = Controller(policy=pol, advisor=LinearPlaceholderAdvisor(), plans=profiler)
    ctl.add_nodes(["a", "b", "c", "d"], now_s=0)
    ctl.submit(spec_from_options({
        "job_id": "f", "min_nodes": 1, "max_nodes": 4, "memory_profile": prof.as_dict(),
        "global_batch": 64, "node_memory_bytes": 140 * MIB, "total_samples": 1e9}), now_s=0)
    ctl.replan(now_s=0)
    view = pol.views[-1]["f"]
    assert view.lo == 2 and view.curve.rate(3) == 0.0
    got = len(ctl.allocation.nodes_of("f"))
    assert got in (2, 4) and ctl.plan_for("f", got).fsdp


def test_adjust_reuses_a_plan_jobs_view_until_a_reading_or_a_new_curve() -> None:
    """``PlanProfiler.adjust`` runs at every replan; an unchanged job (same model version, same
    size range, the curve advisor's same curve object) gets the curve built last time, a new
    reading or a new advisor curve rebuilds it (with the new costs)."""
    from malleparsl.allocator.base import ClusterSnapshot, JobView
    from malleparsl.model import ScalingCurve

    spec = spec_from_options({"job_id": "j", "min_nodes": 1, "max_nodes": 3,
                              "memory_profile": PROF.as_dict(), "global_batch": 64,
                              "node_memory_bytes": 160 * MIB, "total_samples": 1e9})
    prof = PlanProfiler()
    prof.register(spec, now_s=0)
    snap = ClusterSnapshot(now_s=0, nodes=("a", "b", "c"))
    base = ScalingCurve((1, 2, 3), (100.0, 190.0, 270.0))
    first = prof.adjust(snap, [JobView(spec, base)])[0].curve
    assert prof.adjust(snap, [JobView(spec, base)])[0].curve is first  # cache hit
    jp = prof.jobs["j"]
    for n, rate in ((2, 150.0), (3, 60.0)):  # the first reading at a size is a warm-up; the
        for _ in range(2):  # first kept one scales the prior, the next (a slow 3) refits it
            prof.observe("j", jp.choose(n), n, samples_per_s=rate, now_s=1)
    after = prof.adjust(snap, [JobView(spec, base)])[0].curve
    assert after is not first and after.rate(2) != pytest.approx(first.rate(2))  # missed: refit
    assert after.rate(2) == pytest.approx(190.0 / jp.plan_cost(2))
    assert prof.adjust(snap, [JobView(spec, base)])[0].curve is after
    other = ScalingCurve((1, 2, 3), (100.0, 190.0, 270.0))  # equal, but a new advisor curve
    assert prof.adjust(snap, [JobView(spec, other)])[0].curve is not after


def test_a_size_with_no_plan_inside_the_range_is_never_given() -> None:
    """FSDP2 runs only where the global batch splits evenly, so a job that fits only under it
    has holes in its runnable sizes (64 samples: 2 and 4 nodes, not 3). The view lists them
    (``JobView.sizes``); a policy answering a hole breaks the rules and its answer is refused
    (the current allocation stays), and a node lost at 4 nodes, with the policy's answer
    refused, leaves the job the largest runnable size below, on nodes it held: the driver is
    never asked to launch a size with no plan."""
    from malleparsl.model import Allocation

    class Take(AllocationPolicy):
        """Gives the job the first ``k`` nodes."""

        k = 3

        def allocate(self, snapshot, jobs):  # noqa: ANN001, ANN201
            return Allocation({jobs[0].job_id: frozenset(sorted(snapshot.nodes)[: self.k])})

    prof = MemoryProfile(params=10_000_000, act_per_sample=2e6, act_ckpt_per_sample=2e5,
                         unit_params=500_000, opt_states=1, zero_overhead=1.3)
    pol = Take()
    ctl = Controller(policy=pol, advisor=LinearPlaceholderAdvisor(), plans=PlanProfiler())
    ctl.add_nodes(["a", "b", "c", "d", "e"], now_s=0)
    ctl.submit(spec_from_options({
        "job_id": "f", "min_nodes": 1, "max_nodes": 4, "memory_profile": prof.as_dict(),
        "global_batch": 64, "node_memory_bytes": 140 * MIB, "total_samples": 1e9}), now_s=0)
    ctl.replan(now_s=0)  # 3 asked: no plan there, refused
    assert not ctl.allocation.nodes_of("f")
    pol.k = 2
    ctl.replan(now_s=0.5)
    assert ctl.allocation.nodes_of("f") == {"a", "b"} and ctl.plan_for("f", 2).fsdp
    pol.k = 4
    ctl.replan(now_s=1)
    assert ctl.allocation.nodes_of("f") == {"a", "b", "c", "d"} and ctl.plan_for("f", 4).fsdp
    ctl.remove_nodes(["c"], now_s=2)  # lost: 3 left to the job, a hole
    pol.k = 3
    ctl.replan(now_s=2)
    got = ctl.allocation.nodes_of("f")
    assert len(got) == 2 and got <= {"a", "b", "d"}


def test_the_placeholder_advisor_keeps_one_curve_per_job() -> None:
    """A new placeholder object at every replan made the profiler's curve cache always miss."""
    from malleparsl.allocator.base import ClusterSnapshot

    ctl = Controller(policy=make_policy("milp"), advisor=LinearPlaceholderAdvisor())
    ctl.add_nodes(["a", "b"], now_s=0)
    ctl.submit(spec_from_options({"job_id": "p", "max_nodes": 2}), now_s=0)
    snap = ClusterSnapshot(now_s=0.0, nodes=("a", "b"))
    first = ctl.advisor.views(snap, ctl.active_jobs or list(ctl.jobs.values()), ctl.allocation)
    again = ctl.advisor.views(snap, ctl.active_jobs or list(ctl.jobs.values()), ctl.allocation)
    assert first[0].curve is again[0].curve and first[0].curve.rate(2) == 2.0
    ctl.advisor.forget("p")
    assert ctl.advisor.views(snap, list(ctl.jobs.values()), ctl.allocation)[0].curve \
        is not first[0].curve


def test_a_minimum_inside_a_hole_moves_up_to_a_size_with_a_plan() -> None:
    """FSDP2-only job, 64 samples: runs at 2 and 4 nodes, not 3. min_nodes=3 becomes 4 (was 3,
    so a probe at the minimum landed in the hole)."""
    prof = MemoryProfile(params=10_000_000, act_per_sample=2e6, act_ckpt_per_sample=2e5,
                         unit_params=500_000, opt_states=1, zero_overhead=1.3)
    from malleparsl.plans import FAMILIES

    opts = PlanOptions(prof, 64, 140 * MIB, FAMILIES)
    assert min_nodes_for(opts, 3, 8) == 4 and min_nodes_for(opts, 1, 8) == 2
    from malleparsl.allocator.base import ClusterSnapshot, JobView
    from malleparsl.model import JobSpec, ScalingCurve

    prof_ = PlanProfiler()
    spec = JobSpec("f", max_nodes=8, meta={"plan_options": opts})
    prof_.register(spec, 0.0)
    curve = ScalingCurve((1, 8), (1.0, 8.0))
    snap = ClusterSnapshot(now_s=0.0, nodes=tuple("abcdefgh"))
    view = prof_.adjust(snap, [JobView(spec, curve)])[0]
    assert view.sizes == (2, 4, 8) and (view.lo, view.hi) == (2, 8)  # 64 over 2, 4, 8 nodes
    small = ClusterSnapshot(now_s=0.0, nodes=tuple("abc"))  # 3 nodes: only 2 runs
    assert prof_.adjust(small, [JobView(spec, curve)])[0].sizes == (2,)
    plain = JobSpec("p", max_nodes=8, meta={"plan_options": PlanOptions(prof, 64, 390 * MIB)})
    prof_.register(plain, 0.0)
    assert prof_.adjust(snap, [JobView(plain, curve)])[0].sizes is None  # no hole: no list


def test_a_job_with_no_plan_within_its_bounds_is_given_no_nodes() -> None:
    """A job opted in through ``meta["plan_options"]`` keeps the spec's minimum (1 here); the
    FSDP2-only job runs at 2 and 4 nodes. On a 1-node cluster no plan fits at any size, and a
    view narrowed to 1 node has none within its bounds: the view must allow no size (old code
    before the holes change: the controller snapped the answer to 0; after it, the view passed
    through unchanged and the job was given 1 node, where launching it fails)."""
    from malleparsl.allocator.base import ClusterSnapshot, JobView
    from malleparsl.model import JobSpec, ScalingCurve
    from malleparsl.plans import FAMILIES

    prof = MemoryProfile(params=10_000_000, act_per_sample=2e6, act_ckpt_per_sample=2e5,
                         unit_params=500_000, opt_states=1, zero_overhead=1.3)
    opts = PlanOptions(prof, 64, 140 * MIB, FAMILIES)
    spec = JobSpec("f", max_nodes=4, meta={"plan_options": opts})
    pp = PlanProfiler()
    pp.register(spec, 0.0)
    curve = ScalingCurve((1, 4), (1.0, 4.0))
    one = pp.adjust(ClusterSnapshot(now_s=0.0, nodes=("a",)), [JobView(spec, curve)])[0]
    narrowed = pp.adjust(ClusterSnapshot(now_s=0.0, nodes=tuple("abcd")),
                         [JobView(spec, curve, max_nodes=1)])[0]
    assert not one.allows(1) and not narrowed.allows(1)
    for name in ("greedy", "equal-share", "milp"):
        ctl = Controller(policy=make_policy(name), advisor=LinearPlaceholderAdvisor(),
                         plans=PlanProfiler())
        ctl.add_nodes(["a"], now_s=0)
        ctl.submit(spec, now_s=0)
        ctl.replan(now_s=0)
        assert ctl.allocation.size("f") == 0, name


def test_no_plan_runs_where_the_ranks_outnumber_the_global_batch() -> None:
    """Global batch 4, 2 ranks a node: at 3 nodes (6 ranks) two ranks would get no sample (old
    code: every plan "fit" there, the live split gave them local batch 0 and their nodes
    trained nothing). No plan runs above 2 nodes: the profiler's view stops at 2 with the job
    still free to 2; a min_nodes of 3 is refused at submit naming the three values."""
    from malleparsl.allocator.base import ClusterSnapshot, JobView
    from malleparsl.apps.sharding import GlobalBatchSampler
    from malleparsl.model import ScalingCurve

    assert GlobalBatchSampler(dataset_size=8, global_batch=4, world_size=6,
                              rank=5).plan.local_batch == 0  # what the live split does
    opts = PlanOptions(PROF, 4, None, ranks_per_node=2)
    assert opts.feasible(2) and opts.feasible(3) == [] and opts.max_batch_nodes == 2
    with pytest.raises(MemoryBudgetError, match=r"6 ranks exceed global_batch=4"):
        JobPlans(opts).choose(3)
    job = {"job_id": "b", "max_nodes": 4, "memory_profile": PROF.as_dict(), "global_batch": 4,
           "total_samples": 1e6}
    spec = spec_from_options(job, ranks_per_node=2)
    prof = PlanProfiler()
    prof.register(spec, now_s=0)
    snap = ClusterSnapshot(now_s=0, nodes=("a", "b", "c", "d"))
    view = prof.adjust(snap, [JobView(spec, ScalingCurve((1, 4), (1.0, 4.0)))])[0]
    assert (view.min_nodes, view.max_nodes) == (1, 2)
    with pytest.raises(SpecError, match=r"min_nodes=3 is too large: 3 node\(s\) x "
                       r"ranks_per_node=2 = 6 ranks exceed global_batch=4 .*at most 2 node"):
        spec_from_options({**job, "min_nodes": 3}, ranks_per_node=2)
    # memory needs more nodes than the batch allows: said so, not "raise max_nodes"
    with pytest.raises(MemoryBudgetError, match=r"even at 2 node\(s\), the most global_batch=4"
                       r".*raise global_batch"):
        min_nodes_for(PlanOptions(PROF, 4, 60 * MIB, ranks_per_node=2), 1, 8)
