"""Plan-aware versus data-parallel-only allocation in the simulator (Rubick's comparison).

Jobs may carry a memory profile (``JobSpec.meta["memory_profile"]``). :func:`plan_jobsets`
gives a job set two ways:

* **DP-only**: every job runs plain data parallelism; its minimum size is the smallest size at
  which that fits every rank's accelerator (``PlanOptions(..., bases=("dp",)).min_nodes``), its
  curve the job set's measured data-parallel curve;
* **plan-aware**: its minimum size is the smallest size at which *any* plan fits, and its
  curve at every size is the best feasible plan's rate, built by the live system's
  :func:`malleparsl.jpa.plans.plan_aware_curve` with :class:`MeasuredPlusPlanCosts`.

A node has the layout of :data:`LAYOUTS` (``summit`` by default: six ranks, one per 16 GiB
V100, so ZeRO-1 and FSDP2 shard over a node's six ranks while plain DP keeps the whole
replicated state on every GPU at any size; ``one-gpu``: the layout of the figures before
2026-11-26, a node is one 16 GiB rank).

A plan's rate is the measured data-parallel rate plus the plan's *extra* time per step from the
performance model (recomputation, more micro-batches, ZeRO's broadcast, FSDP2's per-pass
gathers and reduce-scatters beyond DP's all-reduce), so plan-aware curves
never beat data parallelism where it fits: ``rate_p(n) = G / (G / rate_dp(n) + extra_p(n))``.
The allocator (the MILP) then plans with these curves, as it would live.

The larger models are given a profile (parameters, activation bytes per sample) such that
plain data parallelism needs several nodes: about a third of the jobs by default. Their
replicated state always fits one GPU: a model that plain DP cannot run at any size is not a
scheduling question, and :func:`plan_jobsets` refuses it.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from malleparsl.allocator.base import ClusterSnapshot, JobView
from malleparsl.controller import PlanAdvisor
from malleparsl.errors import SpecError, unknown_name
from malleparsl.jpa.plans import plan_aware_curve
from malleparsl.model import JobSpec, ScalingCurve
from malleparsl.plans import (
    FAMILIES,
    ExecPlan,
    MemoryBudgetError,
    MemoryProfile,
    PlanOptions,
    cap_to_batch,
    local_batch,
    parse_plan,
)
from malleparsl.sim.result import SimResult

SUMMIT_GPU_BYTES = 16 * 2**30
"""Memory of one Summit V100 (``site_configs.accelerators``' "summit"; a test keeps them equal)."""


@dataclass(frozen=True)
class NodeLayout:
    """What one simulated node holds: ``ranks_per_node`` ranks of ``rank_bytes`` each, and the
    global batch of the job set's large models (fixed at every size)."""

    name: str
    ranks_per_node: int
    rank_bytes: float
    global_batch: int

    @property
    def node_bytes(self) -> float:
        return self.ranks_per_node * self.rank_bytes


LAYOUTS: dict[str, NodeLayout] = {
    # Summit: 6 V100s of 16 GiB, one rank each. Global batch 6 x 256: every rank's local batch
    # at n nodes is the one-gpu layout's 256 / n (so "DP needs n nodes" means the same), and
    # the imagenet jobs' 64 nodes (384 ranks) still get 4 samples a rank (256 would leave
    # ranks without a sample beyond 42 nodes)
    "summit": NodeLayout("summit", 6, SUMMIT_GPU_BYTES, 6 * 256),
    # before 2026-11-26: a node is one 16 GiB rank (reproduces docs/plans.md's older figures)
    "one-gpu": NodeLayout("one-gpu", 1, SUMMIT_GPU_BYTES, 256),
}


@dataclass(frozen=True, kw_only=True)
class PlanCosts:
    """What a plan costs beyond data parallelism, on accelerators (Summit-like defaults).

    The terms are the live performance model's (:func:`malleparsl.jpa.plans.features`) minus
    what the measured DP step already holds: ZeRO-1 adds a broadcast of ``W (n-1)/n`` bytes;
    FSDP2 moves ``3 k W (n-1)/n`` bytes in ``3 k`` collective rounds per step (two all-gathers
    and a reduce-scatter per pass) where DP moved ``2 W (n-1)/n`` in one. Savings (the sharded
    optimizer step) are left out, so a plan never beats DP where DP fits.
    """

    recompute_frac: float = 1 / 3  # one more forward: a third of forward + backward
    micro_batch_s: float = 0.004  # per extra micro-batch (launches, optimizer-free pass)
    # one EDR InfiniBand rail, 100 Gb/s; a Summit node has two (2 x 100 Gb/s = 25 GB/s, OLCF
    # quotes 23 GB/s injection): up to 2x pessimistic across nodes, kept so the documented
    # figures hold (docs/plans.md, "Costs")
    link_bytes_per_s: float = 12.5e9
    latency_s: float = 10e-6  # per extra collective round and log2(n) (a ring step over IB)
    intra_node_bytes_per_s: float = 50e9  # NVLink 2.0 between a Summit node's V100s
    # a ring step over NVLink, all ranks on one node (NCCL's tuning model: 3.4 us for NVLink,
    # Simple protocol, against 9.6 us over the network); assumed, not measured here
    intra_node_latency_s: float = 3.4e-6

    def extra_s(self, prof: MemoryProfile, plan: ExecPlan, n: int, global_batch: int,
                s_per_sample: float, *, nodes: int | None = None) -> float:
        """Seconds one step of ``plan`` at ``n`` ranks on ``nodes`` nodes (default ``n``)
        takes beyond DP's; ``s_per_sample``: one rank's compute per sample. Collectives
        inside one node run over :attr:`intra_node_bytes_per_s` with
        :attr:`intra_node_latency_s`."""
        one_node = (nodes or n) == 1
        link = self.intra_node_bytes_per_s if one_node else self.link_bytes_per_s
        latency = self.intra_node_latency_s if one_node else self.latency_s
        loc = local_batch(global_batch, n)
        mb = min(loc, plan.micro_batch or loc)
        k = math.ceil(loc / mb)
        t = self.micro_batch_s * (k - 1)
        if plan.checkpoint:
            t += self.recompute_frac * s_per_sample * loc
        w = prof.bytes_per_param * prof.params
        if plan.zero and n > 1:
            t += (n - 1) / n * w / link
        if plan.fsdp and n > 1:
            t += (3 * k - 2) * (n - 1) / n * w / link
            t += (3 * k - 1) * math.log2(n) * latency
        return t


@dataclass(frozen=True)
class MeasuredPlusPlanCosts:
    """Step time of a plan: the measured data-parallel step plus the plan's extra time
    (:class:`PlanCosts`); the :class:`~malleparsl.jpa.plans.StepTimeModel` the simulator hands
    to :func:`~malleparsl.jpa.plans.plan_aware_curve`, the live system's curve builder.

    ``n`` counts ranks (as ``plan_aware_curve`` passes it); ``dp`` is measured per node of
    ``ranks_per_node`` ranks."""

    profile: MemoryProfile
    dp: ScalingCurve
    costs: PlanCosts
    ranks_per_node: int = 1

    def step_time(self, plan: ExecPlan, *, n: int, global_batch: int) -> float:
        nodes, odd = divmod(n, self.ranks_per_node)
        if odd or nodes < 1:
            raise SpecError(f"{n} ranks are not whole nodes of {self.ranks_per_node}")
        s1 = self.ranks_per_node / self.dp.rate(1)  # one rank's seconds per sample
        return global_batch / self.dp.rate(nodes) + self.costs.extra_s(
            self.profile, plan, n, global_batch, s1, nodes=nodes)


class KnownPlans(PlanAdvisor):
    """The simulator's plan advisor: the plan per size fixed when the job set was built.

    A plan-aware job carries its best feasible plan per size (``meta["plans"]``,
    ``{nodes: plan name}``, from :func:`plan_jobsets`) and a curve that is 0 where no plan
    fits. Where those sizes have holes (or stop below ``max_nodes``, or start above
    ``min_nodes``), the view lists the runnable ones (``JobView.sizes``), as
    :class:`~malleparsl.jpa.plans.PlanProfiler` does live, so the shared controller and every policy treat a job the same way in the simulator
    and live (the policy never chooses a hole; a node lost at 4 nodes of a job that runs at 2
    and 4 is handled by the policy's next answer, or by the controller's snap). Jobs without
    ``meta["plans"]`` pass through.
    """

    def __init__(self) -> None:
        self.plans: dict[str, dict[int, str]] = {}
        self.holed: dict[str, tuple[int, ...]] = {}  # jobs whose runnable sizes have holes

    def register(self, spec: JobSpec, now_s: float) -> None:
        plans = spec.meta.get("plans") if spec.meta else None
        if not plans:
            return
        self.plans[spec.job_id] = {int(k): str(v) for k, v in plans.items()}
        sizes = tuple(sorted(self.plans[spec.job_id]))
        # a gap, none above, or none at the spec's minimum (live, the profiler raises it)
        if len(sizes) != max(spec.max_nodes, sizes[-1]) - sizes[0] + 1 or sizes[0] > spec.min_nodes:
            self.holed[spec.job_id] = sizes

    def forget(self, job_id: str) -> None:
        self.plans.pop(job_id, None)
        self.holed.pop(job_id, None)

    def observe(self, job_id: str, plan: ExecPlan, n_nodes: int, samples_per_s: float,
                now_s: float) -> None:
        """Nothing to learn: the plans' costs are known."""

    def adjust(self, snapshot: ClusterSnapshot, views: Sequence[JobView]) -> list[JobView]:
        if not self.holed:
            return list(views)
        return [dataclasses.replace(v, sizes=self.holed[v.job_id]) if v.job_id in self.holed
                else v for v in views]

    def plan_for(self, job_id: str, n_nodes: int) -> ExecPlan | None:
        plans = self.plans.get(job_id)
        if plans is None:
            return None
        if n_nodes not in plans:
            raise MemoryBudgetError(f"job {job_id!r}: no plan runs at {n_nodes} node(s)")
        return parse_plan(plans[n_nodes])


def node_layout(layout: NodeLayout | str) -> NodeLayout:
    """``layout`` itself, or the :data:`LAYOUTS` entry of that name."""
    if isinstance(layout, NodeLayout):
        return layout
    if layout not in LAYOUTS:
        raise unknown_name("node layout", layout, LAYOUTS)
    return LAYOUTS[layout]


def large_profile(rng: np.random.Generator, *, global_batch: int, budget: float,
                  dp_nodes: tuple[int, int], units: int = 8,
                  ranks_per_node: int = 1) -> MemoryProfile:
    """A model whose plain data parallelism needs ``dp_nodes[0]..dp_nodes[1]`` nodes of
    ``ranks_per_node`` ranks of ``budget`` bytes each: its replicated state takes 30-60 % of
    one rank's budget (so DP fits some size), its activations the rest several times over. It
    is ``units`` equal blocks (FSDP2 gathers one at a time; 8, as the measured BlockMLP)."""
    params = int(rng.uniform(0.3, 0.6) * budget / 20)  # 16 B/param persistent + 4 sync buffer
    free = budget - 20 * params
    need = int(rng.integers(dp_nodes[0], dp_nodes[1] + 1)) * ranks_per_node
    act = free * need / global_batch * 0.97  # fits at `need` nodes, not at need - 1
    act = max(act, free * (need - ranks_per_node) / global_batch * 1.03)
    return MemoryProfile(params=params, act_per_sample=act, act_ckpt_per_sample=act / 8,
                         grad_transient_per_sample=act / 16, unit_params=params / units)


def plan_job(
    spec: JobSpec,
    prof: MemoryProfile,
    *,
    layout: NodeLayout | str = "summit",
    global_batch: int | None = None,
    costs: PlanCosts | None = None,
    bases: Sequence[str] = FAMILIES,
) -> tuple[JobSpec | None, JobSpec | None]:
    """``(dp_only, plan_aware)`` versions of one job with memory profile ``prof`` on nodes of
    ``layout``; either is None where no size up to ``max_nodes`` fits (DP: the replicated
    state exceeds one rank's memory at any size; only activations shrink with more ranks)."""
    lay = node_layout(layout)
    if spec.curve is None:
        raise SpecError(f"job {spec.job_id!r} needs its true curve")
    gb = global_batch or lay.global_batch
    rpn, budget = lay.ranks_per_node, lay.node_bytes
    meta = {**spec.meta, "memory_profile": prof.as_dict(), "global_batch": gb,
            "ranks_per_node": rpn}
    dp_opts = PlanOptions(prof, gb, budget, ("dp",), rpn)
    try:  # no rank without a sample: capped, as the live controller caps (spec_from_options)
        top = cap_to_batch(spec.min_nodes, spec.max_nodes, global_batch=gb, ranks_per_node=rpn)
    except SpecError as e:
        raise SpecError(f"job {spec.job_id!r}: {e}") from None
    n_dp = dp_opts.min_nodes(spec.max_nodes)
    dp = None if n_dp is None else dataclasses.replace(
        spec, min_nodes=max(spec.min_nodes, n_dp), max_nodes=top, meta=meta)
    pc = plan_aware_curve(MeasuredPlusPlanCosts(prof, spec.curve, costs or PlanCosts(), rpn),
                          global_batch=gb, budget=budget, n_max=spec.max_nodes, bases=bases,
                          name=spec.job_id, ranks_per_node=rpn)
    if pc.curve is None or pc.min_nodes is None:
        return dp, None
    aware = dataclasses.replace(
        spec, min_nodes=max(spec.min_nodes, pc.min_nodes), curve=pc.curve,
        meta={**meta, "plans": {n: p.name for n, p in pc.plans.items()}})
    return dp, aware


def plan_jobsets(
    jobs: Sequence[JobSpec],
    *,
    layout: NodeLayout | str = "summit",
    large_every: int = 3,
    global_batch: int | None = None,
    dp_nodes: tuple[int, int] = (4, 16),
    seed: int = 0,
    costs: PlanCosts | None = None,
    bases: Sequence[str] = FAMILIES,
) -> tuple[list[JobSpec], list[JobSpec]]:
    """``(dp_only, plan_aware)`` versions of ``jobs``; every ``large_every``-th job is large
    (plain DP needs ``dp_nodes`` nodes of ``layout``, global batch the layout's unless given)
    and may run the plan families ``bases`` when plan-aware.

    Small jobs fit at one node under plain data parallelism and are the same in both sets.
    A large job that DP cannot run at any size is refused (SpecError): the DP-only set would
    have to drop it or never finish it, and either compares feasibility, not allocation.
    """
    if isinstance(large_every, bool) or not isinstance(large_every, int) or large_every < 1:
        raise SpecError(f"large_every must be an integer >= 1 (every large_every-th job is "
                        f"large; 1: all), got {large_every!r}")
    lay = node_layout(layout)
    gb = global_batch or lay.global_batch
    rng = np.random.default_rng(seed)
    dp_only, aware = [], []
    for i, spec in enumerate(jobs):
        if spec.curve is None:
            raise SpecError(f"job {spec.job_id!r} needs its true curve")
        if i % large_every != large_every - 1:
            dp_only.append(spec)
            aware.append(spec)
            continue
        prof = large_profile(rng, global_batch=gb, budget=lay.rank_bytes, dp_nodes=dp_nodes,
                             ranks_per_node=lay.ranks_per_node)
        d, a = plan_job(spec, prof, layout=lay, global_batch=gb, costs=costs, bases=bases)
        if d is None:
            raise SpecError(f"job {spec.job_id!r}: data parallelism never fits up to "
                            f"{spec.max_nodes} nodes; lower dp_nodes")
        if a is None:  # DP fits, but the families allowed cannot run at any size
            raise SpecError(f"job {spec.job_id!r}: no plan of {list(bases)} fits up to "
                            f"{spec.max_nodes} nodes (plain DP does from {d.min_nodes}); "
                            "allow more plan families (bases)")
        dp_only.append(d)
        aware.append(a)
    return dp_only, aware


def compare_plans(
    *,
    trace: str = "summit",
    nodes: str = "0:128",
    hours: float = 48.0,
    jobs: str = "imagenet",
    limit: int | None = None,
    policy: str = "milp",
    seed: int = 0,
    samples_scale: float = 1.0,
    max_active: int | None = 10,
    layout: NodeLayout | str = "summit",
    **jobset_options: object,
) -> dict[str, object]:
    """Replay ``trace`` with the DP-only and the plan-aware job sets; the ratios of the issue.

    The window starts at the first job's submission, as ``malleparsl simulate`` does; nodes
    have the layout ``layout`` (:data:`LAYOUTS`).
    """
    from malleparsl.data import load_jobset
    from malleparsl.sim.engine import SimOptions, simulate
    from malleparsl.sim.windows import replay_window
    from malleparsl.traces import load_trace

    lay = node_layout(layout)

    full = load_trace(trace, nodes=nodes)
    specs = [dataclasses.replace(j, total_samples=j.total_samples * samples_scale)
             for j in load_jobset(jobs, limit=limit)]
    tr = replay_window(full, hours, specs=specs)
    dp_only, aware = plan_jobsets(specs, seed=seed, layout=lay,
                                  **jobset_options)  # type: ignore[arg-type]
    opts = SimOptions(seed=seed, max_active=max_active)
    out: dict[str, object] = {"trace": trace, "nodes": nodes, "hours": hours, "jobs": jobs,
                              "limit": limit, "samples_scale": samples_scale, "policy": policy,
                              "seed": seed, "layout": lay.name,
                              "ranks_per_node": lay.ranks_per_node,
                              "global_batch": jobset_options.get("global_batch")
                              or lay.global_batch,
                              "large_jobs": sum(a.curve is not d.curve for a, d in zip(aware, dp_only))}
    rows = {}
    for name, js in (("dp_only", dp_only), ("plan_aware", aware)):
        res = simulate(tr, js, policy=policy, options=opts, history=full)
        s = res.summary()
        rows[name] = s
        large = {j.job_id for j, d in zip(aware, dp_only) if j.curve is not d.curve}
        done = res.jobs.dropna(subset=["finish_s"])
        big = done[done["job"].isin(large)]
        out[name] = {
            "samples": s["samples"], "jobs_done": s["jobs_done"],
            "mean_jct_h": s["mean_jct_h"], "makespan_h": s["last_finish_h"],
            "mean_jct_all_h": mean_jct_all_h(res),
            "utilisation": s["utilisation"],
            "unused_node_h": unused_node_h(res),
            "large_jobs_done": int(len(big)),
            "large_mean_jct_h": float((big["finish_s"] - big["submit_s"]).mean() / 3600)
            if len(big) else None,
        }
    floor_h = jct_all_floor_h(specs, [*dp_only, *aware], start_s=tr.start_s, end_s=tr.end_s,
                              idle_node_s=tr.idle_node_seconds())
    out["jct_all_floor_h"] = floor_h
    a, d = out["plan_aware"], out["dp_only"]
    # the best ratio any scheduler and any plans could reach against this DP-only run
    out["jct_all_ratio_floor"] = _ratio(floor_h, d["mean_jct_all_h"])  # type: ignore[index]
    out["jct_ratio_vs_dp_only"] = _ratio(a["mean_jct_h"], d["mean_jct_h"])  # type: ignore[index]
    out["jct_all_ratio_vs_dp_only"] = _ratio(a["mean_jct_all_h"], d["mean_jct_all_h"])  # type: ignore[index]
    out["makespan_ratio_vs_dp_only"] = _ratio(a["makespan_h"], d["makespan_h"])  # type: ignore[index]
    out["samples_ratio_vs_dp_only"] = _ratio(a["samples"], d["samples"])  # type: ignore[index]
    return out


def mean_jct_all_h(res: SimResult) -> float | None:
    """Mean JCT over *every* submitted job, an unfinished one counted until the window's end
    (a lower bound for it): unlike the finished-only mean, finishing more jobs cannot raise it."""
    jobs = res.jobs
    if jobs.empty:
        return None
    fin = jobs["finish_s"].fillna(res.end_s)
    return float((fin - jobs["submit_s"]).mean() / 3600)


def jct_all_floor_h(
    specs: Sequence[JobSpec],
    curves_from: Sequence[JobSpec],
    *,
    start_s: float,
    end_s: float,
    idle_node_s: float,
) -> float:
    """A lower bound on :func:`mean_jct_all_h` that no scheduler and no plan can beat.

    Why: on a saturated slice mean JCT is capacity-bound, not order-bound. A job needs at least
    ``total_samples / best per-node rate`` node-seconds (the best over every size of every
    curve given for it in ``curves_from``, which must give one for every job: plans are never
    faster per node than that), so at most ``K`` jobs can finish inside the window's
    ``idle_node_s`` (the ``K`` cheapest). The
    bound gives those finishing jobs a JCT of 0, picks the ``K`` that waited longest, and counts
    every other job until ``end_s``, as :func:`mean_jct_all_h` does. Pauses, submission times
    and node availability over time are ignored, which only lowers the bound.
    """
    if not specs:
        raise SpecError("jct_all_floor_h needs at least one job")
    best: dict[str, float] = {}
    for j in curves_from:
        if j.curve is None:
            raise SpecError(f"job {j.job_id!r} has no curve; the floor needs every job's rates")
        r = j.curve.rates_upto(j.max_nodes)
        per_node = float(np.max(r[1:] / np.arange(1, len(r))))
        best[j.job_id] = max(best.get(j.job_id, 0.0), per_node)
    missing = [j.job_id for j in specs if j.job_id not in best]
    if missing:  # counting such a job as one that never finishes would raise the floor
        raise SpecError(f"jct_all_floor_h: no curve given for job(s) {missing[:3]!r}; the floor "
                        "needs every job's rates")
    need = []
    for j in specs:
        rate = best[j.job_id]
        need.append(j.total_samples / rate if rate > 0 else math.inf)
    k = int(np.searchsorted(np.cumsum(np.sort(need)), idle_node_s, side="right"))
    waits = np.sort([end_s - max(j.submit_s, start_s) for j in specs])[::-1]
    return float((waits.sum() - waits[:k].sum()) / len(specs) / 3600)


def unused_node_h(res: SimResult) -> float:
    """Idle node-hours left unused while some job was still unfinished: the only capacity a
    plan can win back, since plans are never faster than data parallelism where it fits."""
    events = res.events
    if events.empty:
        return 0.0
    t = np.append(events["time_s"].to_numpy(), res.end_s)
    free = (events["idle_nodes"] - events["used_nodes"]).clip(lower=0).to_numpy()
    waiting = (events["active_jobs"] + events["queued_jobs"]).to_numpy() > 0
    return float((free * waiting * np.diff(t)).sum() / 3600)


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else float(a) / float(b)
