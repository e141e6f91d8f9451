"""``malleparsl bench jpa``: how close the JPA gets to perfect knowledge, and at what cost.

Runs the simulator on an idle-node trace with every job's curve hidden (``milp+jpa``), against
the MILP given the true curves (the oracle), the MILP assuming linear scaling from a one-node
measurement, and equal share, and prints per setup: samples trained and their share of the
oracle's, profiling node-seconds as a share of all node-seconds used, the curve error
(mean absolute percentage error of the JPA's mean curve at the sizes jobs ran, both at the end
and at decision time weighted by node-seconds), and the decision efficiency of the JPA's
decisions (:mod:`~malleparsl.jpa.audit`).

``--jobs shapes:N`` generates ``N`` jobs whose curves are none of the shipped ones (Amdahl with
p in [0.5, 0.999], saturating, a drop at two nodes, falling past a peak), each with its own
model name so no job inherits another's prior.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Sequence

import numpy as np
import typer

from malleparsl.model import JobSpec, ScalingCurve

SHAPES = ("amdahl", "saturating", "two-node-drop", "peaked")


def shaped_curve(rng: np.random.Generator, shape: str, max_nodes: int, name: str) -> ScalingCurve:
    """A random curve of one of :data:`SHAPES` (parameters over wide ranges, not fitted to data)."""
    n = np.arange(1, max_nodes + 1, dtype=float)
    r1 = float(rng.uniform(300, 8000))
    a = 1 / r1
    if shape == "amdahl":
        p = float(rng.uniform(0.5, 0.999))
        t = a * ((1 - p) + p / n)
    elif shape == "saturating":
        half = float(rng.uniform(2, 64))  # rate = R n / (n + half)
        t = a * (half + n) / (n * (1 + half))
    elif shape == "two-node-drop":
        drop = float(rng.uniform(0.3, 0.7))  # rate(2) = 2 (1 - drop) rate(1), then a plateau
        t = a / n + a / 2 * drop / (1 - drop) * (n >= 2)
    elif shape == "peaked":
        peak = float(rng.uniform(3, 24))
        t = a / n + a / peak**2 * (n - 1)
    else:
        raise ValueError(f"unknown shape {shape!r}; valid shapes are {', '.join(SHAPES)}")
    return ScalingCurve(tuple(int(k) for k in n), tuple(float(v) for v in 1 / t), name=name)


def shaped_jobs(
    *, n_jobs: int, start_s: float, seed: int = 0, max_nodes: int = 64,
    mean_interarrival_s: float = 600.0,
) -> list[JobSpec]:
    """Poisson arrivals of jobs with :func:`shaped_curve` curves, ~2-20 h of work at one node."""
    rng = np.random.default_rng(seed)
    t = start_s + np.cumsum(rng.exponential(mean_interarrival_s, n_jobs))
    jobs = []
    for i in range(n_jobs):
        shape = SHAPES[i % len(SHAPES)]
        curve = shaped_curve(rng, shape, max_nodes, name=f"{shape}-{i}")
        jobs.append(JobSpec(
            job_id=f"S{i:04d}-{shape}", min_nodes=1, max_nodes=max_nodes,
            rescale_up_s=float(rng.uniform(10, 30)), rescale_down_s=float(rng.uniform(5, 15)),
            total_samples=curve.rate(1) * 3600 * float(rng.uniform(2, 20)),
            submit_s=float(t[i]), curve=curve, model=f"{shape}-{i}",
        ))
    return jobs


def curve_errors(advisor: object, truth: dict[str, ScalingCurve]) -> tuple[float, float]:
    """(final MAPE at the sizes each job ran, decision-time MAPE weighted by node-seconds)."""
    finals: list[float] = []
    items = [(j, f["estimate"], f["ran_ns"]) for j, f in advisor.finished.items()]  # type: ignore[attr-defined]
    for j, rec in advisor.records.items():  # type: ignore[attr-defined]
        items.append((j, rec.estimate(max(rec.spec.max_nodes, 1), default_noise=0.05), rec.ran_ns))
    for j, est, ran in items:
        if est is None or j not in truth:
            continue
        for k in ran:
            if 0 < k <= est.n_max and truth[j].rate(k) > 0:
                finals.append(abs(est.rate(k) / truth[j].rate(k) - 1))
    w_sum = e_sum = 0.0
    for (j, k), (w, wp) in advisor.decisions.items():  # type: ignore[attr-defined]
        if j in truth and w > 0 and truth[j].rate(k) > 0:
            w_sum += w
            e_sum += w * abs(wp / w / truth[j].rate(k) - 1)
    return (float(np.mean(finals)) if finals else math.nan,
            e_sum / w_sum if w_sum else math.nan)


def run_comparison(
    trace: object, jobs: Sequence[JobSpec], *, setups: Sequence[str], noise: float = 0.03,
    seed: int = 0, advisor_options: dict | None = None,
) -> list[dict]:
    """Simulate each setup on ``trace``; one row of figures per setup (oracle = ``milp``).

    JPA setups are audited (:mod:`~malleparsl.jpa.audit`): every decision scored by the true
    curves against the best one for the same state (``decision_eff`` and its loss split).
    ``advisor_options`` go to their advisor (to compare variants). A setup ``NAME:KEY=VALUE``
    adds its own options (``milp-perturbed:error=0.01``); its row keeps that label."""
    from malleparsl.jpa.advisor import JobProfilingAdvisor
    from malleparsl.jpa.audit import DecisionAudit
    from malleparsl.jpa.sim_setups import SIM_DEFAULTS
    from malleparsl.sim.bench_decisions import parse_entry
    from malleparsl.sim.engine import SimOptions, simulate

    truth = {j.job_id: j.curve for j in jobs if j.curve is not None}
    rows = []
    for label in setups:
        name, opts = parse_entry(label)
        adv = audit = None
        if name.startswith("milp+jpa"):
            kw = {**SIM_DEFAULTS, **(advisor_options or {}), **opts}
            adv = JobProfilingAdvisor(share_priors=not name.endswith("nopriors"), **kw)  # type: ignore[arg-type]
            audit = DecisionAudit({j.job_id: j for j in jobs})
            opts = {"advisor": adv, "audit": audit}
        elif name == "milp-linear":
            opts = {"noise": noise, "seed": seed, **opts}
        elif name == "milp-perturbed":
            opts = {"seed": seed, **opts}
        t0 = time.perf_counter()
        res = simulate(trace, jobs, policy=name, options=SimOptions(noise=noise, seed=seed),  # type: ignore[arg-type]
                       policy_options=opts)
        row = {"setup": label, "samples": res.samples, "progress": res.progress,
               "jobs_done": res.jobs_done,
               "rescales": res.rescales, "used_node_s": res.used_node_s,
               "wall_s": time.perf_counter() - t0}
        if adv is not None:
            final, decision = curve_errors(adv, truth)  # type: ignore[arg-type]
            row |= {"profiling_share": adv.probe_ns / res.used_node_s if res.used_node_s else 0.0,
                    "mape_final": final, "mape_decision": decision}
        if audit is not None:
            row |= audit.summary(res.end_s)
        rows.append(row)
    oracle = next((r for r in rows if r["setup"] == "milp"), None)
    for r in rows:
        r["pct_of_oracle"] = (100 * r["samples"] / oracle["samples"]
                             if oracle and oracle["samples"] else math.nan)
        r["pct_progress"] = (100 * r["progress"] / oracle["progress"]
                             if oracle and oracle["progress"] else math.nan)
    return rows


def _check_bench_args(*, jobs: str, nodes: str, hours: float, setups: str, noise: float) -> None:
    """Every ``bench jpa`` option checked before any simulation (exit 2, one line)."""
    from malleparsl.errors import SpecError, unknown_name
    from malleparsl.sim.bench_decisions import parse_entry
    from malleparsl.sim.setups import make_setup, setup_names
    from malleparsl.traces import parse_node_slice

    if not (math.isfinite(hours) and hours > 0):
        raise SpecError(f"--hours {hours!r}: must be a finite number of hours > 0")
    if not (math.isfinite(noise) and noise >= 0):
        raise SpecError(f"--noise {noise!r}: must be a finite fraction >= 0")
    slices = [s for s in nodes.split(",") if s.strip()]
    if not slices:
        raise SpecError(f"--nodes {nodes!r}: give one or more node slices such as 0:128")
    for sl in slices:
        parse_node_slice(sl)
    names = [s for s in setups.split(",") if s.strip()]
    if not names:
        raise SpecError(f"--setups {setups!r}: give one or more comma-separated setup names")
    valid = setup_names()
    for label in names:
        if any(not pair.partition("=")[0].strip() or "=" not in pair
               for pair in label.split(":")[1:]):
            raise SpecError(f"--setups {label!r}: write NAME or NAME:KEY=VALUE, "
                            "e.g. milp-perturbed:error=0.01")
        name, own = parse_entry(label)
        if name not in valid:
            raise unknown_name("setup", name, valid)
        if own:  # options checked by building the setup once, before any simulation
            try:
                make_setup(name, **own)
            except TypeError as exc:
                raise SpecError(f"--setups {label!r}: {name} takes no such option ({exc})") from None
    if jobs.startswith("shapes:"):
        n = jobs.split(":", 1)[1]
        if not n.isdigit() or int(n) < 1:
            raise SpecError(f"--jobs {jobs!r}: write shapes:N with a whole N >= 1")


def bench_jpa(
    trace: str = typer.Option("summit", help="Idle-node trace: 'summit' or a fragments CSV."),
    jobs: str = typer.Option(
        "imagenet", help="Job set name/path, 'shapes:N' (generated), or the curve zoo: 'zoo' "
        "(every family), 'zoo:FAMILY,...', 'zoo:held-out', 'zoo:tuned'."),
    nodes: str = typer.Option("0:128,0:512", help="Comma-separated node slices."),
    hours: float = typer.Option(24.0, help="Window length from the first submission."),
    setups: str = typer.Option("milp,milp+jpa,milp+jpa-nopriors,milp-linear,equal-share",
                               help="Comma-separated simulator setups; NAME:KEY=VALUE adds "
                               "options, e.g. 'milp-perturbed:error=0.01' (the MILP with every "
                               "true curve known to 1 %: what the figures resolve)."),
    noise: float = typer.Option(0.03, help="Relative noise of measured rates."),
    seed: int = typer.Option(
        0, help="Random seed of the measurement noise and of 'shapes:N' jobs' arrivals."),
    seeds: str = typer.Option("", help="Zoo only: seeds as '0-3', '0,2' or '0-3,24-27' (default: --seed)."),
    as_json: bool = typer.Option(False, "--json", help="One JSON object per row."),
) -> None:
    """Print samples trained vs the oracle, profiling share and curve MAPE per setup."""
    _check_bench_args(jobs=jobs, nodes=nodes, hours=hours, setups=setups, noise=noise)
    from malleparsl.data import load_jobset
    from malleparsl.sim.windows import replay_window
    from malleparsl.traces import load_trace

    if jobs == "zoo" or jobs.startswith("zoo:"):
        _bench_zoo(trace, jobs, nodes, hours, setups, noise, seeds or str(seed), as_json)
        return

    for sl in nodes.split(","):
        full = load_trace(trace, nodes=sl)
        if jobs.startswith("shapes:"):
            specs = shaped_jobs(n_jobs=int(jobs.split(":")[1]), start_s=full.start_s, seed=seed)
        else:
            specs = load_jobset(jobs)
        tr = replay_window(full, hours, specs=specs)
        rows = run_comparison(tr, specs, setups=setups.split(","), noise=noise, seed=seed)
        for r in rows:
            r |= {"nodes": sl, "hours": hours, "jobs": jobs}
            if as_json:
                typer.echo(json.dumps(_clean(r)))
        if not as_json:
            typer.echo(f"\n{trace} nodes {sl}, {hours:g} h, jobs {jobs}, noise {noise:.0%}, "
                       f"mean idle {tr.mean_idle_nodes():.1f} nodes")
            width = max(20, *(len(r["setup"]) + 1 for r in rows))
            typer.echo(f"{'setup':<{width}}{'samples':>12}{'% oracle':>10}{'% progress':>11}{'done':>6}"
                       f"{'rescales':>9}{'profiling':>11}{'MAPE end':>10}{'MAPE dec':>10}"
                       f"{'dec eff':>9}{'wall s':>8}")
            for r in rows:
                extra = (f"{r['profiling_share']:>10.2%} {r['mape_final']:>9.1%} "
                         f"{r['mape_decision']:>9.1%} {r['decision_eff']:>7.1f}%"
                         if "profiling_share" in r else f"{'':>40}")
                typer.echo(f"{r['setup']:<{width}}{r['samples']:>12.4g}{r['pct_of_oracle']:>9.1f}%"
                           f"{r['pct_progress']:>10.1f}%{r['jobs_done']:>6}{r['rescales']:>9} {extra}"
                           f"{r['wall_s']:>8.1f}")


def _bench_zoo(trace: str, jobs: str, nodes: str, hours: float, setups: str, noise: float,
               seeds: str, as_json: bool) -> None:
    from malleparsl.jpa.bench_zoo import (
        format_table,
        parse_families,
        parse_seeds,
        summarise,
        zoo_rows,
    )

    def emit(r: dict) -> None:
        if as_json:
            typer.echo(json.dumps(_clean(r)))

    names = setups.split(",")
    rows = zoo_rows(trace=trace, families=parse_families(jobs), slices=nodes.split(","),
                    seeds=parse_seeds(seeds), hours=hours, setups=names, noise=noise, emit=emit)
    summary = summarise(rows)
    if as_json:
        for r in summary:
            typer.echo(json.dumps(_clean(r)))
    else:
        typer.echo(format_table(summary, names))


def _clean(r: dict) -> dict:
    """Strict JSON: NaN and infinities become null."""
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in r.items()}
