"""Measure what saving and loading a checkpoint costs in memory, beyond the state itself.

Each measurement runs in a fresh process (see :mod:`malleparsl.apps.memory` for how the peak
is read): :func:`measure_store` saves and reads back a state of a given size through
:class:`~malleparsl.apps.checkpoint.CheckpointStore`; :func:`measure_plan_save` trains
:class:`~malleparsl.apps.examples_plans.BlockMLP` under a plan on ``n`` gloo ranks and then
checkpoints it through ``TrainContext.save`` and restores it in a next segment (under ``plan``,
after training under ``from_plan``: a rescale that switches plans), reporting rank 0's peak
during training, the save and the restore, its resident memory after the save and the
seconds the save and the restore took, next to the memory model's peak.

    python -m malleparsl.apps.bench_checkpoint store --mib 128
    python -m malleparsl.apps.bench_checkpoint plan --plan zero1 --n 2
    python -m malleparsl.apps.bench_checkpoint plan --plan fsdp --from-plan dp --n 2
    python -m malleparsl.apps.bench_checkpoint formats --n 2   # plain file vs DCP, seconds
"""

from __future__ import annotations

import gc
import json
import shutil
import tempfile
from typing import Any

import typer

from malleparsl.ports import free_port

MIB = 2**20


def _store_child(mib: int) -> dict[str, Any]:  # runs in a fresh process
    import torch

    from malleparsl.apps.checkpoint import CheckpointStore
    from malleparsl.apps.memory import peak_rss_bytes, reset_peak_rss, rss_bytes

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as d:
        store = CheckpointStore(directory=d, keep=2)
        store.read(store.save({"w": torch.ones(4)}, step=0))  # torch.save/load's first use
        n = mib * MIB // 4 // 8
        state = {"model": {f"w{i}": torch.randn(n) for i in range(8)}, "step": 1}
        gc.collect()
        reset_peak_rss()
        base = rss_bytes()
        path = store.save(state, step=1)
        save_peak = peak_rss_bytes() - base
        size = path.stat().st_size
        del state
        gc.collect()
        reset_peak_rss()
        base = rss_bytes()
        loaded = store.read(path)
        load_peak = peak_rss_bytes() - base
        held = rss_bytes() - base
        assert loaded["step"] == 1
    return {"file_bytes": size, "save_extra_bytes": save_peak, "load_peak_bytes": load_peak,
            "loaded_bytes": held}


def measure_store(mib: int = 128) -> dict[str, Any]:
    """Peak memory of saving a ``mib``-MiB state beyond the state (``save_extra_bytes``), and
    of reading it back (``load_peak_bytes``, against ``loaded_bytes`` kept afterwards)."""
    from malleparsl.apps.memory import run_fresh

    return run_fresh(_store_child, [((mib,), {})])[0]


