"""From a facility's job log to idle-node fragments: SWF parsing and an FCFS + EASY scheduler.

Logged start times cannot be trusted to give the machine's idle gaps (real logs over-subscribe
the machine when replayed, contain jobs larger than the machine, are out of order), so we
re-schedule the jobs ourselves, the way most facilities do: first-come first-served, with EASY
backfill (a later job may jump the queue if it does not delay the reservation of the job at the
head). Runtimes are the logged ones bounded by the requested time; reservations use the
requested time, as a real scheduler must. Each job takes the lowest-numbered free nodes, so the
result is deterministic. The nodes nobody holds form the idle fragments.
"""

from __future__ import annotations

import gzip
import heapq
import logging
import math
import os
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from malleparsl.errors import SpecError, TraceFormatError

log = logging.getLogger(__name__)

MAX_MACHINE_NODES = 1_000_000
"""Largest machine we re-schedule a log on (the biggest machines have ~10^5 nodes); a header
claiming more is a typo, and would need gigabytes of per-node state."""


@dataclass(frozen=True)
class SwfJob:
    """One job of a log, as the scheduler needs it (times in seconds)."""

    job_id: int
    submit_s: float
    run_s: float
    nodes: int
    req_s: float


def read_swf(path: str | os.PathLike[str]) -> tuple[list[SwfJob], dict[str, str]]:
    """Parse an SWF file: ``(jobs in submit order, header fields)``.

    Jobs with unknown or zero run time or size (cancelled before start) are skipped; a line
    with other than 18 fields or a non-numeric field raises :class:`TraceFormatError`.
    """
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    header: dict[str, str] = {}
    jobs: list[SwfJob] = []
    skipped = 0
    with opener(path, "rt") as fh:
        for lineno, line in enumerate(fh, start=1):
            s = line.strip()
            if not s:
                continue
            if s.startswith(";"):
                key, _, val = s[1:].partition(":")
                if val:
                    header[key.strip()] = val.strip()
                continue
            parts = s.split()
            if len(parts) != 18:
                raise TraceFormatError(
                    f"{path}: line {lineno}: {s[:80]!r} has {len(parts)} fields; an SWF job "
                    "line has 18 whitespace-separated fields"
                )
            try:
                v = [float(p) for p in parts]
            except ValueError:
                raise TraceFormatError(
                    f"{path}: line {lineno}: {s[:80]!r} has a non-numeric field; SWF fields "
                    "are numbers (-1 = unknown)"
                ) from None
            bad = [i + 1 for i, x in enumerate(v) if not math.isfinite(x)]
            if bad:
                raise TraceFormatError(
                    f"{path}: line {lineno}: field(s) {bad} are {[parts[i - 1] for i in bad]}; "
                    "SWF fields must be finite numbers (-1 = unknown)"
                )
            nodes = int(v[4]) if v[4] > 0 else int(v[7])
            run, req = v[3], v[8]
            if run <= 0 or nodes <= 0 or v[1] < 0:
                skipped += 1
                continue
            if req > 0:
                run = min(run, req)
            else:
                req = run
            jobs.append(SwfJob(int(v[0]), v[1], run, nodes, req))
    if skipped:
        log.info("%s: skipped %d jobs with unknown run time or size", path, skipped)
    jobs.sort(key=lambda j: (j.submit_s, j.job_id))
    return jobs, header


