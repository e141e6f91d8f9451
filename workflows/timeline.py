"""A sampler that records what the live system does, for progress displays and the report.

Every ``period_s`` it reads, without taking part in any decision: the nodes the executor
holds ready, the nodes the controller may plan with, which nodes each malleable job's running
segment occupies, and each job's training progress (rank 0's record in the control loop's
store). The samples become the demo's live view and, afterwards, its plots and the
node-seconds in ``summary.json``.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Sample:
    """The system at one instant (``t`` seconds since the recorder started)."""

    t: float
    ready: frozenset[str]  # nodes whose pilot is up
    usable: frozenset[str]  # nodes the controller may plan with
    running: dict[str, tuple[str, ...]] = field(default_factory=dict)  # job -> segment nodes
    samples: dict[str, float] = field(default_factory=dict)  # job -> samples trained so far
    rates: dict[str, float] = field(default_factory=dict)  # job -> samples/s (last record)

    @property
    def used(self) -> frozenset[str]:
        return frozenset(n for nodes in self.running.values() for n in nodes)

    @property
    def idle(self) -> frozenset[str]:
        return self.ready - self.used


class Recorder:
    """Samples a started MalleableExecutor (or nothing, for thread runners) in a thread."""

    def __init__(self, *, executor: Any = None, period_s: float = 0.5) -> None:
        self.executor, self.period_s = executor, period_s
        self.samples: list[Sample] = []
        self.t0 = time.time()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    # ---- lifecycle ----------------------------------------------------------------------
    def start(self) -> Recorder:
        self.t0 = time.time()
        self._thread = threading.Thread(target=self._run, name="malleparsl-recorder", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        try:
            self.sample()  # the final state
        except Exception:  # the control thread may be mid-update; the last sample will do
            log.debug("final recorder sample failed", exc_info=True)

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            try:
                self.sample()
            except Exception:  # never take the run down for a display
                log.debug("recorder sample failed", exc_info=True)

    # ---- sampling -----------------------------------------------------------------------
    @property
    def control(self) -> Any:
        return getattr(self.executor, "control", None)

    def sample(self) -> Sample:
        t = time.time() - self.t0
        ex, ctl = self.executor, self.control
        ready = frozenset(ex.ready_nodes()) if ex is not None else frozenset()
        usable: frozenset[str] = frozenset()
        running: dict[str, tuple[str, ...]] = {}
        samples: dict[str, float] = {}
        rates: dict[str, float] = {}
        if ctl is not None:
            snap = ex.snapshot()
            usable = frozenset(snap.nodes)
            jobs = list(snap.jobs.items())
            # A job told to stop still occupies its nodes' workers until its ranks return; a
            # job launched onto them meanwhile waits. Count each node for its actual occupant.
            jobs.sort(key=lambda kv: kv[1].state != "stopping")
            held: set[str] = set()
            for job_id, job in jobs:
                nodes = tuple(n for n in job.nodes if n not in held)
                held.update(nodes)
                if nodes:
                    running[job_id] = nodes
                    if job.samples is not None:
                        samples[job_id] = job.samples
                    if job.samples_per_s:
                        rates[job_id] = job.samples_per_s
        s = Sample(t, ready, usable, running, samples, rates)
        with self._lock:
            self.samples.append(s)
        return s

    def latest(self) -> Sample | None:
        with self._lock:
            return self.samples[-1] if self.samples else None

    # ---- summaries ----------------------------------------------------------------------
    def node_seconds(self) -> tuple[float, float]:
        """``(offered, used)`` node-seconds: every ready node (the idle nodes the source lent
        us, as the simulator counts them) and those of them running a segment; so
        ``used <= offered`` and ``used / offered`` is the utilisation."""
        offered = used = 0.0
        for a, b in zip(self.samples, self.samples[1:]):
            dt = b.t - a.t
            used += dt * len(a.used & a.ready)
            offered += dt * len(a.ready)
        return offered, used

    def rescale_count(self) -> dict[str, int]:
        """Relaunches per kind (up, down, same, restart) over every malleable job."""
        out: dict[str, int] = {}
        if self.control is None:
            return out
        for job in self.executor.snapshot().jobs.values():
            for r in job.rescales:
                out[r.kind] = out.get(r.kind, 0) + 1
        return out

    def resized_jobs(self) -> dict[str, str]:
        """Jobs relaunched at another size (grown or shrunk from their checkpoint), with the
        sizes they ran at as the samples saw them: ``{job: "1 -> 3 -> 2"}``."""
        out: dict[str, str] = {}
        if self.control is None:
            return out
        for job_id, job in self.executor.snapshot().jobs.items():
            if not any(r.kind in ("up", "down") for r in job.rescales):
                continue
            sizes: list[int] = []
            for smp in self.samples:
                n = len(smp.running.get(job_id, ()))
                if n and (not sizes or sizes[-1] != n):
                    sizes.append(n)
            out[job_id] = " -> ".join(map(str, sizes)) or "?"
        return out

    def plan_changes(self) -> dict[str, str]:
        """Which execution plan ran when, for jobs that ran any plan but plain data parallelism:
        ``{job: "dp@mb=64 x1 (0 s) -> dp x4 (93 s)"}``, seconds from the job's first segment."""
        out: dict[str, str] = {}
        if self.control is None:
            return out
        for job_id, job in self.executor.snapshot().jobs.items():
            log = job.plans
            if not log or all(plan == "dp" for _, _, plan, _ in log):
                continue
            t0 = log[0][3]
            out[job_id] = " -> ".join(f"{plan} x{size} ({start - t0:.0f} s)"
                                      for _, size, plan, start in log)
        return out

