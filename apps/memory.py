"""Measured peak memory on CPU, to check the memory model of :mod:`malleparsl.plans`.

torch's CPU allocator keeps no statistics, so the peak is read from the kernel: the resident
set's high-water mark (``VmHWM`` in ``/proc/self/status``), reset by writing ``5`` to
``/proc/self/clear_refs``. Three precautions make that a sound measure of tensor memory:

* a **fresh process** per measurement, with torch imported and a small warm-up step run
  *before* the reset, so libraries' one-off allocations (kernels, thread pools) are not counted;
* ``MALLOC_MMAP_THRESHOLD_`` fixed at 128 KiB in its environment: every tensor larger than that
  is its own ``mmap`` and goes back to the kernel when freed (glibc's default threshold grows
  up to 32 MiB and would keep freed tensors resident, inflating the peak);
* the peak is taken relative to the resident size just before the model is built.

Pages are only resident once touched; every tensor a training step allocates is written, so
that undercounts nothing the memory model counts.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import time
from collections.abc import Callable
from typing import Any

MMAP_ENV = {"MALLOC_MMAP_THRESHOLD_": "131072", "MALLOC_TRIM_THRESHOLD_": "131072",
            "MALLOC_ARENA_MAX": "2"}


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field} (not Linux?)")


def peak_rss_bytes() -> int:
    """This process's resident-set high-water mark since the last reset."""
    return _status_kib("VmHWM") * 1024


def rss_bytes() -> int:
    return _status_kib("VmRSS") * 1024


def reset_peak_rss() -> None:
    """Reset the high-water mark to the current resident size (Linux >= 4.0)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:  # pragma: no cover - not Linux, or /proc read-only
        pass


def _child(conn: Any, fn: Callable[..., dict], args: tuple, kwargs: dict) -> None:
    try:
        conn.send((True, fn(*args, **kwargs)))
    except BaseException as exc:  # noqa: BLE001 - report anything to the parent
        import traceback

        conn.send((False, f"{exc!r}\n{traceback.format_exc()}"))


def join_gloo(rank: int, world_size: int, port: int, *, alone: bool = False,
              **kwargs: Any) -> None:
    """In a process of :func:`run_fresh`: one torch thread (ranks share this host's cores),
    then join the local gloo group of ``world_size`` ranks at ``port``; one rank joins none
    unless ``alone`` (code that calls collectives at any size). ``kwargs`` go to
    ``init_process_group`` (e.g. ``timeout``)."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    if world_size > 1 or alone:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=world_size, **kwargs)


def run_fresh(
    fn: Callable[..., dict], calls: list[tuple[tuple, dict]], *, timeout_s: float = 600.0
) -> list[dict]:
    """Run ``fn(*args, **kwargs)`` for every call at once, each in a fresh spawned process with
    the allocator settings above (one process per rank of a measured job)."""
    saved = {k: os.environ.get(k) for k in MMAP_ENV}
    os.environ.update(MMAP_ENV)  # spawn copies the environment at start
    procs = []
    try:
        ctx = mp.get_context("spawn")
        for args, kwargs in calls:
            parent, child = ctx.Pipe()
            p = ctx.Process(target=_child, args=(child, fn, args, kwargs), daemon=True)
            p.start()
            child.close()
            procs.append((p, parent))
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    deadline = time.monotonic() + timeout_s
    out = []
    try:
        for p, parent in procs:
            while not parent.poll(0.2):
                if not p.is_alive():
                    raise RuntimeError(f"measurement process exited with code {p.exitcode}")
                if time.monotonic() > deadline:
                    raise TimeoutError(f"measurement took over {timeout_s} s")
            ok, value = parent.recv()
            if not ok:
                raise RuntimeError(f"measurement failed: {value}")
            out.append(value)
    finally:
        for p, _ in procs:
            p.join(5)
            if p.is_alive():
                p.kill()
                p.join(5)
    return out