def easy_backfill(
    jobs: list[SwfJob], machine_nodes: int
) -> tuple[list[tuple[int, float, float]], float, float, dict[int, float]]:
    """Schedule ``jobs`` FCFS with EASY backfill on ``machine_nodes`` nodes.

    Returns ``(fragments, t_start, t_end, starts)``: idle fragments ``(node index, start, end)``
    over ``[first submit, last job end)``, and each job's start time. Jobs larger than the
    machine are clamped to it (logs contain them), with a warning.
    """
    if machine_nodes < 1 or machine_nodes > MAX_MACHINE_NODES:
        raise SpecError(
            f"machine_nodes must be in 1..{MAX_MACHINE_NODES:,}, got {machine_nodes!r}; "
            "fix the log's MaxNodes header or give --machine-nodes"
        )
    if not jobs:
        raise SpecError("the job log has no runnable job; nothing to schedule")
    big = sum(j.nodes > machine_nodes for j in jobs)
    if big:
        log.warning("%d jobs ask for more than %d nodes; clamped", big, machine_nodes)
    t_start = jobs[0].submit_s
    free: list[int] = list(range(machine_nodes))  # a heap of free node indices
    free_since = [t_start] * machine_nodes
    fragments: list[tuple[int, float, float]] = []
    running: list[tuple[float, int, tuple[int, ...]]] = []  # (actual end, job id, nodes)
    est_end: dict[int, tuple[float, int]] = {}  # job id -> (reserved end, size)
    queue: list[SwfJob] = []
    starts: dict[int, float] = {}
    i, now = 0, t_start

    def start(job: SwfJob, t: float) -> None:
        k = min(job.nodes, machine_nodes)
        got = tuple(heapq.heappop(free) for _ in range(k))
        for n in got:
            if t > free_since[n]:
                fragments.append((n, free_since[n], t))
        heapq.heappush(running, (t + job.run_s, job.job_id, got))
        est_end[job.job_id] = (t + job.req_s, k)
        starts[job.job_id] = t

    while i < len(jobs) or queue or running:
        nxt_sub = jobs[i].submit_s if i < len(jobs) else float("inf")
        nxt_end = running[0][0] if running else float("inf")
        now = min(nxt_sub, nxt_end)
        while running and running[0][0] <= now:
            _, jid, got = heapq.heappop(running)
            del est_end[jid]
            for n in got:
                heapq.heappush(free, n)
                free_since[n] = now
        while i < len(jobs) and jobs[i].submit_s <= now:
            queue.append(jobs[i])
            i += 1
        queue = _schedule_pass(queue, now, free, est_end, machine_nodes, start)
    t_end = now
    for n in range(machine_nodes):
        if t_end > free_since[n]:
            fragments.append((n, free_since[n], t_end))
    fragments.sort(key=lambda f: (f[1], f[0]))
    return fragments, t_start, t_end, starts


def _schedule_pass(queue, now, free, est_end, machine_nodes, start):  # noqa: ANN001
    """One FCFS + EASY pass at ``now``; returns the jobs still waiting."""
    while queue and min(queue[0].nodes, machine_nodes) <= len(free):
        start(queue.pop(0), now)
    if not queue or len(queue) == 1:
        return queue
    head = min(queue[0].nodes, machine_nodes)
    # shadow time: when the head job can start if running jobs end at their requested times
    avail, shadow, extra = len(free), float("inf"), 0
    for end, size in sorted(est_end.values()):
        avail += size
        if avail >= head:
            shadow, extra = max(end, now), avail - head
            break
    waiting = [queue[0]]
    for job in queue[1:]:
        k = min(job.nodes, machine_nodes)
        if k <= len(free) and (now + job.req_s <= shadow or k <= extra):
            if now + job.req_s > shadow:
                extra -= k
            start(job, now)
        else:
            waiting.append(job)
    return waiting


def swf_to_trace(
    path: str | os.PathLike[str], *, machine_nodes: int | None = None, name: str | None = None
):  # noqa: ANN201 - returns IdleTrace (imported lazily to keep the layering one-way)
    """Re-schedule an SWF log and return its idle fragments as an :class:`IdleTrace`.

    Times are seconds since the first submission. ``machine_nodes`` defaults to the header's
    ``MaxNodes`` (or ``MaxProcs``).
    """
    from malleparsl.traces import IdleTrace

    jobs, header = read_swf(path)
    if machine_nodes is None:
        for key in ("MaxNodes", "MaxProcs"):
            if key not in header:
                continue
            try:
                value = float(header[key])
            except ValueError:
                value = math.nan
            if value == -1:  # SWF's "unknown"
                continue
            if not (math.isfinite(value) and value == int(value) and 1 <= value <= MAX_MACHINE_NODES):
                raise SpecError(
                    f"{path}: header {key} {header[key]!r} is not a machine size (a whole "
                    f"number in 1..{MAX_MACHINE_NODES:,}); fix it or give --machine-nodes N"
                )
            machine_nodes = int(value)
            break
        else:
            raise SpecError(
                f"{path}: no MaxNodes header; give the machine size (machine_nodes=..., "
                "--machine-nodes N)"
            )
    frags, t0, t1, _ = easy_backfill(jobs, machine_nodes)
    width = len(str(machine_nodes - 1))
    names = tuple(f"n{i:0{width}d}" for i in range(machine_nodes))
    df = pd.DataFrame(frags, columns=["node", "start_s", "end_s"])
    df["node"] = [names[i] for i in df["node"]]
    df["start_s"] = df["start_s"] - t0
    df["end_s"] = df["end_s"] - t0
    df["known_end"] = False
    return IdleTrace(df, names, 0.0, t1 - t0, name or Path(path).stem)
