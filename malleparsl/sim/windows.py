"""Choosing the replay window: skip the warm-up of a job log replayed from its first job.

A job log (SWF) re-scheduled from its first submission starts on an empty machine: for hours
most nodes are idle only because the replay has not yet filled it, a state the real machine
never was in. Those idle nodes are an artefact; a window that starts there inflates every
figure. :func:`warmup_s` finds when the replayed utilisation first reaches its steady level
(the time-weighted median utilisation of the whole replay), and the CLI starts the window
there unless told otherwise (``--warmup-h``). :func:`select_case` is the one place that turns
the command-line options into a window and its jobs, for ``simulate`` and every bench that
replays "a case as ``simulate`` would"; :func:`replay_window` is the window itself (from a job
set's first submission, so many hours long), which every bench and script replays.

>>> from malleparsl.traces import trace_from_fragments
>>> # 4 nodes; the log fills the machine over the first 300 s, then one node idles at times
>>> tr = trace_from_fragments([("a", 0, 100), ("b", 0, 200), ("c", 0, 300),
...                            ("d", 0, 300), ("d", 2000, 2600)])
>>> tr = tr.window(0, 4000)
>>> warmup_s(tr)
300.0
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from malleparsl.errors import SpecError
from malleparsl.model import JobSpec
from malleparsl.traces import IdleTrace

__all__ = [
    "Case", "poisson_fields", "replay_window", "select_case", "steady_utilisation", "warmup_s",
]


def _utilisation(trace: IdleTrace) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Step function of the busy fraction: ``(times, busy, durations)`` within the window."""
    times, idle = trace.idle_count()
    if len(times) == 0 or times[0] > trace.start_s:
        times = np.r_[trace.start_s, times]
        idle = np.r_[0, idle]
    keep = times < trace.end_s
    times, idle = times[keep], idle[keep]
    dur = np.diff(np.r_[times, trace.end_s])
    busy = 1.0 - idle / max(1, len(trace.nodes))
    return times, busy, dur


def steady_utilisation(trace: IdleTrace) -> float:
    """Time-weighted median of the busy fraction over the whole trace."""
    _, busy, dur = _utilisation(trace)
    if busy.size == 0:
        return 1.0
    order = np.argsort(busy, kind="stable")
    cum = np.cumsum(dur[order])
    return float(busy[order][np.searchsorted(cum, cum[-1] / 2)])


def warmup_s(trace: IdleTrace) -> float:
    """Seconds from the trace start until the busy fraction first reaches its steady level."""
    times, busy, _ = _utilisation(trace)
    if busy.size == 0:
        return 0.0
    level = steady_utilisation(trace)
    hit = np.flatnonzero(busy >= level - 1e-12)
    return float(times[hit[0]] - trace.start_s) if hit.size else 0.0


def poisson_fields(spec: str) -> tuple[int, float]:
    """``poisson:N[:MEAN_S]`` -> ``(N, MEAN_S)``; every field is checked, none ignored."""
    parts = spec.split(":")
    rule = "write poisson:N or poisson:N:MEAN_INTERARRIVAL_S with N >= 1 and MEAN > 0"
    try:
        if not 2 <= len(parts) <= 3:
            raise ValueError
        n = int(parts[1])
        mean = float(parts[2]) if len(parts) > 2 else 600.0
    except ValueError:
        raise SpecError(f"--jobs {spec!r}: {rule}") from None
    if n < 1 or not (math.isfinite(mean) and mean > 0):
        raise SpecError(f"--jobs {spec!r}: {rule}")
    return n, mean


def replay_window(
    full: IdleTrace, hours: float, *, specs: Sequence[JobSpec] = (), start_s: float | None = None
) -> IdleTrace:
    """The part of ``full`` a case replays: from ``start_s``, else from the first submission of
    ``specs`` (not before the trace's start), ``hours`` long; ``hours <= 0`` runs to the trace's
    end. A window that opens before the first job would count idle nodes no job could use.

    >>> from malleparsl.model import JobSpec
    >>> from malleparsl.traces import trace_from_fragments
    >>> full = trace_from_fragments([("a", 0, 90_000)]).window(0, 90_000)
    >>> job = JobSpec("j", submit_s=3600.0)
    >>> w = replay_window(full, 1, specs=[job])
    >>> w.start_s, w.end_s, replay_window(full, 0, start_s=50.0).end_s
    (3600.0, 7200.0, 90000.0)
    """
    if start_s is None:
        start_s = max(full.start_s, min((j.submit_s for j in specs), default=full.start_s))
    end_s = full.end_s if hours <= 0 else min(full.end_s, start_s + 3600 * hours)
    return full.window(start_s, end_s)


def _warmup(full: IdleTrace, trace: str, warmup_h: float | None) -> float:
    """Seconds to skip at the trace's start: the user's, else an SWF log's measured warm-up."""
    if warmup_h is not None:
        if not (math.isfinite(warmup_h) and warmup_h >= 0):
            raise SpecError(f"--warmup-h {warmup_h!r}: must be a finite number of hours >= 0")
        return 3600.0 * warmup_h
    if str(trace).lower().endswith((".swf", ".swf.gz")):
        return warmup_s(full)
    return 0.0


@dataclass(frozen=True)
class Case:
    """A replay window and its jobs, as ``simulate``'s options select them."""

    window: IdleTrace
    specs: list[JobSpec]
    warmup_s: float


def select_case(  # noqa: PLR0913 - the simulate options that select a case
    full: IdleTrace,
    trace: str,
    jobs: str,
    *,
    hours: float,
    start_h: float | None,
    warmup_h: float | None = None,
    limit: int | None = None,
    seed: int = 0,
) -> Case:
    """The window ``[t0, t1)`` and the jobs of a case.

    Without ``start_h`` the window opens after the warm-up, or at the first submission of a job
    set if that is later. Generated jobs (``poisson:``) arrive from the window's start, not the
    trace's, so a window late in the trace does not open on a queue of hours-old jobs.
    ``hours <= 0`` runs to the trace's end.
    """
    from malleparsl.data import load_jobset

    warm = _warmup(full, trace, warmup_h)
    generated = jobs.startswith("poisson:")
    t0 = full.start_s + (3600 * start_h if start_h is not None else warm)
    if generated:
        from malleparsl.sim.workloads import poisson_jobs

        n, mean = poisson_fields(jobs)
        specs = poisson_jobs(n_jobs=n, mean_interarrival_s=mean, seed=seed, start_s=t0)
    else:
        specs = load_jobset(jobs, limit=limit)
        if start_h is None:
            t0 = max(t0, min((j.submit_s for j in specs), default=full.start_s))
    return Case(replay_window(full, hours, start_s=t0), list(specs), warm)
