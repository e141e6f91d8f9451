"""``malleparsl bench decisions``: every policy on every case, one JSON line per (case, policy).

A case is a trace slice, a window, a job set, an accounting and a concurrency cap. Each line
gives samples, mean JCT, last finish, rescales, decision time (median, p95, max) and the
percentages of ``upper-bound-capped`` and ``upper-bound`` on the same case. ``--quick`` runs
small slices in seconds (the regression test uses it); the full mode runs the cases of
docs/allocator.md (hours on a shared 2-core machine: run it with ``nice``).

``held_out=False`` marks the cases the policies were tuned on (docs/allocator.md, item 2): the
24 h ImageNet windows of 0:64 and 0:128 (``hold``, 2026-11-23), of 0:128 and 0:512 and
``poisson`` seed 0 at 0:128 (``milp-horizon``'s options, sessions 6 and 7). Report them apart.
The other item-2 cases were not tuned on but have been run and decomposed many times (poisson
seeds 2 and 3 at 0:512 and both whole traces to explain misses); ``FRESH`` (``poisson`` seeds
4-7, 24 h, 0:128 and 0:512) were first run for the final candidate of session 7, ``FRESH2``
(seeds 8-11) for that of session 8.

One replay at 512 nodes moves by 1-3.7 % with tie-breaking alone (docs/allocator.md), so
``--ties K`` replays every policy that takes ``tie_seed`` K times (``None``, 1 .. K-1) and
reports each case's mean, min and max, the best mean of the five policies issue 14 names
(``best_of_five_mean``) and every policy's margin on means against it. A policy entry may
carry its own options, ``NAME:KEY=VALUE:KEY=VALUE`` (e.g. the item-2 candidate next to plain
``milp-horizon``); such an entry never counts among the five.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict, dataclass

import typer


@dataclass(frozen=True)
class Case:
    """One simulated setting."""

    name: str
    nodes: str
    hours: float  # 0: to the trace's end
    jobs: str = "imagenet"
    semantics: str = "default"
    max_active: int = 10  # 0: no cap (admission by the policy)
    seed: int = 0
    held_out: bool = True
    limit_jobs: int | None = None


QUICK = [
    Case("quick-imagenet-0:16-6h", "0:16", 6.0, held_out=False),
    Case("quick-imagenet-0:16-6h-bftrainer", "0:16", 6.0, semantics="bftrainer"),
    Case("quick-poisson-0:32-6h", "0:32", 6.0, jobs="poisson:30:600", seed=1),
]
FULL = [
    Case("imagenet-0:64-24h", "0:64", 24.0, held_out=False),
    Case("imagenet-0:128-24h", "0:128", 24.0, held_out=False),
    Case("imagenet-0:512-24h", "0:512", 24.0, held_out=False),
    Case("poisson-s0-0:128-24h", "0:128", 24.0, jobs="poisson:300:300", seed=0, held_out=False),
    *[
        Case(f"poisson-s{s}-0:128-24h", "0:128", 24.0, jobs="poisson:300:300", seed=s)
        for s in range(1, 4)
    ],
    *[
        Case(f"poisson-s{s}-0:512-24h", "0:512", 24.0, jobs="poisson:300:300", seed=s)
        for s in range(4)
    ],
    Case("imagenet-0:64-whole", "0:64", 0.0),
    Case("imagenet-0:128-whole", "0:128", 0.0),
    Case("imagenet-0:128-whole-nocap", "0:128", 0.0, max_active=0),
    Case("imagenet-0:64-whole-bftrainer", "0:64", 0.0, semantics="bftrainer"),
    Case("imagenet-0:128-whole-bftrainer", "0:128", 0.0, semantics="bftrainer"),
]
FRESH = [
    Case(f"poisson-s{s}-{nodes}-24h", nodes, 24.0, jobs="poisson:300:300", seed=s)
    for nodes in ("0:128", "0:512")
    for s in range(4, 8)
]
"""Held-out generated shapes never run before session 7's final item-2 candidate."""
FRESH2 = [
    Case(f"poisson-s{s}-{nodes}-24h", nodes, 24.0, jobs="poisson:300:300", seed=s)
    for nodes in ("0:128", "0:512")
    for s in range(8, 12)
]
"""Held-out generated shapes never run before session 8's final item-2 candidate."""
FULL += FRESH + FRESH2
POLICIES = "hold,equal-share,greedy,milp,milp-node,milp-horizon"
FIVE = ("equal-share", "greedy", "milp", "milp-node", "milp-horizon")
"""The baselines of issue 14, item 2 (plain entries only)."""


