"""Warm a new node for the jobs that may grow onto it, *before* the controller may use it.

A rescale pauses the whole job from the moment its ranks are told to stop until the new
segment takes its first step. On a worker that has never run the job's code, that pause would
include everything a process does the first time: importing the user's modules, loading the
data, building the model, forming a process group, the first forward and backward pass
(seconds, tens of seconds on a busy machine). So when a node becomes ready while jobs are
active, the control loop first *rehearses* each distinct job entry there — a one-rank run of
the real entry with a scratch checkpoint directory, under a private job id, stopped through
the stop key right after its first step (:func:`rehearse_entry`) — and only then offers the
node to the controller. Every segment re-runs the user's function from the top anyway, so a
rehearsal does nothing a rescale would not. The running jobs keep training meanwhile; the node
joins the plan a few seconds later. ``rehearse=False`` only unpickles the entry (imports its
modules) and calls its ``warm()`` method if it has one (:func:`warm_entry`). A warm-up that
fails or exceeds ``timeout_s`` does not hold the node back.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import socket
import tempfile
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from malleparsl.executors.protocol import DEFAULT_KEY_PREFIX, RankInfo, progress_key, stop_key
from malleparsl.model import NodeId
from malleparsl.procs import process_alive

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


def rehearse_entry(
    entry: Any, info: RankInfo, args: tuple = (), kwargs: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Runs on a worker: one rank of ``entry`` in a scratch checkpoint directory.

    The control loop stops it through ``stop_key(info.job_id)`` once its first progress record
    appears; the scratch directory is removed afterwards.
    """
    sweep_stale_scratch()
    scratch = tempfile.mkdtemp(prefix=_scratch_prefix(os.getpid()))
    t0 = time.perf_counter()
    try:
        info = dataclasses.replace(
            info, ckpt_dir=scratch, options={**info.options, "ckpt_dir": scratch}
        )
        out = entry(info, *args, **(kwargs or {}))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return {"pid": os.getpid(), "seconds": time.perf_counter() - t0,
            "status": getattr(out, "status", None)}


SCRATCH_PREFIX = "malleparsl-rehearsal-"
"""Name of a rehearsal's scratch directory: this prefix, the host, the worker's pid, a suffix."""


def _host_prefix() -> str:
    return f"{SCRATCH_PREFIX}{socket.gethostname()}-"


def _scratch_prefix(pid: int) -> str:
    return f"{_host_prefix()}{pid}-"


def sweep_stale_scratch(tmp: str | None = None) -> list[str]:
    """Remove this host's rehearsal scratch directories whose worker process is gone.

    A worker killed mid-rehearsal (its node taken back, SIGKILL) never runs the ``finally``
    that removes its scratch directory, and every such kill left one in the temporary
    directory. The next rehearsal on the host sweeps them; only this host's (a shared temporary
    directory holds other hosts' pids too) and only dead pids (a reused pid keeps its
    directory: harmless). Returns the removed paths."""
    root = tmp or tempfile.gettempdir()
    host = _host_prefix()
    removed = []
    try:
        names = os.listdir(root)
    except OSError:
        return removed
    for name in names:
        # "<pid>-<suffix>" exactly (mkdtemp's suffix has no "-"): not a host named "<host>-..."
        rest = name[len(host):].split("-") if name.startswith(host) else []
        pid = rest[0] if len(rest) == 2 else ""
        if pid.isdigit() and int(pid) != os.getpid() and not process_alive(int(pid)):
            path = os.path.join(root, name)
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


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
    rehearsals: dict[str, float] = field(default_factory=dict)  # private job id -> stop-by time


class NodeWarmer:
    """Tracks the warm-up tasks of nodes that are ready but not yet offered to the controller.

    Parameters
    ----------
    submit : callable
        ``submit(node, func, *args) -> Future`` (the executor's ``submit_to_node``).
    post : callable
        Hands ``("warmed", node, future)`` to the control loop when a warm-up task ends.
    store : torch.distributed.Store, optional
        The control loop's store; with ``store_host``/``store_port`` it enables rehearsals.
    rehearse : bool
        Rehearse entries (default) rather than only import them.
    timeout_s : float
        After this long a node joins the plan even if its warm-up has not finished.
    rehearsal_stop_s : float
        A rehearsal that has not reported progress by then is told to stop anyway.
    """

    def __init__(
        self,
        *,
        submit: Callable[..., Future],
        post: Callable[[tuple], None],
        store: Any = None,
        store_host: str = "",
        store_port: int = 0,
        rehearse: bool = True,
        timeout_s: float = 120.0,
        rehearsal_stop_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
        key_prefix: str = DEFAULT_KEY_PREFIX,
        env: dict[str, str] | None = None,
    ) -> None:
        self.submit = submit
        self.post = post
        self.store = store
        self.store_host = store_host
        self.store_port = store_port
        self.rehearse = rehearse and store is not None
        self.timeout_s = timeout_s
        self.rehearsal_stop_s = rehearsal_stop_s
        self.clock = clock
        self.key_prefix = key_prefix
        self.env = dict(env or {})
        self._nodes: dict[NodeId, _Warming] = {}
        self.warmed: dict[NodeId, set[tuple[str, str]]] = {}  # what each node has run

    def start(self, node: NodeId, jobs: Iterable[Any]) -> bool:
        """Warm ``node`` for the jobs' entries it has not run; True if the node must wait.

        ``jobs`` are objects with ``job_id``, ``entry``, ``args``, ``kwargs`` and ``options``
        (the control loop's :class:`~malleparsl.executors.driver.MalleableJob`).
        """
        if node in self._nodes:
            return True
        seen = self.warmed.setdefault(node, set())
        todo: dict[tuple[str, str], Any] = {}
        for job in jobs:
            if entry_key(job.entry) not in seen:
                todo.setdefault(entry_key(job.entry), job)
        if not todo:
            return False
        w = _Warming(len(todo), self.clock() + self.timeout_s, set(todo))
        self._nodes[node] = w
        for key, job in todo.items():
            try:
                fut = self._submit_one(node, job, w)
            except Exception as exc:
                log.warning("warm-up of %s for %s not submitted: %r", node, key, exc)
                fut = Future()
                fut.set_exception(exc)
            fut.add_done_callback(lambda f, n=node: self.post(("warmed", n, f)))
        log.info("node %s: %s %d entr%s before use", node,
                 "rehearsing" if self.rehearse else "warming", len(todo),
                 "y" if len(todo) == 1 else "ies")
        return True

    def _submit_one(self, node: NodeId, job: Any, w: _Warming) -> Future:
        if not self.rehearse:
            return self.submit(node, warm_entry, job.entry)
        private = f"{job.job_id}.rehearsal.{node}"
        w.rehearsals[private] = self.clock() + self.rehearsal_stop_s
        info = RankInfo(
            job_id=private, segment=0, rank=0, world_size=1, node=node, nodes=(node,),
            store_host=self.store_host, store_port=self.store_port, ckpt_dir="",
            options={**job.options, "job_id": private, "rehearsal": True},
            key_prefix=self.key_prefix, env=self.env, backend=getattr(job, "backend", "gloo"),
        )
        return self.submit(node, rehearse_entry, job.entry, info, job.args, job.kwargs)

    def poll(self) -> None:
        """Stop each rehearsal once it has stepped (its first progress record is out)."""
        now = self.clock()
        for w in self._nodes.values():
            for private, stop_by in list(w.rehearsals.items()):
                if now >= stop_by or self.store.check(
                        [progress_key(private, 0, self.key_prefix)]):
                    self.store.set(stop_key(private, self.key_prefix), "0")
                    del w.rehearsals[private]

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
