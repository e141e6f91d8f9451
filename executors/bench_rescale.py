"""Rescale latency of the live system: decision -> first training step at the new size.

:func:`measure_rescale_latency` starts a real :class:`MalleableExecutor` (emulated nodes through
``LocalProvider``, one manager and one warm worker per node), runs one
:func:`~malleparsl.executors.synthetic.synthetic_entry` job, and alternately takes a node away
and lends a fresh one through a :class:`ManualNodeSource`. Each shrink and grow is a real
rescale — stop key, checkpoint at a step boundary, all ranks exit, relaunch on the new nodes,
a fresh gloo group — and the driver times it from the moment it set the stop key to the first
step of the new segment, minus the checkpoint save and load time the ranks report.

The allocation policy here is :class:`KeepAndFillPolicy`, a deterministic rule, because this
measures the mechanism, not the decision.
"""

from __future__ import annotations

import logging
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any

from malleparsl.allocator.base import AllocationPolicy, ClusterSnapshot, JobView
from malleparsl.model import Allocation

log = logging.getLogger(__name__)


class KeepAndFillPolicy(AllocationPolicy):
    """Each job (oldest first) keeps the nodes it holds and fills up to its maximum.

    Deterministic and migration-free, so tests and benchmarks know which size a job gets:
    a job keeps its surviving nodes, grows into free nodes up to ``hi``, and holds nothing when
    fewer than ``lo`` nodes are available to it. Not registered by name: pass an instance.
    """

    def allocate(self, snapshot: ClusterSnapshot, jobs: Sequence[JobView]) -> Allocation:
        usable = set(snapshot.nodes)
        taken: set[str] = set()
        out: dict[str, frozenset[str]] = {}
        for v in jobs:
            keep = sorted(v.current & usable)[: v.hi]
            taken |= set(keep)
            out[v.job_id] = frozenset(keep)
        for v in jobs:
            have = set(out[v.job_id])
            free = sorted(usable - taken)
            have |= set(free[: max(0, v.hi - len(have))])
            if len(have) < v.lo:
                taken -= out[v.job_id]
                out[v.job_id] = frozenset()
                continue
            taken |= have
            out[v.job_id] = frozenset(have)
        return Allocation(out)


def local_malleable_config(*, node_source: Any = None, nodes: int | None = None,
                           run_dir: str | None = None, **options: Any) -> Any:
    """A Parsl ``Config`` with one :class:`MalleableExecutor` over emulated local nodes.

    Like ``site_configs.local.local_config`` (which this layer may not import), tuned for
    measuring: 0.1 s control polls, workers that import torch.distributed when a node starts.
    """
    from parsl.config import Config
    from parsl.launchers import SimpleLauncher
    from parsl.providers import LocalProvider

    from malleparsl.executors.executor import MalleableExecutor

    kw: dict[str, Any] = {
        "address": "127.0.0.1",
        "max_workers_per_node": 1,
        "heartbeat_period": 1,
        "heartbeat_threshold": 5,
        "policy": KeepAndFillPolicy(),
        "poll_period_s": 0.1,
        "warm_modules": ("torch.distributed",),
        "provider": LocalProvider(
            init_blocks=0, min_blocks=0, max_blocks=10_000, nodes_per_block=1,
            launcher=SimpleLauncher(),
            worker_init=f"export PATH={os.path.dirname(sys.executable)}:$PATH",
        ),
    }
    kw.update(options)
    ex = MalleableExecutor(node_source=node_source, nodes=nodes, **kw)
    return Config(executors=[ex], strategy="none",
                  run_dir=run_dir or tempfile.mkdtemp(prefix="malleparsl-bench-"))


def _wait(cond: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.02)


