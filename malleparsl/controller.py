"""The controller: events in, rescale plans out. One copy, used live and in the simulator.

The live executor and the trace-replay simulator both feed the controller the same events —
nodes appear or vanish, jobs arrive, report progress, finish — with their own notion of "now"
(wall clock or simulated clock), and call :meth:`Controller.replan` to obtain the
:class:`~malleparsl.model.RescalePlan` they must carry out. The controller owns the bookkeeping
(which nodes are usable, which jobs are admitted, who holds what); the decision itself belongs
to an :class:`~malleparsl.allocator.base.AllocationPolicy`, and the curves it plans with come
from a :class:`CurveAdvisor` (the user's curves, or the Job Profiling Advisor).
"""

from __future__ import annotations

import bisect
import dataclasses
import logging
import time
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum

from malleparsl.allocator.base import AllocationPolicy, ClusterSnapshot, JobView
from malleparsl.errors import SpecError
from malleparsl.model import Allocation, JobSpec, NodeId, RescalePlan
from malleparsl.plans import ExecPlan

log = logging.getLogger(__name__)


class JobStatus(str, Enum):
    QUEUED = "queued"  # submitted, not yet admitted (over the concurrency cap)
    ACTIVE = "active"  # admitted: eligible for nodes (may hold none at a given moment)
    DONE = "done"


@dataclass
class JobState:
    """The controller's record of one job."""

    spec: JobSpec
    status: JobStatus = JobStatus.QUEUED
    submitted_s: float = 0.0
    admitted_s: float | None = None
    finished_s: float | None = None
    done_samples: float = 0.0  # progress last reported (Controller.report_progress)
    node_cap: int | None = None  # max_nodes learnt while running (cap_nodes); None: the spec's
    node_sizes: tuple[int, ...] | None = None  # sizes learnt while running (limit_sizes)

    def progress(self) -> dict[str, float]:
        """The reported progress as :class:`JobView` takes it (``JobView(..., **js.progress())``),
        so every advisor gives policies the same remaining and attained samples."""
        return {"remaining_samples": max(0.0, self.spec.total_samples - self.done_samples),
                "attained_samples": self.done_samples}


class CurveAdvisor(ABC):
    """Supplies, for every active job, the view (curve and bounds) the policy plans with.

    The default, :class:`KnownCurves`, uses the curve in each job's spec. The Job Profiling
    Advisor learns curves from observations instead, and may narrow a job's bounds to probe a
    node count.
    """

    def register(self, spec: JobSpec, now_s: float) -> None:  # noqa: B027 - optional hook
        """A job was admitted."""

    def forget(self, job_id: str) -> None:  # noqa: B027 - optional hook
        """A job finished or was withdrawn."""

    def observe(self, job_id: str, n_nodes: int, samples_per_s: float, now_s: float) -> None:  # noqa: B027
        """A measured training rate of ``job_id`` at ``n_nodes``."""

    def observe_rescale(self, job_id: str, kind: str, pause_s: float) -> None:  # noqa: B027
        """A measured rescale pause; ``kind`` is ``"up"`` or ``"down"``."""

    @abstractmethod
    def views(
        self, snapshot: ClusterSnapshot, jobs: Sequence[JobState], allocation: Allocation
    ) -> list[JobView]:
        """The policy's view of each active job."""


class KnownCurves(CurveAdvisor):
    """Plan with the curve given in each job's spec (the oracle, or a user-supplied table)."""

    def views(
        self, snapshot: ClusterSnapshot, jobs: Sequence[JobState], allocation: Allocation
    ) -> list[JobView]:
        out = []
        for js in jobs:
            if js.spec.curve is None:
                raise SpecError(
                    f"job {js.spec.job_id!r} has no scaling curve; give JobSpec(curve=...) or "
                    "let the Job Profiling Advisor learn it (Controller(advisor=JobProfilingAdvisor()))"
                )
            out.append(
                JobView(
                    js.spec,
                    js.spec.curve,
                    allocation.nodes_of(js.spec.job_id),
                    **js.progress(),
                )
            )
        return out


