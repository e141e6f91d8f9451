"""``malleparsl bench executor`` runs end to end (tiny sizes) and prints the contract's keys."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def test_bench_executor_json_has_the_figures(tmp_path):
    cmd = [sys.executable, "-m", "malleparsl.cli", "bench", "executor", "--json", "--nodes", "1",
           "--tasks", "50", "--rounds", "1", "--rescales", "0", "--no-train"]
    tmp = tmp_path / "tmp"  # the run's temporary directory: its Parsl run_dir goes after it
    tmp.mkdir()
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=580,
                          env={**os.environ, "TMPDIR": str(tmp)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert not list(tmp.glob("malleparsl-bench-noop-*"))  # one per run piled up in /tmp
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    for key in ("noop_tasks_per_s", "htex_noop_tasks_per_s", "ratio_vs_htex", "rescale_median_s"):
        assert key in out
    assert out["noop_tasks_per_s"] > 0 and out["htex_noop_tasks_per_s"] > 0
    assert out["ratio_vs_htex"] == pytest.approx(out["noop_tasks_per_s"] / out["htex_noop_tasks_per_s"])
    assert out["rescale_median_s"] is None  # --rescales 0


def test_bench_executor_rejects_bad_sizes(tmp_path):
    from typer.testing import CliRunner

    from malleparsl.cli import app

    res = CliRunner().invoke(app, ["bench", "executor", "--tasks", "0"])
    assert res.exit_code == 2  # a user's mistake: one "error: ..." line, no traceback
    assert "error: --tasks must be >= 1" in res.output
