"""Per-plan performance model: seconds per step of every execution plan at every size.

The JPA learns a job's throughput per size; with execution plans the size alone no longer
says how fast a step is. Time per step of plan ``p`` at ``n`` ranks (``L``: the largest local
batch, ``k``: micro-batches per step, ``P``: parameters, ``W = w P`` gradient bytes)::

    t(p, n) = c L                       compute (forward + backward) per sample
            + c_r L [ckpt]              recomputation of checkpointed blocks
            + o k                       per micro-batch overhead (kernel launches, Python)
            + u P / (n if sharded else 1)  optimizer step over the parameters this rank owns
            + g W (2 (n-1)/n + [zero1] (n-1)/n)   ring all-reduce, then the ZeRO broadcast
            + l log2(n)                 collective latency

and under FSDP2 (``fsdp``), whose every pass gathers the parameters twice (forward, backward)
and reduce-scatters the gradients, the last two terms are ``g W 3 k (n-1)/n + l 3 k log2(n)``.

Linear in its six coefficients, it is fitted like the JPA's curve models: non-negative least
squares on relative errors (:func:`fit_perf`), pulled towards a prior (:meth:`PlanPerfModel.default`)
with weight ``prior_weight`` so two readings already rank the plans. A job's plan-aware curve
is then ``rate(n) = G / min_p t(p, n)`` over the plans that fit the node's memory, and its
minimum size is the smallest size any plan fits (:func:`plan_aware_curve`).

Live, :class:`PlanProfiler` is where that happens, once per controller: the drivers report
every measured step with the plan that ran, it refits each job's model (:class:`JobPlans`),
gives the allocator a plan-aware curve and minimum size, and tells the driver which plan to
run at the size the allocator chose. Its curve keeps the curve advisor's scaling (learnt per
size) and takes from the model only the best feasible plan's cost relative to plain DP at each
size, as the simulator does (:class:`~malleparsl.sim.plans.MeasuredPlusPlanCosts` with
:func:`plan_aware_curve`): a prior's communication terms must not decide how a job scales.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from malleparsl.allocator.base import ClusterSnapshot, JobView
from malleparsl.controller import PlanAdvisor
from malleparsl.errors import SpecError
from malleparsl.model import JobSpec, ScalingCurve
from malleparsl.plans import (
    FAMILIES,
    ExecPlan,
    MemoryBudgetError,
    MemoryProfile,
    PlanOptions,
    local_batch,
)

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
    rounds = 3 * k if plan.fsdp else 1  # collectives on the critical path, per step
    comm = w * (3 * k * frac if plan.fsdp else 2 * frac + (frac if plan.zero else 0.0))
    return np.array([
        loc, loc if plan.checkpoint else 0.0, k,
        prof.params / (n if plan.sharded else 1), comm, rounds * math.log2(n),
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


class StepTimeModel(Protocol):
    """Anything that predicts seconds per step of a plan at ``n`` ranks for a profiled model:
    the fitted :class:`PlanPerfModel` live, a measured curve plus plan costs in the simulator."""

    profile: MemoryProfile

    def step_time(self, plan: ExecPlan, *, n: int, global_batch: int) -> float: ...


@dataclass(frozen=True)
class PlanCurve:
    """The best feasible plan per size and the rate it gives; ``min_nodes`` is where any fits."""

    curve: ScalingCurve | None
    plans: dict[int, ExecPlan]
    min_nodes: int | None


def best_feasible(perf: StepTimeModel, opts: PlanOptions, nodes: int) -> tuple[ExecPlan, float] | None:
    """The fastest plan that fits at ``nodes`` nodes and its step time (None if none fits)."""
    n, gb = opts.ranks(nodes), opts.global_batch
    timed = [(perf.step_time(p, n=n, global_batch=gb), p.name, p) for p in opts.feasible(nodes)]
    if not timed:
        return None
    t, _, plan = min(timed, key=lambda x: (x[0], x[1]))
    return plan, t


def plan_aware_curve(
    perf: StepTimeModel,
    *,
    global_batch: int,
    budget: float | None,
    n_max: int,
    bases: Iterable[str] = FAMILIES,
    name: str = "",
    ranks_per_node: int = 1,
) -> PlanCurve:
    """``rate(n) = G / min_p t(p, n)`` over plans that fit; sizes where none fits get rate 0.

    ``n`` counts nodes of ``ranks_per_node`` ranks sharing one node's ``budget``. The one
    function the live controller (through :class:`PlanProfiler`) and the simulator
    (:mod:`malleparsl.sim.plans`) build their plan-aware curves with.
    """
    opts = PlanOptions(perf.profile, global_batch, budget, tuple(bases), ranks_per_node)
    plans: dict[int, ExecPlan] = {}
    rates = []
    for n in range(1, n_max + 1):
        got = best_feasible(perf, opts, n)
        if got is None:
            rates.append(0.0)
            continue
        plans[n] = got[0]
        rates.append(global_batch / got[1])
    if not plans:
        return PlanCurve(None, {}, None)
    curve = ScalingCurve(tuple(range(1, n_max + 1)), tuple(rates), name=name)
    return PlanCurve(curve, plans, min(plans))


class JobPlans:
    """One job's per-plan performance model, refitted from every measured step.

    Sizes are nodes (see :class:`~malleparsl.plans.PlanOptions`). Before any reading the model
    is the prior, scaled to the job's given curve when it has one; the first reading rescales
    the prior to the measured step time (so its scale is right and the fit only corrects the
    balance of the terms).

    >>> prof = MemoryProfile(params=10_000_000, act_per_sample=2e6, act_ckpt_per_sample=2e5)
    >>> jp = JobPlans(PlanOptions(prof, 64, 200 * 2**20))
    >>> jp.choose(1).name, jp.choose(4).name
    ('dp@mb=16', 'dp')
    >>> JobPlans(PlanOptions(prof, 64, 160 * 2**20)).choose(2).name  # DP does not fit: ZeRO-1
    'zero1'
    >>> for _ in range(2):  # a measured rate refines the model (the first is a warm-up)
    ...     jp.observe(jp.choose(4), 4, samples_per_s=900.0)
    >>> round(jp.model.rate(ExecPlan(), n=4, global_batch=64))
    900
    """

    def __init__(self, opts: PlanOptions, *, prior: PlanPerfModel | None = None,
                 window: int = 64, prior_weight: float = 0.3, warmup_obs: int = 1) -> None:
        self.opts = opts
        self.prior = prior or PlanPerfModel.default(opts.profile)
        self.window, self.prior_weight, self.warmup_obs = window, prior_weight, warmup_obs
        self.readings: list[StepReading] = []
        self.model = self.prior
        self.version = 0
        self._cache: dict[int, tuple[int, PlanCurve]] = {}
        self._costs: dict[int, tuple[int, list[float | None]]] = {}
        self._views: dict[tuple[int, int], tuple[ScalingCurve, ScalingCurve]] = {}
        self._last: tuple[ExecPlan, int] | None = None
        self._skip = 0

    @classmethod
    def for_spec(cls, spec: JobSpec, opts: PlanOptions) -> JobPlans:
        """A job's plans, the prior scaled to its given curve at one node (if any)."""
        prior = PlanPerfModel.default(opts.profile)
        if spec.curve is None or not spec.curve.rate(1) > 0:
            return cls(opts, prior=prior)
        t = prior.step_time(ExecPlan(), n=opts.ranks(1), global_batch=opts.global_batch)
        want = opts.global_batch / spec.curve.rate(1)
        return cls(opts, prior=prior.scaled(**dict.fromkeys(TERMS, want / t)))

    def observe(self, plan: ExecPlan, nodes: int, *, samples_per_s: float) -> None:
        """One measured rate of ``plan`` at ``nodes``; the first ``warmup_obs`` readings after
        the plan or the size changed are dropped (start-up steps are slow, as in the JPA's
        :class:`~malleparsl.jpa.knowledge.JobRecord`)."""
        if not (samples_per_s > 0 and math.isfinite(samples_per_s)):
            return
        if self._last != (plan, nodes):
            self._last, self._skip = (plan, nodes), self.warmup_obs
        if self._skip > 0:
            self._skip -= 1
            return
        gb, n = self.opts.global_batch, self.opts.ranks(nodes)
        reading = StepReading(plan, n, gb, gb / samples_per_s)
        if not self.readings:  # scale the prior to the first measured step
            f = reading.step_s / self.prior.step_time(plan, n=n, global_batch=gb)
            self.prior = self.prior.scaled(**dict.fromkeys(TERMS, f))
        self.readings = [*self.readings, reading][-self.window:]
        self.model = fit_perf(self.readings, self.prior, prior_weight=self.prior_weight)
        self.version += 1

    def plan_costs(self, n_max: int) -> list[float | None]:
        """:meth:`plan_cost` at 1..``n_max`` nodes (cached until the next reading: the
        controller asks at every replan, and each size weighs every candidate plan)."""
        hit = self._costs.get(n_max)
        if hit is not None and hit[0] == self.version:
            return hit[1]
        costs = [self.plan_cost(n) for n in range(1, n_max + 1)]
        # one entry per cluster size seen since the last reading (older ones are stale)
        self._costs = {k: v for k, v in self._costs.items() if v[0] == self.version}
        self._costs[n_max] = (self.version, costs)
        return costs

    def scaled_curve(self, base: ScalingCurve, n_max: int, *, name: str = "") -> ScalingCurve:
        """``base``'s rate at 1..``n_max`` divided by :meth:`plan_costs` (0 where no plan fits).

        Cached under (model version, ``n_max``) with the very ``base`` object it was built from:
        the controller asks at every replan, and an unchanged job (no new reading, the curve
        advisor's same curve) then costs nothing; a reading or a new curve rebuilds it."""
        key = (self.version, n_max)
        hit = self._views.get(key)
        if hit is not None and hit[0] is base:
            return hit[1]
        costs = self.plan_costs(n_max)
        rates = tuple(0.0 if c is None else base.rate(n) / c for n, c in enumerate(costs, 1))
        curve = ScalingCurve(tuple(range(1, n_max + 1)), rates, name=name)
        self._views = {k: v for k, v in self._views.items() if k[0] == self.version}
        self._views[key] = (base, curve)
        return curve

    def cost_vs_dp(self, plan: ExecPlan, nodes: int) -> float:
        """The model's step time of ``plan`` at ``nodes`` over plain data parallelism's there
        (the one plan-over-DP ratio: :meth:`plan_cost` takes it for the best feasible plan,
        :meth:`PlanProfiler.dp_equivalent` for the plan that ran)."""
        n, gb = self.opts.ranks(nodes), self.opts.global_batch
        return self.model.step_time(plan, n=n, global_batch=gb) / self.model.step_time(
            ExecPlan(), n=n, global_batch=gb)

    def plan_cost(self, nodes: int) -> float | None:
        """:meth:`cost_vs_dp` of the best feasible plan at ``nodes`` (1 where DP fits and is
        fastest, above 1 where only slower plans fit; None where no plan fits): the factor a
        plan-free curve's rate is divided by to become plan-aware (what the simulator's
        ``MeasuredPlusPlanCosts`` adds)."""
        got = best_feasible(self.model, self.opts, nodes)
        return None if got is None else self.cost_vs_dp(got[0], nodes)

    def curve(self, n_max: int, *, name: str = "") -> PlanCurve:
        """The plan-aware curve up to ``n_max`` nodes (cached until the next reading)."""
        hit = self._cache.get(n_max)
        if hit is not None and hit[0] == self.version:
            return hit[1]
        o = self.opts
        pc = plan_aware_curve(self.model, global_batch=o.global_batch, budget=o.budget,
                              n_max=n_max, bases=o.bases, name=name,
                              ranks_per_node=o.ranks_per_node)
        self._cache = {k: v for k, v in self._cache.items() if v[0] == self.version}
        self._cache[n_max] = (self.version, pc)
        return pc

    def choose(self, nodes: int) -> ExecPlan:
        """The fastest plan that fits at ``nodes`` (raises ``MemoryBudgetError`` if none does)."""
        got = best_feasible(self.model, self.opts, nodes)
        if got is None:
            plan, need = self.opts.leanest_need(nodes)
            raise MemoryBudgetError(
                f"no execution plan fits {self.opts.budget_text()} at {nodes} node(s) "
                f"of {self.opts.ranks_per_node} rank(s): the leanest, {plan.name}, needs "
                f"{need / 2**20:.1f} MiB; give the job more nodes (min_nodes) or more memory"
            )
        return got[0]


