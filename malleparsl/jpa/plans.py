"""Per-plan performance model: seconds per step of every execution plan at every size.

The JPA learns a job's throughput per size; with execution plans the size alone no longer
says how fast a step is. Time per step of plan ``p`` at ``n`` ranks (``L``: the largest local
batch, ``k``: micro-batches per step, ``P``: parameters, ``W = w P`` gradient bytes)::

    t(p, n) = c L                       compute (forward + backward) per sample
            + c_r L [ckpt]              recomputation of checkpointed blocks
            + o k                       per micro-batch overhead (kernel launches, Python)
            + u P / (n if zero1 else 1) optimizer step over the parameters this rank owns
            + g W (2 (n-1)/n + [zero1] (n-1)/n)   ring all-reduce, then the ZeRO broadcast
            + l log2(n)                 collective latency

Linear in its six coefficients, it is fitted like the JPA's curve models: non-negative least
squares on relative errors (:func:`fit_perf`), pulled towards a prior (:meth:`PlanPerfModel.default`)
with weight ``prior_weight`` so two readings already rank the plans. A job's plan-aware curve
is then ``rate(n) = G / min_p t(p, n)`` over the plans that fit the node's memory, and its
minimum size is the smallest size any plan fits (:func:`plan_aware_curve`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from malleparsl.errors import SpecError
from malleparsl.model import ScalingCurve
from malleparsl.plans import FAMILIES, ExecPlan, MemoryProfile, candidate_plans, fits, local_batch

TERMS = ("compute", "recompute", "micro_batch", "optimizer", "comm_byte", "latency")


@dataclass(frozen=True)
class StepReading:
    """One measured step: plan, ranks, global batch and seconds per step."""

    plan: ExecPlan
    n: int
    global_batch: int
    step_s: float


def features(prof: MemoryProfile, plan: ExecPlan, n: int, global_batch: int) -> np.ndarray:
    """The six terms' multipliers for one (plan, size); see the module docstring."""
    loc = local_batch(global_batch, n)
    mb = min(loc, plan.micro_batch or loc)
    k = math.ceil(loc / mb)
    w = float(prof.bytes_per_param * prof.params)
    frac = (n - 1) / n
    comm = w * (2 * frac + (frac if plan.zero else 0.0))
    return np.array([
        loc, loc if plan.checkpoint else 0.0, k,
        prof.params / (n if plan.zero else 1), comm, math.log2(n),
    ], dtype=float)


@dataclass(frozen=True)
class PlanPerfModel:
    """Fitted coefficients (seconds per unit of each term) for one job's model."""

    profile: MemoryProfile
    compute: float  # s per sample (forward + backward)
    recompute: float  # s per sample recomputed under checkpointing
    micro_batch: float  # s per micro-batch pass
    optimizer: float  # s per parameter stepped
    comm_byte: float  # s per byte moved by a collective (1 / bandwidth)
    latency: float  # s per log2(n) of collective latency

    @property
    def coeffs(self) -> np.ndarray:
        return np.array([getattr(self, t) for t in TERMS], dtype=float)

    @classmethod
    def default(cls, prof: MemoryProfile, *, s_per_sample: float = 1e-3) -> PlanPerfModel:
        """A prior before any reading: recompute is a third of compute (one more forward),
        a micro-batch costs 2 samples' time, 1 GB/s links, 1 ns per parameter step."""
        return cls(prof, s_per_sample, s_per_sample / 3, 2 * s_per_sample, 1e-9, 1e-9, 1e-4)

    def step_time(self, plan: ExecPlan, *, n: int, global_batch: int) -> float:
        return float(features(self.profile, plan, n, global_batch) @ self.coeffs)

    def rate(self, plan: ExecPlan, *, n: int, global_batch: int) -> float:
        return global_batch / self.step_time(plan, n=n, global_batch=global_batch)

    def scaled(self, **factors: float) -> PlanPerfModel:
        vals = {t: getattr(self, t) * factors.get(t, 1.0) for t in TERMS}
        return PlanPerfModel(self.profile, **vals)