def _plan_child(rank: int, port: int, plan: str, n: int, width: int, depth: int,
                global_batch: int, from_plan: str | None = None
                ) -> dict[str, Any]:  # runs in a fresh process
    import time

    import torch
    import torch.distributed as dist

    from malleparsl.apps.context import TrainContext
    from malleparsl.apps.examples_plans import BlockMLP, loss_sum, teacher_data
    from malleparsl.apps.memory import join_gloo, peak_rss_bytes, reset_peak_rss, rss_bytes
    from malleparsl.apps.plans import prepare, profile_memory

    join_gloo(rank, n, port)
    ckpt = tempfile.mkdtemp(prefix="bench-ckpt-") if rank == 0 else None
    if n > 1:  # every rank checkpoints into rank 0's directory (they share the host)
        box = [ckpt]
        dist.broadcast_object_list(box, src=0)
        ckpt = box[0]
    d_in = 256
    x, y = teacher_data(n=2 * global_batch, d_in=d_in)
    probe = BlockMLP(d_in=d_in, width=width, depth=depth)
    prof = profile_memory(probe, (x[:8], y[:8]), loss_sum, blocks=probe.blocks)
    del probe

    def run(job: str, w: int, dd: int) -> tuple[int, int, int, float]:
        ctx = TrainContext(job_id=job, rank=rank, world_size=n, ckpt_dir=f"{ckpt}/{job}",
                           options={"plan": from_plan or plan, "deterministic": False,
                                    "torch_threads": 1})
        ctx.group = n > 1
        try:
            model = BlockMLP(d_in=d_in, width=w, depth=dd)
            model, opt = prepare(ctx, model, torch.optim.Adam, blocks=model.blocks, lr=1e-3)
            for step in ctx.steps(1, global_batch=global_batch, dataset_size=len(x)):
                opt.zero_grad()
                for idx in step.micro_batches():
                    step.backward(loss_sum(model, (x[idx], y[idx])))
                step.sync(model)
                opt.step()
                if step.index == 0:
                    train_peak = peak_rss_bytes()
                    reset_peak_rss()
                    t0 = time.perf_counter()
                    ctx.save()
                    save_s = time.perf_counter() - t0
                    save_peak = peak_rss_bytes()
                    after = rss_bytes()
            return train_peak, save_peak, after, save_s
        finally:
            ctx.group = False  # keep the process group for the next run
            ctx.close()
            if n > 1:
                dist.barrier()  # rank 0's file is written before any rank looks for it

    def resume(job: str, w: int, dd: int) -> tuple[int, float]:
        """The next segment's restore of that checkpoint: the peak while loading it."""
        ctx = TrainContext(job_id=job, segment=1, rank=rank, world_size=n,
                           ckpt_dir=f"{ckpt}/{job}",
                           options={"plan": plan, "deterministic": False, "torch_threads": 1})
        ctx.group = n > 1
        try:
            model = BlockMLP(d_in=d_in, width=w, depth=dd)
            prepare(ctx, model, torch.optim.Adam, blocks=model.blocks, lr=1e-3)
            reset_peak_rss()
            t0 = time.perf_counter()
            assert ctx.restore()
            return peak_rss_bytes(), time.perf_counter() - t0
        finally:
            ctx.group = False
            ctx.close()

    run("warm", 8, 1)  # kernels, Adam, gloo, torch.save's and torch.load's first use
    resume("warm", 8, 1)
    gc.collect()
    reset_peak_rss()
    base = rss_bytes()
    train_peak, save_peak, after, save_s = run("job", width, depth)
    gc.collect()
    restore_peak, restore_s = resume("job", width, depth)
    if n > 1:
        dist.barrier()  # every rank has read the files before rank 0 removes them
        dist.destroy_process_group()
    if rank == 0:  # the checkpoints (a model's state, its optimizer's) were left in /tmp
        shutil.rmtree(ckpt, ignore_errors=True)
    return {"rank": rank, "train_peak_bytes": train_peak - base,
            "save_peak_bytes": save_peak - base, "after_save_bytes": after - base,
            "restore_peak_bytes": restore_peak - base, "save_s": save_s,
            "restore_s": restore_s, "profile": prof.as_dict()}


def measure_plan_save(plan: str, n: int, *, width: int = 512, depth: int = 8,
                      global_batch: int = 256, from_plan: str | None = None) -> dict[str, Any]:
    """Rank 0's peaks while training one step (under ``from_plan``, default ``plan``), while
    checkpointing after it and while the next segment restores that checkpoint under
    ``plan``, its resident memory after the save, the save's and the restore's seconds, and
    the memory model's peak for ``plan``."""
    from malleparsl.apps.memory import run_fresh
    from malleparsl.plans import MemoryProfile, parse_plan, plan_memory

    port = free_port()
    args = (plan, n, width, depth, global_batch, from_plan)
    r0 = run_fresh(_plan_child, [((r, port, *args), {}) for r in range(n)])[0]
    prof = MemoryProfile.from_dict(r0.pop("profile"))
    pred = plan_memory(prof, parse_plan(plan), n=n, global_batch=global_batch)
    return {"plan": plan, "from_plan": from_plan or plan, "n": n, "params": prof.params, **r0,
            "predicted_bytes": pred.peak,
            "save_over_predicted": r0["save_peak_bytes"] / pred.peak - 1,
            "restore_over_predicted": r0["restore_peak_bytes"] / pred.peak - 1}


