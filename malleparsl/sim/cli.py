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
import math
import sys
from pathlib import Path

import typer

log = logging.getLogger(__name__)


def _fail(msg: str) -> None:
    """One ``error: ...`` line on stderr and exit status 2 (as malleparsl.cli does)."""
    print("error: " + " ".join(msg.split()), file=sys.stderr, flush=True)
    raise typer.Exit(2)


def _check_out(out: Path) -> None:
    from malleparsl.report import check_out_folder

    check_out_folder(out)


def _check_inputs(  # noqa: PLR0913 - one check per option
    *, hours: float, start_h: float | None, limit_jobs: int | None, max_active: int,
    tfwd: float, noise: float, reveal_ends: float, horizon_quantile: float | None,
    machine_nodes: int | None, names: list[str], jobs: str, out: Path | None,
) -> None:
    """Every ``simulate`` option checked before any trace is read (exit 2, one line)."""
    from malleparsl.errors import SpecError

    def need(ok: bool, flag: str, value: object, rule: str) -> None:
        if not ok:
            raise SpecError(f"{flag} {value!r}: {rule}")

    need(math.isfinite(hours) and hours >= 0, "--hours", hours,
         "must be a finite number of hours >= 0 (0 = to the trace's end)")
    if start_h is not None:
        need(math.isfinite(start_h) and start_h >= 0, "--start-h", start_h,
             "must be a finite number of hours >= 0 since the trace start")
    if limit_jobs is not None:
        need(limit_jobs >= 1, "--limit-jobs", limit_jobs, "must be >= 1 (omit it for all jobs)")
    need(max_active >= 0, "--max-active", max_active, "must be >= 0 (0 = no cap)")
    need(math.isfinite(tfwd) and tfwd > 0, "--tfwd", tfwd, "must be a finite number of seconds > 0")
    need(math.isfinite(noise) and noise >= 0, "--noise", noise, "must be a finite fraction >= 0")
    need(0 <= reveal_ends <= 1, "--reveal-ends", reveal_ends, "must be a fraction in [0, 1]")
    if horizon_quantile is not None:
        need(0 < horizon_quantile < 1, "--horizon-quantile", horizon_quantile,
             "must be a quantile in (0, 1)")
    if machine_nodes is not None:
        need(machine_nodes >= 1, "--machine-nodes", machine_nodes, "must be >= 1")
    need(bool(names), "--policy", ",".join(names),
         "names no policy; give one or more comma-separated policy names")
    if jobs.startswith("poisson:"):
        from malleparsl.sim.windows import poisson_fields

        poisson_fields(jobs)
    if out is not None:
        _check_out(out)


def simulate(
    trace: str = typer.Option("summit", help="Trace: 'summit', 'theta', a fragment CSV, or an SWF job log."),
    jobs: str = typer.Option(
        "imagenet", help="Job set: imagenet, shufflenet-10, shufflenet-1000, a CSV, or poisson:N."
    ),
    nodes: str = typer.Option("0:128", help="Node slice START:END of the trace's node list "
                              "(N alone: the first N)."),
    hours: float = typer.Option(24.0, help="Window length in hours (0 = to the trace's end)."),
    start_h: float | None = typer.Option(
        None, help="Window start, hours since the trace start (default: first job submission)."
    ),
    policy: str = typer.Option(
        "milp,hold,equal-share,upper-bound", help="Comma-separated policies (setups) to compare."
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
    warmup_h: float | None = typer.Option(
        None,
        help="SWF logs: hours skipped at the log's start while the replay fills the machine "
        "(default: until utilisation first reaches its steady level; 0 = skip nothing).",
    ),
    semantics: str = typer.Option(
        "default", help="Accounting: 'default' (ours) or 'bftrainer' (the original replayer's)."
    ),
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object per policy."),
    out: Path | None = typer.Option(  # noqa: B008 - typer's way
        None, help="Write logs (CSV), summary.json/.md and PNG plots here."
    ),
) -> None:
    """Replay an idle-node trace with a job set under each policy and compare the results."""
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from malleparsl.errors import MalleparslError, SpecError
    from malleparsl.report import rich_table, write_report
    from malleparsl.sim.engine import SimOptions
    from malleparsl.sim.engine import simulate as run_sim
    from malleparsl.sim.result import compare
    from malleparsl.sim.setups import setup_names
    from malleparsl.sim.windows import select_case
    from malleparsl.traces import load_trace

    console = Console(stderr=json_out)
    if not console.is_terminal:
        console = Console(stderr=json_out, width=180)  # the whole comparison table, uncut
    names = [p.strip() for p in policy.split(",") if p.strip()]
    _check_inputs(
        hours=hours, start_h=start_h, limit_jobs=limit_jobs, max_active=max_active, tfwd=tfwd,
        noise=noise, reveal_ends=reveal_ends, horizon_quantile=horizon_quantile,
        machine_nodes=machine_nodes, names=names,
        jobs=jobs, out=out,
    )
    if bound:
        names += [b for b in ("upper-bound-capped", "upper-bound") if b not in names]
    valid = setup_names()
    bad = [n for n in names if n not in valid]
    if bad:
        raise SpecError(f"--policy: unknown policy {bad}; valid policies are: {', '.join(valid)}")
    try:
        full = load_trace(trace, nodes=nodes, machine_nodes=machine_nodes)
        case = select_case(
            full, trace, jobs, hours=hours, start_h=start_h, warmup_h=warmup_h,
            limit=limit_jobs, seed=seed,
        )
        tr, specs, warm = case.window, case.specs, case.warmup_s
        opts = SimOptions(
            max_active=max_active or None, tfwd_s=tfwd, noise=noise, reveal_ends=reveal_ends,
            seed=seed, horizon_quantile=horizon_quantile, semantics=semantics,
        )
    except (MalleparslError, ValueError, FileNotFoundError) as exc:
        _fail(str(exc))
    if warm > 0:
        console.print(
            f"skipped the first {warm / 3600:.1f} h of the log (warm-up: the replay filling an "
            "empty machine); --warmup-h overrides"
        )
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
                _fail(f"{name}: {exc}")
            res.extra["warmup_h"] = round(warm / 3600, 3)
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
