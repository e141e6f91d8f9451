"""MalleableJob: one malleable training job run as a sequence of fixed-size segments.

A segment is ``k`` rank tasks, one pinned to each of ``k`` nodes through
``executor.submit_to_node``; the ranks form one process group through the control loop's
``TCPStore`` (see :mod:`malleparsl.executors.protocol`). To change size the driver sets the
job's stop key; the ranks checkpoint at the next step boundary and return ``stopped``; the
driver then launches the next segment on the nodes the controller gives. A rank lost with its
node fails the segment; the driver restarts it from the last checkpoint. A user exception fails
the job's future with that exception and its original traceback.

Threading: every method is called by the control loop's single thread. Rank futures resolve on
Parsl's threads, so their callbacks only *post* ``("rank", job_id, segment, rank, future)`` to
the control loop, which calls :meth:`MalleableJob.on_rank_done`. No locks are needed, and the
job's future is resolved from one thread only: exactly once.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from parsl.executors.errors import BadStateException

from malleparsl.errors import CheckpointWriteError, MalleparslError
from malleparsl.executors.protocol import (
    DEFAULT_KEY_PREFIX,
    GroupBrokenError,
    RankInfo,
    SegmentOutcome,
    progress_key,
    stop_key,
)
from malleparsl.model import JobSpec, NodeId
from malleparsl.plans import ExecPlan, UnevenSplitError, parse_plan, plan_options

log = logging.getLogger(__name__)


class RestartLimitError(MalleparslError, RuntimeError):
    """A job lost nodes more often than ``max_restarts`` allows; the last loss is its cause."""


class JobAbortedError(MalleparslError, RuntimeError):
    """The executor shut down (or the control loop died) before the job finished."""


class RankHungError(MalleparslError, RuntimeError):
    """Ranks neither returned nor failed within the deadline after a stop was requested; their
    nodes were killed and the job restarted without them."""


class SegmentLostError(MalleparslError, RuntimeError):
    """A segment's node was reported lost (by the executor or the node source)."""


class JobState(str, Enum):
    WAITING = "waiting"  # no segment running: before the first launch, after a stop or loss
    RUNNING = "running"  # a segment runs; stop not requested
    STOPPING = "stopping"  # stop key set (rescale or failure); waiting for the ranks to return
    DONE = "done"  # the future is resolved


class DriverEvent(str, Enum):
    """What the end of a segment means for the controller."""

    STOPPED = "stopped"  # relaunch at the controller's size
    LOST = "lost"  # nodes died; relaunch from the checkpoint on the remaining nodes
    FINISHED = "finished"  # the future holds rank 0's result
    FAILED = "failed"  # the future holds the user's exception (or a restart-limit error)
    UNEVEN = "uneven"  # the plan cannot split the batch at this size: relaunch at one that can


@dataclass
class RescaleRecord:
    """One relaunch: when it was decided and when the new segment took its first step.

    ``pause_s`` is decision -> first step at the new size, minus checkpoint save/load time
    when the ranks report it (``ckpt_save_s``/``ckpt_load_s`` on their outcomes).
    """

    job_id: str
    kind: str  # "up", "down", "same" (e.g. a swap of nodes) or "restart" (after a lost node)
    from_size: int
    decided_s: float
    segment: int = -1
    to_size: int = 0
    first_step_s: float | None = None
    ckpt_io_s: float = 0.0
    reported: bool = False
    steady: bool = False  # the old segment had reported progress: it was past its start-up

    @property
    def pause_s(self) -> float | None:
        if self.first_step_s is None:
            return None
        return max(0.0, self.first_step_s - self.decided_s - self.ckpt_io_s)


@dataclass(frozen=True)
class ProgressReading:
    """A new progress record of the running segment: its size, rate, execution plan and the
    samples the whole job has trained (as of rank 0's record; None if the record has none)."""

    nodes: int
    samples_per_s: float
    plan: ExecPlan | None  # None: the job runs a fixed plan of its own (no automatic plans)
    samples: float | None = None
    global_batch: int | None = None  # what the loop splits per step (ctx.steps), if it says
    step: int | None = None  # the loop's step as of the record


