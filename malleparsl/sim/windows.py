"""Choosing the replay window: skip the warm-up of a job log replayed from its first job.

A job log (SWF) re-scheduled from its first submission starts on an empty machine: for hours
most nodes are idle only because the replay has not yet filled it, a state the real machine
never was in. Those idle nodes are an artefact; a window that starts there inflates every
figure. :func:`warmup_s` finds when the replayed utilisation first reaches its steady level
(the time-weighted median utilisation of the whole replay), and the CLI starts the window
there unless told otherwise (``--warmup-h``).

>>> from malleparsl.traces import trace_from_fragments
>>> # 4 nodes; the log fills the machine over the first 300 s, then one node idles at times
>>> tr = trace_from_fragments([("a", 0, 100), ("b", 0, 200), ("c", 0, 300),
...                            ("d", 0, 300), ("d", 2000, 2600)])
>>> tr = tr.window(0, 4000)
>>> warmup_s(tr)
300.0
"""

from __future__ import annotations

import numpy as np

from malleparsl.traces import IdleTrace

__all__ = ["steady_utilisation", "warmup_s"]


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
