"""Pure parsers for PBS Pro command output: ``pbsnodes -av``, ``qstat -f``, ``pbs_rstat -f``.

PBS Pro prints records as ``key = value`` lines under a header line (a node name, ``Job Id:
...``, ``Resv ID: ...``); long values wrap onto lines starting with a tab. Times are ctime
strings in the server's local time (``Fri Nov 10 14:00:00 2023``). Vnode lists look like
``(x3004c0s1b0n0:ncpus=64)+(x3004c0s1b1n0:ncpus=64)``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime

from malleparsl.errors import TraceFormatError

# job_state letters (qstat): which ones mean the pilot holds its node, waits, or is over
LIVE_JOB_STATES = frozenset("RB")
WAITING_JOB_STATES = frozenset("QWHT")
SUSPENDED_JOB_STATES = frozenset("SU")  # preempted by suspension: the node serves another job
ENDED_JOB_STATES = frozenset("EFX")


def parse_records(text: str, header: str | None = None) -> list[tuple[str, dict[str, str]]]:
    """Split PBS ``-f``/``-a`` output into ``(record name, {key: value})``.

    ``header``: the prefix of record header lines (``"Job Id:"``); None means "a line that is
    not indented starts a record" (``pbsnodes -av``).
    """
    records: list[tuple[str, dict[str, str]]] = []
    last_key: str | None = None
    for lineno, raw in enumerate(text.splitlines(), 1):
        if not raw.strip():
            continue
        line = raw.rstrip("\n")
        is_header = (line.startswith(header) if header is not None
                     else not line[0].isspace())
        if is_header:
            name = line[len(header):].strip() if header is not None else line.strip()
            records.append((name, {}))
            last_key = None
        elif line.startswith("\t") and last_key is not None and records:
            records[-1][1][last_key] += line.strip()  # a wrapped long value
        elif " = " in line and records:
            key, _, value = line.strip().partition(" = ")
            records[-1][1][key] = value.strip()
            last_key = key
        elif records:
            raise TraceFormatError(f"PBS output line {lineno} not understood: {line!r}")
    return records


def parse_pbs_time(text: str) -> float | None:
    """Epoch seconds from a PBS ctime string (server local time) or epoch digits."""
    t = " ".join(text.split())
    if not t:
        return None
    if re.fullmatch(r"\d+", t):
        return float(t)
    try:
        return datetime.strptime(t, "%a %b %d %H:%M:%S %Y").timestamp()
    except ValueError:
        return None


def vnodes(spec: str) -> list[str]:
    """Host names in an ``exec_vnode``/``resv_nodes`` list (in order, without repeats).

    >>> vnodes("(x1:ncpus=64)+(x2:ncpus=32+x3:ncpus=32)")
    ['x1', 'x2', 'x3']
    """
    out: list[str] = []
    for chunk in re.split(r"[()+]", spec):
        name = chunk.split(":", 1)[0].strip()
        if name and name not in out:
            out.append(name)
    return out


@dataclass(frozen=True)
class PBSNode:
    name: str
    state: str
    jobs: tuple[str, ...]
    resv: tuple[str, ...]
    queue: str | None


def parse_pbsnodes(text: str) -> list[PBSNode]:
    """``pbsnodes -av`` -> nodes with their state, jobs and reservations."""
    nodes = []
    for name, kv in parse_records(text):
        jobs = tuple(j.strip().split("/")[0] for j in kv.get("jobs", "").split(",") if j.strip())
        resv = tuple(r.strip() for r in kv.get("resv", "").split(",") if r.strip())
        nodes.append(PBSNode(name, kv.get("state", "unknown"), jobs, resv, kv.get("queue")))
    return nodes


def free_nodes(nodes: list[PBSNode]) -> list[str]:
    """Wholly free nodes: state exactly ``free`` and no job on them (shared nodes with a job
    report ``free`` too). ``resv-exclusive``, ``offline``, ``down``, ``job-*`` are not free."""
    return sorted(n.name for n in nodes if n.state == "free" and not n.jobs)


@dataclass(frozen=True)
class PBSJob:
    job_id: str
    state: str
    queue: str
    name: str
    est_start: float | None
    est_nodes: tuple[str, ...]
    exec_nodes: tuple[str, ...]


def parse_qstat_f(text: str) -> list[PBSJob]:
    """``qstat -f`` (or ``qstat -x -f``) -> jobs, with the scheduler's estimated start and
    vnodes for queued jobs where the scheduler computed them (``estimated.*``)."""
    jobs = []
    for job_id, kv in parse_records(text, header="Job Id:"):
        jobs.append(PBSJob(
            job_id=job_id,
            state=kv.get("job_state", "?"),
            queue=kv.get("queue", ""),
            name=kv.get("Job_Name", ""),
            est_start=parse_pbs_time(kv.get("estimated.start_time", "")),
            est_nodes=tuple(vnodes(kv.get("estimated.exec_vnode", ""))),
            exec_nodes=tuple(vnodes(kv.get("exec_vnode", ""))),
        ))
    return jobs


@dataclass(frozen=True)
class PBSReservation:
    resv_id: str
    start: float | None
    end: float | None
    nodes: tuple[str, ...]
    state: str


def parse_pbs_rstat(text: str) -> list[PBSReservation]:
    """``pbs_rstat -f`` -> reservations with their start, end and vnodes."""
    out = []
    for rid, kv in parse_records(text, header="Resv ID:"):
        out.append(PBSReservation(
            resv_id=rid,
            start=parse_pbs_time(kv.get("reserve_start", "")),
            end=parse_pbs_time(kv.get("reserve_end", "")),
            nodes=tuple(vnodes(kv.get("resv_nodes", ""))),
            state=kv.get("reserve_state", ""),
        ))
    return out


def pbs_idle_ends(
    nodes: list[str], jobs: list[PBSJob], reservations: list[PBSReservation], *, now: float
) -> dict[str, float]:
    """Earliest estimated start of a queued job or a reservation on each of ``nodes``."""
    want = set(nodes)
    ends: dict[str, float] = {}
    starts = [(j.est_start, j.est_nodes) for j in jobs if j.state in "QW" and j.est_start]
    starts += [(r.start, r.nodes) for r in reservations
               if r.start is not None and (r.end is None or r.end > now)]
    for t, names in starts:
        for n in names:
            if n in want:
                ends[n] = min(ends.get(n, max(t, now)), max(t, now))
    return ends
