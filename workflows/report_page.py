"""The demo's ``report.html``: what the run achieved first, then the plots, then the details.

A person opening the report reads, in this order: one paragraph in plain words, a small table of
the figures that matter (best accuracy and its configuration, trials, rescales, node-seconds
offered and used, utilisation, wall time), the plots, the trials, and last the settings and the
trace slice as tables. Values are formatted for reading (no JSON); paths are relative to the
report's folder, so the folder can be moved or zipped whole. Summary keys this module does not
know yet still show up, formatted, under "Other figures".
"""

from __future__ import annotations

import html
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .results import TrialsTable

# (label, summary key); rows whose value is absent are left out.
HEADLINE = (
    ("Best accuracy", "best_accuracy"),
    ("Best configuration", "best_config"),
    ("Trials", "trials"),
    ("Rescales", "rescales"),
    ("Jobs resized while training", "jobs_resized"),
    ("Node-seconds offered by idle nodes", "node_seconds_idle"),
    ("Node-seconds used for training", "node_seconds_used"),
    ("Utilisation", "utilisation"),
    ("Wall time", "wall_s"),
    ("Policy", "policy"),
)
# Keys shown elsewhere on the page (or folded into a headline row); the rest go to "Other figures".
SHOWN = {k for _, k in HEADLINE} | {
    "workflow", "mode", "runs", "failed_runs", "lost_runs", "best_trial", "best_checkpoint",
    "rescales_by_kind", "workflow_wall_s", "stages_failed", "settings", "trace_slice",
    "monitoring_db", "job_sizes",
}
PLOTS = {  # file stem -> caption (report_html draws them)
    "nodes_timeline": "Nodes over time, coloured by trial",
    "trial_sizes": "Each trial's size over time",
    "throughput": "Throughput against the upper bound",
    "accuracies": "The trials' accuracies",
}
CSS = """body{font-family:system-ui,sans-serif;margin:2em auto;max-width:1100px;padding:0 1em;
color:#222;line-height:1.45}
h1{font-size:1.6em;margin-bottom:.3em} h2{font-size:1.2em;margin-top:1.8em}
p.lead{font-size:1.1em} p.problem{color:#a40000;font-weight:600}
table{border-collapse:collapse;margin:.5em 0} td,th{border:1px solid #ccc;padding:3px 8px;
text-align:left;vertical-align:top} th{background:#f4f4f4;font-weight:600}
table.headline td{font-size:1.05em} table.trials{font-size:12px} td.num{text-align:right}
figure{margin:1em 0} figure img{max-width:100%;border:1px solid #ddd}
figcaption{color:#555;font-size:.9em}"""


def fmt(value: Any) -> str:
    """A value as a person reads it: numbers rounded, dicts as ``k = v``, lists joined.

    A dict inside a dict (a NAS config's ``arch``) comes last, after a semicolon, as
    ``arch: cnn, channels 16/32, kernel 3``: its ``kind`` first, its lists joined by ``/``,
    so its commas never read as the outer dict's.
    """
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if value != value:  # NaN
            return "—"
        return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.4g}"
    if isinstance(value, Mapping):
        flat = ", ".join(f"{k} = {fmt(v)}" for k, v in value.items() if not isinstance(v, Mapping))
        nested = [f"{k}: {_inner(v)}" for k, v in value.items() if isinstance(v, Mapping)]
        return "; ".join(p for p in (flat, *nested) if p) or "—"
    if isinstance(value, (list, tuple, set, frozenset)):
        return ", ".join(fmt(v) for v in value) or "—"
    return str(value)


def _inner(d: Mapping[str, Any]) -> str:
    """A nested dict as ``kind, key value, ...`` (lists as ``16/32``, dicts deeper in braces)."""
    def one(v: Any) -> str:
        if isinstance(v, Mapping):
            return "{" + _inner(v) + "}"
        if isinstance(v, (list, tuple)):
            return "/".join(one(x) for x in v) or "—"
        return fmt(v)

    head = [one(d["kind"])] if "kind" in d else []
    return ", ".join(head + [f"{k} {one(v)}" for k, v in d.items() if k != "kind"]) or "—"


