"""Warm a new node for the jobs that may grow onto it, *before* the controller may use it.

A rescale pauses the whole job from the moment its ranks are told to stop until the new
segment takes its first step. On a node whose worker has never run the job's code, that pause
would include importing the user's modules (torch, torchvision, scikit-learn, the model file:
seconds, tens of seconds on a busy login node). So when a node becomes ready, the control loop
first runs :func:`warm_entry` there for every distinct entry of the active jobs — unpickling an
entry imports its module and everything that module imports; an entry with a ``warm()`` method
is also asked to warm itself — and only then offers the node to the controller. The running
jobs keep training meanwhile; the node simply joins the plan a few seconds later. A warm-up
that fails or exceeds ``timeout_s`` does not hold the node back.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from malleparsl.model import NodeId

log = logging.getLogger(__name__)


def warm_node() -> int:
    """A probe task that imports torch.distributed in a worker so segments start warm."""
    import torch.distributed  # noqa: F401

    return os.getpid()


def warm_entry(entry: Any) -> int:
    """Runs on a worker: receiving ``entry`` imported its modules; call its ``warm()`` if any."""
    import torch.distributed  # noqa: F401

    warm = getattr(entry, "warm", None)
    if callable(warm):
        warm()
    return os.getpid()


def entry_key(entry: Any) -> tuple[str, str]:
    """Entries that share code need one warm-up: key by the wrapped function's module and name."""
    fn = getattr(entry, "user_fn", entry)
    return (str(getattr(fn, "__module__", "")),
            str(getattr(fn, "__qualname__", type(fn).__qualname__)))


@dataclass
class _Warming:
    pending: int
    deadline_s: float
    entries: set[tuple[str, str]] = field(default_factory=set)


class NodeWarmer:
    """Tracks the warm-up tasks of nodes that are ready but not yet offered to the controller.

    Parameters
    ----------
    submit : callable
        ``submit(node, func, *args) -> Future`` (the executor's ``submit_to_node``).
    post : callable
        Hands ``("warmed", node, future)`` to the control loop when a warm-up task ends.
    timeout_s : float
        After this long a node joins the plan even if its warm-up has not finished.
    """

    def __init__(
        self,
        *,
        submit: Callable[..., Future],
        post: Callable[[tuple], None],
        timeout_s: float = 120.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.submit = submit
        self.post = post
        self.timeout_s = timeout_s
        self.clock = clock
        self._nodes: dict[NodeId, _Warming] = {}
        self.warmed: dict[NodeId, set[tuple[str, str]]] = {}  # what each node has imported

    def start(self, node: NodeId, entries: Iterable[Any]) -> bool:
        """Submit warm-ups for the entries ``node`` has not seen; True if the node must wait."""
        seen = self.warmed.setdefault(node, set())
        todo = {}
        for e in entries:
            todo.setdefault(entry_key(e), e)
        todo = {k: e for k, e in todo.items() if k not in seen}
        if not todo or node in self._nodes:
            return node in self._nodes
        self._nodes[node] = _Warming(len(todo), self.clock() + self.timeout_s, set(todo))
        for key, e in todo.items():
            try:
                fut = self.submit(node, warm_entry, e)
            except Exception as exc:
                log.warning("warm-up of %s for %s not submitted: %r", node, key, exc)
                fut = Future()
                fut.set_exception(exc)
            fut.add_done_callback(lambda f, n=node: self.post(("warmed", n, f)))
        log.info("node %s: warming %d entr%s before use", node, len(todo),
                 "y" if len(todo) == 1 else "ies")
        return True

    def done(self, node: NodeId, fut: Future) -> bool:
        """One warm-up of ``node`` ended; True when the node may now join the plan."""
        w = self._nodes.get(node)
        if w is None:
            return False
        exc = fut.exception()
        if exc is not None:
            log.warning("warm-up on node %s failed (%r); using the node anyway", node, exc)
        w.pending -= 1
        if w.pending > 0:
            return False
        del self._nodes[node]
        self.warmed.setdefault(node, set()).update(w.entries)
        return True

    def expired(self) -> list[NodeId]:
        """Nodes whose warm-up ran past ``timeout_s``: they join the plan now."""
        now = self.clock()
        late = [n for n, w in self._nodes.items() if now > w.deadline_s]
        for n in late:
            log.warning("warm-up of node %s still running after %.0f s; using the node anyway",
                        n, self.timeout_s)
            del self._nodes[n]
        return late

    def forget(self, node: NodeId) -> None:
        """The node is gone: stop waiting for it, and a reused name starts cold."""
        self._nodes.pop(node, None)
        self.warmed.pop(node, None)

    def warming(self, node: NodeId) -> bool:
        return node in self._nodes
