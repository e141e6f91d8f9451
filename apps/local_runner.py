"""Run a malleable training function on local processes, without Parsl: a reference driver.

``LocalRunner`` plays the executor's part of the segment protocol with the fewest moving parts:
a few warm worker processes ("nodes", each importing torch once), a ``TCPStore`` it serves
itself, and a fixed *schedule* of sizes. It exists so the training side can be tested and
measured on its own (loss-trajectory equality across rescales, corrupt checkpoints, a user
exception, a killed node) and so a scientist can try a training function at several sizes on a
laptop. The live system uses :class:`malleparsl.executors.MalleableExecutor`, whose driver
follows the same protocol with nodes chosen by the allocator.

>>> # with LocalRunner(nodes=3, ckpt_root="/tmp/ck") as runner:
>>> #     report = runner.run(train_mlp, schedule=[(2, 20), (3, 40), (1, None)], total_steps=60)
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import multiprocessing as mp
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import Future, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from malleparsl.apps.context import GroupBrokenError
from malleparsl.apps.entry import RankEntry
from malleparsl.errors import SpecError
from malleparsl.executors.protocol import RankInfo, SegmentOutcome, progress_key, stop_key
from malleparsl.names import check_safe_name

log = logging.getLogger(__name__)


class NodeLostError(RuntimeError):
    """A local node process died while running a rank."""


def _node_main(conn: Any, threads: int, preload: tuple[str, ...]) -> None:  # child process
    import importlib

    import torch  # warm: paid once per node, not per segment
    from parsl.app.errors import RemoteExceptionWrapper

    torch.set_num_threads(threads)
    for name in preload:
        importlib.import_module(name)
    while True:
        try:
            msg = conn.recv()
        except EOFError:
            return
        if msg is None:
            return
        task_id, fn, args, kwargs = msg
        try:
            reply = (task_id, True, fn(*args, **kwargs))
        except Exception:
            import sys

            reply = (task_id, False, RemoteExceptionWrapper(*sys.exc_info()))
        conn.send(reply)


class LocalNodes:
    """``n`` warm worker processes; :meth:`submit` runs a call on one chosen process."""

    def __init__(
        self, *, n: int, threads_per_node: int = 1, preload: Sequence[str] = ()
    ) -> None:
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise SpecError(f"n must be an integer >= 1, got {n!r}")
        self._mp = mp.get_context("spawn")
        self._args = (threads_per_node, tuple(preload))
        self._ids = itertools.count()
        self._pending: dict[int, dict[int, Future]] = {}
        self._lock = threading.Lock()
        self.procs: list[Any] = [None] * n
        self.conns: list[Any] = [None] * n
        for i in range(n):
            self._start(i)

    def _start(self, i: int) -> None:
        parent, child = self._mp.Pipe()
        p = self._mp.Process(target=_node_main, args=(child, *self._args), daemon=True)
        p.start()
        child.close()
        self.procs[i], self.conns[i] = p, parent
        self._pending[i] = {}
        threading.Thread(target=self._reader, args=(i, parent), daemon=True).start()

    def revive(self) -> list[int]:
        """Start a fresh process in every dead node's slot; returns the revived slots."""
        dead = [i for i, p in enumerate(self.procs) if not p.is_alive()]
        for i in dead:
            self._start(i)
        return dead

    def _reader(self, i: int, conn: Any) -> None:
        pid = self.procs[i].pid
        while True:
            try:
                task_id, ok, value = conn.recv()
            except (EOFError, OSError):
                break
            with self._lock:
                fut = self._pending[i].pop(task_id, None)
            if fut is not None:
                if ok:
                    fut.set_result(value)
                else:
                    fut.set_exception(value.get_exception())
        with self._lock:
            if self.conns[i] is not conn:  # slot already revived
                return
            lost, self._pending[i] = self._pending[i], {}
        for fut in lost.values():
            fut.set_exception(NodeLostError(f"local node {i} (pid {pid}) died"))

    def alive(self, i: int) -> bool:
        return self.procs[i].is_alive()

    def submit(self, i: int, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Future:
        fut: Future = Future()
        task_id = next(self._ids)
        with self._lock:
            if not self.procs[i].is_alive():
                fut.set_exception(NodeLostError(f"local node {i} is dead"))
                return fut
            self._pending[i][task_id] = fut
        self.conns[i].send((task_id, fn, args, kwargs))
        return fut

    def kill(self, i: int) -> None:
        """SIGKILL node ``i`` (its running rank fails with :class:`NodeLostError`)."""
        self.procs[i].kill()
        self.procs[i].join(5)

    def shutdown(self) -> None:
        for conn, p in zip(self.conns, self.procs):
            if p.is_alive():
                with contextlib.suppress(OSError):
                    conn.send(None)
        for p in self.procs:
            p.join(2)  # a worker still importing at start-up will not read its stop message
            if p.is_alive():
                p.kill()
                p.join(5)


@dataclass
class RunReport:
    """What :meth:`LocalRunner.run` observed."""

    result: Any
    finished: bool = False
    segments: list[list[SegmentOutcome]] = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)
    # seconds from each stop request to the first step of the next segment
    rescale_s: list[float] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)  # node losses survived


