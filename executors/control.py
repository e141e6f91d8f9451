"""ControlLoop: the live control thread of a MalleableExecutor.

One thread owns all decisions, so nothing needs a lock: node events (from the executor's
listeners and a :class:`~malleparsl.scavenger.base.NodeSource`), job submissions and rank
results arrive on one queue; the thread turns them into
:class:`~malleparsl.controller.Controller` events, calls ``Controller.replan`` and moves every
:class:`~malleparsl.executors.driver.MalleableJob` towards the controller's allocation. Every
``poll_period_s`` it also polls the node source and reads the jobs' progress records (training
rates go to ``Controller.observe``, measured rescale pauses to ``Controller.observe_rescale``).

It serves the one ``torch.distributed.TCPStore`` through which ranks rendezvous and the
driver signals stops; torch is imported in :meth:`ControlLoop.start`, not at module import.
"""

from __future__ import annotations

import logging
import os
import queue
import socket
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from typing import Any

from malleparsl.allocator.base import AllocationPolicy
from malleparsl.controller import Controller, CurveAdvisor
from malleparsl.errors import SpecError
from malleparsl.executors.driver import DriverEvent, JobAbortedError, MalleableJob
from malleparsl.executors.options import ControlOptions
from malleparsl.executors.planning import build_policy, spec_from_options
from malleparsl.executors.protocol import new_key_prefix
from malleparsl.executors.snapshot import ControlSnapshot, take_snapshot
from malleparsl.executors.warmup import NodeWarmer, entry_key, warm_entry, warm_node
from malleparsl.jpa.plans import PlanProfiler
from malleparsl.model import NodeId
from malleparsl.names import check_safe_name
from malleparsl.plans import (
    MemoryBudgetError,
    batch_below_node,
    batch_max_nodes,
    fixed_plan_option,
    fixed_plan_sizes,
    global_batch_option,
)
from malleparsl.scavenger.base import NodeEvent, NodeSource

log = logging.getLogger(__name__)