def measure_rescale_latency(
    *,
    nodes: int = 3,
    rescales: int = 6,
    step_s: float = 0.05,
    timeout_s: float = 120.0,
    run_dir: str | None = None,
    entry: Any = None,
    entry_kwargs: dict[str, Any] | None = None,
    options: dict[str, Any] | None = None,
    warm_modules: tuple[str, ...] = ("torch.distributed",),
    names: Sequence[str] | None = None,
    **config: Any,
) -> list[float]:
    """Run ``rescales`` alternating shrinks and grows; return each pause in seconds.

    Starts and shuts down its own executor and DataFlowKernel (``nodes`` emulated nodes;
    ``nodes >= 2``), beside any DFK already loaded. The pause excludes checkpoint I/O, as the
    benchmark target asks. ``entry`` defaults to the synthetic gloo job (``step_s`` per global
    step); pass e.g. ``RankEntry(train_digits)`` with ``entry_kwargs`` and malleable
    ``options`` to time a real model (it must train long enough for every rescale), and the
    modules its code imports as ``warm_modules`` (new nodes import them before joining).
    Only rescales decided while the job was past its start-up count (``RescaleRecord.steady``):
    a stop cannot take effect before the first step boundary.

    ``names`` are the first nodes (default ``node-00``, ...); ``config`` goes to
    :func:`local_malleable_config` (e.g. a ``provider`` that puts nodes on emulated hosts, the
    ``address`` they reach, ``control`` options).
    """
    from parsl.dataflow.dflow import DataFlowKernel

    from malleparsl.executors.manual_source import ManualNodeSource
    from malleparsl.executors.synthetic import synthetic_entry

    if nodes < 2:
        raise ValueError(f"nodes must be >= 2 to shrink and grow, got {nodes!r}")
    if entry is None:
        entry = synthetic_entry
        entry_kwargs = {"steps": 10**9, "step_s": step_s, "ckpt_every": 0,
                        "progress_every_s": 0.05, **(entry_kwargs or {})}
    src = ManualNodeSource(nodes=list(names or [f"node-{i:02d}" for i in range(nodes)]))
    dfk = DataFlowKernel(local_malleable_config(node_source=src, run_dir=run_dir,
                                                warm_modules=tuple(warm_modules), **config))
    ex = dfk.executors["malleable"]
    try:
        ex.wait_for_nodes(nodes, timeout_s)
        opts = {"progress_interval_s": 0.05, **(options or {}),
                "job_id": "bench-rescale", "min_nodes": 1, "max_nodes": nodes}
        fut = ex.submit(entry, {"malleable": opts}, **(entry_kwargs or {}))
        job = _job(ex, "bench-rescale", timeout_s)
        _wait(lambda: len(job().nodes) == nodes and job().state == "running", timeout_s,
              f"the job to run on {nodes} nodes")
        fresh = 0

        def measured() -> int:
            return len([r for r in job().rescales if r.pause_s is not None and r.steady])

        for i in range(rescales):
            done = measured()
            _wait(lambda: fut.done() or _stepping(job()), timeout_s, "the job to take steps")
            if i % 2 == 0:
                victim = sorted(job().nodes)[-1]
                src.take(victim)
            else:
                fresh += 1
                src.idle(f"node-x{fresh:02d}")
            _wait(lambda d=done: fut.done() or measured() > d,
                  timeout_s, f"rescale {i + 1} to take its first step")
            if fut.done():
                fut.result()  # surfaces a failure of the job
                raise RuntimeError("the benchmark job ended before its last rescale")
        pauses = [r.pause_s for r in job().rescales
                  if r.pause_s is not None and r.steady and r.kind in ("up", "down")]
        log.info("rescale pauses (s): %s; median %.3f", [round(p, 3) for p in pauses],
                 statistics.median(pauses))
        return pauses
    finally:
        dfk.cleanup()


def _job(ex: Any, job_id: str, timeout_s: float) -> Callable[[], Any]:
    """Wait for the job's admission; returns a function giving its latest ``JobView``."""
    _wait(lambda: job_id in ex.snapshot().jobs, timeout_s, f"job {job_id} to be admitted")
    return lambda: ex.snapshot().jobs[job_id]


def _stepping(job: Any) -> bool:
    """The job runs a segment that has reported progress (it is past its first steps)."""
    return job.state == "running" and job.stepping