def duration(seconds: Any) -> str:
    """``95.2`` -> ``1 min 35 s``."""
    if not isinstance(seconds, (int, float)):
        return fmt(seconds)
    m, s = divmod(round(float(seconds)), 60)
    return f"{m} min {s} s" if m else f"{s} s"


def relative(path: Any, folder: Path) -> str | None:
    """``path`` relative to the report folder (absolute only when on another drive)."""
    if not path:
        return None
    try:
        return os.path.relpath(Path(str(path)).resolve(), folder.resolve())
    except ValueError:
        return str(path)


def _pct(v: Any) -> str:
    return f"{100 * v:.1f} %" if isinstance(v, (int, float)) else fmt(v)


def headline_rows(s: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The headline table as ``(label, text)`` rows."""
    cell = {
        "best_accuracy": lambda v: _pct(v) + (f" ({s['best_trial']})" if s.get("best_trial") else ""),
        "trials": lambda v: f"{fmt(v)} trials, {fmt(s.get('runs'))} runs"
        + (f" ({fmt(s.get('failed_runs'))} failed, {fmt(s.get('lost_runs'))} lost)"
           if s.get("failed_runs") or s.get("lost_runs") else ""),
        "rescales": lambda v: fmt(v) + (f" ({fmt(s['rescales_by_kind'])})"
                                        if s.get("rescales_by_kind") else ""),
        "jobs_resized": lambda v: fmt(v) + (
            " (" + "; ".join(f"{j}: {sz} nodes" for j, sz in s["job_sizes"].items()) + ")"
            if s.get("job_sizes") else ""),
        "node_seconds_idle": lambda v: f"{fmt(v)} node-s",
        "node_seconds_used": lambda v: f"{fmt(v)} node-s",
        "utilisation": lambda v: _pct(v) + " of the offered node-seconds",
        "wall_s": lambda v: duration(v) + (f" (workflow {duration(s['workflow_wall_s'])})"
                                           if s.get("workflow_wall_s") is not None else ""),
    }
    return [(label, cell.get(key, fmt)(s[key])) for label, key in HEADLINE if key in s]


def plain_words(s: Mapping[str, Any]) -> tuple[str, list[str]]:
    """One paragraph saying what the run achieved, and the problems worth a red line."""
    trace = s.get("trace_slice") or {}
    settings = s.get("settings") or {}
    nodes = trace.get("nodes")
    where = (f"on {len(nodes)} emulated nodes that replay Summit idle nodes"
             f"{' at ' + fmt(trace['speed']) + 'x speed' if trace.get('speed') else ''}"
             if nodes else "on the given nodes")
    # the mode is a phrase ("malleable, trials packed into fused arrays"): put it in brackets,
    # not before the noun ("This malleable, trials packed into fused arrays HPO run")
    mode = str(s.get("mode") or "")
    what = f"{str(s.get('workflow', '')).upper()} run".strip() + (f" ({mode})" if mode else "")
    parts = [f"This {what} trained {fmt(s.get('trials'))} trials ({fmt(s.get('runs'))} runs) "
             f"{where} in {duration(s.get('wall_s'))}."]
    if s.get("best_accuracy") is not None:
        parts.append(f"The best trial, {s.get('best_trial') or 'unnamed'}, reached "
                     f"{_pct(s['best_accuracy'])} test accuracy with {fmt(s.get('best_config'))}.")
    if s.get("node_seconds_idle"):
        parts.append(f"Training used {fmt(s.get('node_seconds_used'))} of the "
                     f"{fmt(s['node_seconds_idle'])} node-seconds the idle nodes offered "
                     f"({_pct(s.get('utilisation'))}), with {fmt(s.get('rescales'))} "
                     f"rescale{'' if s.get('rescales') == 1 else 's'}"
                     f"{' under ' + str(s['policy']) if s.get('policy') else ''}.")
    if settings.get("plain"):
        parts.append("Each trial ran on one node and was never resized (the plain baseline).")
    problems = []
    if s.get("best_accuracy") is None:
        problems.append("No trial finished with an accuracy.")
    for key, text in (("failed_runs", "run(s) failed"), ("lost_runs", "run(s) were lost")):
        if s.get(key):
            problems.append(f"{fmt(s[key])} {text}; see the trials table.")
    if s.get("stages_failed"):
        problems.append(f"Stage(s) failed: {fmt(s['stages_failed'])}.")
    return " ".join(parts), problems


def _table(rows: Sequence[tuple[str, str]], cls: str = "") -> str:
    body = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>" for k, v in rows)
    return f"<table class='{cls}'>{body}</table>" if rows else "<p>—</p>"


def trials_table(table: TrialsTable, folder: Path) -> str:
    """One row per trial and rung: what it ran with and how it did (no absolute paths).

    Sizes appear only when the runner recorded them (``TrialRow.sizes``); a column of zeros
    would claim trials ran on no node.
    """
    if not len(table):
        return "<p>No trial ran.</p>"
    sized = any(r.sizes for r in table.rows)
    head = ("trial", "rung", "budget", "status", "configuration", table.metric,
            *(("most nodes", "rescales") if sized else ()), "wall time", "checkpoint folder")
    rows = []
    for r in table.rows:
        flat = r.flat()
        cells = (f"{r.stage}/{r.trial_id}", fmt(r.rung), fmt(r.budget),
                 r.status + (f": {r.error.splitlines()[0][:120]}" if r.error else ""),
                 fmt(r.config), fmt(r.metrics.get(table.metric)),
                 *((fmt(flat["max_nodes_used"]), fmt(flat["rescales"])) if sized else ()),
                 duration(flat["wall_s"]) if flat["wall_s"] else "—",
                 relative(r.ckpt_dir, folder) or "—")
        rows.append("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in cells) + "</tr>")
    th = "".join(f"<th>{html.escape(h)}</th>" for h in head)
    return f"<table class='trials'><tr>{th}</tr>{''.join(rows)}</table>"


def details(s: Mapping[str, Any], folder: Path) -> str:
    """Settings, trace slice, files and any figure not shown above, each as a table."""
    settings = [(k, "this report's folder" if k == "out" else fmt(v))
                for k, v in (s.get("settings") or {}).items()]
    out = ["<h2>Settings</h2>", _table(settings)]
    trace = s.get("trace_slice") or {}
    out += ["<h2>Trace slice</h2>", _table([(k, fmt(v)) for k, v in trace.items()])]
    links = [(label, relative(p, folder)) for label, p in (
        ("summary (JSON)", folder / "summary.json"), ("trials (CSV)", folder / "trials.csv"),
        ("best trial (JSON)", folder / "best.json"), ("best checkpoint", s.get("best_checkpoint")),
        ("Parsl monitoring database", s.get("monitoring_db")))]
    items = "".join(f"<tr><th>{html.escape(label)}</th><td><a href='{html.escape(p)}'>"
                    f"{html.escape(p)}</a></td></tr>" for label, p in links if p)
    out += ["<h2>Files</h2>", f"<table>{items}</table>"]
    other = [(k.replace("_", " "), fmt(v)) for k, v in s.items() if k not in SHOWN]
    if other:
        out += ["<h2>Other figures</h2>", _table(other)]
    return "\n".join(out)


def render_page(folder: str | os.PathLike[str], *, summary: Mapping[str, Any], table: TrialsTable,
                title: str = "malleparsl demo") -> str:
    """The whole ``report.html`` for the report folder ``folder`` (plots already drawn there)."""
    folder = Path(folder)
    lead, problems = plain_words(summary)
    figures = "".join(
        f"<figure><img src='{name}.png' alt='{html.escape(cap)}'>"
        f"<figcaption>{html.escape(cap)}</figcaption></figure>"
        for name, cap in PLOTS.items() if (folder / f"{name}.png").exists())
    warn = "".join(f"<p class='problem'>{html.escape(p)}</p>" for p in problems)
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>{CSS}</style></head><body>
<h1>{html.escape(title)}</h1>
<p class="lead">{html.escape(lead)}</p>
{warn}
{_table(headline_rows(summary), "headline")}
<h2>Plots</h2>
{figures or "<p>No plot was drawn.</p>"}
<h2>Trials</h2>
{trials_table(table, folder)}
{details(summary, folder)}
</body></html>
"""
