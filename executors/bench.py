"""``malleparsl bench executor``: what the malleable executor costs and how fast it rescales.

Two figures, measured in one run on this machine:

* **no-op task throughput** of ordinary Parsl apps through :class:`MalleableExecutor` and
  through stock ``HighThroughputExecutor`` with the same nodes, workers, heartbeats and
  encryption. Runs alternate (HTEX, malleable, HTEX, malleable, ...) and each executor's median
  is reported, so a busy machine penalises both alike; ``ratio_vs_htex`` is the quotient.
* **rescale latency** (``rescale_median_s``), decision to first training step at the new size,
  excluding checkpoint I/O, from the executor-driver helper's
  :func:`~malleparsl.executors.bench_rescale.measure_rescale_latency`;
* **digits-CNN training throughput** at 1 and 2 nodes (``cnn_samples_per_s``,
  ``cnn_speedup_2v1``), from the apps layer's ``bench_train.compare_sizes``.

Parsl and torch are imported inside the command, so ``malleparsl --help`` stays fast.
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

log = logging.getLogger(__name__)


def noop() -> None:
    """The task whose throughput is measured (importable by workers)."""
    return None


def _provider(nodes: int) -> Any:
    from parsl.launchers import SimpleLauncher
    from parsl.providers import LocalProvider

    return LocalProvider(
        init_blocks=0, min_blocks=0, max_blocks=nodes, nodes_per_block=1,
        launcher=SimpleLauncher(),
        worker_init=f"export PATH={os.path.dirname(sys.executable)}:$PATH",
    )


def _common(nodes: int) -> dict[str, Any]:
    """Settings both executors share, so only the executor class differs."""
    return {
        "address": "127.0.0.1",
        "max_workers_per_node": 1,
        "heartbeat_period": 1,
        "heartbeat_threshold": 5,
        "encrypted": True,
        "provider": _provider(nodes),
    }


def _htex_config(nodes: int, run_dir: str) -> Any:
    from parsl.config import Config
    from parsl.executors import HighThroughputExecutor

    opts = _common(nodes)
    opts["provider"].init_blocks = nodes  # stock HTEX: Parsl starts the blocks
    return Config(executors=[HighThroughputExecutor(label="bench", **opts)], strategy="none",
                  run_dir=run_dir)


def _malleable_config(nodes: int, run_dir: str) -> Any:
    from malleparsl.executors.executor import MalleableExecutor
    from parsl.config import Config

    return Config(executors=[MalleableExecutor(label="bench", nodes=nodes, **_common(nodes))],
                  strategy="none", run_dir=run_dir)


def _wait_workers(ex: Any, nodes: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        managers = [m for m in ex.connected_managers() if m["active"]]
        if len(managers) >= nodes and (not hasattr(ex, "ready_nodes") or len(ex.ready_nodes()) >= nodes):
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"{len(managers)} of {nodes} managers connected after {timeout_s} s")
        time.sleep(0.05)


def measure_noop(kind: str, *, nodes: int, tasks: int, warmup: int, timeout_s: float) -> float:
    """Start a fresh DFK with executor ``kind`` ("htex" or "malleable"); return tasks/s."""
    import parsl

    run_dir = tempfile.mkdtemp(prefix=f"malleparsl-bench-{kind}-")
    cfg = (_htex_config if kind == "htex" else _malleable_config)(nodes, run_dir)
    dfk = parsl.load(cfg)
    try:
        ex = dfk.executors["bench"]
        _wait_workers(ex, nodes, timeout_s)
        app = parsl.python_app(noop, executors=["bench"])
        for f in [app() for _ in range(warmup)]:
            f.result(timeout=timeout_s)
        # the control loop's node warm-up tasks (an import of torch.distributed) must not
        # share the timed window: wait until the executor holds no task at all
        deadline = time.monotonic() + timeout_s
        while ex.outstanding() and time.monotonic() < deadline:
            time.sleep(0.05)
        t0 = time.perf_counter()
        futs = [app() for _ in range(tasks)]
        for f in futs:
            f.result(timeout=timeout_s)
        rate = tasks / (time.perf_counter() - t0)
        log.info("%s: %d no-op tasks at %.0f tasks/s", kind, tasks, rate)
        return rate
    finally:
        dfk.cleanup()
        parsl.clear()


# ---- the command ------------------------------------------------------------------------
def bench_executor(
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object."),
    nodes: int = typer.Option(2, help="Emulated nodes (one manager, one worker each)."),
    tasks: int = typer.Option(2000, help="No-op tasks per timed round."),
    rounds: int = typer.Option(3, help="Timed rounds per executor (alternating)."),
    rescales: int = typer.Option(6, help="Rescales to time (0 skips the rescale figure)."),
    train: bool = typer.Option(True, "--train/--no-train",
                               help="Also time digits-CNN training at 1 and 2 nodes."),
    timeout_s: float = typer.Option(300.0, help="Give up on any one wait after this long."),
) -> None:
    """No-op task throughput vs stock HTEX, and rescale latency, of MalleableExecutor."""
    from malleparsl.errors import SpecError

    for name, v, lo in (("nodes", nodes, 1), ("tasks", tasks, 1), ("rounds", rounds, 1),
                        ("rescales", rescales, 0)):
        if v < lo:
            raise SpecError(f"--{name} must be >= {lo}, got {v!r}")
    # Parsl logs at DEBUG to its run_dir; keep those records off the console, where printing
    # them would cost more CPU than the tasks being measured.
    logging.getLogger("parsl").propagate = False
    rates: dict[str, list[float]] = {"htex": [], "malleable": []}
    for _ in range(rounds):
        for kind in ("htex", "malleable"):
            rates[kind].append(
                measure_noop(kind, nodes=nodes, tasks=tasks, warmup=min(200, tasks), timeout_s=timeout_s)
            )
    out: dict[str, Any] = {
        "noop_tasks_per_s": statistics.median(rates["malleable"]),
        "htex_noop_tasks_per_s": statistics.median(rates["htex"]),
        "noop_rounds": {k: [round(r, 1) for r in v] for k, v in rates.items()},
        "nodes": nodes,
        "tasks": tasks,
    }
    out["ratio_vs_htex"] = out["noop_tasks_per_s"] / out["htex_noop_tasks_per_s"]

    # ---- rescale latency: filled in by the executor-driver helper's measurement ----------
    out["rescale_median_s"] = None
    if rescales:
        from malleparsl.executors.bench_rescale import measure_rescale_latency

        pauses = measure_rescale_latency(nodes=max(nodes, 2), rescales=rescales,
                                         timeout_s=timeout_s)
        out["rescale_pauses_s"] = [round(p, 3) for p in pauses]
        out["rescale_median_s"] = statistics.median(pauses) if pauses else None

    if train:
        # The command sits at the top of the stack (like the CLI that registers it), so it may
        # reach the apps layer; the executor itself never does.
        bench_train = importlib.import_module("malleparsl.apps.bench_train")
        cnn = bench_train.compare_sizes((1, 2), steps=60, repeats=3)
        out["cnn_samples_per_s"] = cnn["samples_per_s"]
        out["cnn_speedup_2v1"] = cnn["speedup"]["2"]

    if json_out:
        print(json.dumps(out))
        return
    typer.echo(f"no-op tasks/s   MalleableExecutor {out['noop_tasks_per_s']:8.0f}   "
               f"HTEX {out['htex_noop_tasks_per_s']:8.0f}   ratio {out['ratio_vs_htex']:.3f}")
    typer.echo(f"rounds          {out['noop_rounds']}")
    if out["rescale_median_s"] is not None:
        typer.echo(f"rescale latency median {out['rescale_median_s']:.3f} s over "
                   f"{len(out['rescale_pauses_s'])} rescales: {out['rescale_pauses_s']}")
    if train:
        typer.echo(f"digits CNN samples/s {out['cnn_samples_per_s']}  "
                   f"speed-up 2 vs 1: {out['cnn_speedup_2v1']}")