class LocalRunner:
    """Drive one malleable job through a schedule of sizes on :class:`LocalNodes`.

    Parameters
    ----------
    nodes
        Worker processes to start (the largest size in any schedule).
    ckpt_root
        Checkpoints go to ``<ckpt_root>/<job_id>``.
    threads_per_node
        ``torch.set_num_threads`` in every worker (1 emulates one core per node).
    preload
        Modules every worker imports at start (e.g. the module of the training function).
    """

    def __init__(
        self,
        *,
        nodes: int,
        ckpt_root: str,
        threads_per_node: int = 1,
        preload: Sequence[str] = (),
    ) -> None:
        from torch.distributed import TCPStore

        self.ckpt_root = Path(ckpt_root)
        self.nodes = LocalNodes(n=nodes, threads_per_node=threads_per_node, preload=preload)
        self.store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
        self.host, self.port = "127.0.0.1", self.store.port
        self._next_segment: dict[str, int] = {}  # segment numbers never repeat within a job

    def __enter__(self) -> LocalRunner:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()

    def shutdown(self) -> None:
        self.nodes.shutdown()

    def progress(self, job_id: str, segment: int) -> dict[str, Any] | None:
        import json

        key = progress_key(job_id, segment)
        return json.loads(self.store.get(key)) if self.store.check([key]) else None

    def run(
        self,
        fn: Callable[..., Any],
        *args: Any,
        schedule: Sequence[tuple[int, int | None]],
        options: dict[str, Any] | None = None,
        job_id: str | None = None,
        on_segment: Callable[[int, list[int]], None] | None = None,
        timeout_s: float = 300.0,
        **kwargs: Any,
    ) -> RunReport:
        """Run ``fn`` segment by segment: ``schedule[s] = (size, stop_after_step)``.

        Segment ``s`` runs on the first ``size`` live nodes; once its progress reaches
        ``stop_after_step`` the runner sets the stop key. A node loss ends the segment early
        (the next entry of the schedule resumes from the checkpoint). ``on_segment(s, nodes)``
        is called after launching a segment (tests use it to kill a node). A user exception
        is re-raised as is. If the schedule ends before training does, the report has
        ``finished=False``; a later ``run`` with the same ``job_id`` resumes from the
        checkpoint.
        """
        job_id = check_safe_name(job_id or f"local-{uuid.uuid4().hex[:8]}", what="job_id")
        options = {"progress_interval_s": 0.0, **(options or {})}
        entry = fn if isinstance(fn, RankEntry) else RankEntry(fn)
        report = RunReport(result=None)
        deadline = time.monotonic() + timeout_s
        stop_time: float | None = None
        self.store.delete_key(stop_key(job_id))  # a previous run of this job may have set it
        first_seg = self._next_segment.get(job_id, 0)
        for seg, (size, stop_after) in enumerate(schedule, start=first_seg):
            self._next_segment[job_id] = seg + 1
            prev_stop, stop_time = stop_time, None
            live = [i for i in range(len(self.nodes.procs)) if self.nodes.alive(i)][:size]
            if len(live) < size:
                raise SpecError(f"segment {seg} needs {size} nodes, only {len(live)} alive")
            names = tuple(f"local-{i}" for i in live)
            self.store.delete_key(progress_key(job_id, seg))
            futs = [
                self.nodes.submit(i, entry, RankInfo(
                    job_id=job_id, segment=seg, rank=r, world_size=size, node=names[r],
                    nodes=names, store_host=self.host, store_port=self.port,
                    ckpt_dir=str(self.ckpt_root / job_id), options=options,
                ), *args, **kwargs)
                for r, i in enumerate(live)
            ]
            report.sizes.append(size)
            if on_segment is not None:
                on_segment(seg, live)
            stop_set = False
            while not all(f.done() for f in futs):
                if time.monotonic() > deadline:
                    self.store.set(stop_key(job_id), str(seg))
                    raise TimeoutError(f"job {job_id} segment {seg} exceeded {timeout_s} s")
                if stop_after is not None and not stop_set:
                    prog = self.progress(job_id, seg)
                    if prog and prog["step"] >= stop_after:
                        self.store.set(stop_key(job_id), str(seg))
                        stop_time, stop_set = time.time(), True
                wait(futs, timeout=0.01)
            errors = [f.exception() for f in futs if f.exception() is not None]
            lost = [e for e in errors if isinstance(e, NodeLostError)]
            user = [e for e in errors if not isinstance(e, (NodeLostError, GroupBrokenError))]
            if user:
                raise user[0]
            outcomes = [f.result() for f in futs if f.exception() is None]
            report.segments.append(outcomes)
            if errors:
                report.failures.append(f"segment {seg}: {lost[0] if lost else errors[0]}")
                stop_time = time.time()
                continue
            first = outcomes[0].first_step_time
            if prev_stop is not None and first is not None:
                report.rescale_s.append(first - prev_stop)
            if all(o.status == "finished" for o in outcomes):
                report.result, report.finished = outcomes[0].result, True
                return report
        return report  # the schedule ended first; run again with the same job_id to resume