def _format_child(rank: int, port: int, n: int, width: int, depth: int,
                  repeats: int) -> dict[str, Any]:  # runs in a fresh process
    import time

    import torch
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict,
        get_optimizer_state_dict,
    )

    from malleparsl.apps.checkpoint import CheckpointStore
    from malleparsl.apps.examples_plans import BlockMLP, loss_sum, teacher_data
    from malleparsl.apps.memory import join_gloo

    join_gloo(rank, n, port, alone=True)  # its broadcast runs at any size
    box = [tempfile.mkdtemp(prefix="bench-fmt-") if rank == 0 else None]
    dist.broadcast_object_list(box, src=0)
    store = CheckpointStore(directory=box[0], keep=2)
    x, y = teacher_data(n=16, d_in=256)
    model = BlockMLP(d_in=256, width=width, depth=depth)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    loss_sum(model, (x, y)).backward()
    opt.step()  # Adam's state exists; every rank holds the same replicated state
    out: dict[str, list[float]] = {"plain_save_s": [], "plain_read_s": [], "dcp_save_s": [],
                                   "dcp_read_s": []}
    step = 0

    def timed(key: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        dist.barrier()
        t0 = time.perf_counter()
        got = fn(*args, **kwargs)
        dist.barrier()  # the slowest rank's time: the next segment waits for all of them
        out[key].append(time.perf_counter() - t0)
        return got

    def plain_save(state: dict[str, Any], step: int) -> Any:
        return store.save(state, step=step) if rank == 0 else None

    def dcp_read(step: int, into: dict[str, Any]) -> None:
        payload = store.read(store.sharded_path_for(step))
        for key in ("model", "optimizer"):
            payload["state"][key].load_into(into[key])

    for _ in range(repeats):
        step += 1
        state = {"model": model.state_dict(), "optimizer": opt.state_dict()}
        timed("plain_save_s", plain_save, state, step)
        timed("plain_read_s", store.read, store.path_for(step))
        step += 1
        sharded = {"model": get_model_state_dict(model),
                   "optimizer": get_optimizer_state_dict(model, opt)}
        timed("dcp_save_s", store.save_sharded, {"step": step} if rank == 0 else None, sharded,
              {"model": "module", "optimizer": "optimizer"}, step=step, rank=rank,
              world_size=n)
        timed("dcp_read_s", dcp_read, step, sharded)
    dist.destroy_process_group()  # after timed's barrier: every rank has read the files
    if rank == 0:  # the last two checkpoints were left in /tmp
        shutil.rmtree(box[0], ignore_errors=True)
    return {k: min(v) for k, v in out.items()}


def measure_formats(n: int, *, width: int = 512, depth: int = 8,
                    repeats: int = 3) -> dict[str, Any]:
    """Seconds to save and to read back a replicated plan's state (BlockMLP with Adam) as one
    plain file (rank 0 writes, every rank reads it whole) and as a DCP checkpoint (its
    planner spreads the replicated tensors over the ranks; every rank reads them all): the
    fastest of ``repeats``, the slowest rank's."""
    from malleparsl.apps.memory import run_fresh

    port = free_port()
    r0 = run_fresh(_format_child, [((r, port, n, width, depth, repeats), {})
                                   for r in range(n)])[0]
    return {"n": n, "width": width, "depth": depth, **r0}


app = typer.Typer(add_completion=False)


@app.command()
def formats(n: int = 1, width: int = 512, depth: int = 8, repeats: int = 3) -> None:
    print(json.dumps(measure_formats(n, width=width, depth=depth, repeats=repeats)))


@app.command()
def store(mib: int = 128) -> None:
    print(json.dumps(measure_store(mib)))


@app.command()
def plan(plan: str = "dp", n: int = 1, width: int = 512, depth: int = 8,
         global_batch: int = 256, from_plan: str = "") -> None:
    print(json.dumps(measure_plan_save(plan, n, width=width, depth=depth,
                                       global_batch=global_batch, from_plan=from_plan or None)))


if __name__ == "__main__":
    app()
