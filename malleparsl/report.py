"""Reports of simulation (and demo) runs: the comparison table and PNG plots.

Plots use matplotlib's Agg backend (no display needed) and take plain arrays or result tables,
so the live demo can draw the same figures from what it measured: idle nodes over time, nodes
per job (stacked), and aggregate throughput against the upper bound.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

if TYPE_CHECKING:
    from malleparsl.sim.result import SimResult
    from malleparsl.traces import IdleTrace

log = logging.getLogger(__name__)


def check_out_folder(out: Path) -> None:
    """Make ``out`` a folder we can write, or say so naming ``--out``: before hours of
    simulation or before a demo's nodes start, not when the report is written."""
    import tempfile

    from malleparsl.errors import SpecError

    try:
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=out):
            pass
    except OSError as exc:
        raise SpecError(f"--out {str(out)!r} is not a writable folder "
                        f"({exc.strerror or exc}); choose another --out") from None

TABLE_COLUMNS: list[tuple[str, str, str]] = [
    # (key in the summary row, header, format)
    ("policy", "policy", "{}"),
    ("samples", "samples", "{:.4g}"),
    ("samples_per_s", "samples/s", "{:,.0f}"),
    ("pct_of_upper_bound", "% of bound", "{:.1f}"),
    ("pct_of_capped_bound", "% capped", "{:.1f}"),
    ("utilisation", "util.", "{:.1%}"),
    ("rescales", "rescales", "{:,}"),
    ("pause_s", "pause s", "{:,.0f}"),
    ("preempt_pause_s", "preempt s", "{:,.0f}"),
    ("jobs_done", "jobs done", "{}"),
    ("mean_jct_h", "mean JCT h", "{:.2f}"),
    ("solver_median_ms", "solve med ms", "{:.1f}"),
    ("solver_p95_ms", "p95 ms", "{:.1f}"),
    ("solver_max_ms", "max ms", "{:.0f}"),
    ("wall_s", "wall s", "{:.1f}"),
]


def _cell(row: dict[str, Any], key: str, fmt: str) -> str:
    v = row.get(key)
    if v is None:
        return "-"
    try:
        return fmt.format(v)
    except (ValueError, TypeError):
        return str(v)


def table_markdown(rows: Sequence[dict[str, Any]]) -> str:
    """The comparison table as Markdown (for notes, docs and ``summary.md``)."""
    head = "| " + " | ".join(h for _, h, _ in TABLE_COLUMNS) + " |"
    rule = "|" + "|".join("---" for _ in TABLE_COLUMNS) + "|"
    body = ["| " + " | ".join(_cell(r, k, f) for k, _, f in TABLE_COLUMNS) + " |" for r in rows]
    return "\n".join([head, rule, *body])


def rich_table(rows: Sequence[dict[str, Any]], title: str = ""):  # noqa: ANN201 - rich.table.Table
    """The comparison table for the terminal."""
    from rich.table import Table

    t = Table(title=title or None)
    # the policy names its row: never cut it ("upper-bou…" twice left two rows unnamed)
    name_width = max((len(_cell(r, "policy", "{}")) for r in rows), default=0)
    for i, (_, h, _) in enumerate(TABLE_COLUMNS):
        if i == 0:
            t.add_column(h, justify="left", no_wrap=True, min_width=max(len(h), name_width))
        else:
            t.add_column(h, justify="right")
    for r in rows:
        t.add_row(*(_cell(r, k, f) for k, _, f in TABLE_COLUMNS))
    return t


def binned_mean(
    times: np.ndarray, values: np.ndarray, t0: float, t1: float, bins: int = 300
) -> tuple[np.ndarray, np.ndarray]:
    """Time-weighted mean of a step function (``values[i]`` from ``times[i]`` on) per bin."""
    times = np.asarray(times, float)
    values = np.asarray(values, float)
    edges = np.linspace(t0, t1, bins + 1)
    if len(times) == 0:
        return edges[:-1], np.zeros(bins)
    knots = np.r_[times, t1]
    area = np.r_[0.0, np.cumsum(values * np.diff(knots).clip(min=0))]

    def integral(t: np.ndarray) -> np.ndarray:
        i = np.clip(np.searchsorted(knots, t, side="right") - 1, 0, len(values) - 1)
        before = t < knots[0]
        out = area[i] + values[i] * (t - knots[i])
        return np.where(before, 0.0, out)

    a = integral(edges)
    return edges[:-1], np.diff(a) / np.diff(edges)


