"""``malleparsl simulate``: replay an idle-node trace under several policies and compare them.

Examples::

    malleparsl simulate --trace summit --jobs imagenet --nodes 0:128 --hours 24 \\
        --policy milp,equal-share,upper-bound --out runs/summit128
    malleparsl simulate --trace theta --nodes 0:256 \\
        --jobs poisson:200 --hours 48 --policy static,upper-bound --json

The time window starts at the first job's submission unless ``--start-h`` says otherwise (the
BFTrainer job sets arrive 20 h into the Summit trace; replaying the empty hours before would
only dilute every figure). ``--hours 0`` runs to the end of the trace.
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

import typer

log = logging.getLogger(__name__)


def _jobs(spec: str, *, limit: int | None, start_s: float, seed: int):  # noqa: ANN202
    from malleparsl.data import load_jobset

    if spec.startswith("poisson:"):
        from malleparsl.sim.workloads import poisson_jobs

        parts = spec.split(":")
        try:
            n = int(parts[1])
            mean = float(parts[2]) if len(parts) > 2 else 600.0
        except (ValueError, IndexError):
            raise typer.BadParameter(
                f"--jobs {spec!r}: write poisson:N or poisson:N:MEAN_INTERARRIVAL_S"
            ) from None
        return poisson_jobs(n_jobs=n, mean_interarrival_s=mean, seed=seed, start_s=start_s)
    return load_jobset(spec, limit=limit)


def simulate(
    trace: str = typer.Option("summit", help="Trace: 'summit', 'theta', a fragment CSV, or an SWF job log."),
    jobs: str = typer.Option(
        "imagenet", help="Job set: imagenet, shufflenet-10, shufflenet-1000, a CSV, or poisson:N."
    ),
    nodes: str = typer.Option("0:128", help="Node slice START:END of the trace's node list."),
    hours: float = typer.Option(24.0, help="Window length in hours (0 = to the trace's end)."),
    start_h: float | None = typer.Option(
        None, help="Window start, hours since the trace start (default: first job submission)."
    ),
    policy: str = typer.Option(
        "milp,equal-share,upper-bound", help="Comma-separated policies (setups) to compare."
    ),
    max_active: int = typer.Option(10, help="Cap on concurrently admitted jobs (0 = no cap)."),
    tfwd: float = typer.Option(10.0, help="Expected seconds to the next event (BFTrainer Tfwd)."),
    noise: float = typer.Option(0.03, help="Relative noise of measured rates (learning setups)."),
    reveal_ends: float = typer.Option(
        0.0, help="Fraction of idle fragments whose end is announced (a scheduler's plan)."
    ),
    horizon_quantile: float | None = typer.Option(
        None, help="Plan with this quantile of a node's remaining idle time (default: mean)."
    ),
    machine_nodes: int | None = typer.Option(
        None, help="Machine size for an SWF log (default: its MaxNodes header)."
    ),
    limit_jobs: int | None = typer.Option(None, help="Use only the first N jobs."),
    bound: bool = typer.Option(
        True, help="Also run upper-bound and upper-bound-capped so '% of bound' is defined."
    ),
    seed: int = typer.Option(0, help="Seed for noise, revealed ends and generated jobs."),
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object per policy."),
    out: Path | None = typer.Option(  # noqa: B008 - typer's way
        None, help="Write logs (CSV), summary.json/.md and PNG plots here."
    ),
) -> None:
    """Replay an idle-node trace with a job set under each policy and compare the results."""
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from malleparsl.errors import MalleparslError
    from malleparsl.report import rich_table, write_report
    from malleparsl.sim.engine import SimOptions
    from malleparsl.sim.engine import simulate as run_sim
    from malleparsl.sim.result import compare
    from malleparsl.sim.setups import setup_names
    from malleparsl.traces import load_trace

    console = Console(stderr=json_out)
    if not console.is_terminal:
        console = Console(stderr=json_out, width=170)
    names = [p.strip() for p in policy.split(",") if p.strip()]
    if bound:
        names += [b for b in ("upper-bound-capped", "upper-bound") if b not in names]
    valid = setup_names()
    bad = [n for n in names if n not in valid]
    if bad:
        raise typer.BadParameter(f"unknown policy {bad}; valid policies are: {', '.join(valid)}")
    try:
        full = load_trace(trace, nodes=nodes, machine_nodes=machine_nodes)
        specs = _jobs(jobs, limit=limit_jobs, start_s=full.start_s, seed=seed)
        if start_h is not None:
            t0 = full.start_s + 3600 * start_h
        else:
            t0 = max(full.start_s, min((j.submit_s for j in specs), default=full.start_s))
        t1 = full.end_s if hours <= 0 else min(full.end_s, t0 + 3600 * hours)
        tr = full.window(t0, t1)
        opts = SimOptions(
            max_active=max_active or None, tfwd_s=tfwd, noise=noise, reveal_ends=reveal_ends,
            seed=seed, horizon_quantile=horizon_quantile,
        )
    except (MalleparslError, ValueError, FileNotFoundError) as exc:
        console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from None
    console.print(
        f"trace {tr.name}: {len(tr.nodes)} nodes, {tr.duration_s / 3600:.1f} h from "
        f"t={tr.start_s:.0f} s, mean idle {tr.mean_idle_nodes():.1f} nodes; "
        f"{sum(j.submit_s < tr.end_s for j in specs)} jobs"
    )
    results = []
    with Progress(
        TextColumn("{task.description:>14}"), BarColumn(), TextColumn("{task.percentage:>3.0f}%"),
        TimeElapsedColumn(), console=console, transient=json_out,
    ) as bar:
        for name in names:
            task = bar.add_task(name, total=1.0)
            try:
                res = run_sim(
                    tr, specs, policy=name, options=opts, history=full,
                    progress=lambda f, task=task: bar.update(task, completed=f),
                )
            except MalleparslError as exc:
                console.print(f"[red]error:[/red] {name}: {exc}")
                raise typer.Exit(2) from None
            results.append(res)
    rows = compare(results)
    if json_out:
        for row in rows:
            sys.stdout.write(json.dumps(row) + "\n")
    else:
        console.print(rich_table(rows, title=f"{tr.name} {nodes}, {tr.duration_s / 3600:.0f} h"))
    if out is not None:
        files = write_report(tr, results, rows, out)
        console.print(f"wrote {len(files)} files to {out}")
