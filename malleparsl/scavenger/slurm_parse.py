"""Pure parsers for Slurm command output: hostlists, ``sinfo``, ``squeue --start``, reservations.

Kept apart from :mod:`malleparsl.scavenger.slurm` so the decisions can be tested on recorded
text and the scavenger stays about policy. Times: the scavenger asks Slurm for epoch seconds
(``SLURM_TIME_FORMAT=%s``); ISO timestamps (local time, Slurm's default) are accepted too.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from malleparsl.errors import SpecError

# squeue %T long state names that mean "this job no longer holds (or will not get) its node"
ENDED_STATES = frozenset({
    "BOOT_FAIL", "CANCELLED", "COMPLETED", "DEADLINE", "FAILED", "NODE_FAIL", "OUT_OF_MEMORY",
    "PREEMPTED", "REVOKED", "SPECIAL_EXIT", "TIMEOUT",
})
LIVE_STATES = frozenset({"RUNNING", "COMPLETING", "CONFIGURING", "SIGNALING", "STAGE_OUT"})
WAITING_STATES = frozenset({"PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESIZING",
                            "SUSPENDED", "STOPPED"})

_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")


def expand_hostlist(spec: str) -> list[str]:
    """Expand a Slurm hostlist such as ``n[01-03,07],gpu5`` into names.

    >>> expand_hostlist("n[01-03,07],login1")
    ['n01', 'n02', 'n03', 'n07', 'login1']
    >>> expand_hostlist("(null)")
    []
    """
    spec = spec.strip()
    if not spec or spec in ("(null)", "None", "N/A"):
        return []
    out: list[str] = []
    for part in _split_top(spec):
        out.extend(_expand_one(part))
    return out


def _split_top(spec: str) -> list[str]:
    parts, depth, cur = [], 0, ""
    for ch in spec:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    if depth != 0:
        raise SpecError(f"unbalanced brackets in hostlist {spec!r}")
    parts.append(cur)
    return [p for p in parts if p]


def _expand_one(part: str) -> list[str]:
    m = re.match(r"^([^\[]*)\[([^\]]+)\](.*)$", part)
    if not m:
        return [part]
    prefix, body, rest = m.groups()
    names = []
    for rng in body.split(","):
        r = _RANGE.match(rng)
        if not r:
            raise SpecError(f"bad range {rng!r} in hostlist {part!r}; expected N or N-M")
        lo_s, hi_s = r.group(1), r.group(2) or r.group(1)
        width = len(lo_s)
        for i in range(int(lo_s), int(hi_s) + 1):
            names.extend(prefix + str(i).zfill(width) + tail for tail in _expand_one(rest) or [""])
    return names


def parse_time(text: str) -> float | None:
    """Epoch seconds from Slurm's ``%s`` or ISO output; None for N/A, Unknown, 0."""
    t = text.strip()
    if not t or t in ("N/A", "Unknown", "None", "(null)", "0"):
        return None
    if re.fullmatch(r"\d+(\.\d+)?", t):
        return float(t)
    try:
        return datetime.fromisoformat(t).timestamp()
    except ValueError:
        return None


def parse_sinfo_nodes(text: str) -> dict[str, str]:
    """``sinfo -h -N -o '%N|%T'`` -> ``{node: state}`` (state lower-case, flags kept: ``idle*``)."""
    states: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        name, _, state = line.partition("|")
        for n in expand_hostlist(name):
            states[n] = state.strip().lower()
    return states


USABLE_STATES = frozenset({"idle", "planned"})


def idle_nodes(states: dict[str, str]) -> list[str]:
    """Nodes free now: ``idle``, or ``planned`` (idle, kept by the backfill scheduler for a
    pending job's future start: usable until then). Not ``idle*`` (not responding), ``idle~``
    (powered off), ``idle#`` (powering up), drained, down or in an active reservation."""
    return sorted(n for n, s in states.items() if s in USABLE_STATES)


@dataclass(frozen=True)
class PlannedStart:
    """A pending job the scheduler plans to start at ``start`` (epoch s) on ``nodes``."""

    job_id: str
    start: float
    nodes: tuple[str, ...]


def parse_squeue_start(text: str) -> list[PlannedStart]:
    """``squeue -h -t PD --start -o '%i|%S|%Y'`` -> planned starts (skips unplanned jobs)."""
    out = []
    for line in text.splitlines():
        fields = line.strip().split("|")
        if len(fields) < 3:
            continue
        start = parse_time(fields[1])
        nodes = expand_hostlist(fields[2])
        if start is not None and nodes:
            out.append(PlannedStart(fields[0], start, tuple(nodes)))
    return out


@dataclass(frozen=True)
class Reservation:
    name: str
    start: float
    end: float | None
    nodes: tuple[str, ...]


def parse_reservations(text: str) -> list[Reservation]:
    """``scontrol show reservation -o`` (one reservation per line) -> reservations."""
    out = []
    for line in text.splitlines():
        if "ReservationName=" not in line:
            continue
        kv = dict(tok.split("=", 1) for tok in line.split() if "=" in tok)
        start = parse_time(kv.get("StartTime", ""))
        if start is None:
            continue
        out.append(Reservation(kv.get("ReservationName", "?"), start,
                               parse_time(kv.get("EndTime", "")),
                               tuple(expand_hostlist(kv.get("Nodes", "")))))
    return out


def idle_ends(
    nodes: Iterable[str], planned: Iterable[PlannedStart], reservations: Iterable[Reservation],
    *, now: float,
) -> dict[str, float]:
    """When each idle node will be needed again: the earliest planned start or reservation start
    after ``now`` that names it. A reservation active now makes the node unusable (end = now)."""
    want = set(nodes)
    ends: dict[str, float] = {}

    def note(n: str, t: float) -> None:
        if n in want:
            ends[n] = min(ends.get(n, t), t)

    for p in planned:
        for n in p.nodes:
            note(n, max(p.start, now))
    for r in reservations:
        if r.end is not None and r.end <= now:
            continue
        for n in r.nodes:
            note(n, max(r.start, now))
    return ends


def parse_job_states(text: str) -> dict[str, tuple[str, list[str]]]:
    """``squeue -h -t all -j ids -o '%i|%T|%N'`` -> ``{job_id: (STATE, nodes)}``."""
    out: dict[str, tuple[str, list[str]]] = {}
    for line in text.splitlines():
        fields = line.strip().split("|")
        if len(fields) >= 2 and fields[0]:
            out[fields[0]] = (fields[1].upper(), expand_hostlist(fields[2]) if len(fields) > 2 else [])
    return out


def parse_partition(text: str) -> dict[str, str]:
    """``scontrol show partition NAME -o`` -> its ``key=value`` fields."""
    return dict(tok.split("=", 1) for tok in text.split() if "=" in tok)
