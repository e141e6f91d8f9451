"""report.html reads as a report: achievements first, tables not JSON, relative paths; and a real
browser (headless Chromium) shows the headline figures and loads every image."""

from __future__ import annotations

import os
import re
import shutil
import subprocess

import pytest

from malleparsl.workflows.report_html import write_report
from malleparsl.workflows.report_page import duration, fmt, relative, render_page
from malleparsl.workflows.results import TrialRow, TrialsTable
from malleparsl.workflows.runner import TrialEvent
from malleparsl.workflows.timeline import Sample

CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                  "--no-first-run", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage")


def _report(tmp_path):
    """A report folder from synthetic samples: two trials on three nodes, one rescale."""
    out = tmp_path / "report"
    nodes = frozenset({"n1", "n2", "n3"})
    samples = [
        Sample(0.0, nodes, nodes, {"s-t0-r0": ("n1",), "s-t1-r0": ("n2",)},
               {"s-t0-r0": 0.0, "s-t1-r0": 0.0}, {"s-t0-r0": 100.0, "s-t1-r0": 90.0}),
        Sample(2.0, nodes, nodes, {"s-t0-r0": ("n1", "n3"), "s-t1-r0": ("n2",)},
               {"s-t0-r0": 200.0, "s-t1-r0": 180.0}, {"s-t0-r0": 190.0, "s-t1-r0": 90.0}),
        Sample(6.0, nodes, nodes, {"s-t0-r0": ("n1", "n3")}, {"s-t0-r0": 960.0},
               {"s-t0-r0": 190.0}),
        Sample(9.0, nodes, nodes, {}, {}, {}),
    ]
    ckpt = out / "ckpt" / "s-t0"
    ckpt.mkdir(parents=True)
    (ckpt / "step_40.pt").write_bytes(b"x")
    rows = [TrialRow(stage="search", trial_id="t0", job_id="s-t0-r0", budget=4.0,
                     config={"lr": 0.05, "width": 64}, metrics={"accuracy": 0.9722},
                     status="stopped", ckpt_dir=str(ckpt), started_s=0.0, finished_s=9.0,
                     sizes=[(0.0, 1), (2.0, 2)]),
            TrialRow(stage="search", trial_id="t1", job_id="s-t1-r0", budget=4.0,
                     config={"lr": 0.5, "width": 32}, metrics={"accuracy": 0.81},
                     status="stopped", started_s=0.0, finished_s=6.0, sizes=[(0.0, 1)])]
    events = [TrialEvent(0.0, "submitted", "search", t, 0, f"s-{t}-r0") for t in ("t0", "t1")]
    summary = {
        "workflow": "hpo", "mode": "malleable", "trials": 2, "runs": 2, "failed_runs": 0,
        "lost_runs": 0, "best_accuracy": 0.9722, "best_config": {"lr": 0.05, "width": 64},
        "best_trial": "search/t0", "best_checkpoint": str(ckpt / "step_40.pt"),
        "rescales": 1, "rescales_by_kind": {"up": 1}, "node_seconds_idle": 27.0,
        "node_seconds_used": 20.0, "utilisation": 0.741, "workflow_wall_s": 9.0,
        "wall_s": 95.4, "stages_failed": [], "policy": "milp + JPA",
        "settings": {"out": str(out), "quick": True, "nodes": 3, "speed": 30.0,
                     "policy": "milp"},
        "trace_slice": {"trace": "summit", "nodes": ["a01n01", "a01n02", "a01n03"],
                        "window_start_s": 72743.0, "speed": 30.0},
        "monitoring_db": None, "fused_trials": 4,
    }
    table = TrialsTable(rows)
    write_report(out, samples=samples, table=table, events=events, summary=summary,
                 title="malleparsl demo: HPO on digits, malleable")
    return out