def fit_perf(
    readings: Sequence[StepReading], prior: PlanPerfModel, *, prior_weight: float = 0.3
) -> PlanPerfModel:
    """Non-negative least squares on relative step-time errors, pulled towards ``prior``.

    The unknowns are multipliers of the prior's coefficients, so terms that no reading
    exercises (e.g. recomputation when no checkpointed plan ran) stay at the prior.
    """
    from scipy.optimize import nnls

    if not readings:
        return prior
    base = prior.coeffs
    rows, rhs = [], []
    for r in readings:
        if not (r.step_s > 0 and math.isfinite(r.step_s)):
            raise SpecError(f"step_s must be a finite number > 0, got {r.step_s!r}")
        rows.append(features(prior.profile, r.plan, r.n, r.global_batch) * base / r.step_s)
        rhs.append(1.0)
    scale = prior_weight * np.ones(len(TERMS))
    a = np.vstack([np.array(rows), np.diag(scale)])
    b = np.concatenate([np.array(rhs), scale])
    mult, _ = nnls(a, b)
    return PlanPerfModel(prior.profile, *(base * mult))


@dataclass(frozen=True)
class PlanCurve:
    """The best feasible plan per size and the rate it gives; ``min_nodes`` is where any fits."""

    curve: ScalingCurve | None
    plans: dict[int, ExecPlan]
    min_nodes: int | None


def plan_aware_curve(
    perf: PlanPerfModel,
    *,
    global_batch: int,
    budget: float | None,
    n_max: int,
    bases: Iterable[str] = FAMILIES,
    name: str = "",
) -> PlanCurve:
    """``rate(n) = G / min_p t(p, n)`` over plans that fit; sizes where none fits get rate 0."""
    bases = tuple(bases)
    plans: dict[int, ExecPlan] = {}
    rates = []
    for n in range(1, n_max + 1):
        ok = [p for p in candidate_plans(global_batch, n, bases=bases)
              if budget is None or fits(perf.profile, p, n=n, global_batch=global_batch,
                                        budget=budget)]
        if not ok:
            rates.append(0.0)
            continue
        best = min(ok, key=lambda p: (perf.step_time(p, n=n, global_batch=global_batch), p.name))
        plans[n] = best
        rates.append(perf.rate(best, n=n, global_batch=global_batch))
    if not plans:
        return PlanCurve(None, {}, None)
    curve = ScalingCurve(tuple(range(1, n_max + 1)), tuple(rates), name=name)
    return PlanCurve(curve, plans, min(plans))


class PlanChooser:
    """One job's plan choice at every (re)launch, learning from the steps it measures.

    >>> prof = MemoryProfile(params=10_000_000, act_per_sample=2e6, act_ckpt_per_sample=2e5)
    >>> ch = PlanChooser(prof, global_batch=64, budget=200 * 2**20)
    >>> ch.choose(1).name, ch.choose(4).name
    ('dp@mb=16', 'dp')
    >>> ch.observe(ch.choose(4), 4, samples_per_s=900.0)   # a measured rate refines the model
    """

    def __init__(
        self, profile: MemoryProfile, *, global_batch: int, budget: float | None,
        bases: Sequence[str] = FAMILIES, prior: PlanPerfModel | None = None,
    ) -> None:
        self.profile, self.global_batch, self.budget = profile, global_batch, budget
        self.bases = tuple(bases)
        self.prior = prior or PlanPerfModel.default(profile)
        self.readings: list[StepReading] = []
        self.model = self.prior

    @classmethod
    def from_options(cls, options: dict) -> PlanChooser | None:
        """None unless the job opted in (see :func:`malleparsl.plans.plan_options`)."""
        from malleparsl.plans import plan_options

        got = plan_options(options)
        if got is None:
            return None
        prof, gb, budget, bases = got
        return cls(prof, global_batch=gb, budget=budget, bases=bases)

    def observe(self, plan: ExecPlan, n: int, *, samples_per_s: float) -> None:
        if samples_per_s > 0 and math.isfinite(samples_per_s):
            self.readings.append(StepReading(plan, n, self.global_batch,
                                             self.global_batch / samples_per_s))
            self.readings = self.readings[-64:]
            self.model = fit_perf(self.readings, self.prior)

    def choose(self, n: int) -> ExecPlan:
        """The fastest plan that fits at ``n`` (raises ``MemoryBudgetError`` if none does)."""
        from malleparsl.plans import best_plan

        return best_plan(self.profile, n=n, global_batch=self.global_batch, budget=self.budget,
                         step_time=self.model.step_time, bases=self.bases)
