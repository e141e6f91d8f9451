"""Replay windows: the SWF warm-up is skipped and reported; generated jobs start with the window."""

import json

import pytest
from typer.testing import CliRunner

from malleparsl.cli import app
from malleparsl.sim.windows import steady_utilisation, warmup_s
from malleparsl.traces import trace_from_fragments

runner = CliRunner()

# an 8-node machine whose replay fills over 8 h: node i idles [0, 3600 i), then 1 node at a time
FILLING = [(f"n{i}", 0.0, 3600.0 * i) for i in range(1, 9)] + [
    (f"n{i}", 40000.0 + 5000 * i, 42000.0 + 5000 * i) for i in range(1, 9)
]


def test_warmup_ends_when_utilisation_first_reaches_its_steady_level():
    tr = trace_from_fragments(FILLING).window(0, 100_000)
    assert steady_utilisation(tr) == pytest.approx(1.0)
    assert warmup_s(tr) == pytest.approx(8 * 3600)


def test_a_trace_without_warmup_skips_nothing():
    tr = trace_from_fragments([("a", 500, 600), ("b", 300, 400)]).window(0, 1000)
    assert warmup_s(tr) == 0.0


SWF = """; MaxNodes: 4
1 0 0 36000 4 -1 -1 4 36000 -1 1 1 1 1 1 -1 -1 -1
2 100 0 3600 1 -1 -1 1 3600 -1 1 1 1 1 1 -1 -1 -1
"""


def _rows(output):
    return [json.loads(line) for line in output.splitlines() if line.startswith("{")]


def test_cli_reports_and_overrides_the_swf_warmup(tmp_path):
    log = tmp_path / "tiny.swf"
    # job 1 fills the machine at once after waiting for nothing; job 2 queues behind it
    log.write_text(SWF)
    args = ["simulate", "--trace", str(log), "--nodes", "0:4", "--jobs", "poisson:3:600",
            "--hours", "0", "--policy", "static", "--no-bound", "--json"]
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    (row,) = _rows(res.stdout)
    assert row["warmup_h"] >= 0
    res = runner.invoke(app, [*args, "--warmup-h", "0"])
    assert _rows(res.stdout)[0]["warmup_h"] == 0
    bad = runner.invoke(app, [*args, "--warmup-h", "-1"])
    assert bad.exit_code == 2


def test_generated_jobs_arrive_from_the_window_start(tmp_path):
    trace = tmp_path / "idle.csv"
    trace.write_text("node,start_s,end_s\n" + "\n".join(f"n{i},0,100000" for i in range(4)) + "\n")
    res = runner.invoke(app, [
        "simulate", "--trace", str(trace), "--jobs", "poisson:4:60", "--nodes", "0:4",
        "--hours", "1", "--start-h", "20", "--policy", "hold", "--no-bound", "--json",
    ])
    assert res.exit_code == 0, res.output
    (row,) = _rows(res.stdout)
    # jobs arrive within minutes of the window start (not 20 h before it): all are submitted
    # inside the window and none waits hours
    assert row["jobs_submitted"] == 4


def test_select_case_opens_windows_as_simulate_does():
    """One function picks every replay's window: a job set's from its first submission, a
    generated set's jobs arriving from the window's start, an explicit start taken as given."""
    from malleparsl.sim.windows import select_case
    from malleparsl.traces import load_trace

    full = load_trace("summit", nodes="0:16")
    named = select_case(full, "summit", "imagenet", hours=2, start_h=None, limit=5)
    first = min(j.submit_s for j in named.specs)
    assert named.window.start_s == max(full.start_s, first)
    assert named.window.end_s == named.window.start_s + 7200
    late = select_case(full, "summit", "poisson:4:60", hours=1, start_h=30, seed=1)
    assert late.window.start_s == full.start_s + 30 * 3600
    assert all(j.submit_s >= late.window.start_s for j in late.specs)
    assert len(late.specs) == 4 and late.warmup_s == 0.0