def test_formatting_is_for_people(tmp_path):
    assert fmt({"lr": 0.05, "width": 64}) == "lr = 0.05, width = 64"
    assert fmt(12345.67) == "12,346" and fmt(0.123456) == "0.1235" and fmt(None) == "—"
    assert fmt(["a", "b"]) == "a, b" and fmt(True) == "yes"
    assert duration(95.4) == "1 min 35 s" and duration(9) == "9 s"
    assert relative(tmp_path / "report" / "ckpt" / "x.pt", tmp_path / "report") == "ckpt/x.pt"


def test_a_nested_config_reads_as_its_parts_not_as_equals_inside_equals():
    """A NAS config's ``arch`` once showed as ``arch = kind = cnn, channels = 16, ...``."""
    cfg = {"lr": 0.003, "batch_size": 64,
           "arch": {"kind": "cnn", "channels": [16, 32], "kernel": 3, "fc": 64, "activation": "relu"}}
    assert fmt(cfg) == ("lr = 0.003, batch_size = 64; "
                        "arch: cnn, channels 16/32, kernel 3, fc 64, activation relu")
    assert fmt({"arch": {"kind": "mlp", "layers": [64], "activation": "tanh"}}) == (
        "arch: mlp, layers 64, activation tanh")
    assert fmt({"a": {"b": {"c": 1}}}) == "a: b {c 1}"


def test_report_opens_with_the_achievement_and_has_no_json_or_absolute_paths(tmp_path):
    out = _report(tmp_path)
    page = (out / "report.html").read_text()
    text = re.sub(r"<[^>]+>", " ", re.sub(r"<style>.*?</style>", "", page, flags=re.S))
    order = [page.index(x) for x in ("This HPO run (malleable) trained 2 trials", "class='headline'",
                                     "<h2>Plots", "<h2>Trials", "<h2>Settings", "<h2>Trace slice")]
    assert order == sorted(order)
    assert "reached 97.2 % test accuracy with lr = 0.05, width = 64" in text
    assert "Training used 20 of the 27 node-seconds the idle nodes offered (74.1 %)" in text
    headline = page[page.index("class='headline'"):page.index("<h2>Plots")]
    for figure in ("97.2 % (search/t0)", "lr = 0.05, width = 64", "2 trials, 2 runs", "1 (up = 1)",
                   "27 node-s", "20 node-s", "74.1 %", "1 min 35 s", "milp + JPA"):
        assert figure in headline, figure
    assert "{" not in text and '"lr"' not in page  # tables, not JSON
    assert str(tmp_path) not in page  # paths relative to the report
    assert "ckpt/s-t0/step_40.pt" in page
    assert "fused trials" in text  # a key the page does not know yet still shows
    assert "a01n01, a01n02, a01n03" in text
    assert "most nodes" in text  # t0 recorded its sizes: 1 node, then 2
    rows = TrialsTable([TrialRow(stage="s", trial_id="x", metrics={"accuracy": 0.5},
                                 status="stopped")])
    assert "most nodes" not in render_page(tmp_path, summary={}, table=rows)  # none recorded


def _chromium() -> str:
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail("chromium missing in CI; scripts/setup-system.sh installs it")
        pytest.skip("chromium not installed (scripts/setup-system.sh installs it)")
    return exe


