"""``malleparsl bench jpa --jobs zoo``: the JPA on every curve family of the zoo, held-out apart.

For each family x node slice x seed, the simulator replays the idle-node trace with the family's
jobs under each setup; every run is compared with the oracle (``milp`` with the true curves) of
the same family, slice and seed in two measures:

- ``pct_samples``: samples trained, % of the oracle's;
- ``pct_progress``: normalised progress (the sum over jobs of samples trained / the job's total),
  % of the oracle's, so a fast model does not decide the total alone;
- ``decision_eff`` (JPA setups): every decision scored by the true curves against the oracle's
  choice in the same state (:mod:`~malleparsl.jpa.audit`), free of the chaos of end totals;
  with its loss split into probing, unknown jobs and estimate errors.

Rows per run stream out as they finish (a long sweep can be read while it runs); the summary per
family and slice gives mean and minimum of both, the profiling share of node-seconds and the
decision-time MAPE, with families of :data:`~malleparsl.jpa.zoo.HELD_OUT` marked and their
aggregate reported apart from the tuned ones.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from malleparsl.errors import SpecError
from malleparsl.jpa.zoo import FAMILIES, HELD_OUT, NEAR_LINEAR, zoo_jobs

if TYPE_CHECKING:
    from malleparsl.model import JobSpec
    from malleparsl.traces import IdleTrace

ORACLE = "milp"
DE_PARTS = ("de_loss_probe", "de_loss_unknown", "de_loss_estimate", "de_loss_probing",
            "de_loss_pause", "de_probing_time", "rate_eff")
"""The decision efficiency's loss split (:mod:`~malleparsl.jpa.audit`), averaged per family."""
EXTRA_SETS = ("imagenet",)  # shipped job sets run alongside the zoo families


def parse_families(spec: str) -> list[str]:
    """``zoo`` (every family), ``zoo:a,b`` or ``zoo:held-out`` / ``zoo:tuned``."""
    if spec == "zoo":
        return list(FAMILIES)
    if not spec.startswith("zoo:"):
        raise SpecError(f"zoo job spec must be 'zoo' or 'zoo:FAMILY,...', got {spec!r}")
    out: list[str] = []
    for name in spec[4:].split(","):
        if name == "held-out":
            out += [f for f in FAMILIES if f in HELD_OUT]
        elif name == "tuned":
            out += [f for f in FAMILIES if f not in HELD_OUT]
        elif name in FAMILIES or name in EXTRA_SETS:
            out.append(name)
        else:
            raise SpecError(f"unknown zoo family {name!r}; valid: {', '.join([*FAMILIES, *EXTRA_SETS])}, "
                            "held-out, tuned")
    return out


def parse_seeds(spec: str) -> list[int]:
    """``0-3``, ``0,2,5`` or both (``0-3,24-27``): each comma-separated part a seed or a range,
    in the order given, repeats dropped."""
    seeds: list[int] = []
    try:
        for part in spec.split(","):
            if "-" in part:
                lo, hi = map(int, part.split("-"))
                if hi < lo:
                    raise ValueError
                seeds += range(lo, hi + 1)
            else:
                seeds.append(int(part))
    except ValueError:
        raise SpecError(f"seeds must look like '0-3', '0,2,5' or '0-3,24-27', got {spec!r}") from None
    return list(dict.fromkeys(seeds))


def family_jobs(family: str, *, seed: int, start_s: float) -> list:
    if family == "imagenet":
        from malleparsl.data import load_jobset

        return load_jobset("imagenet")
    return zoo_jobs(family, seed=seed, n_jobs=300, start_s=start_s)


def zoo_case(full: IdleTrace, family: str, *, seed: int, hours: float) -> tuple[IdleTrace, list[JobSpec]]:
    """The window of ``full`` a family's replay runs on, and its jobs: from the first
    submission (or the trace's start), ``hours`` long."""
    from malleparsl.sim.windows import replay_window

    specs = family_jobs(family, seed=seed, start_s=full.start_s)
    return replay_window(full, hours, specs=specs), specs


def zoo_rows(
    *,
    trace: str,
    families: Sequence[str],
    slices: Sequence[str],
    seeds: Sequence[int],
    hours: float,
    setups: Sequence[str],
    noise: float,
    emit: Callable[[dict], None] = lambda r: None,
) -> list[dict]:
    """One row per (family, slice, seed, setup), with both % of the oracle; ``emit`` each."""
    from malleparsl.jpa.bench import run_comparison
    from malleparsl.traces import load_trace

    if ORACLE not in setups:
        setups = [ORACLE, *setups]
    rows: list[dict] = []
    for sl in slices:
        full = load_trace(trace, nodes=sl)
        for fam in families:
            for seed in seeds:
                tr, specs = zoo_case(full, fam, seed=seed, hours=hours)
                got = run_comparison(tr, specs, setups=setups, noise=noise, seed=seed)
                oracle = next(r for r in got if r["setup"] == ORACLE)
                for r in got:
                    r |= {
                        "kind": "run", "family": fam, "nodes": sl, "seed": seed, "hours": hours,
                        "held_out": fam in HELD_OUT, "near_linear": fam in NEAR_LINEAR,
                        "pct_samples": _pct(r["samples"], oracle["samples"]),
                        "pct_progress": _pct(r["progress"], oracle["progress"]),
                    }
                    rows.append(r)
                    emit(r)
    return rows


