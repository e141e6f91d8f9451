"""``bench worst-decisions``: the slowest decisions of a replay, dumped and re-solved alone."""

import json

import pytest
from typer.testing import CliRunner

from malleparsl.cli import app
from malleparsl.data import data_dir

pytestmark = pytest.mark.skipif(
    not (data_dir() / "summit-idle-2021").is_dir(), reason="no reference data"
)
runner = CliRunner()


def _rows(res):
    assert res.exit_code == 0, res.output
    return [json.loads(line) for line in res.stdout.splitlines() if line.startswith("{")]


def test_slowest_decisions_are_dumped_and_resolve_to_the_same_optimum(tmp_path):
    rows = _rows(runner.invoke(app, [
        "bench", "worst-decisions", "--nodes", "0:16", "--hours", "4", "--top", "2",
        "--dump", str(tmp_path),
    ]))
    head, worst = rows[0], rows[1:]
    assert head["decisions"] > len(worst) == 2
    for kind in ("wall", "cpu"):
        assert head[f"{kind}_max_ms"] >= head[f"{kind}_p95_ms"] >= head[f"{kind}_median_ms"] >= 0
    assert worst[0]["cpu_ms"] >= worst[1]["cpu_ms"]
    assert {"jobs", "nodes", "options", "kept", "status"} <= set(worst[0])
    dumped = tmp_path / "worst_0.pkl"
    exact = _rows(runner.invoke(app, ["bench", "worst-decisions", "--resolve", str(dumped),
                                      "--repeats", "1"]))[0]
    solver = _rows(runner.invoke(app, [
        "bench", "worst-decisions", "--resolve", str(dumped), "--repeats", "1",
        "--option", "dp=false", "--option", "time_limit_s=30",
    ]))[0]
    assert exact["jobs"] == worst[0]["jobs"] and exact["nodes"] == worst[0]["nodes"]
    assert exact["objective"] == pytest.approx(solver["objective"], rel=1e-6)


def test_bad_policy_option_is_refused():
    res = runner.invoke(app, ["bench", "worst-decisions", "--option", "nokey"])
    assert res.exit_code == 2
    assert "KEY=VALUE" in res.output