def test_report_renders_in_headless_chromium_with_every_image_loaded(tmp_path):
    exe = _chromium()
    out = _report(tmp_path)
    page = (out / "report.html").read_text()
    # The same page plus a probe that writes what the browser loaded into the DOM.
    probe = ("<script>window.addEventListener('load', () => { const p = document.createElement"
             "('pre'); p.id = 'probe'; p.textContent = 'IMAGES ' + Array.from(document.images)"
             ".map(i => i.complete && i.naturalWidth > 0 ? 'ok' : 'broken:' + i.src).join(' ');"
             " document.body.appendChild(p); });</script>")
    (out / "probe.html").write_text(page.replace("</body>", probe + "</body>"))
    profile = tmp_path / "profile"
    base = [exe, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "--virtual-time-budget=10000"]
    dom = subprocess.run([*base, "--dump-dom", (out / "probe.html").as_uri()],
                         capture_output=True, text=True, timeout=240)
    assert dom.returncode == 0, dom.stderr[-2000:]
    found = re.search(r"IMAGES ([^<]*)</pre>", dom.stdout)
    assert found, dom.stdout[-2000:]
    statuses = found.group(1).split()
    assert statuses == ["ok"] * 4, statuses  # four plots, all decoded
    for figure in ("97.2 % (search/t0)", "lr = 0.05, width = 64", "74.1 %", "1 min 35 s"):
        assert figure in dom.stdout, figure
    shot = tmp_path / "report.png"
    res = subprocess.run([*base, "--window-size=1200,1600", f"--screenshot={shot}",
                          (out / "report.html").as_uri()],
                         capture_output=True, text=True, timeout=240)
    assert res.returncode == 0 and shot.stat().st_size > 10_000, res.stderr[-2000:]
    if os.environ.get("MALLEPARSL_KEEP_SCREENSHOT"):
        shutil.copy(shot, os.environ["MALLEPARSL_KEEP_SCREENSHOT"])


def test_plots_name_the_fused_arrays_that_ran_not_the_trials_that_did_not():
    """In a packed run the jobs that hold nodes are arrays, whose ids no trial event carries:
    they were drawn in tab20's first colour, the first trial's in the legend (the default demo
    read "final/f000 ran the search"), and the sizes plot stacked nothing."""
    from malleparsl.workflows.report_html import _labels, trial_of_job

    nodes = frozenset({"n1", "n2"})
    samples = [Sample(0.0, nodes, nodes, {"search-a000": ("n1", "n2")}, {}, {}),
               Sample(1.0, nodes, nodes, {"final-a001": ("n1",), "x-9": ("n2",)}, {}, {})]
    events = [TrialEvent(0.0, "submitted", "search", t, 0, f"search-{t}-r0")
              for t in ("t000", "t001", "t002")]
    events.append(TrialEvent(0.0, "submitted", "final", "f000", 0, "final-f000-r0"))
    arrays = [{"array_id": "search-a000", "stage": "search", "trials": ["t000", "t001", "t002"]},
              {"array_id": "final-a001", "stage": "final", "trials": ["f000"]}]
    labels = _labels(samples, trial_of_job(events, arrays))
    # what held nodes, named; a job nobody labelled keeps its own id
    assert labels == ["final/array a001 (1 trial)", "search/array a000 (3 trials)", "x-9"]


def test_throughput_plot_says_when_no_progress_was_recorded(tmp_path, monkeypatch):
    """Jobs shorter than a progress interval leave no record; the plot drew a flat 0 samples/s
    line, which reads as training that stalled."""
    import matplotlib.axes

    from malleparsl.workflows.report_html import plot_throughput

    texts, lines = [], []
    real_text, real_step = matplotlib.axes.Axes.text, matplotlib.axes.Axes.step
    monkeypatch.setattr(matplotlib.axes.Axes, "text",
                        lambda self, x, y, s, *a, **k: texts.append(s) or real_text(self, x, y, s, *a, **k))
    monkeypatch.setattr(matplotlib.axes.Axes, "step",
                        lambda self, *a, **k: lines.append(k.get("label")) or real_step(self, *a, **k))
    nodes = frozenset({"n1"})
    samples = [Sample(float(t), nodes, nodes, {"a": ("n1",)} if t == 1 else {}, {}, {})
               for t in range(4)]
    assert plot_throughput(samples, tmp_path / "t.png").exists()
    assert lines == [] and any("no training progress recorded" in t for t in texts)


def test_the_opening_sentence_reads_with_a_packed_mode():
    from malleparsl.workflows.report_page import plain_words

    text, _ = plain_words({"workflow": "hpo", "mode": "malleable, trials packed into fused arrays",
                           "trials": 8, "runs": 10, "wall_s": 25.0})
    assert text.startswith("This HPO run (malleable, trials packed into fused arrays) trained 8 "
                           "trials (10 runs)")
