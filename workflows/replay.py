"""A slice of a real idle-node trace, replayed fast enough for a demo.

The Summit trace's idle fragments last minutes to hours; a demo lasts minutes. We pick a few
nodes and a window with plenty of churn, then map trace time to wall time at ``speed`` trace
seconds per wall second, so nodes join and leave every few seconds. Two adjustments keep a
compressed replay meaningful on emulated nodes: fragments shorter than ``min_fragment_s`` (wall)
are dropped, because a pilot takes seconds to start and could not be used at all, and gaps
shorter than ``min_gap_s`` are closed, because a node taken back must be released before the
same name can start again.

:class:`TraceReplay` speaks the :class:`~malleparsl.scavenger.base.NodeSource` contract, so the
MalleableExecutor's control loop polls it exactly like a Slurm or PBS scavenger.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import numpy as np
import pandas as pd

from malleparsl.errors import SpecError
from malleparsl.scavenger.base import NodeEvent, NodeSource
from malleparsl.traces import IdleTrace

log = logging.getLogger(__name__)


def pick_slice(trace: IdleTrace, *, nodes: int, window_s: float, speed: float,
               candidates: int = 200, seed: int = 0, min_fragment_s: float = 20.0,
               min_gap_s: float = 15.0) -> IdleTrace:
    """A window and ``nodes`` nodes whose compressed replay keeps nodes busy *and* changing.

    Each candidate window (``candidates`` start times drawn with ``seed``) takes its ``nodes``
    most-idle nodes and is scored on the replay the demo would see (:func:`compress`): at
    least half the nodes must be idle from the start, and the score rewards mean idle nodes
    and events (nodes joining or leaving) inside the window. Deterministic for a ``seed``.
    """
    if nodes < 1 or window_s <= 0:
        raise SpecError(f"need nodes >= 1 and window_s > 0, got nodes={nodes}, window_s={window_s}")
    rng = np.random.default_rng(seed)
    best: tuple[float, IdleTrace] | None = None
    f = trace.fragments
    codes, names = pd.factorize(f["node"])
    st, en = f["start_s"].to_numpy(float), f["end_s"].to_numpy(float)
    starts = rng.uniform(trace.start_s, max(trace.start_s, trace.end_s - window_s), candidates)
    wall = window_s / speed
    grid = np.linspace(0.0, wall, 200, endpoint=False)
    for w0 in starts:
        w1 = w0 + window_s
        hit = np.flatnonzero((en > w0) & (st < w1))
        if not len(hit):
            continue
        dur = np.minimum(en[hit], w1) - np.maximum(st[hit], w0)
        idle = np.bincount(codes[hit], weights=dur, minlength=len(names))
        if np.count_nonzero(idle) < nodes:
            continue
        top = np.argsort(-idle, kind="stable")[:nodes]
        keep = hit[np.isin(codes[hit], top)]
        g = f.iloc[keep].copy()
        g["start_s"], g["end_s"] = g["start_s"].clip(lower=w0), g["end_s"].clip(upper=w1)
        chosen = tuple(str(names[i]) for i in top)
        sub = IdleTrace(g.reset_index(drop=True), chosen, float(w0), float(w1), trace.name)
        c = compress(sub, speed=speed, min_fragment_s=min_fragment_s, min_gap_s=min_gap_s)
        if c.empty or int((c["start_s"] <= 0).sum()) < max(1, nodes // 2):
            continue
        cs, ce = c["start_s"].to_numpy(), c["end_s"].to_numpy()
        count = ((cs[:, None] <= grid) & (ce[:, None] > grid)).sum(axis=0)
        churn = int((cs > 0).sum() + (ce < wall - 1e-6).sum())
        score = count.mean() / nodes - 2.0 * float((count == 0).mean()) + 0.1 * min(churn, 2 * nodes)
        if best is None or score > best[0]:
            best = (score, sub)
    if best is None:
        raise SpecError(
            f"no window of {window_s:.0f} s with {nodes} usable idle nodes found in trace "
            f"{trace.name!r}; ask for fewer nodes or a lower speed"
        )
    return best[1]


def compress(trace: IdleTrace, *, speed: float, min_fragment_s: float = 20.0,
             min_gap_s: float = 15.0) -> pd.DataFrame:
    """Fragments in wall seconds from the window start: ``node, start_s, end_s, known_end``."""
    if not speed > 0:
        raise SpecError(f"speed must be > 0 trace seconds per wall second, got {speed!r}")
    rows = []
    for node, g in trace.fragments.sort_values(["node", "start_s"]).groupby("node", sort=True):
        merged: list[list] = []
        for r in g.itertuples(index=False):
            s, e = (r.start_s - trace.start_s) / speed, (r.end_s - trace.start_s) / speed
            if merged and s - merged[-1][2] < min_gap_s:
                merged[-1][2] = max(merged[-1][2], e)
                merged[-1][3] = merged[-1][3] and bool(r.known_end)
            else:
                merged.append([node, s, e, bool(r.known_end)])
        rows += [m for m in merged if m[2] - m[1] >= min_fragment_s]
    return pd.DataFrame(rows, columns=["node", "start_s", "end_s", "known_end"])


class TraceReplay(NodeSource):
    """Replays compressed fragments as ``idle``/``taken`` events on the caller's clock.

    The first :meth:`poll` fixes wall time 0. With ``cycle_s`` the window repeats, so a run
    that outlasts it still sees nodes come and go (and is never left without nodes for good).
    Events are kept consistent per node: no ``idle`` for a node already idle, no ``taken``
    for one that is not, and a node taken back becomes idle again no sooner than
    ``min_gap_s`` later (its pilot must be released first). ``end_s`` is given where the trace
    marks the end as announced in advance (``known_end``), else left unknown.
    """

    def __init__(self, *, fragments: pd.DataFrame, clock: Callable[[], float] = time.time,
                 cycle_s: float | None = None, min_gap_s: float = 15.0) -> None:
        if cycle_s is not None and not cycle_s > 0:
            raise SpecError(f"cycle_s must be > 0 seconds or None, got {cycle_s!r}")
        self.fragments = fragments.sort_values(["start_s", "node"]).reset_index(drop=True)
        self.cycle_s, self.min_gap_s, self.clock = cycle_s, min_gap_s, clock
        self.t0: float | None = None
        base = []
        for r in self.fragments.itertuples(index=False):
            base.append((float(r.start_s), 1, "idle", str(r.node),
                         float(r.end_s) if r.known_end else None))
            if cycle_s is None or r.end_s < cycle_s - 1e-9:
                base.append((float(r.end_s), 0, "taken", str(r.node), None))
        self._base = sorted(base, key=lambda e: (e[0], e[1], e[3]))  # taken first at ties
        self._cycle, self._i = 0, 0
        self._idle: set[str] = set()
        self._taken_at: dict[str, float] = {}
        self._deferred: dict[str, float] = {}  # node -> time its idle event is due
        self.log: list[NodeEvent] = []
        self._closed = False

    @property
    def nodes(self) -> list[str]:
        return sorted(set(self.fragments["node"]))

    def _next_base(self, upto: float) -> tuple[float, str, str, float | None] | None:
        if not self._base:
            return None
        if self._i >= len(self._base):
            if self.cycle_s is None:
                return None
            self._cycle, self._i = self._cycle + 1, 0
        t, _, kind, node, end = self._base[self._i]
        off = self._cycle * (self.cycle_s or 0.0)
        if t + off > upto:
            return None
        self._i += 1
        return t + off, kind, node, None if end is None else end + off

    def poll(self, now_s: float) -> list[NodeEvent]:
        if self._closed:
            return []
        if self.t0 is None:
            self.t0 = now_s
        rel = now_s - self.t0
        raw: list[tuple[float, str, str, float | None]] = []
        while (ev := self._next_base(rel)) is not None:
            raw.append(ev)
        out: list[NodeEvent] = []
        for t, kind, node, end in raw:
            self._due(t, out)
            if kind == "idle":
                if node in self._idle or node in self._deferred:
                    continue
                ready_at = self._taken_at.get(node, -np.inf) + self.min_gap_s
                if ready_at > t:
                    self._deferred[node] = ready_at
                    continue
                self._emit(out, "idle", node, t, end)
            else:
                self._deferred.pop(node, None)
                if node in self._idle:
                    self._emit(out, "taken", node, t, None)
        self._due(rel, out)
        self.log.extend(out)
        return out

    def _due(self, upto: float, out: list[NodeEvent]) -> None:
        for node, t in sorted(self._deferred.items(), key=lambda kv: kv[1]):
            if t <= upto:
                del self._deferred[node]
                self._emit(out, "idle", node, t, None)

    def _emit(self, out: list[NodeEvent], kind: str, node: str, t: float, end: float | None) -> None:
        assert self.t0 is not None  # noqa: S101 - set by poll
        if kind == "idle":
            self._idle.add(node)
        else:
            self._idle.discard(node)
            self._taken_at[node] = t
        out.append(NodeEvent(kind, node, self.t0 + t, None if end is None else self.t0 + end))

    def close(self) -> None:
        self._closed = True