def parse_entry(entry: str) -> tuple[str, dict]:
    """``"milp-horizon:learn_hold=calibrate:costs=pause"`` -> the policy and its own options."""
    from malleparsl.sim.bench_worst import _policy_options

    name, *pairs = entry.split(":")
    return name.strip(), _policy_options(pairs)


def takes_ties(name: str, options: dict) -> bool:
    """Whether the policy ``name`` accepts a ``tie_seed`` (``hold`` and ``equal-share`` do not)."""
    from malleparsl.errors import SpecError
    from malleparsl.sim.setups import make_setup

    try:
        make_setup(name, **{**options, "tie_seed": 1})
    except (SpecError, TypeError):
        return False
    return True


def _margins(rows: list[dict]) -> None:
    """Add ``best_of_five_mean`` and each row's margin (%) on means against it, in place."""
    five = [r["samples_mean"] for r in rows if r["label"] in FIVE]
    best = max(five) if five else None
    for r in rows:
        r["best_of_five_mean"] = best
        r["margin_vs_best_of_five_mean_pct"] = (
            None if not best else round(100.0 * (r["samples_mean"] / best - 1.0), 3)
        )


def run_case(
    case: Case, policies: list[str], options: dict | None = None, ties: int = 1
) -> list[dict]:
    """Simulate ``case`` under each policy and both bounds; one row per policy.

    ``options`` go to every named policy (not to the bounds), as ``simulate``'s policy options;
    an entry ``NAME:KEY=VALUE`` adds its own (:func:`parse_entry`). With ``ties`` > 1 each
    policy that takes ``tie_seed`` is replayed with ``None``, 1 .. ``ties``-1; ``samples`` and
    the other figures stay the ``None`` replay's, ``samples_mean/min/max`` cover all.
    """
    from malleparsl.data import load_jobset
    from malleparsl.sim.engine import SimOptions, simulate
    from malleparsl.sim.result import compare
    from malleparsl.sim.windows import replay_window
    from malleparsl.sim.workloads import poisson_jobs
    from malleparsl.traces import load_trace

    full = load_trace("summit", nodes=case.nodes)
    t0: float | None = None  # a job log's replay opens at its first submission
    if case.jobs.startswith("poisson:"):
        _, n, mean = case.jobs.split(":")
        t0 = full.start_s + 20 * 3600  # the hour the ImageNet set arrives, for comparability
        specs = poisson_jobs(
            n_jobs=int(n), mean_interarrival_s=float(mean), seed=case.seed, start_s=t0
        )
    else:
        specs = load_jobset(case.jobs, limit=case.limit_jobs)
    tr = replay_window(full, case.hours, specs=specs, start_s=t0)
    opts = SimOptions(max_active=case.max_active or None, semantics=case.semantics, seed=case.seed)
    entries = [(label, *parse_entry(label)) for label in policies]
    merged = [{**(options or {}), **own} for _, _, own in entries]
    names = [name for _, name, _ in entries] + ["upper-bound-capped", "upper-bound"]
    results = [
        simulate(tr, specs, policy=p, options=opts, history=full,
                 policy_options=(merged[i] or None) if i < len(entries) else None)
        for i, p in enumerate(names)
    ]
    tie_samples: list[list[float]] = [[r.samples] for r in results[: len(entries)]]
    for i, (_, name, _) in enumerate(entries):
        if ties > 1 and takes_ties(name, merged[i]):
            for seed in range(1, ties):
                more = simulate(tr, specs, policy=name, options=opts, history=full,
                                policy_options={**merged[i], "tie_seed": seed})
                tie_samples[i].append(more.samples)
    rows = []
    for i, r in enumerate(compare(results)[: len(policies)]):
        got = tie_samples[i]
        rows.append(
            {
                "case": case.name,
                "held_out": case.held_out,
                "semantics": case.semantics,
                "max_active": case.max_active,
                "policy": r["policy"],
                "label": entries[i][0],
                "options": merged[i],
                "ties": len(got),
                "tie_samples": got,
                "samples_mean": sum(got) / len(got),
                "samples_min": min(got),
                "samples_max": max(got),
                "samples": r["samples"],
                "mean_jct_h": r["mean_jct_h"],
                "last_finish_h": r["last_finish_h"],
                "jobs_done": r["jobs_done"],
                "rescales": r["rescales"],
                "pct_of_capped_bound": r["pct_of_capped_bound"],
                "pct_of_upper_bound": r["pct_of_upper_bound"],
                "decision_median_ms": r["solver_median_ms"],
                "decision_p95_ms": r["solver_p95_ms"],
                "decision_max_ms": r["solver_max_ms"],
                "wall_s": r["wall_s"],
            }
        )
    _margins(rows)
    return rows


