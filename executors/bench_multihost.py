"""``malleparsl bench multihost``: the live system across emulated hosts (network namespaces).

Every node's pilot runs on its own emulated host (:mod:`malleparsl.testbed`); the interchange,
the control loop and the rendezvous store run on the "login node" (the root namespace) at the
bridge address; ranks talk over the hosts' ``eth0``. Three figures:

* ``rescale_median_s``: decision -> first step at the new size (checkpoint I/O excluded), over
  alternating shrinks and grows of a synthetic gloo job across 3 hosts;
* ``partition_to_resumed_s``: a host's link cut (``ip link set ... down``: a partition, the host
  keeps running) -> the job training again on the other hosts. Bounded by the heartbeat
  threshold (the interchange declares the cut manager lost) and by the survivors' collective
  timeout (they are blocked in an all-reduce with the cut rank), whichever is longer, plus a
  relaunch;
* ``samples_per_s``: the digits MLP (``train_digits``, fixed global batch) on 1 and on 3 hosts.

Needs root and iproute2 (as the ``multihost`` tests).
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import statistics
import sys
import tempfile
import time
from typing import Any

import typer

from malleparsl.executors.bench_rescale import (
    _wait,
    local_malleable_config,
    measure_rescale_latency,
)
from malleparsl.executors.options import ControlOptions

log = logging.getLogger(__name__)

HEARTBEAT_PERIOD_S = 1
HEARTBEAT_THRESHOLD_S = 5  # a cut host's manager is declared lost after this
COLLECTIVE_TIMEOUT_S = 8.0  # survivors blocked in an all-reduce with the cut rank give up after this


def netns_config(bed: Any, *, node_source: Any, run_dir: str | None = None,
                 control: ControlOptions | None = None, worker_init: str = "",
                 **options: Any) -> Any:
    """A Parsl ``Config`` whose nodes are pilots on ``bed``'s emulated hosts.

    The interchange and the store listen on the bridge address only; ranks use the hosts'
    interface for gloo/NCCL.
    """
    from parsl.launchers import SimpleLauncher

    from malleparsl.testbed.provider import NetnsProvider

    init = f"export PATH={os.path.dirname(sys.executable)}:$PATH"
    provider = NetnsProvider(bed, launcher=SimpleLauncher(),
                             worker_init=f"{init}; {worker_init}" if worker_init else init)
    control = control or ControlOptions(poll_period_s=0.1, socket_ifname=bed.ifname,
                                        fail_grace_s=COLLECTIVE_TIMEOUT_S + 5)
    options.setdefault("heartbeat_period", HEARTBEAT_PERIOD_S)
    options.setdefault("heartbeat_threshold", HEARTBEAT_THRESHOLD_S)
    return local_malleable_config(node_source=node_source, run_dir=run_dir, provider=provider,
                                  address=bed.bridge_address, control=control, **options)


def measure_partition(bed: Any, *, repeats: int = 2, timeout_s: float = 180.0) -> list[float]:
    """Cut a host's link while a 3-host job trains; seconds until it trains on the other two.

    After each cut the link is restored, the host is lent again and the job regrows to 3.
    """
    from parsl.dataflow.dflow import DataFlowKernel

    from malleparsl.executors.manual_source import ManualNodeSource
    from malleparsl.executors.synthetic import synthetic_entry

    hosts = [h.name for h in bed.hosts]
    src = ManualNodeSource(nodes=hosts)
    dfk = DataFlowKernel(netns_config(bed, node_source=src))
    ex = dfk.executors["malleable"]
    out: list[float] = []
    try:
        ex.wait_for_nodes(len(hosts), timeout_s)
        fut = ex.submit(synthetic_entry, {"malleable": {"job_id": "part", "min_nodes": 1,
                                                        "max_nodes": len(hosts)}},
                        steps=10**9, step_s=0.05, ckpt_every=10, progress_every_s=0.1,
                        timeout_s=COLLECTIVE_TIMEOUT_S, finish_key="bench/part/finish")
        _wait(lambda: "part" in ex.snapshot().jobs, timeout_s, "admission")

        def job() -> Any:
            return ex.snapshot().jobs["part"]

        for i in range(repeats):
            _wait(lambda: len(job().nodes) == len(hosts) and job().stepping, timeout_s,
                  "the job to train on every host")
            time.sleep(1.0)  # a few steps at full size
            victim = sorted(job().nodes)[i % len(hosts)]
            seen = len(job().rescales)
            t_cut = time.time()
            bed.cut(victim)
            try:
                def resumed(seen: int = seen) -> float | None:
                    for r in job().rescales[seen:]:
                        if r.kind == "restart" and r.first_step_s and r.to_size == len(hosts) - 1:
                            return r.first_step_s
                    return None

                _wait(lambda: resumed() is not None or fut.done(), timeout_s,
                      "training on the other hosts")
                if fut.done():
                    fut.result()
                    raise RuntimeError("the partition job ended early")
                out.append(resumed() - t_cut)  # type: ignore[operator]
                log.info("partition %d (%s): resumed after %.2f s", i, victim, out[-1])
            finally:
                bed.restore(victim)
            _wait(lambda v=victim: v not in ex.ready_nodes() and v not in ex.snapshot().nodes,
                  timeout_s, "the cut node to be dropped")
            src.idle(victim)  # the link is back: the node is offered again and rejoins
        _wait(lambda: len(job().nodes) == len(hosts) and job().stepping, timeout_s, "regrowth")
        snap = ex.snapshot()
        import torch.distributed as dist

        dist.TCPStore(snap.store_host, snap.store_port, None, False).set("bench/part/finish", "1")
        fut.result(timeout=timeout_s)
    finally:
        dfk.cleanup()
    return out


def measure_throughput(bed: Any, *, hosts: int, steps: int = 3000, timeout_s: float = 240.0,
                       ranks_per_node: int = 1) -> float:
    """Samples per second of the digits MLP (global batch 256) on ``hosts`` emulated hosts."""
    from parsl.dataflow.dflow import DataFlowKernel

    from malleparsl.executors.manual_source import ManualNodeSource
    from malleparsl.executors.protocol import as_entry

    train = importlib.import_module("malleparsl.apps.examples_digits").train_digits
    names = [h.name for h in bed.hosts][:hosts]
    src = ManualNodeSource(nodes=names)
    ctl = ControlOptions(poll_period_s=0.1, socket_ifname=bed.ifname,
                         ranks_per_node=ranks_per_node)
    dfk = DataFlowKernel(netns_config(bed, node_source=src, control=ctl,
                                      max_workers_per_node=ranks_per_node))
    ex = dfk.executors["malleable"]
    rates: list[float] = []
    try:
        ex.wait_for_nodes(hosts, timeout_s)
        opts = {"job_id": f"tput{hosts}", "min_nodes": hosts, "max_nodes": hosts,
                "torch_threads": 1, "progress_interval_s": 0.25, "ckpt_interval_s": 1e9}
        fut = ex.submit(as_entry(train), {"malleable": opts}, arch="mlp", total_steps=steps,
                        global_batch=256)
        deadline = time.monotonic() + timeout_s
        while not fut.done() and time.monotonic() < deadline:
            view = ex.snapshot().jobs.get(opts["job_id"])
            if view is not None and view.samples_per_s:
                rates.append(view.samples_per_s)
            time.sleep(0.25)
        fut.result(timeout=10)
    finally:
        dfk.cleanup()
    if not rates:
        raise RuntimeError(f"no progress record at {hosts} host(s); raise steps")
    return rates[-1]


def run_bench(*, rescales: int = 6, partitions: int = 2,
              timeout_s: float = 300.0) -> dict[str, Any]:
    """All figures on one 3-host test bed; see the module docstring."""
    from malleparsl.testbed import NetnsTestbed

    with NetnsTestbed(3) as bed:
        hosts = [h.name for h in bed.hosts]
        run_dir = tempfile.mkdtemp(prefix="malleparsl-bench-multihost-")
        pauses = measure_rescale_latency(
            nodes=3, rescales=rescales, names=hosts, run_dir=run_dir, timeout_s=timeout_s,
            **_netns_kwargs(bed),
        )
        log.warning("rescale pauses across hosts (s): %s", [round(p, 3) for p in pauses])
        parts = measure_partition(bed, repeats=partitions, timeout_s=timeout_s)
        log.warning("partition -> resumed (s): %s", [round(p, 3) for p in parts])
        tput = {str(n): round(measure_throughput(bed, hosts=n, timeout_s=timeout_s), 1)
                for n in (1, 3)}
    return {
        "bench": "multihost",
        "hosts": 3,
        "ranks_per_node": 1,
        "rescale_median_s": round(statistics.median(pauses), 3),
        "rescale_pauses_s": [round(p, 3) for p in pauses],
        "partition_to_resumed_s": round(statistics.median(parts), 3),
        "partition_trials_s": [round(p, 3) for p in parts],
        "heartbeat_period_s": HEARTBEAT_PERIOD_S,
        "heartbeat_threshold_s": HEARTBEAT_THRESHOLD_S,
        "collective_timeout_s": COLLECTIVE_TIMEOUT_S,
        "samples_per_s": tput,
    }


def _netns_kwargs(bed: Any) -> dict[str, Any]:
    """What :func:`measure_rescale_latency` passes on to the config for emulated hosts."""
    from parsl.launchers import SimpleLauncher

    from malleparsl.testbed.provider import NetnsProvider

    return {
        "provider": NetnsProvider(bed, launcher=SimpleLauncher(),
                                  worker_init=f"export PATH={os.path.dirname(sys.executable)}:$PATH"),
        "address": bed.bridge_address,
        "heartbeat_period": HEARTBEAT_PERIOD_S,
        "heartbeat_threshold": HEARTBEAT_THRESHOLD_S,
        "control": ControlOptions(poll_period_s=0.1, socket_ifname=bed.ifname),
    }


def bench_multihost(
    json_out: bool = typer.Option(False, "--json", help="Print one JSON line."),
    rescales: int = typer.Option(6, help="Alternating shrinks and grows to time (>= 2)."),
    partitions: int = typer.Option(2, help="Link cuts to time (>= 1)."),
    timeout_s: float = typer.Option(300.0, help="Give up on any one wait after this long."),
) -> None:
    """Rescale latency, partition recovery and throughput across 3 emulated hosts (root)."""
    from malleparsl.errors import SpecError

    if rescales < 2 or partitions < 1:
        raise SpecError(f"need --rescales >= 2 and --partitions >= 1, got {rescales}, {partitions}")
    logging.getLogger("parsl").propagate = False
    out = run_bench(rescales=rescales, partitions=partitions, timeout_s=timeout_s)
    if json_out:
        typer.echo(json.dumps(out))
        return
    for k, v in out.items():
        typer.echo(f"{k:>24}: {v}")
