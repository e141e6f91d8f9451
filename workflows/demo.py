"""``malleparsl demo``: the whole system at work on one machine.

Emulated nodes join and leave as a time-compressed slice of the Summit idle-node trace says;
a hyperparameter sweep (ASHA) — or, with ``--nas``, an architecture search (regularised
evolution) — trains real models on scikit-learn's digits as malleable jobs through the
MalleableExecutor, which the allocator and the Job Profiling Advisor resize at every event.
Digits trains in a fraction of a second, so each training step also pays ``step_delay_s`` of
an emulated bigger model (a sleep per local sample: a job on n nodes pays 1/n of it); trials
then last seconds, long enough to publish progress and be grown or shrunk from a checkpoint.
A second stage retrains the best configurations of the first. Live progress shows the nodes
and the trials; the report folder gets ``report.html`` with plots, ``summary.json``,
``trials.csv`` and ``best.json``.

Heavy imports (parsl, torch) happen inside the functions, so ``malleparsl --help`` stays fast.
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import typer

from malleparsl.errors import SpecError
from malleparsl.extras import require

log = logging.getLogger(__name__)

STEP_DELAY_S = 0.05  # the demo's emulated model: trials train for seconds, not a fraction of one
PILOT_START_S = 12.0  # wall seconds an emulated node takes to start (torch warmed), measured


@dataclass(frozen=True)
class DemoSettings:
    """Everything a demo run depends on (the CLI's options, as values a test can build)."""

    out: str = "report"
    quick: bool = False
    nas: bool = False
    nodes: int = 0  # 0: 3 with quick, else 5
    trials: int | None = None
    max_nodes: int = 3
    speed: float = 30.0
    policy: str = "milp"
    jpa: bool = True
    plain: bool = False
    monitoring: bool = False
    seed: int = 0
    timeout_s: float = 600.0
    final_top_k: int = 2
    # seconds one node spends on a training step on top of the real work (n nodes: 1/n of it),
    # an emulated bigger model: digits trains in well under a second, too fast to resize
    step_delay_s: float = STEP_DELAY_S
    pack: bool = True  # fuse compatible trials into arrays (HFTA); False: one job per trial
    array_size: int = 0  # trials per array; 0: chosen from measured throughput ("auto")

    def __post_init__(self) -> None:
        if self.nodes == 0:
            object.__setattr__(self, "nodes", 3 if self.quick else 5)
        if self.nodes < 1 or self.max_nodes < 1:
            raise SpecError(f"nodes ({self.nodes}) and max_nodes ({self.max_nodes}) must be >= 1")
        if self.trials is not None and self.trials < 2:
            raise SpecError(f"trials must be >= 2 for a search with a second stage, got {self.trials}")
        if not 0 <= self.step_delay_s < float("inf"):
            raise SpecError(f"step delay must be >= 0 seconds, got {self.step_delay_s}")
        if not 0 < self.speed < float("inf"):
            raise SpecError(f"speed must be > 0 trace seconds per wall second, got {self.speed}")
        from malleparsl.allocator.base import policy_names  # checked before the trace loads
        from malleparsl.errors import unknown_name

        if self.policy not in policy_names():
            raise unknown_name("policy", self.policy, policy_names())

    @property
    def n_trials(self) -> int:
        if self.trials is not None:
            return self.trials
        return (6 if self.quick else 12) if not self.nas else (6 if self.quick else 14)

    @property
    def expected_wall_s(self) -> float:
        """Rough length of the run: the trace window replayed spans this much wall time."""
        return 75.0 if self.quick else 200.0


def build_workflow(s: DemoSettings) -> tuple[Any, Any, float]:
    """The demo's DAG: a search stage, then the best ``final_top_k`` retrained at full budget."""
    from .dag import FixedTrials, TrialStage, Workflow, top_k
    from .digits import default_budget, default_space
    from .hpo import ASHA
    from .nas import ArchSpace, RegularizedEvolution

    wf = Workflow(metric="accuracy", mode="max")
    conc = max(2, (s.nodes + 1) // 2)  # leave room for trials to grow
    if s.pack and not s.plain:  # arrays hold many trials: hand out every suggestion at once
        conc = max(conc, s.n_trials)
    if s.nas:
        full = 12.0 if s.quick else 20.0
        pop = max(2, min(6, s.n_trials // 2))
        wf.add(TrialStage("evolve", lambda _: RegularizedEvolution(
            space=ArchSpace(widths=(32, 64, 128), channels=(8, 16)), n_trials=s.n_trials,
            population_size=pop, sample_size=max(1, pop // 2), budget=full / 2,
            base={"lr": 3e-3, "batch_size": 64}, seed=s.seed), max_concurrent=conc))
        first = "evolve"
    else:
        budget = default_budget(quick=s.quick)
        full = budget.max_budget
        space = default_space()
        wf.add(TrialStage("search", lambda _: ASHA(space=space, n_trials=s.n_trials,
                                                   budget=budget, seed=s.seed),
                          max_concurrent=conc))
        first = "search"
    wf.add(TrialStage("final", lambda inp: FixedTrials(
        configs=[{**r.config, "seed": 1} for r in inp[first]], budget=full * 1.5, prefix="f"),
        max_concurrent=conc), after=[first], select=top_k(s.final_top_k))
    return wf, first, full


def _policy(s: DemoSettings) -> tuple[Any, Any]:
    if not s.jpa:
        return s.policy, None
    from malleparsl.jpa import JobProfilingAdvisor, ProbeFirst

    # The replay runs trace time ``speed`` times faster, and the demo's trials are that much
    # shorter than real ones: the JPA's wall-time thresholds (built for hour-long jobs) scale
    # with them. Unscaled, every demo job is "nearly done" (under 300 s left), so the JPA never
    # measures a second size and each job stays at the size it was probed at while nodes idle.
    d = JobProfilingAdvisor.__init__.__kwdefaults__
    jpa = JobProfilingAdvisor(explore_min_s=d["explore_min_s"] / s.speed,
                              probe_timeout_s=d["probe_timeout_s"] / s.speed)
    return ProbeFirst(advisor=jpa, inner=s.policy), jpa


def make_source(s: DemoSettings) -> tuple[Any, dict[str, Any]]:
    """The Summit slice (``nodes`` nodes, a window of churn) replayed at ``speed``."""
    from malleparsl.traces import load_trace

    from .replay import demo_source, pick_slice

    window = s.speed * s.expected_wall_s
    trace = load_trace("summit")
    # nodes arriving or leaving once pilots are up (and trials train) count most: that is
    # when jobs grow and shrink
    sl = pick_slice(trace, nodes=s.nodes, window_s=window, speed=s.speed, seed=s.seed,
                    warmup_s=PILOT_START_S, churn_weight=0.25)
    src = demo_source(sl, speed=s.speed)
    frags = src.trace.fragments
    info = {"trace": "summit", "nodes": list(sl.nodes), "window_start_s": sl.start_s,
            "window_s": window, "speed": s.speed, "fragments": len(frags),
            "mean_idle_nodes": round(float((frags["end_s"] - frags["start_s"]).sum())
                                     / s.expected_wall_s, 2)}
    return src, info


def run_demo(s: DemoSettings, *, node_source: Any = None, console: Any = None,
             t_start: float | None = None) -> dict[str, Any]:
    """Run the demo; returns the summary (also written to ``<out>/summary.json``).

    ``wall_s`` counts from ``t_start`` (default: now) to the report written.
    """
    require("torch", "sklearn", feature="the demo")
    import parsl

    from malleparsl.site_configs.local import local_config

    from .apprunner import AppTrialRunner
    from .digits import (
        build_digits,
        default_budget,
        global_batch_of,
        load_split,
        steps_of,
        train_digits,
        train_digits_array,
    )
    from .packing import PackedTrialRunner
    from .progress import ProgressView
    from .report_html import write_plots, write_summary
    from .timeline import Recorder

    t_start = time.time() if t_start is None else t_start
    out = Path(s.out).resolve()
    for stale in ("ckpt", "runinfo"):
        shutil.rmtree(out / stale, ignore_errors=True)
    out.mkdir(parents=True, exist_ok=True)
    bin_dir = os.path.dirname(sys.executable)  # Parsl starts its interchange from PATH
    if bin_dir not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = bin_dir + os.pathsep + os.environ.get("PATH", "")
    trace_info: dict[str, Any] = {"trace": "given node source"}
    if node_source is None:
        node_source, trace_info = make_source(s)
    if console is not None:
        from .report_page import fmt

        console.print("[bold]idle nodes[/bold]: " + "; ".join(
            f"{k.replace('_', ' ')} {fmt(v)}" for k, v in trace_info.items()), highlight=False)
    policy, advisor = _policy(s)
    config = local_config(nodes=0, run_dir=str(out / "runinfo"), node_source=node_source,
                          ckpt_root=str(out / "ckpt"), policy=policy, advisor=advisor,
                          max_active=max(2, s.nodes), poll_period_s=0.25,
                          warm_modules=("torch",))
    if s.monitoring:
        from parsl.monitoring import MonitoringHub

        # HTEX sends workers' monitoring messages through its interchange: nothing else listens
        config.monitoring = MonitoringHub(workflow_name="malleparsl-demo",
                                          logging_endpoint=f"sqlite:///{out / 'monitoring.db'}",
                                          resource_monitoring_interval=2)
    wf, first, full = build_workflow(s)
    n_train = len(load_split()[0])
    mode = "plain (1 node per trial, no resizing)" if s.plain else "malleable"
    packed = s.pack and not s.plain
    if packed:
        mode += ", trials packed into fused arrays"
    dfk = parsl.load(config)
    try:
        ex = dfk.executors["malleable"]
        rec = Recorder(executor=ex, period_s=0.5).start()
        common = dict(train_fn=train_digits, budget_unit="epochs", min_nodes=1,
                      max_nodes=s.max_nodes, ckpt_root=out / "ckpt",
                      samples_per_unit=n_train, malleable=not s.plain,
                      global_batch_of=global_batch_of,  # each trial capped at its batch
                      options={"torch_threads": 1, "ckpt_interval_s": 5,
                               "progress_interval_s": 0.5, "pg_timeout_s": 60,
                               "step_delay_s": s.step_delay_s})
        if packed:
            rungs = None if s.nas else default_budget(quick=s.quick).rungs
            runner = PackedTrialRunner(array_fn=train_digits_array, steps_of=steps_of,
                                       rungs=rungs, pack=s.array_size or "auto",
                                       build=build_digits, **common)
        else:
            runner = AppTrialRunner(**common)
        title = f"malleparsl demo: {'NAS' if s.nas else 'HPO'} on digits, {mode}"
        with ProgressView(recorder=rec, runner=runner, n_trials=s.n_trials + s.final_top_k,
                          title=title, console=console):
            result = wf.run(runner, timeout_s=s.timeout_s, raise_on_failure=False)
            if packed and not runner.drain(timeout_s=30.0):
                log.warning("an array job was still running 30 s after its trials' results")
        rec.stop()
        rescales = rec.rescale_count()
        resized = rec.resized_jobs()
        with_progress = len({j for smp in rec.samples for j in smp.rates})
        plans = rec.plan_changes()
        idle_ns, used_ns = rec.node_seconds()
    finally:
        dfk.cleanup()
        parsl.clear()
    table = result.table
    best = table.best()
    lost = [(e.stage, e.trial_id, e.rung) for e in runner.events if e.kind == "submitted"
            and not any(f.kind != "submitted" and (f.stage, f.trial_id, f.rung)
                        == (e.stage, e.trial_id, e.rung) for f in runner.events)]
    summary: dict[str, Any] = {
        "workflow": "nas" if s.nas else "hpo",
        "mode": mode,
        "trials": len({(r.stage, r.trial_id) for r in table.rows}),
        "runs": len(table.rows),
        "failed_runs": len(table.failed()),
        "lost_runs": len(lost),
        "best_accuracy": None if best is None else best.metrics.get("accuracy"),
        "best_config": None if best is None else {k: v for k, v in best.config.items()},
        "best_trial": None if best is None else f"{best.stage}/{best.trial_id}",
        "best_checkpoint": None if best is None else best.checkpoint,
        "rescales": sum(rescales.values()),
        "rescales_by_kind": rescales,
        "jobs_resized": len(resized),  # jobs grown or shrunk from a checkpoint while training
        **({"job_sizes": resized} if resized else {}),  # the sizes each of them ran at
        "jobs_with_progress": with_progress,  # jobs whose rank 0 published a progress record
        **({"plans": plans} if plans else {}),  # which execution plan ran when (issue 17)
        "node_seconds_idle": round(idle_ns, 1),  # what the idle nodes offered
        "node_seconds_used": round(used_ns, 1),  # of those, the ones running training
        "utilisation": round(used_ns / idle_ns, 3) if idle_ns else None,
        "workflow_wall_s": round(result.wall_s, 1),
        "wall_s": None,
        "stages_failed": sorted(result.failed),
        "policy": s.policy + (" + JPA" if s.jpa else ""),
        "settings": asdict(s),
        "trace_slice": trace_info,
        "monitoring_db": str(out / "monitoring.db") if s.monitoring else None,
    }
    if packed:
        runner.close()
        pk = runner.packing_summary()
        summary["packing"] = pk
        summary["arrays"] = pk["arrays"]
        summary["array_speedup_measured"] = max((m["speedup"] for m in pk["measured"]), default=None)
    write_plots(out, samples=rec.samples, table=table, events=runner.events,
                arrays=runner.arrays if packed else ())
    summary["wall_s"] = round(time.time() - t_start, 1)  # everything but this last write
    write_summary(out, table=table, summary=summary, title=title)
    return summary


def _check_out(out: Path) -> None:
    from malleparsl.report import check_out_folder

    check_out_folder(out)


def demo(
    quick: bool = typer.Option(False, "--quick", help="A smaller sweep: 3 nodes, 6 trials, two rungs."),
    nas: bool = typer.Option(False, "--nas", help="Architecture search instead of HPO."),
    out: Path = typer.Option("report", "--out", help="Report folder."),  # noqa: B008
    nodes: int = typer.Option(0, "--nodes", help="Summit nodes replayed as emulated nodes "
                              "(0: 3 with --quick, else 5)."),
    trials: int = typer.Option(0, "--trials", help="Trials in the search (0: 6 quick, 12 full)."),
    max_nodes: int = typer.Option(3, "--max-nodes", help="Largest size of one trial."),
    speed: float = typer.Option(30.0, "--speed", help="Trace seconds per wall second."),
    policy: str = typer.Option("milp", "--policy", help="Allocation policy name."),
    jpa: bool = typer.Option(True, "--jpa/--no-jpa", help="Learn curves with the JPA."),
    plain: bool = typer.Option(False, "--plain", help="One node per trial, no resizing."),
    pack: bool = typer.Option(True, "--pack/--no-pack", help="Fuse compatible trials into "
                              "arrays (one job trains many; --no-pack: one job per trial)."),
    monitoring: bool = typer.Option(False, "--monitoring", help="Write Parsl's monitoring DB."),
    seed: int = typer.Option(0, "--seed", help="Seeds the trace window and the search."),
    step_delay: float = typer.Option(STEP_DELAY_S, "--step-delay", help="Seconds one node "
                                     "adds to each training step, emulating a bigger model "
                                     "(n nodes: 1/n of it; 0: digits alone, trials end in "
                                     "under a second, too soon to resize)."),
) -> None:
    """Run an HPO (or NAS) sweep on emulated nodes that replay the Summit idle-node trace."""
    t_start = time.time()
    from rich.console import Console

    console = Console()
    require("torch", "sklearn", feature="the demo")  # before --out is made: a missing extra
    _check_out(out)  # leaves nothing behind
    s = DemoSettings(out=str(out), quick=quick, nas=nas, nodes=nodes, trials=trials or None,
                     max_nodes=max_nodes, speed=speed, policy=policy, jpa=jpa, plain=plain,
                     monitoring=monitoring, seed=seed, pack=pack, step_delay_s=step_delay)
    root = logging.getLogger()
    for h in root.handlers:  # parsl.load() sets its logger to DEBUG; keep it off the console
        if h.level == logging.NOTSET:
            h.setLevel(root.level or logging.WARNING)
    summary = run_demo(s, console=console, t_start=t_start)
    from .report_page import fmt

    console.print(f"[bold]best accuracy[/bold] {fmt(summary['best_accuracy'])}  "
                  f"config {fmt(summary['best_config'])}", highlight=False)
    console.print(f"trials {summary['trials']}  rescales {summary['rescales']}  node-s used "
                  f"{summary['node_seconds_used']} of {summary['node_seconds_idle']} idle  wall "
                  f"{summary['wall_s']} s  ({summary['mode']})")
    if summary.get("job_sizes"):
        console.print("resized while training: " + "; ".join(
            f"{j} {sz} nodes" for j, sz in summary["job_sizes"].items()), highlight=False)
    if summary.get("packing"):
        console.print(f"arrays {summary['arrays']} (sizes {summary['packing']['array_sizes']}), "
                      f"measured fused speed-up x{summary['array_speedup_measured']}")
    console.print(f"report: {Path(out).resolve() / 'report.html'}")
    if (summary["best_accuracy"] or 0.0) < 0.95:
        console.print("[yellow]the best trial stayed below 0.95 test accuracy; try more trials "
                      "(--trials) or another --seed[/yellow]")
    if summary["best_accuracy"] is None or summary["lost_runs"] or summary["stages_failed"]:
        raise typer.Exit(code=1)
