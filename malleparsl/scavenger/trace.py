"""A live node source that replays an idle-node trace, time-compressed, on the caller's clock.

The demo and the executor's tests need nodes that come and go the way a real machine's idle
nodes do, without a real machine: :class:`TraceNodeSource` replays a slice of a trace (the
Summit trace, an SWF-derived one, any fragment CSV) ``speedup`` times faster than it happened
and maps the trace's node names onto the caller's (e.g. the local executor's emulated nodes).

>>> from malleparsl.traces import trace_from_fragments
>>> tr = trace_from_fragments([("a02n02", 0, 600), ("a02n03", 60, 120)])
>>> src = TraceNodeSource(trace=tr, speedup=60, origin_s=1000.0, node_names=["node-0", "node-1"])
>>> [(e.kind, e.node, e.time_s) for e in src.poll(1001.0)]
[('idle', 'node-0', 1000.0), ('idle', 'node-1', 1001.0)]
>>> [(e.kind, e.node, e.time_s) for e in src.poll(1002.0)]
[('taken', 'node-1', 1002.0)]
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import numpy as np

from malleparsl.errors import SpecError
from malleparsl.model import NodeId
from malleparsl.scavenger.base import NodeEvent, NodeSource
from malleparsl.traces import IdleTrace

log = logging.getLogger(__name__)


class TraceNodeSource(NodeSource):
    """Replay ``trace`` at ``speedup`` x real time, from ``origin_s`` on the caller's clock.

    Parameters
    ----------
    trace
        The idle fragments to replay (already sliced and windowed as wanted).
    speedup
        Trace seconds per caller second (60: an hour of trace per minute).
    origin_s
        The caller-clock time at which the trace's ``start_s`` is replayed; default: the
        ``now_s`` of the first :meth:`poll`.
    node_names
        Names to report instead of the trace's, in the trace's node order (``trace.nodes``);
        at least as many as the trace has nodes.
    announce_ends
        Tell, with each ``idle`` event, when the node will be taken (``end_s`` on the caller's
        clock), as a scheduler with a plan would; otherwise only fragments marked
        ``known_end`` in the trace carry it.
    """

    def __init__(
        self,
        *,
        trace: IdleTrace,
        speedup: float = 60.0,
        origin_s: float | None = None,
        node_names: Sequence[NodeId] | None = None,
        announce_ends: bool = False,
    ) -> None:
        if not speedup > 0:
            raise SpecError(f"speedup must be > 0, got {speedup!r}; 60 replays an hour a minute")
        names = dict(zip(trace.nodes, node_names)) if node_names is not None else None
        if names is not None and len(names) < len(trace.nodes):
            raise SpecError(
                f"node_names has {len(names)} names for a trace of {len(trace.nodes)} nodes; "
                "give one per node or slice the trace (load_trace(..., nodes='0:N'))"
            )
        self.trace = trace
        self.speedup = float(speedup)
        self.origin_s = origin_s
        self.announce_ends = announce_ends
        f = trace.fragments
        rename = (lambda n: names[n]) if names is not None else (lambda n: n)
        # one row per event; at equal times "taken" sorts before "idle" (a node can come back)
        t = np.concatenate([f["end_s"].to_numpy(), f["start_s"].to_numpy()])
        kind = np.r_[np.zeros(len(f), int), np.ones(len(f), int)]
        order = np.lexsort((kind, t))
        nodes = [rename(n) for n in f["node"]] * 2
        ends = np.r_[f["end_s"].to_numpy(), f["end_s"].to_numpy()]
        known = np.r_[np.zeros(len(f), bool), f["known_end"].to_numpy(bool) | announce_ends]
        self._t = t[order]
        self._kind = kind[order]
        self._node = [nodes[i] for i in order]
        self._end = ends[order]
        self._known = known[order]
        self._i = 0
        # fragments clipped at the window's end are not taken back by the trace
        self._skip_end = self.trace.end_s

    def to_caller(self, trace_s: float) -> float:
        """A trace time on the caller's clock."""
        if self.origin_s is None:
            raise SpecError("the replay has no origin yet; poll() once or give origin_s=...")
        return self.origin_s + (trace_s - self.trace.start_s) / self.speedup

    @property
    def exhausted(self) -> bool:
        """Every event of the trace has been returned."""
        return self._i >= len(self._t)

    def poll(self, now_s: float) -> list[NodeEvent]:
        if self.origin_s is None:
            self.origin_s = float(now_s)
        horizon = self.trace.start_s + (now_s - self.origin_s) * self.speedup
        out: list[NodeEvent] = []
        while self._i < len(self._t) and self._t[self._i] <= horizon:
            i = self._i
            self._i += 1
            t = float(self._t[i])
            if self._kind[i] == 0:
                if t >= self._skip_end:
                    continue
                out.append(NodeEvent("taken", self._node[i], self.to_caller(t)))
            else:
                end = self.to_caller(float(self._end[i])) if self._known[i] else None
                out.append(NodeEvent("idle", self._node[i], self.to_caller(t), end))
        if out:
            log.debug("trace source: %d events up to trace t=%.0f", len(out), horizon)
        return out

    def next_event_s(self) -> float | None:
        """Caller-clock time of the next event (for a loop that wants to sleep until it)."""
        if self.exhausted or self.origin_s is None:
            return None
        return self.to_caller(float(self._t[self._i]))
