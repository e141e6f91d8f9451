"""A node source driven by hand: say which nodes are idle and which are taken back.

Useful on a laptop (``source.idle("node-04")`` to lend the executor one more emulated node), in
tests and benchmarks (grow and shrink on cue), and from any outside loop that knows about idle
nodes but is not a batch scheduler. Thread-safe: call :meth:`idle` and :meth:`take` from any
thread; the control loop collects the events at its next poll.

>>> src = ManualNodeSource()
>>> src.idle("node-00", end_s=600.0); src.take("node-01")
>>> [(e.kind, e.node) for e in src.poll(now_s=1.0)]
[('idle', 'node-00'), ('taken', 'node-01')]
>>> src.poll(now_s=2.0)
[]
"""

from __future__ import annotations

import threading
import time

from malleparsl.errors import SpecError
from malleparsl.model import NodeId
from malleparsl.scavenger.base import NodeEvent, NodeSource


class ManualNodeSource(NodeSource):
    """Queues ``idle``/``taken`` events given by :meth:`idle` and :meth:`take`.

    Parameters
    ----------
    nodes : node names that are idle from the start (e.g. ``[f"node-{i:02d}" for i in range(4)]``).
    """

    def __init__(self, *, nodes: list[NodeId] | tuple[NodeId, ...] = ()) -> None:
        self._lock = threading.Lock()
        self._events: list[NodeEvent] = []
        for n in nodes:
            self.idle(n)

    def idle(self, node: NodeId, *, end_s: float | None = None) -> None:
        """``node`` may be used, until ``end_s`` (seconds on the poller's clock) if known."""
        if not isinstance(node, str) or not node:
            raise SpecError(f"node must be a non-empty string, got {node!r}; e.g. 'node-04'")
        with self._lock:
            self._events.append(NodeEvent("idle", node, time.time(), end_s))

    def take(self, node: NodeId) -> None:
        """``node`` is needed back: the executor moves work off it and releases its pilot."""
        with self._lock:
            self._events.append(NodeEvent("taken", node, time.time()))

    def poll(self, now_s: float) -> list[NodeEvent]:
        with self._lock:
            out, self._events = self._events, []
        return out