class PlanProfiler(PlanAdvisor):
    """The JPA's per-plan profiler: one :class:`JobPlans` per job that opted into plans.

    The controller hands it every measured step with the plan that ran
    (:meth:`~malleparsl.controller.Controller.observe` with ``plan=``; the curve advisor learns
    the same reading as the rate plain DP would have had, :meth:`dp_equivalent`), lets it scale
    the curve advisor's view of such jobs by the best feasible plan's cost relative to DP at each
    size, with the memory model's minimum size and no size above the largest any plan runs at
    (:meth:`adjust`), and asks it which plan a job runs at its new size (:meth:`plan_for`).
    Jobs opt in through ``JobSpec.meta["plan_options"]`` (a :class:`~malleparsl.plans.PlanOptions`;
    :func:`malleparsl.executors.planning.spec_from_options` sets it); others pass through.
    """

    def __init__(self) -> None:
        self.jobs: dict[str, JobPlans] = {}

    def register(self, spec: JobSpec, now_s: float) -> None:
        opts = spec.meta.get("plan_options") if spec.meta else None
        if isinstance(opts, PlanOptions) and spec.job_id not in self.jobs:
            self.jobs[spec.job_id] = JobPlans.for_spec(spec, opts)

    def forget(self, job_id: str) -> None:
        self.jobs.pop(job_id, None)

    def observe(self, job_id: str, plan: ExecPlan, n_nodes: int, samples_per_s: float,
                now_s: float) -> None:
        jp = self.jobs.get(job_id)
        if jp is not None:
            jp.observe(plan, n_nodes, samples_per_s=samples_per_s)

    def dp_equivalent(self, job_id: str, plan: ExecPlan, n_nodes: int,
                      samples_per_s: float) -> float:
        """The rate plain data parallelism would have had at ``n_nodes`` (the curve advisor
        learns that, so :meth:`adjust` does not count a plan's penalty twice)."""
        jp = self.jobs.get(job_id)
        if jp is None:
            return samples_per_s
        ratio = jp.cost_vs_dp(plan, n_nodes)
        return samples_per_s * ratio if ratio > 0 and math.isfinite(ratio) else samples_per_s

    def adjust(self, snapshot: ClusterSnapshot, views: Sequence[JobView]) -> list[JobView]:
        """Keep the curve advisor's scaling (it learns the job per size); divide its rate at
        each size by the best feasible plan's cost over plain DP there (the model's only job:
        plan penalties, as in the simulator), zero where no plan fits; the minimum size is the
        smallest any plan fits, the maximum the largest up to the cluster's size; where a size
        above the smallest has no plan (FSDP2's uneven batches, no plan above some size) the
        view lists the sizes that have one (``JobView.sizes``, honoured by every policy, and
        what the controller snaps a job left at a size with no plan by a lost node to); none
        (``sizes=()``) where no plan fits within the view's bounds on this cluster."""
        out = []
        for v in views:
            jp = self.jobs.get(v.job_id)
            if jp is None or v.curve is None:
                out.append(v)
                continue
            n_max = max(1, min(v.spec.max_nodes, len(snapshot.nodes)))
            costs = jp.plan_costs(n_max)
            ok = [n for n, c in enumerate(costs, 1) if c is not None]
            if not ok or ok[0] > v.hi:  # no plan fits within its bounds here: no size runs
                out.append(dataclasses.replace(v, sizes=()))
                continue
            curve = jp.scaled_curve(v.curve, n_max, name=v.job_id)
            lo = max(v.lo, ok[0])
            hi = v.hi if ok[-1] == n_max else max(lo, min(v.hi, ok[-1]))  # no plan above
            holes = len(ok) != n_max - ok[0] + 1  # some size above the first has no plan
            if holes and v.sizes is not None:
                ok = sorted(set(ok) & set(v.sizes))
            sizes = tuple(ok) if holes else v.sizes
            out.append(dataclasses.replace(v, curve=curve, min_nodes=lo, max_nodes=hi,
                                           sizes=sizes))
        return out

    def plan_for(self, job_id: str, n_nodes: int) -> ExecPlan | None:
        jp = self.jobs.get(job_id)
        return None if jp is None else jp.choose(n_nodes)
