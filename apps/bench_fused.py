"""``malleparsl bench fused``: B trials fused into one model vs the same trials unfused.

For the digits MLP (64-128-10) and CNN (two 3x3 convolutions with BatchNorm) and B trials
that differ in learning rate, weight decay and seed (Adam, global batch 64), on one torch
thread, three ways to train the same B trials for ``steps`` steps:

* **fused**: one :class:`FusedSequential` + :class:`FusedOptimizer` (what a trial array runs);
* **serial**: the B plain models with ``torch.optim.Adam``, one after another in one process;
* **procs**: the B trials spread over ``min(B, cores)`` warm worker processes (what B
  separate one-trial jobs get from this machine's cores).

Throughput is trial-samples per second (B x global batch x steps / wall). Fused and serial
are measured in interleaved pairs (``repeats`` each, medians, the speed-up is the median of
the per-pair ratios), so background load hits both alike. Memory per trial counts the bytes
of parameters, gradients and optimizer state plus the activations autograd saves in one
step. ``max_abs_loss_diff`` is the largest difference between a fused trial's loss and the
same trial's loss trained alone, over all steps and trials. B = 64 is kept out of the tuning
loop (``held_out``).
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import statistics
import time
from collections.abc import Sequence
from typing import Any

import typer

HELD_OUT_TRIALS = (64,)
MODELS = {"mlp": {"width": 128}, "cnn": {"channels": 8, "batchnorm": True}}


def trial_configs(model: str, B: int) -> list[dict[str, Any]]:
    return [{**MODELS[model], "optimizer": "adam", "lr": 1e-3 * (1 + i % 8),
             "weight_decay": 1e-4 * (i % 3), "seed": i} for i in range(B)]


def _setup(model: str, B: int, gb: int, steps: int) -> tuple[Any, ...]:
    import torch

    from malleparsl.apps.fused_digits import BUILDERS, digits_data
    from malleparsl.apps.sharding import GlobalBatchSampler

    Xtr, ytr, _, _ = digits_data()
    cfgs = trial_configs(model, B)
    idx = []
    for c in cfgs:
        s = GlobalBatchSampler(dataset_size=len(Xtr), global_batch=gb, world_size=1, rank=0,
                               micro_batch=gb, seed=c["seed"])
        idx.append(torch.stack([s.global_indices(t) for t in range(steps)]))
    idx = torch.stack(idx)  # (B, steps, gb)
    return BUILDERS[model], cfgs, Xtr, ytr, idx


def run_serial(model: str, cfgs: Sequence[dict], gb: int, steps: int, idx: Any = None
               ) -> tuple[float, list[list[float]], int]:
    """Train ``cfgs`` one after another; (seconds, losses per trial, bytes per trial)."""
    import torch
    import torch.nn.functional as F

    from malleparsl.apps.fused_digits import BUILDERS, digits_data
    from malleparsl.apps.fused_optim import TrialHparams

    torch.set_num_threads(1)
    Xtr, ytr, _, _ = digits_data()
    models, opts = [], []
    for c in cfgs:
        torch.manual_seed(c["seed"])
        models.append(BUILDERS[model](c))
        opts.append(TrialHparams.from_config(c).torch_optimizer(models[-1].parameters()))
    if idx is None:
        idx = _setup(model, len(cfgs), gb, steps)[-1]
    losses: list[list[float]] = [[] for _ in cfgs]
    t0 = time.perf_counter()
    for i, (m, opt) in enumerate(zip(models, opts)):
        for t in range(steps):
            j = idx[i, t]
            opt.zero_grad()
            loss = F.cross_entropy(m(Xtr[j]), ytr[j], reduction="sum") / gb
            loss.backward()
            opt.step()
            losses[i].append(float(loss.detach()))
    wall = time.perf_counter() - t0
    state = sum(p.numel() * p.element_size() for p in models[0].parameters()) * 4
    saved = _saved_bytes(lambda: F.cross_entropy(models[0](Xtr[idx[0, 0]]), ytr[idx[0, 0]]))
    return wall, losses, state + saved


def run_fused(model: str, cfgs: Sequence[dict], gb: int, steps: int, idx: Any,
              channels_last: bool = False) -> tuple[float, list[list[float]], int]:
    """Train ``cfgs`` as one fused array; (seconds, losses per trial, bytes per trial)."""
    import torch
    import torch.nn.functional as F

    from malleparsl.apps.fused_digits import BUILDERS, digits_data
    from malleparsl.apps.fused_layers import FusedSequential
    from malleparsl.apps.fused_optim import FusedOptimizer, TrialHparams

    torch.set_num_threads(1)
    Xtr, ytr, _, _ = digits_data()
    models = []
    for c in cfgs:
        torch.manual_seed(c["seed"])
        models.append(BUILDERS[model](c))
    fm = FusedSequential.from_models(models, channels_last=channels_last)
    opt = FusedOptimizer(list(fm.parameters()), [TrialHparams.from_config(c) for c in cfgs])
    B = len(cfgs)
    sums_all = []
    t0 = time.perf_counter()
    for t in range(steps):
        j = idx[:, t]
        opt.zero_grad()
        out = fm(Xtr[j])
        sums = F.cross_entropy(out.reshape(-1, 10), ytr[j].reshape(-1),
                               reduction="none").view(B, -1).sum(1)
        sums.sum().backward()
        for p in fm.parameters():
            p.grad /= gb
        opt.step()
        sums_all.append(sums.detach() / gb)
    wall = time.perf_counter() - t0
    losses = torch.stack(sums_all, 1).tolist()
    state = sum(p.numel() * p.element_size() for p in fm.parameters()) * 4
    j = idx[:, 0]
    saved = _saved_bytes(lambda: F.cross_entropy(fm(Xtr[j]).reshape(-1, 10), ytr[j].reshape(-1)))
    return wall, losses, (state + saved) // B


def _saved_bytes(forward: Any) -> int:
    """Bytes of the tensors autograd saves for backward in one forward pass."""
    import torch

    total = [0]

    def pack(t: Any) -> Any:
        total[0] += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        forward()
    return total[0]


def _proc_chunk(args: tuple[str, list[dict], int, int]) -> float:
    model, cfgs, gb, steps = args
    return run_serial(model, cfgs, gb, steps)[0] if cfgs else 0.0


def measure(model: str, B: int, *, gb: int = 64, steps: int = 30, repeats: int = 3,
            pool: Any = None, procs: int = 2) -> dict[str, Any]:
    """One JSON row: fused vs serial (interleaved pairs) vs ``procs`` worker processes."""
    _, cfgs, _, _, idx = _setup(model, B, gb, steps)
    run_fused(model, cfgs, gb, 2, idx)  # warm
    run_serial(model, cfgs[:1], gb, 2, idx[:1])
    fused, serial, ratios, ratios_cl = [], [], [], []
    diff, diff_cl, mem_f, mem_s = 0.0, 0.0, 0, 0
    for _ in range(repeats):
        tf, lf, mem_f = run_fused(model, cfgs, gb, steps, idx)
        ts, ls, mem_s = run_serial(model, cfgs, gb, steps, idx)
        fused.append(B * gb * steps / tf)
        serial.append(B * gb * steps / ts)
        ratios.append(ts / tf)
        diff = max(diff, max(abs(a - b) for x, y in zip(lf, ls) for a, b in zip(x, y)))
        if model == "cnn":  # the faster, not bit-comparable layout, reported apart
            tc, lc, _ = run_fused(model, cfgs, gb, steps, idx, channels_last=True)
            ratios_cl.append(ts / tc)
            diff_cl = max(diff_cl, max(abs(a - b) for x, y in zip(lc, ls) for a, b in zip(x, y)))
    row: dict[str, Any] = {
        "model": model, "trials": B, "global_batch": gb, "steps": steps, "repeats": repeats,
        "samples_per_s_fused": round(statistics.median(fused), 1),
        "samples_per_s_serial": round(statistics.median(serial), 1),
        "speedup_vs_serial": round(statistics.median(ratios), 3),
        "speedup_pairs": [round(r, 2) for r in ratios],
        "mem_per_trial_fused_bytes": int(mem_f), "mem_per_trial_alone_bytes": int(mem_s),
        "max_abs_loss_diff": diff,
        "held_out": B in HELD_OUT_TRIALS,
    }
    if ratios_cl:
        row["speedup_vs_serial_channels_last"] = round(statistics.median(ratios_cl), 3)
        row["max_abs_loss_diff_channels_last"] = diff_cl
    if pool is not None:
        chunks = [(model, cfgs[k::procs], gb, steps) for k in range(procs)]
        pool.map(_proc_chunk, [(model, c[1][:1], gb, 2) for c in chunks])  # warm each worker
        t0 = time.perf_counter()
        pool.map(_proc_chunk, chunks)
        wall = time.perf_counter() - t0
        row["procs"] = procs
        row["samples_per_s_procs"] = round(B * gb * steps / wall, 1)
        row["speedup_vs_procs"] = round(row["samples_per_s_fused"] / row["samples_per_s_procs"], 3)
    row["load_avg_1m"] = round(os.getloadavg()[0], 1)
    return row


def _init_worker() -> None:
    import torch

    torch.set_num_threads(1)
    from malleparsl.apps.fused_digits import digits_data

    digits_data()


def bench_fused(
    models: str = typer.Option("mlp,cnn", help="Comma-separated: mlp, cnn."),
    trials: str = typer.Option("1,4,16,64", help="Comma-separated array sizes B."),
    steps: int = typer.Option(30, help="Training steps per measurement."),
    repeats: int = typer.Option(3, help="Interleaved fused/serial pairs per case."),
    global_batch: int = typer.Option(64, help="Samples per optimizer step of every trial."),
    procs: int = typer.Option(0, help="Worker processes for the 'procs' baseline (0: cores)."),
    as_json: bool = typer.Option(False, "--json", help="One JSON object per model and B."),
) -> None:
    """Samples/s of B fused trials vs one after another vs separate processes."""
    import torch

    from malleparsl.errors import SpecError

    torch.set_num_threads(1)
    names = [m.strip() for m in models.split(",") if m.strip()]
    bad = [m for m in names if m not in MODELS]
    if bad:
        raise SpecError(f"unknown model(s) {bad}; choose from {sorted(MODELS)}")
    sizes = [int(b) for b in trials.split(",")]
    if any(b < 1 for b in sizes) or steps < 2 or repeats < 1:
        raise SpecError(f"need trials >= 1, steps >= 2, repeats >= 1; got {sizes}, {steps}, {repeats}")
    nprocs = procs or os.cpu_count() or 1
    with mp.get_context("spawn").Pool(nprocs, initializer=_init_worker) as pool:
        for m in names:
            for B in sizes:
                row = measure(m, B, gb=global_batch, steps=steps, repeats=repeats, pool=pool,
                              procs=min(nprocs, B))
                if as_json:
                    print(json.dumps(row), flush=True)
                else:
                    typer.echo(f"{m:4s} B={B:3d}  fused {row['samples_per_s_fused']:>10.0f}/s  "
                               f"serial {row['samples_per_s_serial']:>9.0f}/s  "
                               f"procs {row.get('samples_per_s_procs', 0):>9.0f}/s  "
                               f"x{row['speedup_vs_serial']:.2f} vs serial  "
                               f"max|dloss| {row['max_abs_loss_diff']:.1e}"
                               f"{'  (held out)' if row['held_out'] else ''}")


def fused_rate(build: Any, config: dict[str, Any], B: int, *, gb: int = 64, steps: int = 8
               ) -> tuple[float, int]:
    """Trial-samples/s of ``B`` copies of ``build(config)`` fused, and bytes per trial
    (parameters, gradients, optimizer state, saved activations): what an array size costs."""
    import torch
    import torch.nn.functional as F

    from malleparsl.apps.fused_digits import digits_data
    from malleparsl.apps.fused_layers import FusedSequential
    from malleparsl.apps.fused_optim import FusedOptimizer, TrialHparams

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        Xtr, ytr, _, _ = digits_data()
        fm = FusedSequential.from_models([build(config) for _ in range(B)])
        opt = FusedOptimizer(list(fm.parameters()), [TrialHparams.from_config(config)] * B)
        gen = torch.Generator().manual_seed(0)

        def step() -> None:
            j = torch.randint(0, len(Xtr), (B, gb), generator=gen)
            opt.zero_grad()
            out = fm(Xtr[j])
            F.cross_entropy(out.reshape(-1, out.shape[-1]), ytr[j].reshape(-1)).backward()
            opt.step()

        step()
        times = []
        for _ in range(steps):
            t0 = time.perf_counter()
            step()
            times.append(time.perf_counter() - t0)
        # the lower quartile of step times: robust to other processes taking the core
        rate = B * gb / sorted(times)[len(times) // 4]
        j = torch.randint(0, len(Xtr), (B, gb), generator=gen)
        saved = _saved_bytes(lambda: fm(Xtr[j]).sum())
        state = sum(p.numel() * p.element_size() for p in fm.parameters()) * 4
        return rate, (state + saved) // B
    finally:
        torch.set_num_threads(threads)
