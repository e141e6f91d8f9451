"""An HTEX interchange that can pin a task to one block (one node).

Parsl's interchange hands each task to whichever manager a ``ManagerSelector`` ranks first; the
selector sees managers, never the task, so a rank of a training job cannot be sent to the node
the allocator chose. This subclass keeps everything else stock (ZMQ sockets, registration,
heartbeats, ``ManagerLost`` on an expired manager) and adds two things:

* a task whose ``resource_spec`` carries :data:`AFFINITY_KEY` (a block id) waits in a per-block
  queue and is dispatched only to a manager of that block, ahead of unpinned tasks;
* a control message on the task channel (``{CONTROL_KEY: "drop_block", "block_id": ...}``) that
  the executor sends when it releases a node: the block's in-flight and queued pinned tasks fail
  at once with ``ManagerLost`` and its managers are forgotten, instead of waiting for the
  heartbeat threshold.

Pinned tasks whose block has registered before but has no live manager any more (the heartbeat
expired it) fail the same way, so a rank on a dead node never waits forever. All failures go
through the interchange's one result channel, so every task resolves exactly once.

The executor launches this module through HTEX's ``interchange_launch_cmd``
(``python -m malleparsl.executors.interchange``); it reads the same pickled config on stdin as
Parsl's ``interchange.py``.
"""

from __future__ import annotations

import logging
import os
import pickle
import sys
import time
from collections import deque
from typing import Any

import zmq
from parsl.app.errors import RemoteExceptionWrapper
from parsl.executors.high_throughput.errors import ManagerLost
from parsl.executors.high_throughput.interchange import PKL_SHUTDOWN_CODE, Interchange
from parsl.serialize import serialize as serialize_object

logger = logging.getLogger("parsl.executors.high_throughput.interchange")

AFFINITY_KEY = "malleparsl_block"
"""``resource_spec`` key holding the block id a task is pinned to (set by the executor only)."""

CONTROL_KEY = "malleparsl_control"
"""Key that marks a message on the task channel as a command to the interchange."""


class AffinityInterchange(Interchange):
    """Stock interchange plus per-block task queues and a ``drop_block`` command."""

    def __init__(self, **config: Any) -> None:
        super().__init__(**config)
        self.pinned: dict[str, deque[dict]] = {}
        self.dropped_blocks: set[str] = set()
        self._parent = os.getppid()
        self._next_parent_check = 0.0

    # ---- incoming tasks and commands ----------------------------------------------------
    def process_task_incoming(self) -> None:
        if self.socks.get(self.task_incoming) != zmq.POLLIN:
            return
        msg = self.task_incoming.recv_pyobj()
        if CONTROL_KEY in msg:
            self._handle_control(msg)
            return
        resource_spec = msg["context"].get("resource_spec", {})
        block = resource_spec.get(AFFINITY_KEY)
        if block is None:
            priority = resource_spec.get("priority", float("inf"))
            self.pending_task_queue.add((-priority, -msg["task_id"], msg))
            return
        block = str(block)
        if block in self.dropped_blocks:
            self._fail([msg["task_id"]], block, hostname="(released)")
            return
        self.pinned.setdefault(block, deque()).append(msg)
        logger.debug("Task %s pinned to block %s", msg["task_id"], block)

    def _handle_control(self, msg: dict) -> None:
        command = msg[CONTROL_KEY]
        if command == "drop_block":
            self.drop_block(str(msg["block_id"]))
        else:
            logger.error("Unknown malleparsl control message %r; ignoring it", msg)

    def drop_block(self, block: str) -> None:
        """Forget ``block``: fail its in-flight and pinned tasks, tell its managers to stop."""
        logger.info("Dropping block %s", block)
        self.dropped_blocks.add(block)
        for manager_id, m in list(self._ready_managers.items()):
            if m.get("block_id") != block:
                continue
            self._fail(list(m["tasks"]), block, hostname=m.get("hostname", "?"), manager_id=manager_id)
            try:
                self.manager_sock.send_multipart([manager_id, PKL_SHUTDOWN_CODE])
            except zmq.ZMQError:
                logger.warning("Could not send shutdown to manager %r", manager_id)
            self._ready_managers.pop(manager_id, None)
        queued = self.pinned.pop(block, deque())
        self._fail([t["task_id"] for t in queued], block, hostname="(released)")

    # ---- dispatch -----------------------------------------------------------------------
    def process_tasks_to_send(self, interesting_managers: set[bytes], monitoring_radio: Any) -> None:
        if self.pinned:
            self._send_pinned(interesting_managers)
        super().process_tasks_to_send(interesting_managers, monitoring_radio)

    def _send_pinned(self, interesting_managers: set[bytes]) -> None:
        for manager_id, m in self._ready_managers.items():
            queue = self.pinned.get(m.get("block_id"))
            if not queue or not m["active"] or m["draining"]:
                continue
            capacity = m["max_capacity"] - len(m["tasks"])
            tasks = [queue.popleft() for _ in range(min(capacity, len(queue)))]
            if not queue:
                self.pinned.pop(m["block_id"], None)
            if not tasks:
                continue
            self.manager_sock.send_multipart([manager_id, pickle.dumps(tasks)])
            self.count += len(tasks)
            tids = [t["task_id"] for t in tasks]
            m["tasks"].extend(tids)
            m["idle_since"] = None
            if len(m["tasks"]) >= m["max_capacity"]:
                interesting_managers.discard(manager_id)
            logger.debug("Sent pinned tasks %s to manager %r", tids, manager_id)

    # ---- failures -----------------------------------------------------------------------
    def expire_bad_managers(self, interesting_managers: set[bytes], monitoring_radio: Any) -> None:
        self._exit_if_orphaned()
        super().expire_bad_managers(interesting_managers, monitoring_radio)
        if not self.pinned:
            return
        live = {m.get("block_id") for m in self._ready_managers.values()}
        seen = set(self.connected_block_history)
        for block in [b for b in self.pinned if b in seen and b not in live]:
            queued = self.pinned.pop(block)
            logger.warning("Block %s has no live manager; failing %d pinned tasks", block, len(queued))
            self._fail([t["task_id"] for t in queued], block, hostname="(lost)")

    def _exit_if_orphaned(self) -> None:
        """Exit when the executor's process is gone (stock HTEX would run on forever).

        Managers then lose the interchange and exit after their heartbeat threshold, so a
        crashed or killed client leaves no processes behind.
        """
        now = time.monotonic()
        if now < self._next_parent_check:
            return
        self._next_parent_check = now + 1.0
        if os.getppid() != self._parent:
            logger.warning("executor process %d is gone; interchange exiting", self._parent)
            os._exit(0)

    def _fail(
        self, task_ids: list[int], block: str, *, hostname: str, manager_id: bytes | None = None
    ) -> None:
        mid = manager_id if manager_id is not None else f"block-{block}".encode()
        for tid in task_ids:
            try:
                raise ManagerLost(mid, hostname)
            except ManagerLost:
                exc = serialize_object(RemoteExceptionWrapper(*sys.exc_info()))
            self.results_outgoing.send(
                pickle.dumps({"type": "result", "task_id": tid, "exception": exc})
            )


def main() -> None:
    """Entry point: read the pickled config from stdin, as Parsl's interchange does."""
    from parsl.utils import setproctitle

    setproctitle("parsl: malleparsl interchange")
    config = pickle.load(sys.stdin.buffer)
    AffinityInterchange(**config).start()


if __name__ == "__main__":
    main()