@dataclass
class _Segment:
    index: int
    nodes: tuple[NodeId, ...]
    started_s: float
    outcomes: dict[int, SegmentOutcome] = field(default_factory=dict)
    errors: dict[int, BaseException] = field(default_factory=dict)
    error_order: list[int] = field(default_factory=list)
    lost: set[NodeId] = field(default_factory=set)  # nodes reported gone during this segment
    ranks_per_node: int = 1
    fail_deadline_s: float | None = None
    stop_deadline_s: float | None = None  # a requested stop must be honoured by then
    hung: set[NodeId] = field(default_factory=set)  # nodes whose ranks missed the deadline
    last_progress_time: float | None = None
    plan: ExecPlan | None = None  # the automatic plan this segment runs (None: a fixed one)

    @property
    def resolved(self) -> int:
        return len(self.outcomes) + len(self.errors)

    @property
    def world_size(self) -> int:
        return len(self.nodes) * self.ranks_per_node

    def node_of(self, rank: int) -> NodeId:
        """Ranks are numbered node by node: a lost node takes ranks ``i*r .. i*r + r - 1``."""
        return self.nodes[rank // self.ranks_per_node]


def is_node_loss(exc: BaseException) -> bool:
    """True for errors that mean "the node (or its worker) died", not "the user's code failed".

    Parsl's ``ManagerLost``/``WorkerLost`` and any executor error whose class name ends in
    ``Lost`` (a pinned task whose node vanished) count.
    """
    return any(t.__name__.endswith("Lost") for t in type(exc).__mro__)


_TORCH_DIST_ERRORS = frozenset({"DistError", "DistBackendError", "DistNetworkError",
                                "DistStoreError"})


def is_collateral(exc: BaseException) -> bool:
    """A rank error that is, by its *type*, a consequence of another rank failing.

    :class:`~malleparsl.executors.protocol.GroupBrokenError` (raised by the apps layer and the
    synthetic entry around every collective) and torch's ``torch.distributed.DistError``
    family. Never decided from the message: a user's ``TimeoutError("... timed out")`` or a
    ``RuntimeError`` that mentions gloo is the user's error and reaches the future.
    """
    if isinstance(exc, GroupBrokenError):
        return True
    return any(t.__name__ in _TORCH_DIST_ERRORS and t.__module__.startswith("torch")
               for t in type(exc).__mro__)


class MalleableJob:
    """Runs one malleable job through its segments; see the module docstring for the protocol.

    Parameters
    ----------
    spec : JobSpec
        What the controller plans with (``job_id``, bounds, curve).
    entry : callable
        ``entry(rank_info, *args, **kwargs) -> SegmentOutcome``, picklable.
    options : dict
        The job's malleable options; passed to every rank in ``RankInfo.options``.
    executor : object
        Anything with ``submit_to_node(node, func, *args, **kwargs) -> Future``.
    store : torch.distributed.Store
        A client of the control loop's ``TCPStore`` at ``store_host:store_port``.
    post : callable
        Hands an event tuple to the control loop's queue (called on Parsl's threads).
    key_prefix : str
        The executor's secret store namespace (:func:`~malleparsl.executors.protocol.new_key_prefix`).
    ranks_per_node, rank_env, backend
        Rank tasks per node, the environment of local rank ``i`` (``rank_env(i)``: socket
        interface, device binding) and the collective backend, from the executor's
        :class:`~malleparsl.executors.options.ControlOptions`.
    plan_for : callable, optional
        ``plan_for(nodes) -> ExecPlan | None``: the plan to run at a size, for a job with
        automatic plans (the control loop asks the controller's plan profiler). Without it
        such a job takes the best plan by the performance model's prior.
    """

    def __init__(
        self,
        *,
        spec: JobSpec,
        entry: Callable[..., Any],
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
        options: Mapping[str, Any] | None = None,
        executor: Any,
        store: Any,
        store_host: str,
        store_port: int,
        ckpt_dir: str,
        post: Callable[[tuple], None],
        clock: Callable[[], float] = time.time,
        max_restarts: int = 10,
        fail_grace_s: float = 30.0,
        stop_timeout_s: float = 120.0,
        key_prefix: str = DEFAULT_KEY_PREFIX,
        ranks_per_node: int = 1,
        rank_env: Callable[[int], dict[str, str]] | None = None,
        backend: str = "gloo",
        plan_for: Callable[[int], ExecPlan | None] | None = None,
    ) -> None:
        self.spec = spec
        self.job_id = spec.job_id
        self.entry = entry
        self.args = tuple(args)
        self.kwargs = dict(kwargs or {})
        self.options = dict(options or {})
        self.executor = executor
        self.store = store
        self.store_host = store_host
        self.store_port = store_port
        self.ckpt_dir = ckpt_dir
        self.post = post
        self.clock = clock
        self.max_restarts = max_restarts
        self.fail_grace_s = fail_grace_s
        self.stop_timeout_s = stop_timeout_s
        self.key_prefix = key_prefix
        self.ranks_per_node = ranks_per_node
        self.rank_env = rank_env or (lambda local_rank: {})
        self.backend = backend
        self.future: Future = Future()
        self.state = JobState.WAITING
        self.segment: _Segment | None = None
        self.next_index = 0
        self.restarts = 0
        self.last_lost: frozenset[NodeId] = frozenset()  # nodes the last failed segment lost
        self.last_hung: frozenset[NodeId] = frozenset()  # of those, nodes whose ranks hung
        self.rescales: list[RescaleRecord] = []
        self.history: list[tuple[NodeId, ...]] = []  # the nodes of every segment launched
        self._pending: RescaleRecord | None = None
        self._last_save_s = 0.0
        self.last_progress: dict[str, Any] = {}  # rank 0's last progress record
        self.notices: list[str] = []  # rank 0's warnings (ranks with no sample), each once
        self.resolutions = 0  # how often the driver resolved the future: must end at exactly 1
        # batches ranks refused a size for, in order, each with the step the loop needs it
        # from, until rank 0 reports a step past it (refused again after that: a phased loop)
        self.uneven_ahead: dict[int, int] = {}
        self.plan_opts = plan_options(self.options, ranks_per_node=ranks_per_node)
        self.plan_for = plan_for
        self.plan_log: list[tuple[int, int, str, float]] = []  # (segment, size, plan, start)
        os.makedirs(ckpt_dir, exist_ok=True)

    # ---- placement ----------------------------------------------------------------------
    @property
    def nodes(self) -> tuple[NodeId, ...]:
        """The nodes the current segment runs on (empty when waiting or done)."""
        return self.segment.nodes if self.segment is not None else ()

    def reconcile(self, target: frozenset[NodeId]) -> None:
        """Move towards the controller's node set: launch, or ask the running segment to stop."""
        if self.state is JobState.DONE:
            return
        if self.state is JobState.WAITING:
            if target:
                self._launch(tuple(sorted(target)))
            return
        if self.state is JobState.RUNNING and frozenset(self.nodes) != target:
            size = len(self.nodes)
            steady = self.segment is not None and self.segment.last_progress_time is not None
            self._pending = RescaleRecord(self.job_id, "", size, self.clock(), steady=steady)
            self._request_stop()

    def _request_stop(self) -> None:
        seg = self.segment
        assert seg is not None  # noqa: S101 - internal invariant
        self.state = JobState.STOPPING
        if seg.stop_deadline_s is None:
            seg.stop_deadline_s = self.clock() + self.stop_timeout_s
        self.store.set(stop_key(self.job_id, self.key_prefix), str(seg.index))
        log.info("job %s: stop requested for segment %d", self.job_id, seg.index)

    def _launch(self, nodes: tuple[NodeId, ...]) -> None:
        plan = self._choose_plan(len(nodes))  # first: if it raises, the job stays waiting
        index = self.next_index
        self.next_index += 1
        seg = _Segment(index=index, nodes=nodes, started_s=self.clock(),
                       ranks_per_node=self.ranks_per_node, plan=plan)
        self.segment, self.state = seg, JobState.RUNNING
        self.history.append(nodes)
        rec = self._pending
        if rec is not None:
            rec.segment, rec.to_size = index, len(nodes)
            if rec.kind != "restart":
                rec.kind = (
                    "up" if len(nodes) > rec.from_size else "down" if len(nodes) < rec.from_size
                    else "same"
                )
            rec.ckpt_io_s = self._last_save_s
            self.rescales.append(rec)
            self._pending = None
        options = self.options
        if seg.plan is not None:  # the best plan that fits at this size (Rubick)
            options = {**options, "plan": seg.plan.name}
        self.plan_log.append((index, len(nodes), str(options.get("plan") or "dp"), self.clock()))
        log.info("job %s: segment %d on %s, plan %s", self.job_id, index, ",".join(nodes),
                 options.get("plan") or "dp")
        for rank in range(seg.world_size):
            node, local = seg.node_of(rank), rank % self.ranks_per_node
            info = RankInfo(
                job_id=self.job_id,
                segment=index,
                rank=rank,
                world_size=seg.world_size,
                node=node,
                nodes=nodes,
                store_host=self.store_host,
                store_port=self.store_port,
                ckpt_dir=self.ckpt_dir,
                options=options,
                key_prefix=self.key_prefix,
                local_rank=local,
                local_world_size=self.ranks_per_node,
                env=self.rank_env(local),
                backend=self.backend,
            )
            try:
                fut = self.executor.submit_to_node(node, self.entry, info, *self.args, **self.kwargs)
            except Exception as exc:  # the node vanished between plan and launch
                log.warning("job %s: cannot submit rank %d to %s: %r", self.job_id, rank, node, exc)
                fut = Future()
                fut.set_exception(exc)
                seg.lost.add(node)
            fut.add_done_callback(
                lambda f, s=index, r=rank: self.post(("rank", self.job_id, s, r, f))
            )

    def _choose_plan(self, nodes: int) -> ExecPlan | None:
        """The plan profiler's choice at this size, for a job with automatic plans."""
        if self.plan_opts is None:
            return None
        plan = self.plan_for(nodes) if self.plan_for is not None else None
        if plan is None:  # no profiler knows the job: the prior's choice
            from malleparsl.jpa.plans import JobPlans

            plan = JobPlans(self.plan_opts).choose(nodes)
        return parse_plan(plan)

    # ---- segment results ----------------------------------------------------------------
    def node_lost(self, node: NodeId) -> None:
        """The executor or node source says ``node`` is gone; fail its segment fast."""
        seg = self.segment
        if seg is not None and node in seg.nodes and self.state is not JobState.DONE:
            seg.lost.add(node)
            self._start_failing(seg)

    def _start_failing(self, seg: _Segment) -> None:
        if seg.fail_deadline_s is None:
            seg.fail_deadline_s = self.clock() + self.fail_grace_s
        if self.state is JobState.RUNNING:
            self._request_stop()  # survivors stop at the next step (or fail on the broken group)

    def on_rank_done(self, segment: int, rank: int, fut: Future) -> DriverEvent | None:
        """Record one rank's end; returns an event when the whole segment has ended."""
        seg = self.segment
        if self.state is JobState.DONE or seg is None or seg.index != segment:
            log.debug("job %s: late result of segment %d rank %d ignored", self.job_id, segment, rank)
            return None
        exc = fut.exception()
        if exc is None:
            out = fut.result()
            if not isinstance(out, SegmentOutcome):
                exc = TypeError(
                    f"job {self.job_id!r}: the entry returned {type(out).__name__}, expected a "
                    "SegmentOutcome; wrap the training function with malleparsl.apps"
                )
            else:
                seg.outcomes[rank] = out
        if exc is not None:
            seg.errors[rank] = exc
            seg.error_order.append(rank)
            self._start_failing(seg)
        if seg.resolved == seg.world_size:
            return self._conclude(seg)
        return None

    def tick(self) -> DriverEvent | None:
        """Enforce the deadlines: ranks still silent ``stop_timeout_s`` after a stop request,
        or ``fail_grace_s`` after a failure that no lost node explains, are hung; their nodes
        count as lost (the control loop kills them) and the job restarts from its checkpoint
        without them. Ranks silent after a node was lost are most likely blocked in a
        collective with the lost peer (until their collective timeout): the segment is
        concluded without waiting for them, but their healthy nodes are kept."""
        seg = self.segment
        if self.state is JobState.DONE or seg is None:
            return None
        now = self.clock()
        deadlines = [d for d in (seg.fail_deadline_s, seg.stop_deadline_s) if d is not None]
        if not deadlines or now <= min(deadlines):
            return None
        silent = [r for r in range(seg.world_size) if r not in seg.outcomes and r not in seg.errors]
        known_lost = seg.lost | {seg.node_of(r) for r in seg.error_order
                                 if is_node_loss(seg.errors[r])}
        stop_missed = seg.stop_deadline_s is not None and now > seg.stop_deadline_s
        if stop_missed or not known_lost:
            seg.hung = {seg.node_of(r) for r in silent} - known_lost
            log.warning("job %s: rank(s) %s of segment %d on %s missed their deadline; killing "
                        "the segment and restarting without those nodes", self.job_id, silent,
                        seg.index, sorted(seg.hung))
        else:
            log.warning("job %s: rank(s) %s of segment %d still silent %.0f s after losing %s; "
                        "concluding (they wait on the lost peer), their nodes kept", self.job_id,
                        silent, seg.index, self.fail_grace_s, sorted(known_lost))
        return self._conclude(seg)

    def _conclude(self, seg: _Segment) -> DriverEvent:
        self.segment = None
        lost_ranks = [r for r in seg.error_order if is_node_loss(seg.errors[r])]
        lost = {seg.node_of(r) for r in lost_ranks} | seg.lost | seg.hung
        self._last_save_s = max(
            (float(getattr(o, "ckpt_save_s", 0.0) or 0.0) for o in seg.outcomes.values()),
            default=0.0,
        )
        self._record_first_step(seg)
        broken = next((e for e in seg.errors.values() if isinstance(e, BadStateException)), None)
        if broken is not None:  # the executor itself failed (e.g. its interchange died)
            try:
                raise JobAbortedError(f"job {self.job_id!r}: the executor failed: {broken}") from broken
            except JobAbortedError as err:
                self._resolve(exc=err)
            return DriverEvent.FAILED
        system = next((e for e in seg.errors.values() if isinstance(e, CheckpointWriteError)), None)
        if system is not None:  # not the user's fault, and a retry would hit the same disk
            log.error("job %s: checkpoint write failed in segment %d: %s", self.job_id,
                      seg.index, system)
            self._resolve(exc=system)
            return DriverEvent.FAILED
        uneven = None if lost else self._uneven(seg)
        if uneven is not None:
            return self._rerun_uneven(seg, uneven)
        if seg.errors or lost:
            # a group that broke with no user error (every rank failed with a broken-group
            # type, e.g. a peer preempted before the driver heard of it) is a loss too: restart
            # from the checkpoint rather than fail the job for something the user did not do.
            # Errors of other types with no node known lost are the user's.
            only_collateral = all(is_collateral(seg.errors[r]) for r in seg.error_order)
            if lost or lost_ranks or (seg.errors and only_collateral):
                return self._restart_after_loss(seg, lost)
            primary = self._primary_error(seg)
            log.info("job %s: user code failed in segment %d: %r", self.job_id, seg.index, primary)
            self._resolve(exc=primary)
            return DriverEvent.FAILED
        rank0 = seg.outcomes.get(0)
        if rank0 is not None and rank0.status == "finished":
            self._resolve(result=rank0.result)
            return DriverEvent.FINISHED
        self.state = JobState.WAITING
        return DriverEvent.STOPPED

    def _restart_after_loss(self, seg: _Segment, lost: set[NodeId]) -> DriverEvent:
        self.restarts += 1
        if self.restarts > self.max_restarts:
            cause = self._loss_cause(seg, lost)
            try:
                raise RestartLimitError(
                    f"job {self.job_id!r} lost nodes {self.restarts} times (max_restarts="
                    f"{self.max_restarts}); the last time: {cause}; raise max_restarts in its "
                    "malleable options to keep going"
                ) from cause
            except RestartLimitError as err:
                self._resolve(exc=err)
            return DriverEvent.FAILED
        log.warning("job %s: segment %d lost node(s) %s; restarting from the last checkpoint",
                    self.job_id, seg.index, sorted(lost))
        self.last_lost = frozenset(lost)
        self.last_hung = frozenset(seg.hung)
        self._pending = RescaleRecord(self.job_id, "restart", len(seg.nodes), self.clock())
        self.state = JobState.WAITING
        return DriverEvent.LOST

    def _uneven(self, seg: _Segment) -> UnevenSplitError | None:
        """The ranks' refusal of the segment's size (a fixed FSDP2 plan whose batch does not
        split there), when nothing else went wrong; None otherwise."""
        errs = [seg.errors[r] for r in seg.error_order]
        first = next((e for e in errs if isinstance(e, UnevenSplitError)), None)
        if first is None or not all(isinstance(e, UnevenSplitError) or is_collateral(e)
                                    for e in errs):
            return None
        return first

    def _rerun_uneven(self, seg: _Segment, err: UnevenSplitError) -> DriverEvent:
        """Back to waiting (from the last checkpoint, as after a loss) so the control loop,
        told the batch (:attr:`uneven_ahead`), relaunches at a size that splits it: the size
        was the controller's choice, not the user's mistake. A batch refused again before rank
        0 reported a step past where the loop needs it means the controller could not avoid
        it: the job fails with the ranks' error, never a loop (each re-run trains a step)."""
        if err.global_batch in self.uneven_ahead:
            log.error("job %s: segment %d at %d node(s) refused global_batch=%d again",
                      self.job_id, seg.index, len(seg.nodes), err.global_batch)
            self._resolve(exc=err)
            return DriverEvent.FAILED
        self.uneven_ahead[err.global_batch] = int(getattr(err, "step", 0) or 0)
        log.warning("job %s: its plan cannot split global_batch=%d over segment %d's %d "
                    "rank(s); relaunching at a size that does", self.job_id,
                    err.global_batch, seg.index, seg.world_size)
        self._pending = RescaleRecord(self.job_id, "restart", len(seg.nodes), self.clock())
        self.state = JobState.WAITING
        return DriverEvent.UNEVEN

    def _loss_cause(self, seg: _Segment, lost: set[NodeId]) -> BaseException:
        """What ended the segment: a node-loss error, the hung ranks, or the first rank error."""
        errs = [seg.errors[r] for r in seg.error_order]
        first = next((e for e in errs if is_node_loss(e)), None)
        if first is not None:
            return first
        if seg.hung:
            return RankHungError(
                f"job {self.job_id!r} segment {seg.index}: the rank(s) on {sorted(seg.hung)} "
                "neither returned nor failed within the deadline (stop_timeout_s / fail_grace_s)"
            )
        if errs:
            return errs[0]
        return SegmentLostError(
            f"job {self.job_id!r} segment {seg.index}: node(s) {sorted(lost)} reported lost"
        )

    def _primary_error(self, seg: _Segment) -> BaseException:
        """The user's own exception: the first error that is not a broken-group consequence."""
        errs = [seg.errors[r] for r in seg.error_order]
        return next((e for e in errs if not is_collateral(e)), errs[0])

    def _record_first_step(self, seg: _Segment) -> None:
        for rec in self.rescales:
            if rec.segment == seg.index and rec.first_step_s is None:
                times = [o.first_step_time for o in seg.outcomes.values() if o.first_step_time]
                if times:
                    rec.first_step_s = max(times)
                    rec.ckpt_io_s += max(
                        (float(getattr(o, "ckpt_load_s", 0.0) or 0.0) for o in seg.outcomes.values()),
                        default=0.0,
                    )

    # ---- progress and end -----------------------------------------------------------------
    def read_progress(self) -> ProgressReading | None:
        """The running segment's size, rate and plan if rank 0 wrote a new progress record
        since the last read."""
        seg = self.segment
        if seg is None or self.state is not JobState.RUNNING:
            return None
        key = progress_key(self.job_id, seg.index, self.key_prefix)
        if not self.store.check([key]):
            return None
        try:
            rec = json.loads(self.store.get(key))
        except (ValueError, RuntimeError) as exc:
            log.debug("job %s: unreadable progress record: %r", self.job_id, exc)
            return None
        t, rate = rec.get("time"), rec.get("samples_per_s")
        self.last_progress = {**rec, "segment": seg.index}
        note = rec.get("notice")
        if note and note not in self.notices:  # said where the user looks, not only in a rank's log
            self.notices.append(note)
            log.warning("job %s: %s", self.job_id, note)
        if rate is None or t == seg.last_progress_time:
            return None
        seg.last_progress_time = t
        first = rec.get("first_step_time")
        for r in self.rescales:
            if r.segment == seg.index and r.first_step_s is None and first:
                r.first_step_s = float(first)
                r.ckpt_io_s += float(rec.get("ckpt_load_s") or 0.0)
        done, gb = rec.get("samples"), rec.get("global_batch")
        gb = int(gb) if isinstance(gb, int) and gb >= 1 else None
        step = rec.get("step") if isinstance(rec.get("step"), int) else None
        for b, at in list(self.uneven_ahead.items()):
            if step is not None and step > at:  # the loop trained past it at a size that splits
                del self.uneven_ahead[b]
        return ProgressReading(len(seg.nodes), float(rate), seg.plan,
                               None if done is None else float(done), gb, step)

    def take_measured_rescales(self) -> list[RescaleRecord]:
        """Rescales whose pause became known since the last call (for ``observe_rescale``)."""
        out = [r for r in self.rescales if r.pause_s is not None and not r.reported]
        for r in out:
            r.reported = True
        return out

    def abort(self, exc: BaseException) -> None:
        """Fail the future (shutdown); running ranks are asked to stop."""
        if self.state is JobState.DONE:
            return
        seg = self.segment
        if seg is not None:
            try:
                self.store.set(stop_key(self.job_id, self.key_prefix), str(seg.index))
            except Exception as err:  # the store may already be gone at shutdown
                log.debug("job %s: could not set the stop key: %r", self.job_id, err)
        self._resolve(exc=exc)

    def _resolve(self, *, result: Any = None, exc: BaseException | None = None) -> None:
        self.state = JobState.DONE
        self.segment = None
        self.resolutions += 1
        try:
            if exc is not None:
                self.future.set_exception(exc)
            else:
                self.future.set_result(result)
        except InvalidStateError:  # cancelled by the user: nothing to deliver
            log.info("job %s: future was already resolved or cancelled", self.job_id)
