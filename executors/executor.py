"""``MalleableExecutor``: Parsl's HighThroughputExecutor with named nodes that come and go.

HTEX already has what a malleable pool needs underneath — pilot jobs (blocks) through any
provider, one manager per node, heartbeats, ``ManagerLost`` when a node dies. What it lacks is
*which* node: scaling is by block count and dispatch is to any free worker. This subclass adds

* one block per node, started, released or killed by name (:meth:`add_node`,
  :meth:`release_node`, :meth:`kill_node`), with listeners told when a node becomes ready (its
  manager registered and a probe task answered) or is lost;
* tasks pinned to a node (:meth:`submit_to_node`), dispatched by
  :class:`~malleparsl.executors.interchange.AffinityInterchange`;
* hand-off of malleable jobs (``resource_specification={"malleable": {...}}``) to the control
  loop, which runs them as sequences of pinned rank tasks.

Every other task is an ordinary HTEX task, so existing Parsl apps run unchanged.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import logging
import os
import queue
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any

import zmq
from parsl.executors import HighThroughputExecutor
from parsl.executors.high_throughput.errors import ManagerLost
from parsl.jobs.states import JobState, JobStatus
from parsl.providers import LocalProvider
from parsl.serialize import pack_apply_message
from parsl.serialize.errors import SerializationError

from malleparsl.errors import SpecError
from malleparsl.executors import parsl_compat as compat
from malleparsl.executors.interchange import AFFINITY_KEY, CONTROL_KEY
from malleparsl.executors.nodes import (
    NodeTable,
    local_process_groups,
    probe_node,
    tolerant_error_handler,
)
from malleparsl.executors.options import ControlOptions
from malleparsl.executors.protocol import as_entry
from malleparsl.executors.snapshot import ControlSnapshot
from malleparsl.executors.watchdog import (
    DeadlineError,
    InterchangeLostError,
    InterchangeWatchdog,
    command_with_deadline,
    send_with_deadline,
)
from malleparsl.model import NodeId

log = logging.getLogger(__name__)

Listener = Callable[[str, NodeId], None]


class MalleableExecutor(HighThroughputExecutor):
    """A Parsl executor whose nodes are named pilot jobs that a controller grows and shrinks.

    Parameters
    ----------
    label, provider : as for ``HighThroughputExecutor``; the provider must have
        ``nodes_per_block=1`` (one block is one node). Default: a ``LocalProvider`` with no
        initial blocks, so every node is started by name.
    nodes : emulated nodes (``node-00``, ...) to start in :meth:`start` when there is no
        ``node_source``.
    policy, advisor, node_source, max_active, ckpt_root : handed to the control loop that runs
        malleable jobs (see ``malleparsl.executors.control``).
    poll_period_s : how often the node monitor asks the interchange which managers are alive.
    warm_modules : modules the probe imports on every new node (e.g. ``("torch",)``) so a
        rescale does not pay for the import.
    malleable : start the control loop (it imports torch and serves a TCPStore). ``False``
        gives a plain node-aware HTEX: ordinary apps and ``submit_to_node`` only.
    probe_timeout_s : a node whose probe (including ``warm_modules``) has not answered this
        long after its manager registered is released rather than waited on forever.
    control : ControlOptions, optional
        Every setting of the control loop (store address and interface, ranks per node and
        device binding, grace periods, restart limit, warm-up, policy options); see
        :class:`~malleparsl.executors.options.ControlOptions`. ``max_active`` and
        ``poll_period_s`` given here override its fields of the same name.
    address : as for HTEX: the address nodes reach the interchange at. The rendezvous store
        listens on it too (only there), unless ``control.store_address`` names another.
    command_timeout_s, put_timeout_s : deadlines of a command to the interchange (the node
        monitor's ``MANAGERS`` query) and of a task put; past them the interchange counts as
        lost (see :mod:`malleparsl.executors.watchdog`).
    watchdog_period_s : how often the watchdog checks that the interchange process lives.
    **htex_kwargs : any other ``HighThroughputExecutor`` argument. Heartbeats default to a 2 s
        period and a 10 s threshold (HTEX: 30 s / 120 s): a lost node should be noticed quickly.

    Examples
    --------
    >>> ex = MalleableExecutor(nodes=2)          # doctest: +SKIP
    >>> ex.run_dir = "runinfo"; ex.start()       # doctest: +SKIP
    >>> fut = ex.submit_to_node("node-01", print, "hello")  # doctest: +SKIP
    """

    def __init__(
        self,
        *,
        label: str = "malleable",
        provider: Any = None,
        nodes: int | None = None,
        policy: str = "milp",
        advisor: Any = None,
        node_source: Any = None,
        max_active: int | None = None,
        poll_period_s: float | None = None,
        ckpt_root: str | None = None,
        warm_modules: Sequence[str] = (),
        malleable: bool = True,
        probe_timeout_s: float = 300.0,
        control: ControlOptions | None = None,
        command_timeout_s: float = 60.0,
        put_timeout_s: float = 60.0,
        watchdog_period_s: float = 0.2,
        **htex_kwargs: Any,
    ) -> None:
        control = control if control is not None else ControlOptions()
        if not isinstance(control, ControlOptions):
            raise SpecError(
                f"control must be a malleparsl.executors.ControlOptions, got {type(control).__name__}"
            )
        if max_active is not None:
            control = dataclasses.replace(control, max_active=max_active)
        if poll_period_s is not None:
            control = dataclasses.replace(control, poll_period_s=poll_period_s)
        poll_period_s = control.poll_period_s
        if nodes is not None and (isinstance(nodes, bool) or not isinstance(nodes, int) or nodes < 0):
            raise SpecError(f"nodes must be an integer >= 0, got {nodes!r}")
        if provider is None:
            provider = LocalProvider(init_blocks=0, min_blocks=0, max_blocks=1_000_000)
        if getattr(provider, "nodes_per_block", 1) != 1:
            raise SpecError(
                f"MalleableExecutor needs one node per block, got nodes_per_block="
                f"{provider.nodes_per_block}; set nodes_per_block=1 so nodes come and go alone"
            )
        workers = htex_kwargs.get("max_workers_per_node")
        if workers is not None and workers < control.ranks_per_node:
            raise SpecError(
                f"ranks_per_node={control.ranks_per_node} needs max_workers_per_node >= "
                f"{control.ranks_per_node}, got {workers}: each rank runs on its own worker"
            )
        htex_kwargs.setdefault("heartbeat_period", 2)
        htex_kwargs.setdefault("heartbeat_threshold", 10)
        htex_kwargs.setdefault("block_error_handler", tolerant_error_handler)
        htex_kwargs.setdefault(
            "interchange_launch_cmd", [sys.executable, "-m", "malleparsl.executors.interchange"]
        )
        super().__init__(label=label, provider=provider, **htex_kwargs)
        self.nodes = nodes
        self.policy = policy
        self.advisor = advisor
        self.node_source = node_source
        self.control_options = control
        # Parsl's RepresentationMixin reads every __init__ argument back as an attribute (config
        # repr, monitoring): these two mirror the options object, which is what the loop reads.
        self.max_active = control.max_active
        self.poll_period_s = poll_period_s
        self.ckpt_root = ckpt_root
        self.warm_modules = tuple(warm_modules)
        self.malleable = malleable
        self.probe_timeout_s = probe_timeout_s
        self.command_timeout_s = command_timeout_s
        self.put_timeout_s = put_timeout_s
        self.watchdog_period_s = watchdog_period_s
        self.watchdog: InterchangeWatchdog | None = None
        self.node_table = NodeTable()
        self.control: Any = None
        self._listeners: list[Listener] = []
        self._events: queue.Queue[tuple[str, NodeId]] = queue.Queue()
        self._monitor_stop = threading.Event()
        self._monitor: threading.Thread | None = None
        self._put_lock = threading.Lock()
        self._lost_lock = threading.Lock()

    def __repr__(self) -> str:
        """Parsl's RepresentationMixin reads every ``__init__`` argument back as an attribute,
        but ``control`` is the live loop (``ex.control.set_policy``), ``None`` before ``start``:
        show the :class:`ControlOptions` given instead, in the mixin's layout (sorted keywords,
        one per line when long)."""
        shown = {
            name: self.control_options if name == "control" else getattr(self, name, "<unrecorded>")
            for name, p in inspect.signature(MalleableExecutor.__init__).parameters.items()
            if p.kind is p.KEYWORD_ONLY
        }
        items = [f"{k}={v!r}" for k, v in sorted(shown.items())]
        line = f"{type(self).__name__}({', '.join(items)})"
        if len(line) <= self.__max_width__:
            return line
        return f"{type(self).__name__}(\n    " + ",\n    ".join(
            i.replace("\n", "\n    ") for i in items) + "\n)"

    # ---- lifecycle ----------------------------------------------------------------------
    def start(self) -> None:
        super().start()
        try:
            self._start_malleable()
        except BaseException:
            self.shutdown()
            raise

    def _start_malleable(self) -> None:
        sock = self.outgoing_q.zmq_socket
        sock.setsockopt(zmq.LINGER, 0)  # shutdown must not wait for a dead interchange to read

        def locked_put(message: Any) -> None:  # ZMQ sockets are not thread-safe
            try:
                with self._put_lock:
                    send_with_deadline(sock, message, timeout_s=self.put_timeout_s,
                                       broken=self._broken)
            except DeadlineError as exc:
                self._interchange_lost(InterchangeLostError(str(exc)))
                raise self.executor_exception from exc

        self.outgoing_q.put = locked_put  # type: ignore[method-assign]
        self.watchdog = InterchangeWatchdog(
            process=lambda: self.interchange_proc, on_lost=self._interchange_lost,
            label=self.label, period_s=self.watchdog_period_s,
        )
        self.watchdog.start()
        self._monitor = threading.Thread(target=self._monitor_loop, name="malleparsl-nodes", daemon=True)
        self._monitor.start()
        if self.node_source is None and self.nodes:
            for i in range(self.nodes):
                self.add_node(f"node-{i:02d}")
        self.control = self._make_control() if self.malleable else None
        if self.control is not None:
            self.control.start()

    def _make_control(self) -> Any:
        try:
            import torch.distributed  # noqa: F401  (the control loop serves a TCPStore)

            from malleparsl.executors.control import ControlLoop
        except ImportError as exc:
            log.warning("malleable jobs disabled (%s); ordinary Parsl apps still run", exc)
            return None
        return ControlLoop(
            executor=self,
            policy=self.policy,
            advisor=self.advisor,
            node_source=self.node_source,
            ckpt_root=self.ckpt_root,
            options=self.control_options,
        )

    def snapshot(self) -> ControlSnapshot:
        """The control loop's state (jobs, their segments and rescales, planned nodes) as of
        its last pass: frozen values, safe from any thread. Empty without a control loop."""
        ctl = self.control
        return ctl.snapshot() if ctl is not None else ControlSnapshot()

    def shutdown(self, timeout: float = 10.0) -> None:
        if self.watchdog is not None:
            self.watchdog.stop()  # the interchange is about to be terminated on purpose
        if self.control is not None:
            try:
                self.control.stop()
            except Exception:
                log.exception("control loop did not stop cleanly")
        self._monitor_stop.set()
        if self._monitor is not None:
            self._monitor.join(timeout=5)
        live = self.node_table.alive()
        for rec in live:
            self.node_table.gone(rec.name, "executor shut down")
        # Parsl's DFK may have scaled the blocks in already; cancel only what still runs.
        polled = compat.block_status(self)
        self._cancel_blocks([
            r.block_id for r in live if not (r.block_id in polled and polled[r.block_id].terminal)
        ])
        super().shutdown(timeout=timeout)

    # ---- nodes --------------------------------------------------------------------------
    def add_node(self, name: NodeId, *, end_s: float | None = None) -> None:
        """Start a pilot (one block) that becomes node ``name`` once its manager registers."""
        self.node_table.check_new_name(name)
        if self.bad_state_is_set:
            raise self.executor_exception
        block_id = compat.new_block_id(self)
        try:
            job_id = self._launch_node_block(block_id, name)
        except Exception as exc:
            compat.set_block_status(self, block_id, JobStatus(
                JobState.FAILED, f"Failed to start block {block_id} for node {name}: {exc}"
            ))
            raise
        self.node_table.add(name, block_id=block_id, job_id=job_id, end_s=end_s)
        self.blocks_to_job_id[block_id] = job_id
        self.job_ids_to_block[job_id] = block_id
        compat.set_block_status(self, block_id, JobStatus(JobState.PENDING), simulated=False)
        log.info("node %s: block %s submitted as job %s", name, block_id, job_id)

    def _launch_node_block(self, block_id: str, name: NodeId) -> Any:
        """Submit the pilot; a provider with ``submit_to_node`` is asked for that very host."""
        submit = getattr(self.provider, "submit_to_node", None)
        if submit is None:
            return compat.launch_block(self, block_id)
        cmd = compat.launch_command(self, block_id)
        return submit(cmd, 1, f"parsl.{self.label}.block-{block_id}", node=name)

    def release_node(self, name: NodeId) -> None:
        """Give node ``name`` back: fail its tasks now and cancel its pilot job."""
        rec = self._require(name)
        events = self.node_table.gone(name, "released")
        self._drop_block(rec.block_id)
        self._cancel_blocks([rec.block_id])
        self._emit(events)

    def kill_node(self, name: NodeId) -> None:
        """SIGKILL node ``name``'s manager and workers, as a preemption would.

        Nothing is told to the interchange: it notices through the missed heartbeats, exactly
        as for a node that died on its own. Works for nodes on this host; elsewhere it falls
        back to cancelling the pilot.
        """
        rec = self._require(name)
        pgids = local_process_groups(rec, self.provider)
        if not pgids:
            log.warning("cannot SIGKILL node %s from here; cancelling its pilot instead", name)
            self._cancel_blocks([rec.block_id])
            return
        for pgid in pgids:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGKILL)
        log.info("node %s: SIGKILLed process group(s) %s", name, sorted(pgids))

    def ready_nodes(self) -> set[NodeId]:
        """Nodes whose manager is registered, alive and answered the probe."""
        return self.node_table.ready()

    def node_info(self, name: NodeId) -> dict[str, Any]:
        """What the probe learned about ``name`` (hostname, pids, pgid, warm-up seconds)."""
        return dict(self._require(name).info)

    def add_node_listener(self, cb: Listener) -> None:
        """Call ``cb(event, node)`` with ``event`` in {"ready", "lost"}, from one thread.

        Only events after the call are reported; ask :meth:`ready_nodes` for the nodes that
        are ready already (a node may then be reported twice, which listeners must tolerate).
        """
        self._listeners.append(cb)

    def wait_for_nodes(self, n: int, timeout_s: float = 60.0) -> set[NodeId]:
        """Block until at least ``n`` nodes are ready; raise ``TimeoutError`` otherwise."""
        deadline = time.monotonic() + timeout_s
        while True:
            ready = self.ready_nodes()
            if len(ready) >= n:
                return ready
            if time.monotonic() > deadline:
                raise TimeoutError(f"only {len(ready)} of {n} nodes ready after {timeout_s} s")
            time.sleep(0.05)

    # ---- tasks --------------------------------------------------------------------------
    def validate_resource_spec(self, resource_specification: dict) -> None:
        rest = {k: v for k, v in (resource_specification or {}).items() if k not in ("malleable", "node")}
        super().validate_resource_spec(rest)

    def submit(self, func: Callable, resource_specification: dict, *args: Any, **kwargs: Any) -> Future:
        spec = resource_specification or {}
        if self.bad_state_is_set:
            raise self.executor_exception
        if "malleable" in spec:
            if self.control is None:
                raise SpecError(
                    "this MalleableExecutor has no control loop (not started, or "
                    "malleparsl.executors.control is missing); start it before submitting "
                    "malleable apps"
                )
            return self.control.submit_job(as_entry(func), spec["malleable"], args, kwargs)
        if "node" in spec:
            self.validate_resource_spec(spec)
            return self.submit_to_node(spec["node"], func, *args, **kwargs)
        return super().submit(func, resource_specification, *args, **kwargs)

    def set_bad_state_and_fail_all(self, exception: Exception) -> None:
        """Fail ordinary tasks (Parsl's behaviour) and every malleable job, queued or running:
        with no node able to start, nobody should wait on them."""
        super().set_bad_state_and_fail_all(exception)
        if self.control is not None:
            why = (str(exception) if isinstance(exception, InterchangeLostError)
                   else f"the executor cannot start nodes: {exception}")
            self.control.stop(why=why)

    def submit_to_node(self, node: NodeId, func: Callable, *args: Any, **kwargs: Any) -> Future:
        """Run ``func(*args, **kwargs)`` on ``node`` only.

        The future fails with ``ManagerLost`` if the node is released, killed or lost before
        or while the task runs (also when it was already gone at submission).
        """
        rec = self.node_table.get(node)
        if rec is None:
            raise SpecError(
                f"unknown node {node!r}; known nodes: {sorted(r.name for r in self.node_table.records())[:10]}. "
                "Add it with add_node() first"
            )
        if not rec.alive:
            fut: Future = Future()
            fut.set_exception(ManagerLost(f"block-{rec.block_id}".encode(), rec.info.get("hostname", node)))
            return fut
        try:
            buf = pack_apply_message(func, args, kwargs, buffer_threshold=1 << 20)
        except TypeError:
            raise SerializationError(getattr(func, "__name__", repr(func))) from None
        return self.submit_payload({"resource_spec": {AFFINITY_KEY: rec.block_id}}, buf)

    # ---- internals ----------------------------------------------------------------------
    def _require(self, name: NodeId) -> Any:
        rec = self.node_table.get(name)
        if rec is None:
            raise SpecError(f"unknown node {name!r}; add it with add_node() first")
        return rec

    def _drop_block(self, block_id: str) -> None:
        try:
            self.outgoing_q.put({CONTROL_KEY: "drop_block", "block_id": block_id})
        except InterchangeLostError as exc:  # its tasks failed with the executor already
            log.debug("block %s not dropped: %s", block_id, exc)

    def _broken(self) -> BaseException | None:
        """The executor's fatal error, if any (also when the watchdog has not looked yet)."""
        if self.bad_state_is_set:
            return self.executor_exception
        # the watchdog thread fails everything within its period; this caller must not wait
        return self.watchdog.check() if self.watchdog is not None else None

    def _interchange_lost(self, err: InterchangeLostError) -> None:
        """Fail every task and job with ``err`` and refuse new ones (once)."""
        if not self._lost_lock.acquire(blocking=False):
            return  # another thread is failing everything already
        try:
            if not self.bad_state_is_set:
                self.set_bad_state_and_fail_all(err)
        finally:
            self._lost_lock.release()

    def _cancel_blocks(self, block_ids: Sequence[str]) -> None:
        jobs = [self.blocks_to_job_id[b] for b in block_ids if b in self.blocks_to_job_id]
        if not jobs:
            return
        try:
            self.provider.cancel(jobs)
        except Exception:
            log.exception("provider failed to cancel jobs %s", jobs)
        for b in block_ids:
            compat.set_block_status(self, b, JobStatus(JobState.SCALED_IN))

    def _emit(self, events: Sequence[tuple[str, NodeId]]) -> None:
        for ev in events:
            self._events.put(ev)

    def _probe(self, rec: Any) -> None:
        fut = self.submit_to_node(rec.name, probe_node, self.warm_modules)

        def done(f: Future, name: NodeId = rec.name) -> None:
            exc = f.exception()
            if exc is None:
                self._emit(self.node_table.probed(name, f.result()))
            elif not isinstance(exc, ManagerLost):
                log.error("probe of node %s failed (%r); releasing it", name, exc)
                self.release_node(name)

        fut.add_done_callback(done)

    def _monitor_loop(self) -> None:
        next_check = 0.0
        while not self._monitor_stop.is_set():
            try:
                ev = self._events.get(timeout=min(self.poll_period_s, 0.1))
                self._deliver(ev)
            except queue.Empty:
                pass
            if time.monotonic() >= next_check:
                next_check = time.monotonic() + self.poll_period_s
                try:
                    self._reconcile()
                except InterchangeLostError as exc:
                    self._interchange_lost(exc)
                except Exception:
                    if not self._monitor_stop.is_set():
                        log.exception("node monitor failed to reconcile; retrying")

    def _reconcile(self) -> None:
        if self.bad_state_is_set:
            return
        managers = command_with_deadline(self.command_client, "MANAGERS",
                                         timeout_s=self.command_timeout_s)
        self.poll_facade()  # rate-limited by the provider's status_polling_interval
        terminal = [b for b, s in compat.block_status(self).items() if s.terminal]
        to_probe, events = self.node_table.reconcile(managers, terminal)
        self._adopt_unnamed(managers)
        for rec in to_probe:
            self._probe(rec)
        for name in self.node_table.stuck_probing(self.probe_timeout_s):
            log.error("node %s did not answer its probe in %.0f s; releasing it", name,
                      self.probe_timeout_s)
            self.release_node(name)
        self._emit(events)

    def _adopt_unnamed(self, managers: Sequence[dict]) -> None:
        """Blocks Parsl started on its own (``init_blocks``, a strategy) become nodes too."""
        for m in managers:
            bid = str(m["block_id"])
            if self.node_table.by_block(bid) is None and bid in self.blocks_to_job_id:
                name = self.node_table.auto_name(bid, self.label)
                self.node_table.add(name, block_id=bid, job_id=self.blocks_to_job_id[bid], end_s=None)
                rec = self.node_table.registered(bid, str(m["manager"]))
                if rec is not None:
                    self._probe(rec)

    def _deliver(self, ev: tuple[str, NodeId]) -> None:
        for cb in list(self._listeners):
            try:
                cb(*ev)
            except Exception:
                log.exception("node listener %r failed on %s", cb, ev)