def bench_decisions(
    json_out: bool = typer.Option(False, "--json", help="One JSON line per case and policy."),
    quick: bool = typer.Option(False, "--quick", help="Small slices only (seconds)."),
    policy: str = typer.Option(POLICIES, help="Comma-separated policies."),
    cases: str = typer.Option("", help="Comma-separated case names (default: all of the mode)."),
    option: list[str] = typer.Option(  # noqa: B008 - typer's way to declare a repeated option
        [], "--option", help="KEY=VALUE option of the named policies (repeatable; e.g. "
        "--policy milp-horizon --option learn_hold=median)."
    ),
    ties: int = typer.Option(
        1, "--ties", min=1, help="Replays per policy with tie_seed None, 1 .. K-1 (policies "
        "that take it); report mean, min, max and margins on means."
    ),
) -> None:
    """Samples, mean JCT and decision times of each policy on each case, with both bounds."""
    from rich.console import Console
    from rich.table import Table

    from malleparsl.sim.bench_worst import _policy_options

    chosen = QUICK if quick else FULL
    if cases:
        want = {c.strip() for c in cases.split(",")}
        known = {c.name for c in QUICK + FULL}
        bad = sorted(want - known)
        if bad:
            raise typer.BadParameter(f"unknown case(s) {bad}; known: {', '.join(sorted(known))}")
        chosen = [c for c in QUICK + FULL if c.name in want]
    names = [p.strip() for p in policy.split(",") if p.strip()]
    options = _policy_options(option)
    if ties > 1 and "tie_seed" in options:
        raise typer.BadParameter("--ties sets tie_seed itself: drop --option tie_seed")
    for label in names:  # refuse a misfit option before hours of replays, naming the policy
        name, own = parse_entry(label)
        if not (options or own):
            continue
        from malleparsl.errors import SpecError
        from malleparsl.sim.setups import make_setup

        try:
            make_setup(name, **{**options, **own})
        except SpecError as exc:
            raise typer.BadParameter(f"--option for policy {name!r}: {exc}") from None
    table = Table(
        "case", "policy", "samples", "% capped", "% bound", "JCT h", "rescales",
        "ms med/p95/max", *(["mean (min-max)", "vs best 5 %"] if ties > 1 else []),
    )
    for case in chosen:
        for row in run_case(case, names, options, ties):
            if json_out:
                sys.stdout.write(json.dumps(row) + "\n")
                sys.stdout.flush()
            else:
                table.add_row(
                    case.name + ("" if case.held_out else " (tuning)"),
                    row["label"],
                    f"{row['samples']:.4g}",
                    f"{row['pct_of_capped_bound'] or 0:.1f}",
                    f"{row['pct_of_upper_bound'] or 0:.1f}",
                    "-" if row["mean_jct_h"] is None else f"{row['mean_jct_h']:.2f}",
                    str(row["rescales"]),
                    f"{row['decision_median_ms']:.1f}/{row['decision_p95_ms']:.1f}/"
                    f"{row['decision_max_ms']:.1f}",
                    *(
                        [
                            f"{row['samples_mean']:.5g} ({row['samples_min']:.5g}-"
                            f"{row['samples_max']:.5g})",
                            str(row["margin_vs_best_of_five_mean_pct"]),
                        ]
                        if ties > 1
                        else []
                    ),
                )
    if not json_out:
        Console(width=160).print(table)


__all__ = [
    "FIVE",
    "FRESH",
    "FRESH2",
    "FULL",
    "QUICK",
    "Case",
    "asdict",
    "bench_decisions",
    "parse_entry",
    "run_case",
    "takes_ties",
]