class ControlLoop:
    """The live control loop: node events and job results in, segments launched and stopped.

    Parameters
    ----------
    executor : object
        The :class:`MalleableExecutor` (``submit_to_node``, ``add_node``, ``release_node``,
        ``ready_nodes``, ``add_node_listener``).
    policy : str or AllocationPolicy
        A registered policy name (``malleparsl.allocator.policy_names()``) or an instance.
        ``"jpa"`` profiles jobs online: it builds a
        :class:`~malleparsl.jpa.JobProfilingAdvisor` (unless ``advisor`` is one) and wraps
        ``policy_options.get("inner", "milp")`` with the JPA's probe-first policy.
    advisor : CurveAdvisor, optional
        Defaults to :class:`LinearPlaceholderAdvisor` (the job's curve, else linear).
    node_source : NodeSource, optional
        Idle/taken node events; ``idle`` starts a pilot (``executor.add_node``), ``taken``
        removes the node from the plan and releases its pilot after ``release_grace_s``.
    ckpt_root : str, optional
        Jobs checkpoint to ``<ckpt_root>/<job_id>`` unless their options give ``ckpt_dir``.
    warm_nodes, warm_rehearse, warm_timeout_s
        A node that becomes ready while jobs run first rehearses their entries (or, without
        ``warm_rehearse``, imports them) and joins the plan after, so a grow does not pause
        the job for a cold start; see :mod:`malleparsl.executors.warmup`.
    options : ControlOptions
        Every other setting (store address and interface, ranks per node, grace periods,
        restart limit, warm-up, policy options): see
        :class:`~malleparsl.executors.options.ControlOptions`. Read once, never changed.
    """

    def __init__(
        self,
        *,
        executor: Any,
        policy: str | AllocationPolicy = "milp",
        advisor: CurveAdvisor | None = None,
        node_source: NodeSource | None = None,
        ckpt_root: str | None = None,
        options: ControlOptions | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        opts = options if options is not None else ControlOptions()
        if not isinstance(opts, ControlOptions):
            raise SpecError(f"options must be a ControlOptions, got {type(opts).__name__}")
        self.options = opts
        self.executor = executor
        pol, advisor = build_policy(policy, dict(opts.policy_options), advisor)
        self.controller = Controller(
            policy=pol,
            advisor=advisor,
            max_active=opts.max_active,
            tfwd_s=opts.tfwd_s,
            plans=PlanProfiler(),
        )
        self.node_source = node_source
        self.poll_period_s = opts.poll_period_s
        run_dir = getattr(executor, "run_dir", None) or "."
        self.ckpt_root = ckpt_root or os.path.join(run_dir, "malleable_ckpt")
        self.store_host = opts.store_address or default_store_address(executor)
        self.key_prefix = new_key_prefix()
        self.warm_nodes = opts.warm_nodes
        self.warm_timeout_s = opts.warm_timeout_s
        self.warm_rehearse = opts.warm_rehearse
        self._warmer: NodeWarmer = NodeWarmer(submit=executor.submit_to_node, post=self._queue_put)
        self.release_grace_s = opts.release_grace_s
        self.fail_grace_s = opts.fail_grace_s
        self.stop_timeout_s = opts.stop_timeout_s
        self.max_restarts = opts.max_restarts
        self.observe_replan_s = opts.observe_replan_s
        self.clock = clock
        self._snapshot_lock = threading.Lock()
        self._snapshot: ControlSnapshot = ControlSnapshot()
        self._observed = False
        self._last_replan = 0.0
        self.jobs: dict[str, MalleableJob] = {}
        self.replans = 0
        self._queue: queue.Queue[tuple] = queue.Queue()
        self._node_end: dict[NodeId, float | None] = {}
        self._releases: dict[NodeId, float] = {}  # node -> time to release its pilot
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._store: Any = None

    # ---- lifecycle ------------------------------------------------------------------------
    def start(self) -> None:
        """Serve the TCPStore, subscribe to node events and start the control thread."""
        import datetime

        import torch.distributed as dist

        # listen on the one address ranks dial, not on every interface: TCPStore alone binds
        # to all of them, so hand it a socket bound here
        self._listener = socket.create_server((self.store_host, 0), backlog=512)
        self._store = dist.TCPStore(
            self.store_host, self._listener.getsockname()[1], None, True,
            timeout=datetime.timedelta(seconds=30), wait_for_workers=False,
            master_listen_fd=self._listener.fileno(),
        )
        self.store_port = self._store.port
        self._warmer = NodeWarmer(
            submit=self.executor.submit_to_node, post=self._queue_put, store=self._store,
            store_host=self.store_host, store_port=self.store_port,
            rehearse=self.warm_rehearse, timeout_s=self.warm_timeout_s,
            key_prefix=self.key_prefix, env=self.options.rank_env(0),
        )
        self.executor.add_node_listener(self._on_node_event)
        now = self.clock()
        ready = set(self.executor.ready_nodes())
        self.controller.add_nodes(ready, now_s=now)
        for n in ready:
            self._warm(n)
        self._publish()  # readers see the store before the first pass
        self._thread = threading.Thread(target=self._run, name="malleparsl-control", daemon=True)
        self._thread.start()
        log.info("control loop started: store %s:%d, %d node(s) ready",
                 self.store_host, self.store_port, len(ready))

    def stop(self, timeout_s: float = 10.0,
             why: str = "the executor shut down before the job finished") -> None:
        """Stop the thread; jobs not finished fail with :class:`JobAbortedError` saying ``why``."""
        self._stop.set()
        self._queue.put(("wake",))
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout_s)
        self._abort_all(why)
        if self.node_source is not None:
            self.node_source.close()

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    # ---- inputs (any thread) --------------------------------------------------------------
    def submit_job(
        self,
        entry: Callable[..., Any],
        options: Mapping[str, Any],
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
    ) -> Future:
        """Queue a malleable job; its future gets rank 0's result or the user's exception."""
        if not self.alive:
            raise RuntimeError("the control loop is not running; start the executor first")
        spec = spec_from_options(options, now_s=self.clock(),
                                 ranks_per_node=self.options.ranks_per_node)
        check_safe_name(spec.job_id, what="job_id")  # it becomes <ckpt_root>/<job_id>
        opts = {**dict(options), "job_id": spec.job_id}
        ckpt_dir = str(opts.get("ckpt_dir") or os.path.join(self.ckpt_root, spec.job_id))
        opts["ckpt_dir"] = ckpt_dir
        job = MalleableJob(
            spec=spec, entry=entry, args=args, kwargs=kwargs, options=opts,
            executor=self.executor, store=self._store, store_host=self.store_host,
            store_port=self.store_port, ckpt_dir=ckpt_dir, post=self._queue.put,
            clock=self.clock, max_restarts=int(opts.get("max_restarts", self.max_restarts)),
            fail_grace_s=self.fail_grace_s, stop_timeout_s=self.stop_timeout_s,
            key_prefix=self.key_prefix,
            ranks_per_node=self.options.ranks_per_node, rank_env=self.options.rank_env,
            backend=self.options.resolved_backend(),
            plan_for=lambda n, j=spec.job_id: self.controller.plan_for(j, n),
        )
        self._queue.put(("submit", job))
        return job.future

    def set_policy(
        self,
        policy: str | AllocationPolicy,
        policy_options: Mapping[str, Any] | None = None,
        advisor: CurveAdvisor | None = None,
    ) -> None:
        """Plan with another policy (and advisor) from the next event on; running jobs stay.

        A new advisor is told about the jobs already admitted.
        """
        pol, adv = build_policy(policy, dict(policy_options or {}), advisor)
        self._queue.put(("policy", pol, adv))

    def _on_node_event(self, event: str, node: NodeId) -> None:
        self._queue.put(("node", event, node))

    def _queue_put(self, ev: tuple) -> None:
        self._queue.put(ev)

    # ---- the thread -----------------------------------------------------------------------
    def _run(self) -> None:
        next_tick = 0.0
        try:
            while not self._stop.is_set():
                timeout = max(0.0, next_tick - time.monotonic())
                dirty = False
                try:
                    ev = self._queue.get(timeout=timeout)
                    dirty |= self._handle_safely(ev)
                    while True:  # drain: one replan for a burst of events
                        dirty |= self._handle_safely(self._queue.get_nowait())
                except queue.Empty:
                    pass
                if time.monotonic() >= next_tick:
                    dirty |= self._tick()
                    next_tick = time.monotonic() + self.poll_period_s
                    dirty |= self._observed and (
                        time.monotonic() - self._last_replan >= self.observe_replan_s)
                if dirty and not self._stop.is_set():
                    self._replan()
                self._publish()
        except BaseException as exc:  # never die silently: the futures would hang
            log.exception("control loop died")
            self._abort_all(f"the control loop died: {exc!r}")
            raise

    def _handle_safely(self, ev: tuple) -> bool:
        try:
            return self._handle(ev)
        except Exception:
            log.exception("control loop: error handling %r", ev[:3])
            return True

    def _handle(self, ev: tuple) -> bool:
        now = self.clock()
        kind = ev[0]
        if kind == "submit":
            job: MalleableJob = ev[1]
            if job.job_id in self.jobs:
                job.abort(SpecError(f"job id {job.job_id!r} is already in use; job ids must be unique"))
                return False
            self.jobs[job.job_id] = job
            self.controller.submit(job.spec, now_s=now)
            self._prewarm_free_nodes(job.entry)
            return True
        if kind == "rank":
            _, job_id, segment, rank, fut = ev
            result = self.jobs[job_id].on_rank_done(segment, rank, fut)
            return self._after_driver_event(job_id, result, now)
        if kind == "node":
            _, event, node = ev
            if event == "ready":
                self._releases.pop(node, None)
                active = [j for j in self.jobs.values() if j.state.value != "done"]
                if self.warm_nodes and self._warmer.start(node, active):
                    return False  # joins the plan once warm: see malleparsl.executors.warmup
                self._node_ready(node, now)
            elif event == "lost":
                self._node_gone(node, now)
            return True
        if kind == "warmed":
            _, node, fut = ev
            if self._warmer.done(node, fut) and node in self.executor.ready_nodes():
                self._node_ready(node, now)
                return True
            return False
        if kind == "policy":
            _, pol, adv = ev
            self.controller.policy = pol
            if adv is not self.controller.advisor:
                self.controller.advisor = adv
                for js in self.controller.active_jobs:
                    adv.register(js.spec, now)
            return True
        return False  # "wake"

    def _after_driver_event(self, job_id: str, ev: DriverEvent | None, now: float) -> bool:
        if ev is None:
            return False
        job = self.jobs[job_id]
        if ev in (DriverEvent.FINISHED, DriverEvent.FAILED):
            self.controller.finish(job_id, now_s=now)
        elif ev is DriverEvent.UNEVEN:  # its ranks refused the size: learn the batch's sizes
            self._split_sizes(job_id, job, next(reversed(job.uneven_ahead)), now)
        elif ev is DriverEvent.LOST:
            gone = [n for n in job.last_lost if n in self.controller.nodes]
            self.controller.remove_nodes(gone, now_s=now)
            for node in set(job.last_hung) & set(self.executor.ready_nodes()):
                # a hung rank (stopped, deadlocked) ignores SIGTERM while it holds the node's
                # worker: SIGKILL the node's processes before its pilot is released below
                log.warning("node %s holds a hung rank of job %s; killing it", node, job_id)
                try:
                    self.executor.kill_node(node)
                except Exception:
                    log.exception("kill of node %s failed", node)
            for node in set(gone) & set(self.executor.ready_nodes()):
                # a rank died there but the executor still counts the node: do not keep an
                # unplanned pilot (a node source may offer the node again later)
                log.warning("node %s lost a rank but is still registered; releasing it", node)
                try:
                    self.executor.release_node(node)
                except Exception:
                    log.exception("release of node %s failed", node)
        return True

    def _node_ready(self, node: NodeId, now: float) -> None:
        self.controller.add_nodes([node], now_s=now, end_s=self._ends(node))
        self._warm(node)

    def _prewarm_free_nodes(self, entry: Any) -> None:
        """A new job's code is imported on idle nodes now, not when the job grows onto them."""
        if not self.warm_nodes:
            return
        busy = {n for j in self.jobs.values() for n in j.nodes}
        key = entry_key(entry)
        for node in set(self.controller.nodes) - busy:
            seen = self._warmer.warmed.setdefault(node, set())
            if key not in seen:
                seen.add(key)
                try:
                    self.executor.submit_to_node(node, warm_entry, entry)
                except Exception as exc:
                    log.debug("pre-warm of %s not submitted: %r", node, exc)

    def _node_gone(self, node: NodeId, now: float) -> None:
        self._warmer.forget(node)
        self.controller.remove_nodes([node], now_s=now)
        self._node_end.pop(node, None)
        for job in self.jobs.values():
            job.node_lost(node)

    def _ends(self, node: NodeId) -> dict[NodeId, float]:
        end = self._node_end.get(node)
        return {node: end} if end is not None else {}

    def _warm(self, node: NodeId) -> None:
        if not self.warm_nodes or getattr(self.executor, "warm_modules", None):
            return  # the executor's own probe already imported what the ranks need
        try:
            self.executor.submit_to_node(node, warm_node)
        except Exception as exc:
            log.debug("warm-up of %s not submitted: %r", node, exc)

    def _tick(self) -> bool:
        now = self.clock()
        dirty = False
        self._warmer.poll()
        for node in self._warmer.expired():
            if node in self.executor.ready_nodes():
                self._node_ready(node, now)
                dirty = True
        if self.node_source is not None:
            try:
                events = self.node_source.poll(now)
            except Exception:
                log.exception("node source poll failed")
                events = []
            for e in events:
                dirty = True
                try:
                    self._source_event(e, now)
                except Exception:
                    log.exception("node source event %s not applied", e)
        busy = {n for j in self.jobs.values() for n in j.nodes}
        for node, due in list(self._releases.items()):
            if node not in busy or now >= due:
                del self._releases[node]
                try:
                    self.executor.release_node(node)
                except Exception:
                    log.exception("release of node %s failed", node)
        for job_id, job in list(self.jobs.items()):
            dirty |= self._after_driver_event(job_id, job.tick(), now)
            try:
                prog = job.read_progress()
            except Exception as exc:
                log.debug("job %s: progress not read: %r", job_id, exc)
                prog = None
            if prog is not None and job_id in self.controller.jobs:
                self.controller.observe(job_id, n_nodes=prog.nodes, samples_per_s=prog.samples_per_s,
                                        now_s=now, plan=prog.plan)
                if prog.samples is not None:  # policies and the JPA read what remains, as in
                    # the simulator (engine.py reports it at every event)
                    self.controller.report_progress(job_id, samples_done=prog.samples)
                if prog.global_batch is not None:
                    dirty |= self._cap_to_batch(job_id, job, prog.global_batch)
                    dirty |= self._split_sizes(job_id, job, prog.global_batch, now)
                self._observed = True
            for rec in job.take_measured_rescales():
                if rec.kind in ("up", "down") and rec.steady:  # not inflated by a start-up
                    self.controller.observe_rescale(job_id, kind=rec.kind, pause_s=rec.pause_s)
        return dirty

    def _cap_to_batch(self, job_id: str, job: MalleableJob, global_batch: int) -> bool:
        """A job whose loop splits ``global_batch`` samples a step gets from now on no more
        nodes than give each rank a sample (one that named the option was capped at submit);
        the latest batch decides, so a later phase with a larger one lifts the cap again.
        True if that changed its bound (replan: it may hold nodes that train nothing, or may
        grow)."""
        top = batch_max_nodes(global_batch, job.ranks_per_node)
        js = self.controller.jobs.get(job_id)
        if js is None:
            return False
        least = js.spec.min_nodes
        splits = (f"its loop splits global_batch={global_batch} samples a step (ctx.steps) over "
                  f"{job.ranks_per_node} rank(s) a node")
        if top >= (js.spec.max_nodes if js.node_cap is None else js.node_cap):
            return self.controller.cap_nodes(job_id, top, why=f"{splits} now")
        fix = batch_below_node(global_batch, job.ranks_per_node) or (
            f"past {top} node(s) a rank trains nothing, but its min_nodes={least} keeps it "
            "there: lower min_nodes or raise global_batch" if least > top else
            f"past {top} node(s) a rank trains nothing; give global_batch={global_batch} in "
            "its malleable options to cap it from submit")
        return self.controller.cap_nodes(job_id, top, why=f"{splits}: {fix}")

    def _split_sizes(self, job_id: str, job: MalleableJob, global_batch: int, now: float) -> bool:
        """A job with a fixed plan whose options do not name ``global_batch`` gets from now on
        only the node counts whose ranks split the batch its loop reports (FSDP2: every rank
        runs as many passes), as one that named it got at submit; True if that changed them.
        No such count in its bounds fails its future with that error, never a hang. Within
        those, only the counts that split a batch its ranks refused further on, until the loop
        passes that step (:attr:`MalleableJob.uneven_ahead`; a warm-up phase's batch would
        grow it back into the size refused at the next phase), where some count splits both."""
        js = self.controller.jobs.get(job_id)
        plan = fixed_plan_option(job.options)
        if js is None or plan is None or global_batch_option(job.options) is not None:
            return False  # no fixed plan, or its sizes were set at submit
        try:
            sizes = fixed_plan_sizes(plan, js.spec.min_nodes, js.spec.max_nodes,
                                     global_batch=global_batch, ranks_per_node=job.ranks_per_node)
        except SpecError as exc:
            log.error("job %s: %s", job_id, exc)
            job.abort(exc)
            self.controller.finish(job_id, now_s=now)
            return True
        why = (f"plan {plan.name!r} needs its loop's global_batch={global_batch} (ctx.steps) "
               f"to split evenly over the ranks ({job.ranks_per_node} a node)")
        for b, step in job.uneven_ahead.items():
            if b == global_batch:
                continue
            try:
                ahead = set(fixed_plan_sizes(plan, js.spec.min_nodes, js.spec.max_nodes,
                                             global_batch=b, ranks_per_node=job.ranks_per_node))
            except SpecError:
                continue
            if ahead & set(sizes):
                sizes = tuple(k for k in sizes if k in ahead)
                why += f", and global_batch={b}, which its ranks refused at step {step}, ahead"
        if len(sizes) < js.spec.max_nodes - js.spec.min_nodes + 1:
            why += (f"; give global_batch={global_batch} in its malleable options to limit it "
                    "from submit")
        return self.controller.limit_sizes(job_id, sizes, why=why)

    def _source_event(self, e: NodeEvent, now: float) -> None:
        if e.kind == "idle":
            self._node_end[e.node] = e.end_s
            self.executor.add_node(e.node, end_s=e.end_s)
        else:  # taken: out of the plan now; pilot released once its ranks have stopped
            self.controller.remove_nodes([e.node], now_s=now)
            self._node_end.pop(e.node, None)
            self._releases[e.node] = now + self.release_grace_s

    def _replan(self) -> None:
        while self._replan_once():  # a job failed for good: its nodes go to the others now
            pass

    def _replan_once(self) -> bool:
        """Replan and reconcile every job; True if a job was failed and its nodes freed."""
        self._observed, self._last_replan = False, time.monotonic()
        now = self.clock()
        planned = True
        try:
            self.controller.replan(now_s=now)
        except Exception:
            planned = False
            log.exception("replan failed; keeping the current allocation")
        self.replans += 1
        alloc = self.controller.allocation
        freed = False
        for job_id, job in list(self.jobs.items()):
            try:
                job.reconcile(alloc.nodes_of(job_id))
            except (MemoryBudgetError, SpecError) as exc:  # no plan at this size: never a hang
                n = len(alloc.nodes_of(job_id))
                if not planned:  # the kept allocation may be stale: wait for a replan
                    log.warning("job %s: cannot run on %d node(s) of the kept allocation: %s",
                                job_id, n, exc)
                    continue
                log.error("job %s: cannot run on %d node(s): %s", job_id, n, exc)
                job.abort(exc)
                if job_id in self.controller.jobs:
                    self.controller.finish(job_id, now_s=now)  # frees its nodes
                    freed = True
            except Exception:
                log.exception("job %s: reconcile failed", job_id)
        return freed

    def _abort_all(self, why: str) -> None:
        for job in list(self.jobs.values()):
            job.abort(JobAbortedError(f"job {job.job_id!r}: {why}"))
        while True:  # jobs submitted but never seen by the thread
            try:
                ev = self._queue.get_nowait()
            except queue.Empty:
                break
            if ev[0] == "submit":
                ev[1].abort(JobAbortedError(f"job {ev[1].job_id!r}: {why}"))

    # ---- introspection --------------------------------------------------------------------
    def _publish(self) -> None:
        snap = take_snapshot(self)
        with self._snapshot_lock:
            self._snapshot = snap

    def snapshot(self) -> ControlSnapshot:
        """The loop's state as of its last pass: immutable, safe to read from any thread."""
        with self._snapshot_lock:
            return self._snapshot


def default_store_address(executor: Any) -> str:
    """The executor's own address when it names one host (the nodes reach it), else loopback."""
    addr = getattr(executor, "address", None)
    if isinstance(addr, str) and addr and "," not in addr:
        return addr
    return "127.0.0.1"
