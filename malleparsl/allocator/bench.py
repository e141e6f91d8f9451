"""``malleparsl bench allocator``: solve latency and optimality gap of every policy and solver.

For each size (jobs x nodes) it draws ``repeats`` random instances: ImageNet jobs from the
BFTrainer job set with their measured curves, about 70 % of the nodes held by the jobs (random
legal sizes) and 30 % newly idle. Every (policy, solver) cell runs in a forked child process, so
a hard wall-clock budget can stop a slow solver ("did not finish in N s") and the child's peak
resident memory is the memory of that solve. The gap is measured against the best known
solution of each instance: the exact dynamic-programming optimum of the published objective
(:func:`~malleparsl.allocator.objective.best_count_objective`) or any policy's better answer.

Also runnable as ``python -m malleparsl.allocator.bench``.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import multiprocessing as mp
import os
import random
import resource
import statistics
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import typer

from malleparsl.allocator.base import ClusterSnapshot, JobView, make_policy
from malleparsl.allocator.objective import (
    allocation_objective,
    best_count_objective,
    feasibility_problems,
)
from malleparsl.errors import SpecError

log = logging.getLogger(__name__)

__all__ = ["DEFAULT_SIZES", "BenchRow", "bench_allocator", "make_instance", "run_bench"]

DEFAULT_SIZES = "3x16,10x64,10x128,20x128,64x1024,100x4734"
DEFAULT_CELLS = (
    "milp:highs,milp:cbc,milp-horizon:highs,milp-node:highs,milp-node:cbc,greedy,equal-share"
)


@dataclass
class BenchRow:
    """One (policy, solver, size) line of the table; ``--json`` prints these fields."""

    policy: str
    solver: str
    jobs: int
    nodes: int
    runs: int
    median_ms: float | None
    p95_ms: float | None
    objective: float | None  # mean over instances
    gap: float | None  # worst relative gap to the best known solution
    gap_mean: float | None
    peak_rss_mb: float | None  # peak resident memory of the process that ran the solves
    status: str  # "ok", "did not finish in N s", "skipped: ..."
    fallbacks: int = 0  # solves that ended without a solver solution
    lp_proved: int = 0  # milp solves closed by the LP bound alone (no MILP needed)


def make_instance(
    specs: Sequence, n_jobs: int, n_nodes: int, rng: random.Random
) -> tuple[ClusterSnapshot, list[JobView]]:
    """``n_jobs`` random jobs, ``n_nodes`` nodes, ~70 % of them held at random legal sizes."""
    nodes = tuple(f"n{i:05d}" for i in range(n_nodes))
    chosen = rng.sample(list(specs), n_jobs)
    pool = list(nodes)
    rng.shuffle(pool)
    budget = round(0.7 * n_nodes)
    sizes = [0] * n_jobs
    while budget > 0:  # hand out held nodes one at a time to random jobs below their cap
        open_jobs = [i for i in range(n_jobs) if sizes[i] < chosen[i].max_nodes]
        if not open_jobs:
            break
        i = rng.choice(open_jobs)
        step = min(budget, chosen[i].max_nodes - sizes[i], max(1, rng.randint(1, 8)))
        sizes[i] += step
        budget -= step
    views, pos = [], 0
    for spec, k in zip(chosen, sizes):
        if 0 < k < spec.min_nodes:
            k = 0
        views.append(JobView(spec, spec.curve, frozenset(pool[pos : pos + k])))
        pos += k
    return ClusterSnapshot(now_s=0.0, nodes=nodes), views


@functools.lru_cache(maxsize=2)
def _fragment_lengths(path: str):
    import pandas as pd

    frag = pd.read_csv(path, usecols=["start_s", "end_s"])
    return (frag["end_s"] - frag["start_s"]).to_numpy(dtype=float)


def summit_residuals(n: int, rng: random.Random, path: str | None = None) -> list[float]:
    """``n`` remaining idle times (s) of nodes seen idle at a random moment on Summit.

    A node observed idle at a random time sits in a fragment chosen with probability
    proportional to its length, at a uniform position in it (the inspection paradox).
    """
    import numpy as np

    from malleparsl.data import data_dir

    src = path or str(data_dir() / "summit-idle-2021" / "idle_fragments.csv.gz")
    length = _fragment_lengths(src)
    gen = np.random.default_rng(rng.randrange(2**32))
    picked = gen.choice(length, size=n, p=length / length.sum())
    return (picked * gen.random(n)).tolist()


def _with_ends(snap: ClusterSnapshot, residuals: list[float]) -> ClusterSnapshot:
    ends = {n: snap.now_s + r for n, r in zip(snap.nodes, residuals)}
    return ClusterSnapshot(now_s=snap.now_s, nodes=snap.nodes, node_end_s=ends, tfwd_s=snap.tfwd_s)


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _run_cell(policy: str, options: dict, instances: list, conn) -> None:
    """Child process: solve every instance, send back (times, objectives, fallbacks, rss)."""
    try:
        pol = make_policy(policy, **options)
        times, objs, falls, proved = [], [], 0, 0
        for snap, jobs in instances:
            t0 = time.perf_counter()
            alloc = pol.allocate(snap, jobs)
            times.append(time.perf_counter() - t0)
            bad = feasibility_problems(snap, jobs, alloc)
            if bad:
                raise SpecError(f"{policy} returned an infeasible allocation: {bad[:3]}")
            objs.append(allocation_objective(snap, jobs, alloc))
            falls += int(bool(getattr(pol, "last_fallback", False)))
            res = getattr(pol, "last_result", None)
            proved += int(res is not None and res.detail == "proved by the LP bound")
        conn.send(("ok", times, objs, (falls, proved), _rss_mb()))
    except Exception as exc:  # report, don't hang the parent
        conn.send(("error", repr(exc), [], (0, 0), _rss_mb()))
    finally:
        conn.close()


def _cell_in_child(policy: str, options: dict, instances: list, budget_s: float):
    ctx = mp.get_context("fork")
    parent, child = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_run_cell, args=(policy, options, instances, child), daemon=True)
    proc.start()
    child.close()
    try:
        if parent.poll(budget_s):
            return parent.recv()
        return None
    finally:
        if proc.is_alive():
            proc.kill()
        proc.join(5)


def _pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]


def run_bench(
    *,
    sizes: str = DEFAULT_SIZES,
    cells: str = DEFAULT_CELLS,
    repeats: int = 10,
    time_limit_s: float = 5.0,
    node_time_limit_s: float = 10.0,
    node_repeats: int = 1,
    node_max_binaries: int = 200_000,
    seed: int = 0,
    jobset: str = "imagenet",
    ends: str = "none",
) -> list[BenchRow]:
    """Run the benchmark and return its rows (see the module docstring)."""
    from malleparsl.data import load_jobset

    specs = load_jobset(jobset)
    rows: list[BenchRow] = []
    for size in sizes.split(","):
        try:
            n_jobs, n_nodes = (int(x) for x in size.lower().split("x"))
        except ValueError:
            raise SpecError(f"size {size!r} is not JOBSxNODES (e.g. 20x128)") from None
        rng = random.Random(f"{seed}-{size}")
        insts = [make_instance(specs, n_jobs, n_nodes, rng) for _ in range(repeats)]
        if ends == "summit":
            insts = [(_with_ends(s, summit_residuals(n_nodes, rng)), j) for s, j in insts]
        elif ends != "none":
            raise SpecError(f"ends must be 'none' or 'summit', got {ends!r}")
        best = [best_count_objective(s, j)[0] for s, j in insts]
        size_rows = []
        for cell in cells.split(","):
            policy, _, solver = cell.partition(":")
            options: dict = {}
            mine = insts
            budget = max(60.0, 30 * time_limit_s)
            if solver:
                options["solver"] = solver
            if policy == "milp-node":
                options["time_limit_s"] = node_time_limit_s
                mine = insts[: max(1, node_repeats if n_nodes > 64 else min(3, repeats))]
                budget = node_time_limit_s * len(mine) + 10.0
                if n_jobs * n_nodes > node_max_binaries:
                    size_rows.append(
                        _row(
                            policy,
                            solver,
                            n_jobs,
                            n_nodes,
                            None,
                            best,
                            f"skipped: {n_jobs * n_nodes:,} binaries > {node_max_binaries:,}",
                        )
                    )
                    continue
            elif policy.startswith("milp"):
                options["time_limit_s"] = time_limit_s
            log.info("bench %s %s at %dx%d", policy, solver or "-", n_jobs, n_nodes)
            got = _cell_in_child(policy, options, mine, budget)
            if got is None:
                status = f"did not finish in {budget:.0f} s"
                size_rows.append(_row(policy, solver, n_jobs, n_nodes, None, best, status))
            elif got[0] != "ok":
                size_rows.append(
                    _row(policy, solver, n_jobs, n_nodes, None, best, f"error: {got[1]}")
                )
            else:
                size_rows.append(_row(policy, solver, n_jobs, n_nodes, got, best, "ok"))
        rows.extend(size_rows)
    return rows


def _row(policy, solver, n_jobs, n_nodes, got, best, status) -> BenchRow:
    if got is None:
        return BenchRow(
            policy, solver or "-", n_jobs, n_nodes, 0, None, None, None, None, None, None, status
        )
    _, times, objs, falls, rss = got
    # best known: the exact DP optimum, or a policy's answer if one ever scored higher
    gaps = [(max(b, o) - o) / abs(max(b, o)) if max(b, o) else 0.0 for o, b in zip(objs, best)]
    ms = [t * 1000 for t in times]
    return BenchRow(
        policy=policy,
        solver=solver or "-",
        jobs=n_jobs,
        nodes=n_nodes,
        runs=len(times),
        median_ms=round(statistics.median(ms), 2),
        p95_ms=round(_pct(ms, 0.95), 2),
        objective=round(statistics.fmean(objs), 3),
        gap=max(gaps),
        gap_mean=statistics.fmean(gaps),
        peak_rss_mb=round(rss, 1),
        status=status,
        fallbacks=falls[0],
        lp_proved=falls[1],
    )


def _fmt(v: float | None, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


def _status(r: BenchRow) -> str:
    notes = [f"{r.fallbacks} fallbacks"] if r.fallbacks else []
    notes += [f"{r.lp_proved} proved by LP bound"] if r.lp_proved else []
    return r.status + (f" ({', '.join(notes)})" if notes else "")


def _print_table(rows: list[BenchRow]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(
        title=f"allocator benchmark ({os.cpu_count()} cores, load {os.getloadavg()[0]:.1f})"
    )
    for col in (
        "policy",
        "solver",
        "jobs x nodes",
        "runs",
        "median ms",
        "p95 ms",
        "gap max",
        "gap mean",
        "peak RSS MB",
        "status",
    ):
        table.add_column(col)
    for r in rows:
        table.add_row(
            r.policy,
            r.solver,
            f"{r.jobs}x{r.nodes}",
            str(r.runs),
            _fmt(r.median_ms, ".1f"),
            _fmt(r.p95_ms, ".1f"),
            _fmt(r.gap, ".2e"),
            _fmt(r.gap_mean, ".2e"),
            _fmt(r.peak_rss_mb, ".0f"),
            _status(r),
        )
    Console(width=160).print(table)


def check_bench_args(
    *, sizes: str, cells: str, repeats: int, time_limit_s: float, node_time_limit_s: float,
    node_repeats: int, ends: str,
) -> None:
    """Every ``bench allocator`` option checked before the first instance (exit 2, one line)."""
    from malleparsl.allocator.base import policy_names
    from malleparsl.allocator.solvers import SOLVERS
    from malleparsl.errors import unknown_name

    for size in sizes.split(","):
        parts = size.lower().split("x")
        if len(parts) != 2 or not all(p.strip().isdigit() and int(p) >= 1 for p in parts):
            raise SpecError(f"--sizes: {size!r} is not JOBSxNODES with whole numbers >= 1 "
                            "(e.g. 20x128)")
    for cell in cells.split(","):
        policy, _, solver = cell.partition(":")
        if policy not in policy_names():
            raise unknown_name("policy", policy, policy_names())
        if solver and solver not in SOLVERS:
            raise unknown_name("solver", solver, SOLVERS)
    for flag, v in (("--repeats", repeats), ("--node-repeats", node_repeats)):
        if v < 1:
            raise SpecError(f"{flag} {v!r}: must be >= 1 instance")
    for flag, t in (("--time-limit-s", time_limit_s), ("--node-time-limit-s", node_time_limit_s)):
        if not (math.isfinite(t) and t > 0):
            raise SpecError(f"{flag} {t!r}: must be a finite number of seconds > 0")
    if ends not in ("none", "summit"):
        raise SpecError(f"--ends {ends!r}: must be 'none' or 'summit'")


def bench_allocator(
    json_out: bool = typer.Option(False, "--json", help="One JSON object per row."),
    sizes: str = typer.Option(DEFAULT_SIZES, help="Comma-separated JOBSxNODES."),
    cells: str = typer.Option(DEFAULT_CELLS, help="Comma-separated policy[:solver]."),
    repeats: int = typer.Option(10, help="Random instances per size."),
    time_limit_s: float = typer.Option(5.0, help="Solver time limit of the count MILPs."),
    node_time_limit_s: float = typer.Option(10.0, help="Solver time limit of milp-node."),
    node_repeats: int = typer.Option(1, help="Instances for milp-node above 64 nodes."),
    ends: str = typer.Option(
        "none", help="'summit': give nodes idle ends drawn from the Summit trace (milp-horizon)."
    ),
    seed: int = typer.Option(0, help="Random seed of the instances."),
) -> None:
    """Latency (median, p95) and optimality gap of each allocation policy and solver."""
    check_bench_args(sizes=sizes, cells=cells, repeats=repeats, time_limit_s=time_limit_s,
                     node_time_limit_s=node_time_limit_s, node_repeats=node_repeats, ends=ends)
    rows = run_bench(
        sizes=sizes,
        cells=cells,
        repeats=repeats,
        time_limit_s=time_limit_s,
        node_time_limit_s=node_time_limit_s,
        node_repeats=node_repeats,
        seed=seed,
        ends=ends,
    )
    if json_out:
        for r in rows:
            print(json.dumps(asdict(r)))
    else:
        _print_table(rows)


if __name__ == "__main__":
    typer.run(bench_allocator)
