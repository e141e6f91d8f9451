"""Measure execution plans on CPU: samples/s and peak memory per rank, against the models.

:func:`measure_plan` runs ``n`` ranks of :class:`~malleparsl.apps.examples_plans.BlockMLP`
under one plan, each in a fresh process (see :mod:`malleparsl.apps.memory` for why and how
the peak is read), joined in a real gloo group. Rank 0 holds the largest local batch; its
peak is compared with :func:`malleparsl.plans.plan_memory` for the profile measured in the
same process. Used by ``malleparsl bench plans`` and the memory-model tests.
"""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass
from typing import Any

import typer

from malleparsl.errors import SpecError
from malleparsl.plans import MemoryProfile, PlanOptions, parse_plan, plan_memory
from malleparsl.ports import free_port


@dataclass(frozen=True)
class PlanCase:
    plan: str
    n: int
    width: int = 512
    depth: int = 6
    global_batch: int = 512
    steps: int = 4
    d_in: int = 256


def _rank(rank: int, port: int, case: PlanCase) -> dict[str, Any]:  # runs in a fresh process
    import torch

    from malleparsl.apps.context import TrainContext
    from malleparsl.apps.examples_plans import BlockMLP, loss_sum, teacher_data
    from malleparsl.apps.memory import join_gloo, peak_rss_bytes, reset_peak_rss, rss_bytes
    from malleparsl.apps.plans import prepare, profile_memory

    join_gloo(rank, case.n, port)
    ctx = TrainContext(rank=rank, world_size=case.n,
                       options={"plan": case.plan, "deterministic": False})
    ctx.group = case.n > 1
    try:
        x, y = teacher_data(n=2 * case.global_batch, d_in=case.d_in)
        probe = BlockMLP(d_in=case.d_in, width=case.width, depth=case.depth)
        prof = profile_memory(probe, (x[:8], y[:8]), loss_sum, blocks=probe.blocks)
        tiny = BlockMLP(d_in=case.d_in, width=8, depth=1)  # warm kernels, autograd, Adam
        if parse_plan(case.plan).fsdp and case.n > 1:  # and FSDP2's modules, DTensor's caches
            from malleparsl.apps.plans import shard_model

            shard_model(tiny, tiny.blocks, world_size=case.n, device="cpu")
        if parse_plan(case.plan).checkpoint:  # and checkpointing's first use
            from malleparsl.apps.plans import set_checkpointing

            set_checkpointing(tiny.blocks, True)
        topt = torch.optim.Adam(tiny.parameters())
        loss_sum(tiny, (x[:4], y[:4])).backward()
        topt.step()
        ctx.all_reduce(torch.zeros(4))
        del probe, tiny, topt
        gc.collect()
        reset_peak_rss()
        base = rss_bytes()
        model = BlockMLP(d_in=case.d_in, width=case.width, depth=case.depth)
        model, opt = prepare(ctx, model, torch.optim.Adam, blocks=model.blocks, lr=1e-3)
        times = []
        for step in ctx.steps(case.steps, global_batch=case.global_batch, dataset_size=len(x)):
            t0 = time.perf_counter()
            opt.zero_grad()
            for idx in step.micro_batches():
                step.backward(loss_sum(model, (x[idx], y[idx])))
            step.sync(model)
            opt.step()
            times.append(time.perf_counter() - t0)
        peak = peak_rss_bytes() - base
    finally:
        ctx.close()
    times = sorted(times[1:] or times)
    return {"rank": rank, "peak_bytes": peak, "step_s": times[len(times) // 2],
            "profile": prof.as_dict(), "local_batch": ctx.local_batch}


def measure_plan(case: PlanCase, *, timeout_s: float = 600.0) -> dict[str, Any]:
    """Measured and predicted figures of one plan at one size (rank 0's)."""
    from malleparsl.apps.memory import run_fresh

    port = free_port()
    outs = run_fresh(_rank, [((r, port, case), {}) for r in range(case.n)], timeout_s=timeout_s)
    r0 = outs[0]
    prof = MemoryProfile.from_dict(r0["profile"])
    pred = plan_memory(prof, parse_plan(case.plan), n=case.n, global_batch=case.global_batch)
    return {
        "plan": case.plan, "n": case.n, "global_batch": case.global_batch,
        "width": case.width, "depth": case.depth,
        "samples_per_s": case.global_batch / r0["step_s"], "step_s": r0["step_s"],
        "peak_bytes": r0["peak_bytes"], "predicted_bytes": pred.peak,
        "memory_error": pred.peak / r0["peak_bytes"] - 1,
        "params": prof.params, "act_per_sample": prof.act_per_sample,
        "act_ckpt_per_sample": prof.act_ckpt_per_sample,
    }


def perf_model_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The JPA's per-plan performance model against the measured samples/s: for every case,
    the model fitted (:func:`malleparsl.jpa.plans.fit_perf`, from the scaled prior as live) on
    the *other* cases of the same model shape, predicting this one (leave-one-out)."""
    from malleparsl.jpa.plans import JobPlans

    out = []
    for row in rows:
        same = [r for r in rows if r is not row and (r["width"], r["depth"], r["global_batch"])
                == (row["width"], row["depth"], row["global_batch"])]
        if not same:
            continue
        prof = MemoryProfile.from_dict({k: row[k] for k in ("params", "act_per_sample",
                                                           "act_ckpt_per_sample")})
        jp = JobPlans(PlanOptions(prof, row["global_batch"]), warmup_obs=0)  # steady rows
        for r in same:
            jp.observe(parse_plan(r["plan"]), r["n"], samples_per_s=r["samples_per_s"])
        pred = jp.model.rate(parse_plan(row["plan"]), n=row["n"], global_batch=row["global_batch"])
        out.append({"kind": "perf_model", "set": row["set"], "plan": row["plan"], "n": row["n"],
                    "fitted_on": len(same), "samples_per_s": row["samples_per_s"],
                    "predicted_samples_per_s": pred,
                    "rate_error": pred / row["samples_per_s"] - 1})
    return out


TUNED = (  # the cases the memory model was checked on while it was written
    PlanCase(plan="dp", n=1, width=256, depth=8, global_batch=4096, steps=3),
    PlanCase(plan="dp@mb=512", n=1, width=256, depth=8, global_batch=4096, steps=3),
    PlanCase(plan="ckpt", n=1, width=256, depth=8, global_batch=4096, steps=3),
    PlanCase(plan="ckpt", n=2, width=256, depth=8, global_batch=4096, steps=3),
    PlanCase(plan="zero1", n=2, width=256, depth=8, global_batch=4096, steps=3),
    PlanCase(plan="zero1+ckpt@mb=256", n=3, width=256, depth=8, global_batch=4096, steps=3),
)
HELD_OUT = (  # never used while tuning: another shape of model and batch
    PlanCase(plan="dp", n=3, width=384, depth=6, global_batch=3072, steps=3),
    PlanCase(plan="ckpt@mb=384", n=1, width=384, depth=6, global_batch=3072, steps=3),
    PlanCase(plan="zero1", n=3, width=384, depth=6, global_batch=3072, steps=3),
    PlanCase(plan="zero1+ckpt", n=2, width=384, depth=6, global_batch=3072, steps=3),
)


def bench_plans(
    json_out: bool = typer.Option(False, "--json", help="One JSON object per line."),
    quick: bool = typer.Option(False, help="One tuned and one held-out case only."),
    sim: bool = typer.Option(True, help="Also run the simulator comparison (item 5)."),
    cpu: bool = typer.Option(True, help="Measure the plans on CPU (--no-cpu: simulator only)."),
    sim_hours: float = typer.Option(48.0, help="Simulated window in hours."),
    sim_nodes: str = typer.Option("0:128", help="Node slice of the Summit trace."),
    sim_limit: int = typer.Option(0, help="Use only the first N jobs (0: all)."),
    sim_samples_scale: float = typer.Option(1.0, help="Scale every job's samples."),
    sim_max_active: int = typer.Option(
        10, help="Concurrent-job cap; 0: none (the allocator decides admission)."),
    sim_large_every: int = typer.Option(
        3, help="Every N-th job is a large model (1: all, Rubick's memory-bound case)."),
    sim_dp_nodes: str = typer.Option(
        "4:16", help="LO:HI nodes plain data parallelism needs for the large models."),
    sim_policy: str = typer.Option("milp", help="Simulator policy (setup)."),
    sim_layout: str = typer.Option(
        "summit", help="Node layout: summit (6 ranks of 16 GiB, global batch 1536) or "
        "one-gpu (a node is one 16 GiB rank, global batch 256: figures before 2026-11-26)."),
) -> None:
    """Execution plans on CPU (samples/s, peak memory vs the memory model) and the simulator's
    plan-aware vs data-parallel-only comparison on the Summit trace.

    One JSON line per plan and size with ``memory_error`` = predicted / measured - 1 (``set``:
    ``tuned`` or ``held_out``), then one line with the simulator ratios.
    """
    import json

    lo, _, hi = sim_dp_nodes.partition(":")
    if not (lo.isdigit() and hi.isdigit() and 1 <= int(lo) <= int(hi)):
        raise SpecError(f"--sim-dp-nodes must be LO:HI with 1 <= LO <= HI, got {sim_dp_nodes!r}")
    from malleparsl.sim.plans import LAYOUTS

    if sim_layout not in LAYOUTS:
        raise SpecError(f"--sim-layout must be one of {sorted(LAYOUTS)}, got {sim_layout!r}")
    if sim_max_active < 0 or sim_large_every < 1:
        raise SpecError(f"need --sim-max-active >= 0 and --sim-large-every >= 1, got "
                        f"{sim_max_active} and {sim_large_every}")
    cases = [("tuned", c) for c in TUNED] + [("held_out", c) for c in HELD_OUT]
    if quick:
        cases = [cases[0], cases[len(TUNED)]]
    if not cpu:
        cases = []
    rows = []
    for which, case in cases:
        row = {"set": which, **measure_plan(case)}
        rows.append(row)
        if json_out:
            print(json.dumps(row), flush=True)
        else:
            print(f"{which:8s} {row['plan']:20s} n={row['n']} {row['samples_per_s']:8.0f} "
                  f"samples/s  peak {row['peak_bytes'] / 2**20:7.1f} MiB  predicted "
                  f"{row['predicted_bytes'] / 2**20:7.1f} MiB  error {row['memory_error']:+.1%}",
                  flush=True)
    for row in perf_model_rows(rows):
        if json_out:
            print(json.dumps(row), flush=True)
        else:
            print(f"perf-model {row['set']:8s} {row['plan']:20s} n={row['n']} predicted "
                  f"{row['predicted_samples_per_s']:8.0f} samples/s  measured "
                  f"{row['samples_per_s']:8.0f}  error {row['rate_error']:+.1%}", flush=True)
    if not sim:
        return
    from malleparsl.sim.plans import compare_plans

    res = compare_plans(hours=sim_hours, nodes=sim_nodes, limit=sim_limit or None,
                        samples_scale=sim_samples_scale, policy=sim_policy,
                        max_active=sim_max_active or None, large_every=sim_large_every,
                        dp_nodes=(int(lo), int(hi)), layout=sim_layout)
    print(json.dumps(res, default=float), flush=True)
