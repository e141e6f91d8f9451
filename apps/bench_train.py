"""Training throughput of the digits CNN at a given size, on real local gloo processes.

The Job Profiling Advisor and the executor benchmark call :func:`digits_cnn_throughput` to put
a measured number on "how much faster is this job on 2 nodes than on 1". Each emulated node is
one warm worker process with one torch thread (one core's worth), the ranks form a real gloo
group, and the rate is the one the training loop itself reports (samples/s after the first
step, which pays for warm-up), so it includes gradient all-reduce and stop checks.

    python -m malleparsl.apps.bench_train --sizes 1 2 --steps 60
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections.abc import Sequence
from typing import Any

from malleparsl.apps.examples_digits import train_cnn
from malleparsl.apps.local_runner import LocalRunner
from malleparsl.errors import SpecError

PRELOAD = ("malleparsl.apps.examples_digits", "sklearn.datasets")


def _measure(runner: LocalRunner, size: int, *, steps: int, global_batch: int) -> float:
    rep = runner.run(
        train_cnn, schedule=[(size, None)], total_steps=steps, global_batch=global_batch
    )
    rate = rep.segments[-1][0].samples_per_s
    if not rep.finished or not rate:
        raise RuntimeError(f"size {size}: no rate measured ({rep})")
    return float(rate)


def digits_cnn_throughput(
    world_size: int,
    *,
    steps: int = 60,
    global_batch: int = 128,
    repeats: int = 1,
    runner: LocalRunner | None = None,
) -> float:
    """Samples/s of the digits CNN trained at ``world_size`` local ranks (median of repeats).

    Pass a ``runner`` to reuse warm workers across calls (it needs ``world_size`` nodes);
    otherwise one is started and shut down here (about one ``import torch`` per node).
    """
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise SpecError(f"world_size must be an integer >= 1, got {world_size!r}")
    if runner is not None:
        return statistics.median(
            _measure(runner, world_size, steps=steps, global_batch=global_batch)
            for _ in range(repeats)
        )
    with tempfile.TemporaryDirectory() as tmp, LocalRunner(
        nodes=world_size, ckpt_root=tmp, preload=PRELOAD
    ) as own:
        _measure(own, world_size, steps=3, global_batch=global_batch)  # warm every worker
        return digits_cnn_throughput(
            world_size, steps=steps, global_batch=global_batch, repeats=repeats, runner=own
        )


def compare_sizes(
    sizes: Sequence[int] = (1, 2), *, steps: int = 60, global_batch: int = 128, repeats: int = 3
) -> dict[str, Any]:
    """Throughput at each size on one set of warm workers, sizes interleaved per repeat so
    that background load hits them alike. Returns rates, speed-ups and the raw samples."""
    raw: dict[int, list[float]] = {k: [] for k in sizes}
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp, LocalRunner(
        nodes=max(sizes), ckpt_root=tmp, preload=PRELOAD
    ) as runner:
        _measure(runner, max(sizes), steps=3, global_batch=global_batch)  # warm every worker
        for _ in range(repeats):
            for k in sizes:
                raw[k].append(_measure(runner, k, steps=steps, global_batch=global_batch))
    rates = {k: statistics.median(v) for k, v in raw.items()}
    base = rates[min(sizes)]
    return {
        "model": "digits-cnn",
        "global_batch": global_batch,
        "steps": steps,
        "samples_per_s": {str(k): round(r, 1) for k, r in rates.items()},
        "speedup": {str(k): round(r / base, 3) for k, r in rates.items()},
        "raw": {str(k): [round(x, 1) for x in v] for k, v in raw.items()},
        "wall_s": round(time.monotonic() - t0, 1),
    }


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--global-batch", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    a = parser.parse_args(argv)
    print(json.dumps(compare_sizes(a.sizes, steps=a.steps, global_batch=a.global_batch,
                                   repeats=a.repeats)))


if __name__ == "__main__":
    main()