def summarise(rows: Iterable[dict]) -> list[dict]:
    """Per family x slice x setup: mean/min of both measures, profiling share, decision MAPE;
    then per slice x setup the tuned and the held-out families pooled (means of family means)."""
    rows = [r for r in rows if r.get("kind") == "run"]
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["family"], r["nodes"], r["setup"]), []).append(r)
    out = []
    for (fam, sl, setup), rs in groups.items():
        out.append({
            "kind": "family", "family": fam, "nodes": sl, "setup": setup, "runs": len(rs),
            "held_out": fam in HELD_OUT, "near_linear": fam in NEAR_LINEAR,
            **_stats(rs, "pct_samples"), **_stats(rs, "pct_progress"),
            "profiling_share": _mean(rs, "profiling_share"),
            "profiling_share_max": _max(rs, "profiling_share"),
            "mape_decision": _mean(rs, "mape_decision"),
            **_stats(rs, "decision_eff"),
            **{f"{k}_mean": _mean(rs, k) for k in DE_PARTS},
        })
    pooled: dict[tuple, list[dict]] = {}
    for f in out:
        if f["family"] in EXTRA_SETS:
            continue
        part = "held-out" if f["held_out"] else "tuned"
        pooled.setdefault((part, f["nodes"], f["setup"]), []).append(f)
    for (part, sl, setup), fs in pooled.items():
        out.append({
            "kind": "pooled", "part": part, "nodes": sl, "setup": setup, "families": len(fs),
            "pct_samples_mean": _mean(fs, "pct_samples_mean"),
            "pct_samples_min": min(f["pct_samples_min"] for f in fs),
            "pct_progress_mean": _mean(fs, "pct_progress_mean"),
            "pct_progress_min": min(f["pct_progress_min"] for f in fs),
            "profiling_share_max": max((f["profiling_share_max"] for f in fs
                                        if not math.isnan(f["profiling_share_max"])), default=math.nan),
            "decision_eff_mean": _mean(fs, "decision_eff_mean"),
            "decision_eff_min": min((f["decision_eff_min"] for f in fs
                                     if not math.isnan(f["decision_eff_min"])), default=math.nan),
        })
    return out


def format_table(summary: Sequence[dict], setups: Sequence[str]) -> str:
    """A text table: one line per family and slice, % of oracle mean (min) per setup."""
    fams = [f for f in summary if f["kind"] == "family"]
    keys = sorted({(f["held_out"], f["family"], f["nodes"]) for f in fams})
    by = {(f["family"], f["nodes"], f["setup"]): f for f in fams}
    shown = [s for s in setups if s != ORACLE]
    # the JPA columns are the first JPA setup's, a labelled variant (milp+jpa:KEY=VALUE) included
    jpa_setup = next((s for s in shown if s.split(":")[0] == "milp+jpa"), "milp+jpa")
    width = {s: max(30, len(s) + 11) for s in shown}  # labels such as NAME:KEY=VALUE are long
    head = f"{'family':<22}{'nodes':<7}" + "".join(f"{s + ' smp/prog':>{width[s]}}" for s in shown)
    lines = [head + f"{'prof %':>8}{'MAPE':>7}{'dec eff (min)':>15}{'loss probe/unkn/est':>21}"]
    for held, fam, sl in keys:
        cells = ""
        for s in shown:
            f = by.get((fam, sl, s))
            cells += ("" if f is None else
                      f"{f['pct_samples_mean']:>7.1f} ({f['pct_samples_min']:5.1f}) /"
                      f"{f['pct_progress_mean']:>6.1f} ({f['pct_progress_min']:5.1f})").rjust(width[s])
        jpa = by.get((fam, sl, jpa_setup))
        tail = (f"{100 * jpa['profiling_share']:>8.2f}{100 * jpa['mape_decision']:>6.1f}%"
                f"{jpa['decision_eff_mean']:>8.1f} ({jpa['decision_eff_min']:4.1f})"
                f"{jpa['de_loss_probe_mean']:>9.1f} /{jpa['de_loss_unknown_mean']:4.1f} /"
                f"{jpa['de_loss_estimate_mean']:4.1f}" if jpa else "")
        lines.append(f"{fam + (' (held out)' if held else ''):<22}{sl:<7}{cells}{tail}")
    for p in (f for f in summary if f["kind"] == "pooled" and f["setup"] == jpa_setup):
        lines.append(f"{p['part']} families, {p['nodes']}: {jpa_setup} mean {p['pct_samples_mean']:.1f} % "
                     f"samples (min {p['pct_samples_min']:.1f}), {p['pct_progress_mean']:.1f} % progress "
                     f"(min {p['pct_progress_min']:.1f}), profiling max "
                     f"{100 * p['profiling_share_max']:.2f} %, decision efficiency "
                     f"{p['decision_eff_mean']:.1f} % (min {p['decision_eff_min']:.1f})")
    return "\n".join(lines)


def _pct(x: float, ref: float) -> float:
    return 100.0 * x / ref if ref else math.nan


def _vals(rs: Sequence[dict], key: str) -> np.ndarray:
    v = np.array([r.get(key, math.nan) for r in rs], dtype=float)
    return v[np.isfinite(v)]


def _mean(rs: Sequence[dict], key: str) -> float:
    v = _vals(rs, key)
    return float(v.mean()) if v.size else math.nan


def _max(rs: Sequence[dict], key: str) -> float:
    v = _vals(rs, key)
    return float(v.max()) if v.size else math.nan


def _stats(rs: Sequence[dict], key: str) -> dict:
    v = _vals(rs, key)
    return {f"{key}_mean": float(v.mean()) if v.size else math.nan,
            f"{key}_min": float(v.min()) if v.size else math.nan}
