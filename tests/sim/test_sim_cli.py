"""``malleparsl simulate`` end to end: JSON lines, the table, --out files, bad input."""

import json

import pytest
from typer.testing import CliRunner

from malleparsl.cli import app
from malleparsl.data import data_dir

runner = CliRunner()
KEYS = {"policy", "samples", "pct_of_upper_bound", "utilisation", "rescales", "jobs_done",
        "solver_p95_ms", "wall_s"}


def _json_rows(output):
    return [json.loads(line) for line in output.splitlines() if line.startswith("{")]


@pytest.mark.skipif(not (data_dir() / "summit-idle-2021").is_dir(), reason="no reference data")
def test_simulate_summit_slice_prints_one_json_object_per_policy():
    res = runner.invoke(app, [
        "simulate", "--trace", "summit", "--jobs", "shufflenet-10", "--nodes", "0:32",
        "--hours", "3", "--policy", "static,greedy", "--json",
    ])
    assert res.exit_code == 0, res.output
    rows = _json_rows(res.stdout)
    assert [r["policy"] for r in rows] == ["static", "greedy", "upper-bound-capped", "upper-bound"]
    for r in rows:
        assert set(r) >= KEYS
        assert 0 <= r["utilisation"] <= 1 + 1e-9
    assert rows[-1]["pct_of_upper_bound"] == pytest.approx(100)
    assert all(r["pct_of_upper_bound"] <= 100 + 1e-6 for r in rows)


def test_simulate_user_csv_with_generated_jobs_writes_the_report(tmp_path):
    trace = tmp_path / "idle.csv"
    rows = [f"n{i},{i * 60},{4000 + i * 300}" for i in range(8)]
    trace.write_text("node,start_s,end_s\n" + "\n".join(rows) + "\n")
    out = tmp_path / "out"
    res = runner.invoke(app, [
        "simulate", "--trace", str(trace), "--jobs", "poisson:5:300", "--nodes", "0:8",
        "--hours", "0", "--policy", "static", "--out", str(out),
    ])
    assert res.exit_code == 0, res.output
    assert "static" in res.output and "% of bound" in res.output
    names = {p.name for p in out.iterdir()}
    assert {"summary.json", "summary.md", "idle_nodes.png", "throughput.png",
            "events_static.csv", "sizes_static.csv", "jobs_static.csv"} <= names
    summary = json.loads((out / "summary.json").read_text())
    assert {r["policy"] for r in summary} == {"static", "upper-bound", "upper-bound-capped"}
    assert (out / "throughput.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--policy", "nope"], "unknown policy"),
        (["--nodes", "9:3"], "END must be greater"),
        (["--jobs", "poisson:x"], "poisson:N"),
    ],
)
def test_bad_options_are_explained(tmp_path, args, message):
    trace = tmp_path / "idle.csv"
    trace.write_text("node,start_s,end_s\na,0,100\n")
    res = runner.invoke(app, ["simulate", "--trace", str(trace), "--jobs", "poisson:2", *args])
    assert res.exit_code != 0
    assert message in res.output
