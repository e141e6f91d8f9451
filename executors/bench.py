"""``malleparsl bench executor``: what the malleable executor costs and how fast it rescales.

Two figures, measured in one run on this machine:

* **no-op task throughput** of ordinary Parsl apps through :class:`MalleableExecutor` and
  through stock ``HighThroughputExecutor`` with the same nodes, workers, heartbeats and
  encryption, both in one DFK. Timed batches alternate (HTEX, malleable, malleable, HTEX, ...)
  so a busy machine penalises both alike; each executor's median rate is reported, and
  ``ratio_vs_htex`` is the median of the per-pair ratios.
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
import math
import os
import shutil
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


def _config(nodes: int, run_dir: str) -> Any:
    """One DFK holding both executors, so their batches can alternate under the same load."""
    from parsl.config import Config
    from parsl.executors import HighThroughputExecutor

    from malleparsl.executors.executor import MalleableExecutor

    htex_opts = _common(nodes)
    htex_opts["provider"].init_blocks = nodes  # stock HTEX: Parsl starts the blocks
    return Config(
        executors=[
            HighThroughputExecutor(label="htex", **htex_opts),
            MalleableExecutor(label="malleable", nodes=nodes, **_common(nodes)),
        ],
        strategy="none",
        run_dir=run_dir,
    )


def _wait_workers(ex: Any, nodes: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        managers = [m for m in ex.connected_managers() if m["active"]]
        if len(managers) >= nodes and (not hasattr(ex, "ready_nodes") or len(ex.ready_nodes()) >= nodes):
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"{len(managers)} of {nodes} managers connected after {timeout_s} s")
        time.sleep(0.05)


def _batch(app: Any, tasks: int, timeout_s: float) -> float:
    t0 = time.perf_counter()
    futs = [app() for _ in range(tasks)]
    for f in futs:
        f.result(timeout=timeout_s)
    return tasks / (time.perf_counter() - t0)


def measure_noop(*, nodes: int, tasks: int, pairs: int, timeout_s: float) -> dict[str, list[float]]:
    """Tasks/s of ``pairs`` alternating batches on stock HTEX and on MalleableExecutor.

    Both executors live in one DFK with identical nodes; each pair times one batch on each
    (the order flips every pair), so load from other processes hits both alike and the
    per-pair ratios are comparable even on a busy machine.
    """
    import parsl

    run_dir = tempfile.mkdtemp(prefix="malleparsl-bench-noop-")  # removed after: one per run piled up
    dfk = parsl.load(_config(nodes, run_dir))
    try:
        apps = {k: parsl.python_app(noop, executors=[k]) for k in ("htex", "malleable")}
        for k in apps:
            _wait_workers(dfk.executors[k], nodes, timeout_s)
            _batch(apps[k], min(200, tasks), timeout_s)  # warm-up
        # the control loop's node warm-up tasks (an import of torch.distributed) must not
        # share a timed window: wait until no executor holds any task
        deadline = time.monotonic() + timeout_s
        while any(dfk.executors[k].outstanding() for k in apps) and time.monotonic() < deadline:
            time.sleep(0.05)
        rates: dict[str, list[float]] = {"htex": [], "malleable": []}
        for i in range(pairs):
            for k in (("htex", "malleable") if i % 2 == 0 else ("malleable", "htex")):
                rates[k].append(_batch(apps[k], tasks, timeout_s))
        return rates
    finally:
        dfk.cleanup()
        parsl.clear()
        shutil.rmtree(run_dir, ignore_errors=True)


# ---- the command ------------------------------------------------------------------------
def bench_executor(
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object."),
    nodes: int = typer.Option(2, help="Emulated nodes (one manager, one worker each)."),
    tasks: int = typer.Option(1000, help="No-op tasks per timed batch."),
    rounds: int = typer.Option(10, help="Timed pairs of batches (HTEX and malleable)."),
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
    if not (math.isfinite(timeout_s) and timeout_s > 0):
        raise SpecError(f"--timeout-s must be a finite number of seconds > 0, got {timeout_s!r}")
    if rescales or train:
        from malleparsl.extras import require

        require("torch", feature="the rescale and training figures (--rescales 0 --no-train skip them)")
    # Parsl logs at DEBUG to its run_dir; keep those records off the console, where printing
    # them would cost more CPU than the tasks being measured.
    logging.getLogger("parsl").propagate = False
    rates = measure_noop(nodes=nodes, tasks=tasks, pairs=rounds, timeout_s=timeout_s)
    ratios = [m / h for m, h in zip(rates["malleable"], rates["htex"])]
    out: dict[str, Any] = {
        "noop_tasks_per_s": statistics.median(rates["malleable"]),
        "htex_noop_tasks_per_s": statistics.median(rates["htex"]),
        "noop_rounds": {k: [round(r, 1) for r in v] for k, v in rates.items()},
        "noop_pair_ratios": [round(r, 3) for r in ratios],
        "nodes": nodes,
        "tasks": tasks,
    }
    out["ratio_vs_htex"] = statistics.median(ratios)  # median of paired ratios
    log.info("no-op tasks/s: %s", out["noop_rounds"])

    # ---- rescale latency: filled in by the executor-driver helper's measurement ----------
    out["rescale_median_s"] = None
    if rescales:
        try:
            from malleparsl.executors.bench_rescale import measure_rescale_latency

            pauses = measure_rescale_latency(nodes=max(nodes, 2), rescales=rescales,
                                             timeout_s=timeout_s)
            out["rescale_pauses_s"] = [round(p, 3) for p in pauses]
            out["rescale_median_s"] = statistics.median(pauses) if pauses else None
        except Exception as exc:  # keep the figures already measured
            log.exception("rescale latency measurement failed")
            out["rescale_error"] = repr(exc)

    if train:
        try:
            # The command sits at the top of the stack (like the CLI that registers it), so it
            # may reach the apps layer; the executor itself never does.
            bench_train = importlib.import_module("malleparsl.apps.bench_train")
            cnn = bench_train.compare_sizes((1, 2), steps=60, repeats=3)
            out["cnn_samples_per_s"] = cnn["samples_per_s"]
            out["cnn_speedup_2v1"] = cnn["speedup"]["2"]
        except Exception as exc:
            log.exception("digits-CNN throughput measurement failed")
            out["cnn_error"] = repr(exc)

    if json_out:
        print(json.dumps(out))
        return
    typer.echo(f"no-op tasks/s   MalleableExecutor {out['noop_tasks_per_s']:8.0f}   "
               f"HTEX {out['htex_noop_tasks_per_s']:8.0f}   ratio {out['ratio_vs_htex']:.3f}")
    typer.echo(f"rounds          {out['noop_rounds']}")
    if out["rescale_median_s"] is not None:
        typer.echo(f"rescale latency median {out['rescale_median_s']:.3f} s over "
                   f"{len(out['rescale_pauses_s'])} rescales: {out['rescale_pauses_s']}")
    elif "rescale_error" in out:
        typer.echo(f"rescale latency: not measured ({out['rescale_error']})")
    if "cnn_samples_per_s" in out:
        typer.echo(f"digits CNN samples/s {out['cnn_samples_per_s']}  "
                   f"speed-up 2 vs 1: {out['cnn_speedup_2v1']}")
