"""The demo's report folder: ``report.html`` with PNG plots, ``summary.json``, the trials table.

The page itself (what the run achieved, then plots, then details) is :mod:`.report_page`.

Plots come from the :class:`~malleparsl.workflows.timeline.Recorder`'s samples and the trials
table: nodes over time coloured by trial, each trial's size over time, aggregate throughput
against a linear-scaling upper bound, and the trials' accuracies. The simulator's plots
(:mod:`malleparsl.report`) are drawn in hours over days of trace; a demo lasts minutes, so
these draw seconds and per-node detail instead, with the same Agg backend.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .report_page import render_page
from .results import TrialsTable
from .runner import TrialEvent
from .timeline import Sample

log = logging.getLogger(__name__)


def _plt():  # noqa: ANN202
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def trial_of_job(events: Sequence[TrialEvent],
                 arrays: Sequence[Mapping[str, Any]] = ()) -> dict[str, str]:
    """``job id -> "stage/trial"`` (a trial runs one job per rung); a fused array's job (the
    packed runner's ``arrays``: ``array_id``, ``stage``, ``trials``) is labelled
    ``"stage/array a000 (6 trials)"``."""
    out = {e.job_id: f"{e.stage}/{e.trial_id}" for e in events}
    for a in arrays:
        n = len(a.get("trials", ()))
        short = str(a["array_id"]).rsplit("-", 1)[-1]
        out[str(a["array_id"])] = f"{a['stage']}/array {short} ({n} trial{'s' if n != 1 else ''})"
    return out


def _labels(samples: Sequence[Sample], job_trial: Mapping[str, str]) -> list[str]:
    """The labels of the jobs that ran: a plot's legend names only what it draws, and a job
    without a label shows as its job id (it was drawn in tab20's first colour, which reads
    as the first trial's)."""
    return sorted({job_trial.get(j, j) for s in samples for j, ns in s.running.items() if ns})


def _colours(keys: Sequence[str]) -> dict[str, Any]:
    plt = _plt()
    cmap = plt.get_cmap("tab20")
    return {k: cmap(i % 20) for i, k in enumerate(keys)}


def throughput_series(samples: Sequence[Sample], *, bin_s: float = 0.0
                      ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(t, samples/s, bound)``: progress rate summed over jobs, and the linear bound.

    The rate is the growth of each job's trained-sample count between samples (a restart that
    rolls back counts as 0), averaged over bins of ``bin_s`` seconds when given. The bound
    gives every ready node the best per-node rate any segment measured: what perfect scaling
    without pauses or start-up costs would reach.
    """
    per_node = max((r / len(s.running[j]) for s in samples for j, r in s.rates.items()
                    if s.running.get(j)), default=0.0)
    t, grow, dts, ready = [], [], [], []
    for a, b in zip(samples, samples[1:]):
        dt = b.t - a.t
        if dt <= 0:
            continue
        t.append(a.t)
        grow.append(sum(max(0.0, b.samples[j] - a.samples.get(j, b.samples[j]))
                        for j in b.samples))
        dts.append(dt)
        ready.append(len(a.ready) * dt)
    t_, g, d, r = (np.asarray(x, float) for x in (t, grow, dts, ready))
    if bin_s > 0 and len(t_):
        edges = np.arange(t_[0], t_[-1] + d[-1] + bin_s, bin_s)
        idx = np.clip(np.digitize(t_, edges) - 1, 0, len(edges) - 2)
        dsum = np.bincount(idx, weights=d, minlength=len(edges) - 1)
        ok = dsum > 0
        gsum = np.bincount(idx, weights=g, minlength=len(edges) - 1)[ok]
        rsum = np.bincount(idx, weights=r, minlength=len(edges) - 1)[ok]
        return edges[:-1][ok], gsum / dsum[ok], per_node * rsum / dsum[ok]
    return t_, (g / d if len(d) else g), per_node * (r / d if len(d) else r)


def plot_nodes_timeline(samples: Sequence[Sample], job_trial: Mapping[str, str], path: Path) -> Path:
    """One row per node: grey while ready and idle, the trial's colour while it runs a rank."""
    plt = _plt()
    nodes = sorted({n for s in samples for n in s.ready | s.usable | s.used})
    trials = _labels(samples, job_trial)
    colour = _colours(trials)
    fig, ax = plt.subplots(figsize=(10, 0.35 * max(4, len(nodes)) + 1.5))
    for i, node in enumerate(nodes):
        for a, b in zip(samples, samples[1:]):
            owner = next((j for j, ns in a.running.items() if node in ns), None)
            if owner is not None:
                c = colour[job_trial.get(owner, owner)]
                ax.broken_barh([(a.t, b.t - a.t)], (i - 0.4, 0.8), color=c, lw=0)
            elif node in a.ready:
                ax.broken_barh([(a.t, b.t - a.t)], (i - 0.4, 0.8), color="0.85", lw=0)
    ax.set_yticks(range(len(nodes)), nodes, fontsize=7)
    ax.set_xlabel("seconds")
    ax.set_title("Nodes over time (grey: idle, colour: the trial running on it; blank: not ours)")
    handles = [plt.Rectangle((0, 0), 1, 1, color=colour[t]) for t in trials[:20]]
    if handles:
        ax.legend(handles, trials[:20], fontsize=6, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def plot_trial_sizes(samples: Sequence[Sample], job_trial: Mapping[str, str], path: Path) -> Path:
    """Nodes held by each trial over time, stacked (the top edge is all nodes in use)."""
    plt = _plt()
    trials = _labels(samples, job_trial)
    t = np.array([s.t for s in samples])
    ys = []
    for tr in trials:
        ys.append(np.array([sum(len(ns) for j, ns in s.running.items()
                                if job_trial.get(j, j) == tr) for s in samples]))
    ready = np.array([len(s.ready) for s in samples])
    fig, ax = plt.subplots(figsize=(10, 4))
    if ys and len(t):
        ax.stackplot(t, *ys, labels=trials, colors=[_colours(trials)[x] for x in trials], step="post")
    ax.step(t, ready, where="post", color="k", lw=1, label="nodes ready")
    ax.set_xlabel("seconds")
    ax.set_ylabel("nodes")
    ax.set_title("Each trial's size over time")
    ax.legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def plot_throughput(samples: Sequence[Sample], path: Path) -> Path:
    plt = _plt()
    t, rate, bound = throughput_series(samples, bin_s=2.0)
    fig, ax = plt.subplots(figsize=(10, 3.5))
    if not any(s.rates or s.samples for s in samples):
        # a flat line at 0 samples/s would say training stalled; it ran, but no job lived
        # long enough to publish a progress record (rank 0 writes one every
        # progress_interval_s, 1 s by default)
        ax.text(0.5, 0.5, "no training progress recorded: every job ended before the recorder\n"
                "saw a progress record (rank 0 writes one every progress_interval_s, 1 s)",
                ha="center", va="center", transform=ax.transAxes)
        ax.set_xticks([]), ax.set_yticks([])
    elif len(t):
        ax.fill_between(t, bound, step="post", color="0.85", label="upper bound (linear scaling)")
        ax.step(t, rate, where="post", lw=1, label="measured")
    ax.set_xlabel("seconds")
    ax.set_ylabel("samples/s (2 s bins)")
    ax.set_title("Aggregate training throughput against the upper bound")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def plot_accuracies(table: TrialsTable, path: Path, *, target: float | None = 0.95) -> Path:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(10, 3.5))
    order = {}
    for r in table.rows:
        order.setdefault(f"{r.stage}/{r.trial_id}", len(order))
    marks = "os^Dv*"
    for stage in sorted({r.stage for r in table.rows}):
        for rung in sorted({r.rung for r in table.rows if r.stage == stage}):
            pts = [(order[f"{r.stage}/{r.trial_id}"], r.metrics.get(table.metric))
                   for r in table.rows if r.stage == stage and r.rung == rung and r.ok]
            pts = [(x, y) for x, y in pts if isinstance(y, (int, float))]
            if pts:
                ax.scatter(*zip(*pts), marker=marks[rung % len(marks)],
                           label=f"{stage} rung {rung}", s=30)
    if target is not None:
        ax.axhline(target, color="0.5", ls="--", lw=0.8, label=f"target {target}")
    ax.set_xlabel("trial (in order of first start)")
    ax.set_ylabel(table.metric)
    ax.set_title("Trials' test accuracies")
    ax.legend(fontsize=7, loc="lower right")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def write_plots(out: str | Path, *, samples: Sequence[Sample], table: TrialsTable,
                events: Sequence[TrialEvent], arrays: Sequence[Mapping[str, Any]] = ()
                ) -> dict[str, Path]:
    """The four PNGs plus ``trials.csv`` and ``best.json``; a failing plot is logged, skipped.

    ``arrays``: the fused arrays of a packed run (their jobs are named in the plots)."""
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    jt = trial_of_job(events, arrays)
    paths: dict[str, Path] = dict(table.save(folder))
    draw = {
        "nodes_timeline": lambda p: plot_nodes_timeline(samples, jt, p),
        "trial_sizes": lambda p: plot_trial_sizes(samples, jt, p),
        "throughput": lambda p: plot_throughput(samples, p),
        "accuracies": lambda p: plot_accuracies(table, p),
    }
    for name, fn in draw.items():
        try:
            paths[name] = fn(folder / f"{name}.png")
        except Exception:
            log.exception("plot %s failed", name)
    return paths


def write_summary(out: str | Path, *, table: TrialsTable, summary: Mapping[str, Any],
                  title: str = "malleparsl demo") -> dict[str, Path]:
    """``summary.json`` and ``report.html`` (which shows the PNGs already in ``out``)."""
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    paths = {"summary": folder / "summary.json", "html": folder / "report.html"}
    paths["summary"].write_text(json.dumps(dict(summary), indent=2, default=str))
    paths["html"].write_text(render_page(folder, summary=summary, table=table, title=title))
    return paths


def write_report(out: str | Path, *, samples: Sequence[Sample], table: TrialsTable,
                 events: Sequence[TrialEvent], summary: Mapping[str, Any],
                 title: str = "malleparsl demo") -> dict[str, Path]:
    """Every file of the report folder; returns their paths by name."""
    paths = write_plots(out, samples=samples, table=table, events=events)
    paths.update(write_summary(out, table=table, summary=summary, title=title))
    return paths
