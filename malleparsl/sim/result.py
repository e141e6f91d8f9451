"""What a simulation run measured: the summary figures, the per-event log, the per-job table.

Kept apart from the engine so that reports, the CLI and tests read results without running
anything. In the per-event log, ``samples_per_s`` is the mean throughput from that event to the
next (pauses included), so the log integrates exactly to the samples trained. ``summary()`` gives the figures of the comparison table; ``pct_of_upper_bound`` is
filled in by :func:`compare` once the ``upper-bound`` run of the same trace is known.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

EVENT_COLUMNS = [
    "time_s",
    "idle_nodes",
    "used_nodes",
    "active_jobs",
    "queued_jobs",
    "samples_per_s",
    "solve_ms",
    "changed_jobs",
]
SIZE_COLUMNS = ["time_s", "job", "nodes"]
JOB_COLUMNS = [
    "job",
    "model",
    "submit_s",
    "start_s",
    "finish_s",
    "samples",
    "rescales",
    "pause_s",
    "total_samples",
]
"""The per-job table's columns, one definition for every accounting (``progress`` reads
``samples`` / ``total_samples``)."""


@dataclass
class SimResult:
    """Figures and logs of one simulated policy on one trace and workload."""

    policy: str
    trace: str
    start_s: float
    end_s: float
    samples: float
    idle_node_s: float
    used_node_s: float
    rescales: int
    pause_s: float
    preempt_pause_s: float
    preempt_cost_samples: float
    preemptions: int
    jobs_done: int
    jobs_submitted: int
    solve_s: np.ndarray
    wall_s: float
    events: pd.DataFrame
    sizes: pd.DataFrame
    jobs: pd.DataFrame
    replans: int
    pct_of_upper_bound: float | None = None
    pct_of_capped_bound: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def duration_s(self) -> float:
        return self.end_s - self.start_s

    def summary(self) -> dict[str, Any]:
        """One flat dict: the comparison-table row and the ``--json`` object."""
        s = self.solve_s * 1e3 if len(self.solve_s) else np.zeros(1)
        return {
            "policy": self.policy,
            "trace": self.trace,
            "hours": round(self.duration_s / 3600, 3),
            "samples": float(self.samples),
            "progress": self.progress,
            "samples_per_s": float(self.samples / self.duration_s) if self.duration_s else 0.0,
            "pct_of_upper_bound": self.pct_of_upper_bound,
            "pct_of_capped_bound": self.pct_of_capped_bound,
            "utilisation": float(self.used_node_s / self.idle_node_s) if self.idle_node_s else 0.0,
            "rescales": int(self.rescales),
            "pause_s": float(self.pause_s),
            "preemptions": int(self.preemptions),
            "preempt_pause_s": float(self.preempt_pause_s),
            "preempt_cost_samples": float(self.preempt_cost_samples),
            "jobs_done": int(self.jobs_done),
            "jobs_submitted": int(self.jobs_submitted),
            # when a workload runs out (every job done) samples tie; completion times still differ
            **self._completion_h(),
            "replans": int(self.replans),
            "solver_median_ms": float(np.median(s)),
            "solver_p95_ms": float(np.percentile(s, 95)),
            "solver_max_ms": float(np.max(s)),
            "wall_s": float(self.wall_s),
            **self.extra,
        }

    @property
    def progress(self) -> float:
        """Normalised progress: the sum over jobs of samples trained / the job's total samples.

        Rates differ by orders of magnitude between models, so raw samples let one fast job
        decide a total; here every job's whole training counts 1. Jobs without a finite total
        count 0 (no fraction of them is defined).
        """
        if "total_samples" not in self.jobs.columns or self.jobs.empty:
            return 0.0
        tot = self.jobs["total_samples"].astype(float)
        ok = np.isfinite(tot) & (tot > 0)
        return float((self.jobs["samples"][ok] / tot[ok]).sum())

    def _completion_h(self) -> dict[str, float | None]:
        """``mean_jct_h``: mean submission-to-finish time of the finished jobs; ``last_finish_h``:
        window start to the last finish, once every submitted job is done (hours)."""
        done = self.jobs[self.jobs["finish_s"].notna()]
        if done.empty:
            return {"mean_jct_h": None, "last_finish_h": None}
        all_done = self.jobs_done >= self.jobs_submitted
        return {
            "mean_jct_h": float((done["finish_s"] - done["submit_s"]).mean() / 3600),
            "last_finish_h": float((done["finish_s"].max() - self.start_s) / 3600) if all_done else None,
        }

    def save(self, out_dir: str | Path) -> dict[str, Path]:
        """Write the per-event log, size changes and per-job table as CSV under ``out_dir``."""
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        safe = self.policy.replace("/", "_").replace("+", "_")
        paths = {
            "events": out / f"events_{safe}.csv",
            "sizes": out / f"sizes_{safe}.csv",
            "jobs": out / f"jobs_{safe}.csv",
        }
        self.events.to_csv(paths["events"], index=False)
        self.sizes.to_csv(paths["sizes"], index=False)
        self.jobs.to_csv(paths["jobs"], index=False)
        return paths


def compare(results: Sequence[SimResult]) -> list[dict[str, Any]]:
    """Fill the ``pct_of_*`` figures from the bound runs present; return the summary rows."""
    bound = next((r for r in results if r.policy == "upper-bound"), None)
    if bound is not None and bound.samples > 0:
        for r in results:
            r.pct_of_upper_bound = 100.0 * r.samples / bound.samples
    capped = next((r for r in results if r.policy == "upper-bound-capped"), None)
    if capped is not None and capped.samples > 0:
        for r in results:
            r.pct_of_capped_bound = 100.0 * r.samples / capped.samples
    rows = [r.summary() for r in results]
    for row in rows:
        for k, v in row.items():
            if isinstance(v, float) and not math.isfinite(v):
                row[k] = None
    return rows