class PlanAdvisor(ABC):
    """Execution plans (Rubick): per-plan readings in, plan-aware views and plans out.

    Set as ``Controller(plans=...)`` (the JPA's :class:`~malleparsl.jpa.plans.PlanProfiler`).
    It sees every job the curve advisor sees; for jobs that opted into plans it replaces the
    view's curve by the best feasible plan's rate per size, its minimum size by the smallest
    size any plan fits and, where some size in between has no plan (FSDP2 needs a global
    batch that splits evenly), lists the sizes that have one (``JobView.sizes``, which every
    policy honours); and it names the plan a job runs at a size.
    """

    def register(self, spec: JobSpec, now_s: float) -> None:  # noqa: B027 - optional hook
        """A job was admitted."""

    def forget(self, job_id: str) -> None:  # noqa: B027 - optional hook
        """A job finished or was withdrawn."""

    @abstractmethod
    def observe(self, job_id: str, plan: ExecPlan, n_nodes: int, samples_per_s: float,
                now_s: float) -> None:
        """A measured training rate of ``job_id`` running ``plan`` at ``n_nodes``."""

    def dp_equivalent(self, job_id: str, plan: ExecPlan, n_nodes: int,
                      samples_per_s: float) -> float:
        """The rate plain data parallelism would have had (what the curve advisor learns)."""
        return samples_per_s

    @abstractmethod
    def adjust(self, snapshot: ClusterSnapshot, views: Sequence[JobView]) -> list[JobView]:
        """The curve advisor's views with plan-aware curves and minimum sizes."""

    @abstractmethod
    def plan_for(self, job_id: str, n_nodes: int) -> ExecPlan | None:
        """The plan ``job_id`` should run at ``n_nodes`` (None: the job has no plans)."""


class HorizonEstimator(ABC):
    """Fills in, for nodes with no announced end, an estimate of when each stops being idle.

    Set as ``Controller(horizon=...)``; the snapshot's ``node_end_s`` then covers every node,
    so a horizon-aware policy can weigh rescale costs against how long nodes will last.
    """

    @abstractmethod
    def estimate(
        self, now_s: float, since_s: Mapping[NodeId, float], known_end_s: Mapping[NodeId, float]
    ) -> dict[NodeId, float]:
        """End times for the nodes in ``since_s`` (idle since); keep the known ones."""


@dataclass
class ReplanStats:
    """What one call to :meth:`Controller.replan` cost and did."""

    now_s: float
    solve_s: float
    jobs: int
    nodes: int
    plan: RescalePlan


