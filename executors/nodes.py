"""Node bookkeeping for :class:`~malleparsl.executors.MalleableExecutor`.

One node is one Parsl block (``nodes_per_block=1``): nodes come and go independently, and a
node's identity is the block id its manager registers with. A node moves through

``pending`` (pilot submitted) -> ``probing`` (manager registered; a probe task is running on
it) -> ``ready`` (the probe answered: the worker is alive, warm, and we know its host and
process group) -> ``gone`` (released, killed, lost, or its pilot ended).

The table here is plain data plus the transition rules, with no Parsl calls, so the rules are
tested without processes. :func:`probe_node` is the task the executor runs on every new node.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import socket
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from malleparsl.errors import SpecError
from malleparsl.model import NodeId

log = logging.getLogger(__name__)

NodeState = Literal["pending", "probing", "ready", "gone"]
NodeEventKind = Literal["ready", "lost"]


@dataclass
class NodeRecord:
    """One node: its pilot (block) and what we learned about it."""

    name: NodeId
    block_id: str
    job_id: Any  # the provider's job id for the block
    state: NodeState = "pending"
    end_s: float | None = None  # when the node must be given back, if known
    added_at: float = field(default_factory=time.time)
    registered_at: float | None = None
    ready_at: float | None = None
    manager_id: str | None = None
    info: dict[str, Any] = field(default_factory=dict)  # from probe_node: host, pids, pgid
    gone_reason: str = ""

    @property
    def alive(self) -> bool:
        return self.state != "gone"


class NodeTable:
    """Thread-safe map of node names to records, with the transition rules.

    Methods that change state return the listener events to emit (``("ready", node)`` or
    ``("lost", node)``); a ``lost`` event is only emitted for a node that was ``ready``, so a
    listener sees every node as ready-then-lost at most once per pilot.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._nodes: dict[NodeId, NodeRecord] = {}
        self._by_block: dict[str, NodeId] = {}
        self._auto = 0

    # ---- queries ------------------------------------------------------------------------
    def get(self, name: NodeId) -> NodeRecord | None:
        with self._lock:
            return self._nodes.get(name)

    def by_block(self, block_id: str) -> NodeRecord | None:
        with self._lock:
            name = self._by_block.get(str(block_id))
            return self._nodes.get(name) if name is not None else None

    def records(self) -> list[NodeRecord]:
        with self._lock:
            return list(self._nodes.values())

    def stuck_probing(self, timeout_s: float, now: float | None = None) -> list[NodeId]:
        """Nodes whose probe has not answered ``timeout_s`` after registration."""
        now = time.time() if now is None else now
        with self._lock:
            return [n for n, r in self._nodes.items() if r.state == "probing"
                    and r.registered_at is not None and now - r.registered_at > timeout_s]

    def ready(self) -> set[NodeId]:
        with self._lock:
            return {n for n, r in self._nodes.items() if r.state == "ready"}

    def alive(self) -> list[NodeRecord]:
        with self._lock:
            return [r for r in self._nodes.values() if r.alive]

    # ---- transitions --------------------------------------------------------------------
    def check_new_name(self, name: NodeId) -> None:
        """Raise if ``name`` is not a usable new node name."""
        if not isinstance(name, str) or not name:
            raise SpecError(f"node name must be a non-empty string, got {name!r}")
        rec = self.get(name)
        if rec is not None and rec.alive:
            raise SpecError(
                f"node {name!r} is already {rec.state} (block {rec.block_id}); release it "
                "first or pick another name"
            )

    def add(self, name: NodeId, *, block_id: str, job_id: Any, end_s: float | None) -> NodeRecord:
        rec = NodeRecord(name=name, block_id=str(block_id), job_id=job_id, end_s=end_s)
        with self._lock:
            self._nodes[name] = rec
            self._by_block[rec.block_id] = name
        return rec

    def auto_name(self, block_id: str, prefix: str) -> NodeId:
        """A name for a block Parsl launched by itself (``init_blocks``, a scaling strategy)."""
        with self._lock:
            name = f"{prefix}-b{block_id}"
            while name in self._nodes:
                self._auto += 1
                name = f"{prefix}-b{block_id}.{self._auto}"
            return name

    def registered(self, block_id: str, manager_id: str) -> NodeRecord | None:
        """The block's manager appeared; returns the record if it now needs a probe."""
        with self._lock:
            rec = self._nodes.get(self._by_block.get(str(block_id), ""))
            if rec is None or rec.state != "pending":
                return None
            rec.state, rec.manager_id, rec.registered_at = "probing", manager_id, time.time()
            return rec

    def probed(self, name: NodeId, info: Mapping[str, Any]) -> list[tuple[str, NodeId]]:
        with self._lock:
            rec = self._nodes.get(name)
            if rec is None or rec.state != "probing":
                return []
            rec.state, rec.ready_at, rec.info = "ready", time.time(), dict(info)
            return [("ready", name)]

    def gone(self, name: NodeId, reason: str) -> list[tuple[str, NodeId]]:
        """The node stopped being usable, for ``reason``; idempotent."""
        with self._lock:
            rec = self._nodes.get(name)
            if rec is None or rec.state == "gone":
                return []
            was_ready = rec.state == "ready"
            rec.state, rec.gone_reason = "gone", reason
            log.info("node %s (block %s) gone: %s", name, rec.block_id, reason)
            return [("lost", name)] if was_ready else []

    def reconcile(
        self,
        managers: Sequence[Mapping[str, Any]],
        terminal_blocks: Iterable[str],
    ) -> tuple[list[NodeRecord], list[tuple[str, NodeId]]]:
        """Compare the table with the interchange's manager list and the provider's status.

        Returns the records that just registered (they need a probe) and the events for nodes
        whose manager vanished or whose pilot ended.
        """
        live = {str(m["block_id"]): m for m in managers if m.get("active", True)}
        terminal = {str(b) for b in terminal_blocks}
        to_probe: list[NodeRecord] = []
        events: list[tuple[str, NodeId]] = []
        for rec in self.alive():
            m = live.get(rec.block_id)
            if rec.state == "pending" and m is not None:
                r = self.registered(rec.block_id, str(m["manager"]))
                if r is not None:
                    to_probe.append(r)
            elif rec.state in ("probing", "ready") and m is None:
                events += self.gone(rec.name, "its manager is no longer registered")
            elif rec.state == "pending" and rec.block_id in terminal:
                events += self.gone(rec.name, "its pilot job ended before registering")
        return to_probe, events


