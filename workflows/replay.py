"""A slice of a real idle-node trace, replayed fast enough for a demo.

The Summit trace's idle fragments last minutes to hours; a demo lasts minutes. We pick a few
nodes and a window with plenty of churn, then map trace time to wall time at ``speed`` trace
seconds per wall second, so nodes join and leave every few seconds. Two adjustments keep a
compressed replay meaningful on emulated nodes: fragments shorter than ``min_fragment_s`` (wall)
are dropped, because a pilot takes seconds to start and could not be used at all, and gaps
shorter than ``min_gap_s`` are closed, because a node taken back must be released before the
same name can start again.

:func:`demo_source` hands the result to the simulator's
:class:`~malleparsl.scavenger.trace.TraceNodeSource`, a ``NodeSource`` the MalleableExecutor's
control loop polls exactly like a Slurm or PBS scavenger.
"""

from __future__ import annotations

import logging

import numpy as np
import pandas as pd

from malleparsl.errors import SpecError
from malleparsl.scavenger.trace import TraceNodeSource
from malleparsl.traces import IdleTrace

log = logging.getLogger(__name__)


def pick_slice(trace: IdleTrace, *, nodes: int, window_s: float, speed: float,
               candidates: int = 200, seed: int = 0, min_fragment_s: float = 20.0,
               min_gap_s: float = 15.0, warmup_s: float = 0.0,
               churn_weight: float = 0.1) -> IdleTrace:
    """A window and ``nodes`` nodes whose compressed replay keeps nodes busy *and* changing.

    Each candidate window (``candidates`` start times drawn with ``seed``) takes its ``nodes``
    most-idle nodes and is scored on the replay the demo would see (:func:`compress`): at
    least half the nodes must be idle from the start, and the score rewards mean idle nodes
    and events (nodes joining or leaving) inside the window; at least one node must still be
    idle at the window's end. Deterministic for a ``seed``.
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
        if not (c["end_s"] >= wall - 1e-6).any():
            continue  # no node left idle at the end: a run outlasting the window would starve
        cs, ce = c["start_s"].to_numpy(), c["end_s"].to_numpy()
        count = ((cs[:, None] <= grid) & (ce[:, None] > grid)).sum(axis=0)
        churn = int((cs > warmup_s).sum() + ((ce > warmup_s) & (ce < wall - 1e-6)).sum())
        score = (count.mean() / nodes - 2.0 * float((count == 0).mean())
                 + churn_weight * min(churn, 2 * nodes))
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


def demo_source(trace: IdleTrace, *, speed: float, min_fragment_s: float = 20.0,
                min_gap_s: float = 15.0) -> TraceNodeSource:
    """The simulator's :class:`TraceNodeSource` over the compressed slice (wall seconds).

    Fragments still open at the window's end are never taken back, so a run that outlasts
    the window keeps those nodes (:func:`pick_slice` makes sure there is at least one).
    """
    c = compress(trace, speed=speed, min_fragment_s=min_fragment_s, min_gap_s=min_gap_s)
    if c.empty:
        raise SpecError(
            f"no fragment of trace {trace.name!r} lasts {min_fragment_s} s at speed {speed}; "
            "lower the speed"
        )
    wall = IdleTrace(c, tuple(trace.nodes), 0.0, trace.duration_s / speed, trace.name)
    return TraceNodeSource(trace=wall, speedup=1.0)
