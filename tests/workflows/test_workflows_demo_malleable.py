"""The quick demo as a user runs it (``malleparsl demo --quick``: the Summit slice, the
emulated model, packed trials) shows what the product is for: running jobs grow or shrink from
their checkpoint as nodes come and go, and their progress is published while they train.

Before the demo's trials lasted seconds and its slice had nodes leave mid-run, a quick run
finished every trial in under a second with no resize and no progress record."""

import json

import pytest

from malleparsl.workflows.demo import DemoSettings, run_demo

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def test_quick_demo_resizes_running_jobs_and_publishes_progress(tmp_path):
    out = tmp_path / "report"
    run_demo(DemoSettings(out=str(out), quick=True, timeout_s=400))
    doc = json.loads((out / "summary.json").read_text())
    kinds = doc["rescales_by_kind"]
    assert kinds.get("up", 0) + kinds.get("down", 0) >= 1, doc  # a resize, not a restart
    assert doc["jobs_resized"] >= 1 and len(doc["job_sizes"]) == doc["jobs_resized"], doc
    assert doc["jobs_with_progress"] >= 1, doc  # the throughput plot has something to show
    assert doc["lost_runs"] == doc["failed_runs"] == 0 and doc["stages_failed"] == []
    assert doc["best_accuracy"] > 0.5
    assert "Jobs resized while training" in (out / "report.html").read_text()