def _figure():  # noqa: ANN202
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_idle_nodes(times: np.ndarray, counts: np.ndarray, path: str | Path, *, title: str = "") -> Path:
    """Idle nodes over time (a step plot), hours on the x axis."""
    plt = _figure()
    fig, ax = plt.subplots(figsize=(10, 3.5))
    t0 = times[0] if len(times) else 0.0
    ax.step((np.asarray(times) - t0) / 3600, counts, where="post", lw=0.8)
    ax.set_xlabel("hours")
    ax.set_ylabel("idle nodes")
    ax.set_title(title or "Idle nodes")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Path(path)


def plot_nodes_per_job(
    sizes: pd.DataFrame, t0: float, t1: float, path: str | Path, *, top: int = 15, title: str = ""
) -> Path:
    """Stacked nodes per job over time from ``(time_s, job, nodes)`` change rows.

    The ``top`` jobs by node-seconds get their own band; the rest share one "other" band.
    """
    plt = _figure()
    grid = np.linspace(t0, t1, 600)
    bands: dict[str, np.ndarray] = {}
    for job, g in sizes.sort_values("time_s", kind="stable").groupby("job", sort=False):
        t, n = g["time_s"].to_numpy(), g["nodes"].to_numpy()
        i = np.searchsorted(t, grid, side="right") - 1
        bands[str(job)] = np.where(i >= 0, n[np.clip(i, 0, None)], 0)
    order = sorted(bands, key=lambda k: -bands[k].sum())
    keep = order[:top]
    ys = [bands[k] for k in keep]
    labels = list(keep)
    if len(order) > top:
        ys.append(np.sum([bands[k] for k in order[top:]], axis=0))
        labels.append(f"other ({len(order) - top} jobs)")
    fig, ax = plt.subplots(figsize=(10, 4))
    if ys:
        ax.stackplot((grid - t0) / 3600, *ys, labels=labels, step="post")
        ax.legend(fontsize=6, ncol=2, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.set_xlabel("hours")
    ax.set_ylabel("nodes")
    ax.set_title(title or "Nodes per job")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Path(path)


def plot_throughput(
    series: dict[str, tuple[np.ndarray, np.ndarray]], t0: float, t1: float, path: str | Path,
    *, bound: str = "upper-bound", title: str = "",
) -> Path:
    """Aggregate samples/s per policy (binned means), the bound drawn as a filled area."""
    plt = _figure()
    fig, ax = plt.subplots(figsize=(10, 4))
    for name, (t, v) in series.items():
        x, y = binned_mean(t, v, t0, t1)
        x = (x - t0) / 3600
        if name == bound:
            ax.fill_between(x, y, step="post", color="0.85", label=name)
        else:
            ax.step(x, y, where="post", lw=0.9, label=name)
    ax.set_xlabel("hours")
    ax.set_ylabel("samples/s (binned mean)")
    ax.set_title(title or "Aggregate throughput against the upper bound")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Path(path)


def write_report(
    trace: IdleTrace, results: Sequence[SimResult], rows: Sequence[dict[str, Any]],
    out_dir: str | Path,
) -> list[Path]:
    """Everything for ``--out DIR``: logs, ``summary.json``/``.md`` and the three plots."""
    import json

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    for r in results:
        written.extend(r.save(out).values())
    (out / "summary.json").write_text(json.dumps(list(rows), indent=1))
    (out / "summary.md").write_text(table_markdown(rows) + "\n")
    written += [out / "summary.json", out / "summary.md"]
    t, c = trace.idle_count()
    t, c = np.r_[trace.start_s, t], np.r_[0, c]
    written.append(plot_idle_nodes(t, c, out / "idle_nodes.png", title=f"Idle nodes: {trace.name}"))
    main = next((r for r in results if not r.policy.startswith("upper-bound")),
                results[0] if results else None)
    if main is not None:
        written.append(plot_nodes_per_job(
            main.sizes, trace.start_s, trace.end_s, out / f"nodes_per_job_{main.policy}.png",
            title=f"Nodes per job under {main.policy}",
        ))
    series = {
        r.policy: (r.events["time_s"].to_numpy(), r.events["samples_per_s"].to_numpy())
        for r in results
    }
    written.append(plot_throughput(series, trace.start_s, trace.end_s, out / "throughput.png"))
    log.info("wrote %d files under %s", len(written), out)
    return written
