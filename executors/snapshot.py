"""Read-only views of the control loop, for any thread.

The control loop owns its jobs and controller and changes them from its one thread; readers in
other threads (the demo recorder, benchmarks, tests) must not reach into them. At the end of
every pass the loop builds a :class:`ControlSnapshot` (plain frozen values, copied out of its
objects) and swaps it in under a lock; ``executor.snapshot()`` returns the latest one.

>>> snap = ControlSnapshot()
>>> snap.jobs, snap.nodes
({}, frozenset())
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any


@dataclass(frozen=True)
class RescaleView:
    """One relaunch of a job (see :class:`~malleparsl.executors.driver.RescaleRecord`)."""

    kind: str  # "up", "down", "same", "restart"
    from_size: int
    to_size: int
    pause_s: float | None  # decision -> first step at the new size, checkpoint I/O excluded
    steady: bool
    decided_s: float  # when the relaunch was decided (the loop's clock)
    first_step_s: float | None  # wall time of the new segment's first step


@dataclass(frozen=True)
class JobView:
    """One malleable job as the control loop last saw it."""

    job_id: str
    state: str  # "waiting", "running", "stopping", "done"
    max_nodes: int  # the bound the controller plans with (below the spec's once it learnt a cap)
    segment: int | None  # index of the running segment
    nodes: tuple[str, ...]  # the running segment's nodes
    world_size: int  # ranks of the running segment (nodes x ranks per node)
    started_s: float | None  # when the running segment was launched
    stepping: bool  # the running segment has reported progress
    step: int | None  # the running segment's last reported step
    samples: float | None  # from rank 0's last progress record
    samples_per_s: float | None
    history: tuple[tuple[str, ...], ...]  # the nodes of every segment launched
    rescales: tuple[RescaleView, ...]
    restarts: int
    resolutions: int
    plans: tuple[tuple[int, int, str, float], ...] = ()  # (segment, size, plan, start) per segment


@dataclass(frozen=True)
class ControlSnapshot:
    """The control loop's state at ``time`` (seconds since the epoch)."""

    time: float = 0.0
    store_host: str = ""
    store_port: int | None = None
    nodes: frozenset[str] = frozenset()  # nodes the controller plans with
    used_nodes: frozenset[str] = frozenset()  # nodes the current allocation gives to jobs
    replans: int = 0
    jobs: Mapping[str, JobView] = field(default_factory=dict)

    def rescale_pauses(self, kinds: tuple[str, ...] = ("up", "down", "same")) -> list[float]:
        """Every measured pause of the given kinds, over all jobs."""
        return [r.pause_s for j in self.jobs.values() for r in j.rescales
                if r.pause_s is not None and r.kind in kinds]


def job_view(job: Any, node_cap: int | None = None) -> JobView:
    """``node_cap``: the controller's bound learnt while the job runs (``JobState.node_cap``);
    the site configs' demand hooks read ``max_nodes``, so a pilot scavenger holds no node the
    controller would never give the job."""
    seg = job.segment
    last = getattr(job, "last_progress", None) or {}
    current = seg is not None and last.get("segment") == seg.index
    return JobView(
        job_id=job.job_id,
        state=job.state.value,
        max_nodes=job.spec.max_nodes if node_cap is None else min(job.spec.max_nodes, node_cap),
        segment=seg.index if seg is not None else None,
        nodes=tuple(seg.nodes) if seg is not None else (),
        world_size=seg.world_size if seg is not None else 0,
        started_s=seg.started_s if seg is not None else None,
        stepping=seg is not None and seg.last_progress_time is not None,
        step=int(last["step"]) if current and last.get("step") is not None else None,
        samples=float(last["samples"]) if last.get("samples") is not None else None,
        samples_per_s=(float(last["samples_per_s"])
                       if current and last.get("samples_per_s") is not None else None),
        history=tuple(tuple(h) for h in job.history),
        rescales=tuple(RescaleView(r.kind, r.from_size, r.to_size, r.pause_s, r.steady,
                                   r.decided_s, r.first_step_s) for r in job.rescales),
        restarts=job.restarts,
        resolutions=job.resolutions,
        plans=tuple(tuple(p) for p in getattr(job, "plan_log", ())),
    )


def take_snapshot(loop: Any) -> ControlSnapshot:
    """Copy the loop's state; call only from the loop's own thread."""
    return ControlSnapshot(
        time=time.time(),
        store_host=loop.store_host,
        store_port=getattr(loop, "store_port", None),
        nodes=frozenset(loop.controller.nodes),
        used_nodes=frozenset(loop.controller.allocation.used_nodes),
        replans=loop.replans,
        jobs=MappingProxyType({k: job_view(j, learnt_max(loop.controller.jobs.get(k)))
                               for k, j in loop.jobs.items()}),
    )


def learnt_max(state: Any) -> int | None:
    """The most nodes the controller learnt it may give a job while it runs (None: its
    spec's): its cap (``JobState.node_cap``) or its largest learnt size (``node_sizes``)."""
    bounds = [b for b in (getattr(state, "node_cap", None),
                          (getattr(state, "node_sizes", None) or (None,))[-1]) if b is not None]
    return min(bounds) if bounds else None
