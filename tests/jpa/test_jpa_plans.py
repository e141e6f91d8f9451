"""The per-plan performance model: fitting from measured steps, plan-aware curves, choice."""

from __future__ import annotations

import pytest

from malleparsl.jpa.plans import PlanChooser, PlanPerfModel, StepReading, fit_perf, plan_aware_curve
from malleparsl.plans import MemoryBudgetError, MemoryProfile, parse_plan

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


def test_chooser_learns_measured_step_times_towards_the_readings() -> None:
    ch = PlanChooser(PROF, global_batch=64, budget=None)
    assert ch.choose(2).name == "dp"
    tight = PlanChooser(PROF, global_batch=64, budget=200 * MIB)
    first = tight.choose(1)
    assert first.micro_batch is not None or first.checkpoint
    for _ in range(3):  # measured: this plan is 5x slower than the prior said
        tight.observe(first, 1, samples_per_s=64 / (5 * tight.prior.step_time(first, n=1, global_batch=64)))
    assert tight.model.step_time(first, n=1, global_batch=64) > 2 * tight.prior.step_time(first, n=1, global_batch=64)
    with pytest.raises(MemoryBudgetError, match="no execution plan fits"):
        PlanChooser(PROF, global_batch=64, budget=10 * MIB).choose(1)
