"""Trial runners: how a stage turns a suggestion into a running app and a future.

A :class:`TrialRunner` is the only thing a workflow knows about execution. :class:`ThreadTrialRunner`
runs a plain function in threads (unit tests, notebooks); :class:`AppTrialRunner`
(:mod:`malleparsl.workflows.apprunner`) submits a ``@malleable_app`` to Parsl, so each trial
is a malleable job placed and resized by the MalleableExecutor's controller. Runners also keep
an event log (submitted / finished / failed, with times) that live progress displays and the
report read.
"""

from __future__ import annotations

import concurrent.futures as cf
import os
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .results import TrialRow
from .scheduler import Suggestion


@dataclass(frozen=True)
class TrialEvent:
    """``kind`` is ``submitted``, ``finished`` or ``failed``; ``metrics`` set when finished."""

    time_s: float
    kind: str
    stage: str
    trial_id: str
    rung: int
    job_id: str
    metrics: Mapping[str, Any] = field(default_factory=dict)


class TrialRunner(ABC):
    """Submits trials and records what happened to them."""

    def __init__(self, *, ckpt_root: str | os.PathLike[str] | None = None) -> None:
        self.ckpt_root = os.fspath(ckpt_root) if ckpt_root is not None else None
        self.events: list[TrialEvent] = []
        self._lock = threading.Lock()
        self.listeners: list[Callable[[TrialEvent], None]] = []

    @staticmethod
    def job_id(stage: str, s: Suggestion) -> str:
        """Unique per trial and rung (the executor's controller needs unique job ids)."""
        return f"{stage}-{s.trial_id}-r{s.rung}"

    def ckpt_dir(self, stage: str, s: Suggestion) -> str | None:
        """Shared by every rung of a trial, so a promoted trial resumes where it stopped."""
        if self.ckpt_root is None:
            return None
        return os.path.join(self.ckpt_root, stage, s.trial_id)

    def submit(self, stage: str, s: Suggestion) -> tuple[str, str | None, cf.Future]:
        """Start ``s``; returns its job id, checkpoint folder and result future."""
        job_id, ckpt = self.job_id(stage, s), self.ckpt_dir(stage, s)
        if ckpt is not None:
            os.makedirs(ckpt, exist_ok=True)
        fut = self._submit(stage, s, job_id, ckpt)
        self._emit(TrialEvent(time.time(), "submitted", stage, s.trial_id, s.rung, job_id))
        return job_id, ckpt, fut

    def trial_done(self, stage: str, s: Suggestion, row: TrialRow) -> None:
        """Called by the stage once a trial's future resolved (metrics or failure)."""
        kind = "failed" if row.status == "failed" else "finished"
        self._emit(TrialEvent(time.time(), kind, stage, s.trial_id, s.rung,
                              row.job_id or self.job_id(stage, s), dict(row.metrics)))

    def _emit(self, ev: TrialEvent) -> None:
        with self._lock:
            self.events.append(ev)
            listeners = list(self.listeners)
        for cb in listeners:
            cb(ev)

    @abstractmethod
    def _submit(self, stage: str, s: Suggestion, job_id: str, ckpt_dir: str | None) -> cf.Future:
        """Start the work; return a future of the metrics dict."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release threads or executors the runner owns."""


class ThreadTrialRunner(TrialRunner):
    """Runs ``fn(config, budget) -> metrics`` in a thread pool (tests, quick local trials)."""

    def __init__(self, fn: Callable[[Mapping[str, Any], float], Any], *, max_workers: int = 4,
                 ckpt_root: str | os.PathLike[str] | None = None) -> None:
        super().__init__(ckpt_root=ckpt_root)
        self.fn = fn
        self.pool = cf.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="trial")

    def _submit(self, stage: str, s: Suggestion, job_id: str, ckpt_dir: str | None) -> cf.Future:
        return self.pool.submit(self.fn, dict(s.config), s.budget)

    def close(self) -> None:
        self.pool.shutdown(wait=True)