def probe_node(warm_modules: Sequence[str] = ()) -> dict[str, Any]:
    """Runs on a new node's worker: import ``warm_modules`` and report where we are.

    Importing torch once here (~1.7 s) keeps it out of every later rescale: HTEX workers are
    long-lived processes, so the rank tasks that follow find it already loaded.
    """
    t0 = time.perf_counter()
    for name in warm_modules:
        importlib.import_module(name)
    return {
        "hostname": socket.gethostname(),
        "pid": os.getpid(),
        "ppid": os.getppid(),
        "pgid": os.getpgid(0),
        "warm_s": time.perf_counter() - t0,
        "pool_id": os.environ.get("PARSL_WORKER_POOL_ID"),
    }


def local_process_groups(rec: NodeRecord, provider: Any) -> set[int]:
    """Process groups on this host that hold node ``rec``'s manager and workers.

    From the probe (the worker's group, when it ran on this host) and from a provider that
    records the pilot's pid (``LocalProvider``). Never the caller's own group.
    """
    pgids: set[int] = set()
    if rec.info.get("hostname") == socket.gethostname() and rec.info.get("pgid"):
        pgids.add(int(rec.info["pgid"]))
    res = getattr(provider, "resources", {}).get(rec.job_id, {})
    if isinstance(res, dict) and res.get("remote_pid"):
        with contextlib.suppress(ProcessLookupError):
            pgids.add(os.getpgid(int(res["remote_pid"])))
    pgids.discard(os.getpgid(0))
    return pgids


def tolerant_error_handler(executor: Any, status: Mapping[str, Any]) -> None:
    """Block error handler for malleable pools: a node that dies after joining is normal.

    Parsl's default handler fails every task once all blocks have failed, which would turn the
    loss of the last node into a failed workflow. Here the executor is put in a bad state only
    while no pilot has ever registered, and then when every pilot failed and either there were
    at least three, or one exited 126/127 (the shell could not find or run the worker command:
    the venv is not on the nodes' PATH, say). Both are configuration errors nobody should wait
    on.
    """
    from parsl.jobs.states import JobState

    from malleparsl.executors.parsl_compat import block_error

    table = getattr(executor, "node_table", None)
    if table is not None and any(r.ready_at is not None for r in table.records()):
        return
    failed = [s for s in status.values() if s.state in (JobState.FAILED, JobState.MISSING)]
    not_runnable = any(s.exit_code in (126, 127) for s in failed)
    if failed and len(failed) == len(status) and (len(failed) >= 3 or not_runnable):
        executor.set_bad_state_and_fail_all(block_error(dict(status)))