@dataclass
class Controller:
    """Bookkeeping plus a policy: the single decision loop of malleparsl.

    >>> from malleparsl.allocator import make_policy
    >>> from malleparsl.model import JobSpec, ScalingCurve
    >>> c = Controller(policy=make_policy("equal-share"))
    >>> c.add_nodes(["n1", "n2"], now_s=0)
    >>> c.submit(JobSpec("j", max_nodes=4, curve=ScalingCurve((1, 2), (1.0, 2.0))), now_s=0)
    >>> sorted(c.replan(now_s=0).start["j"])
    ['n1', 'n2']
    """

    policy: AllocationPolicy
    advisor: CurveAdvisor = field(default_factory=KnownCurves)
    max_active: int | None = 10
    tfwd_s: float = 10.0
    jobs: dict[str, JobState] = field(default_factory=dict)
    nodes: dict[NodeId, float | None] = field(default_factory=dict)  # node -> known idle end
    node_since_s: dict[NodeId, float] = field(default_factory=dict)
    allocation: Allocation = field(default_factory=Allocation.empty)
    history: list[ReplanStats] = field(default_factory=list)
    keep_history: bool = True
    horizon: HorizonEstimator | None = None
    plans: PlanAdvisor | None = None  # execution plans; None: every job runs its own plan

    def __post_init__(self) -> None:
        if self.max_active is not None and self.max_active < 1:
            raise SpecError(f"max_active must be >= 1 or None, got {self.max_active!r}")

    # ---- events -------------------------------------------------------------------------
    def add_nodes(
        self,
        nodes: Iterable[NodeId],
        *,
        now_s: float,
        end_s: Mapping[NodeId, float] | None = None,
    ) -> None:
        """Nodes became usable; ``end_s`` gives known idle-end times where a scheduler says."""
        ends = dict(end_s or {})
        for n in nodes:
            if n not in self.nodes:
                self.node_since_s[n] = now_s
            self.nodes[n] = ends.get(n, self.nodes.get(n))

    def remove_nodes(self, nodes: Iterable[NodeId], *, now_s: float) -> dict[str, frozenset[NodeId]]:
        """Nodes vanished (preempted, released). Returns ``{job: nodes it lost}``."""
        gone = frozenset(n for n in nodes if n in self.nodes)
        for n in gone:
            del self.nodes[n]
            self.node_since_s.pop(n, None)
        lost = {
            j: held & gone for j, held in self.allocation.assignment.items() if held & gone
        }
        self.allocation = self.allocation.without_nodes(gone)
        return lost

    def submit(self, spec: JobSpec, *, now_s: float) -> None:
        if spec.job_id in self.jobs:
            raise SpecError(f"job id {spec.job_id!r} was already submitted; job ids must be unique")
        sizes = spec.meta.get("sizes") if spec.meta else None
        if sizes is not None and not (  # the JPA probes a new job at exactly min_nodes
                all(isinstance(k, int) and not isinstance(k, bool) for k in sizes)
                and all(0 < a < b for a, b in zip(sizes, sizes[1:])) and spec.min_nodes in sizes):
            raise SpecError(f"job {spec.job_id!r}: meta['sizes'] must be strictly increasing node "
                            f"counts >= 1 that include min_nodes ({spec.min_nodes}), got {sizes!r}")
        self.jobs[spec.job_id] = JobState(spec=spec, submitted_s=now_s)

    def finish(self, job_id: str, *, now_s: float) -> frozenset[NodeId]:
        """A job completed (or failed for good); returns the nodes it frees."""
        js = self._job(job_id)
        js.status, js.finished_s = JobStatus.DONE, now_s
        freed = self.allocation.nodes_of(job_id)
        self.allocation = self.allocation.without_jobs([job_id])
        self.advisor.forget(job_id)
        if self.plans is not None:
            self.plans.forget(job_id)
        return freed

    def observe(self, job_id: str, *, n_nodes: int, samples_per_s: float, now_s: float,
                plan: ExecPlan | None = None) -> None:
        """A training-rate measurement from the monitor (live) or the simulator; ``plan`` is
        the execution plan that ran (it goes to the plan advisor as well)."""
        self._job(job_id)
        rate = samples_per_s
        if plan is not None and self.plans is not None:  # the advisor learns DP's scaling
            self.plans.observe(job_id, plan, n_nodes, samples_per_s, now_s)
            rate = self.plans.dp_equivalent(job_id, plan, n_nodes, samples_per_s)
        self.advisor.observe(job_id, n_nodes, rate, now_s)

    def plan_for(self, job_id: str, n_nodes: int) -> ExecPlan | None:
        """The execution plan ``job_id`` runs at ``n_nodes`` (None: it has no automatic plans)."""
        self._job(job_id)
        return None if self.plans is None else self.plans.plan_for(job_id, n_nodes)

    def report_progress(self, job_id: str, *, samples_done: float) -> None:
        """Samples a job has trained so far (policies plan with what is left)."""
        self._job(job_id).done_samples = float(samples_done)

    def observe_rescale(self, job_id: str, *, kind: str, pause_s: float) -> None:
        self._job(job_id)
        self.advisor.observe_rescale(job_id, kind, pause_s)

    def cap_nodes(self, job_id: str, max_nodes: int, *, why: str) -> bool:
        """Give ``job_id`` at most ``max_nodes`` in every later decision, clamped to its spec's
        ``min_nodes..max_nodes``; the latest call wins, up as well as down. True (and one log
        line saying ``why``: a warning when the bound drops, info when it rises) if that
        changes its bound.

        For a bound learnt while the job runs (its loop's global batch feeds fewer ranks than
        its ``max_nodes``): a later phase of the loop with a larger batch lifts what a smaller
        one set, or the job would stay small for the rest of its run. The spec stays as
        submitted, since advisors keep their own copy, and :meth:`replan` narrows the job's
        view instead, whichever advisor made it."""
        js = self._job(job_id)
        bound = js.spec.max_nodes if js.node_cap is None else js.node_cap
        cap = min(js.spec.max_nodes, max(js.spec.min_nodes, int(max_nodes)))
        if cap == bound:
            return False
        log.log(logging.WARNING if cap < bound else logging.INFO,
                "job %r: max_nodes %d -> %d from now on: %s", job_id, bound, cap, why)
        js.node_cap = None if cap == js.spec.max_nodes else cap
        return True

    def limit_sizes(self, job_id: str, sizes: Sequence[int], *, why: str) -> bool:
        """Give ``job_id`` only node counts in ``sizes`` in every later decision, the latest
        call winning (all of ``min_nodes..max_nodes``: no limit); True (and one log line saying
        ``why``: a warning for a limit, info when it is lifted) if that changes them.

        For sizes learnt while the job runs: a fixed FSDP2 plan runs only where its ranks
        split the loop's global batch, which a job whose options do not name it reveals only
        once running. As :meth:`cap_nodes`, the spec stays as submitted."""
        js = self._job(job_id)
        got = tuple(sorted({int(k) for k in sizes}))
        if not got or got[0] < js.spec.min_nodes or got[-1] > js.spec.max_nodes:
            raise SpecError(f"job {job_id!r}: sizes must be node counts within min_nodes.."
                            f"max_nodes ({js.spec.min_nodes}..{js.spec.max_nodes}), got {sizes!r}")
        new = None if got == tuple(range(js.spec.min_nodes, js.spec.max_nodes + 1)) else got
        if new == js.node_sizes:
            return False
        log.log(logging.INFO if new is None else logging.WARNING, "job %r: %s from now on: %s",
                job_id, "every node count" if new is None else f"node counts {list(new)} only",
                why)
        js.node_sizes = new
        return True

    # ---- decisions ----------------------------------------------------------------------
    @property
    def active_jobs(self) -> list[JobState]:
        return [j for j in self.jobs.values() if j.status is JobStatus.ACTIVE]

    def snapshot(self, now_s: float) -> ClusterSnapshot:
        ends = {n: e for n, e in self.nodes.items() if e is not None}
        if self.horizon is not None:
            ends = self.horizon.estimate(now_s, self.node_since_s, ends)
        return ClusterSnapshot(
            now_s=now_s,
            nodes=tuple(self.nodes),
            node_end_s=ends,
            tfwd_s=self.tfwd_s,
            queued=sum(j.status is JobStatus.QUEUED for j in self.jobs.values()),
        )

    def _admit(self, now_s: float) -> None:
        active = len(self.active_jobs)
        if self.max_active is not None and active >= self.max_active:
            return  # full: skip sorting every job ever submitted (hot in long simulations)
        for js in sorted(self.jobs.values(), key=lambda j: (j.submitted_s, j.spec.submit_s)):
            if js.status is not JobStatus.QUEUED:
                continue
            if self.max_active is not None and active >= self.max_active:
                break
            js.status, js.admitted_s = JobStatus.ACTIVE, now_s
            self.advisor.register(js.spec, now_s)
            if self.plans is not None:
                self.plans.register(js.spec, now_s)
            active += 1

    def replan(self, *, now_s: float) -> RescalePlan:
        """Admit queued jobs, ask the policy, check its answer, and return the plan."""
        self._admit(now_s)
        snap = self.snapshot(now_s)
        active = self.active_jobs
        views = self.advisor.views(snap, active, self.allocation)
        if self.plans is not None:
            views = self.plans.adjust(snap, views)
        views = self._bounded(views)
        t0 = time.perf_counter()
        answer = self.policy.allocate(snap, views)
        solve_s = time.perf_counter() - t0
        new = self._checked(answer, snap, views)
        if new is not answer and self._holed(views):  # rejected: the current one is kept
            new = self._runnable(new, views)
            if new is not self.allocation:  # the nodes a snap freed go to the policy at once
                again = [dataclasses.replace(v, current=new.nodes_of(v.job_id)) for v in views]
                t0 = time.perf_counter()
                answer = self.policy.allocate(snap, again)
                solve_s += time.perf_counter() - t0
                new = self._checked(answer, snap, again, new)
        plan = self.allocation.plan_to(new)
        self.allocation = new
        if self.keep_history:
            self.history.append(ReplanStats(now_s, solve_s, len(views), len(snap.nodes), plan))
        return plan

    def _checked(self, new: Allocation, snap: ClusterSnapshot, views: Sequence[JobView],
                 keep: Allocation | None = None) -> Allocation:
        """Reject a policy answer that breaks the rules (a size out of bounds or, for a job
        with plan holes, one it cannot run at); keep the current allocation (``keep``: the
        current one, by default) instead."""
        usable = set(snap.nodes)
        by_id = {v.job_id: v for v in views}
        problems = []
        for job, nodes in new.assignment.items():
            v = by_id.get(job)
            if v is None:
                problems.append(f"job {job!r} is not active")
            elif not (v.lo <= len(nodes) <= v.hi):
                problems.append(f"job {job!r} got {len(nodes)} nodes outside {(v.lo, v.hi)}")
            elif v.sizes is not None and len(nodes) not in v.sizes:
                problems.append(f"job {job!r} got {len(nodes)} nodes, no plan runs there")
            if nodes - usable:
                problems.append(f"job {job!r} got unusable nodes {sorted(nodes - usable)[:3]}")
        if problems:
            log.error("policy %r returned an invalid allocation (%s); keeping the current one",
                      self.policy, "; ".join(problems))
            return self.allocation if keep is None else keep
        return new

    def _bounded(self, views: list[JobView]) -> list[JobView]:
        """The views within what the controller knows of each job beyond its advisors, whichever
        advisor made them: the sizes its spec limits it to (``meta["sizes"]``: a fixed FSDP2
        plan runs only where its ranks split the global batch evenly,
        :func:`~malleparsl.executors.planning.spec_from_options`), within any the plan advisor
        listed, or the sizes :meth:`limit_sizes` learnt instead; and the bound :meth:`cap_nodes`
        learnt (an advisor's narrower ``lo`` above the cap, a probe, comes down to it; one
        pinned at a size the job cannot run, to the largest below it that it can)."""
        out = []
        for v in views:
            js = self.jobs[v.job_id]
            fixed = js.node_sizes if js.node_sizes is not None else (
                js.spec.meta.get("sizes") if js.spec.meta else None)
            cap = js.node_cap if js.node_cap is not None and v.hi > js.node_cap else None
            if fixed is not None or cap is not None:
                change: dict = {}
                lo, hi = v.lo, v.hi
                if cap is not None:
                    lo, hi = min(lo, cap), cap
                    change.update(min_nodes=lo, max_nodes=hi)
                if fixed is not None:
                    sizes = tuple(fixed if v.sizes is None else sorted(set(fixed) & set(v.sizes)))
                    change["sizes"] = sizes
                    if sizes and not any(lo <= k <= hi for k in sizes):
                        k = max((k for k in sizes if k <= hi), default=sizes[0])
                        change.update(min_nodes=k, max_nodes=k)
                v = dataclasses.replace(v, **change)
            out.append(v)
        return out

    @staticmethod
    def _holed(views: Sequence[JobView]) -> bool:
        return any(v.sizes is not None and len(v.current) not in v.sizes and v.current
                   for v in views)

    def _runnable(self, kept: Allocation, views: Sequence[JobView]) -> Allocation:
        """The kept allocation (the policy's answer was rejected) after a lost node left a job
        at a size with no execution plan (4 nodes, one taken back, 3; ``JobView.sizes``): the
        job shrinks to the largest size below it runs at (or stops, below its minimum), keeping
        the first of its nodes by name. Launching it at 3 would fail it."""
        out = dict(kept.assignment)
        for v in views:
            nodes = kept.nodes_of(v.job_id)
            if v.sizes is None or not nodes or len(nodes) in v.sizes:
                continue
            i = bisect.bisect_right(v.sizes, len(nodes))
            k = v.sizes[i - 1] if i else 0
            keep = sorted(nodes, key=str)[: k if k >= v.lo else 0]
            log.info("job %r: no plan runs at %d nodes; given %d", v.job_id, len(nodes), len(keep))
            if keep:
                out[v.job_id] = frozenset(keep)
            else:
                del out[v.job_id]
        return kept if out == dict(kept.assignment) else Allocation(out)

    def _job(self, job_id: str) -> JobState:
        try:
            return self.jobs[job_id]
        except KeyError:
            raise SpecError(f"unknown job id {job_id!r}") from None
