"""``bench decisions --quick``: the default policy (``hold``) wins or ties every small case."""

import json

import pytest
from typer.testing import CliRunner

from malleparsl.cli import app
from malleparsl.data import data_dir
from malleparsl.sim.bench_decisions import QUICK

pytestmark = pytest.mark.skipif(
    not (data_dir() / "summit-idle-2021").is_dir(), reason="no reference data"
)
runner = CliRunner()
RIVALS = ["equal-share", "greedy", "milp"]


def test_default_policy_wins_or_ties_every_quick_case():
    res = runner.invoke(
        app, ["bench", "decisions", "--quick", "--json", "--policy", ",".join(["hold", *RIVALS])]
    )
    assert res.exit_code == 0, res.output
    rows = [json.loads(line) for line in res.stdout.splitlines() if line.startswith("{")]
    assert {r["case"] for r in rows} == {c.name for c in QUICK}
    for case in {r["case"] for r in rows}:
        got = {r["policy"]: r for r in rows if r["case"] == case}
        assert set(got) == {"hold", *RIVALS}
        best = max(got[p]["samples"] for p in RIVALS)
        assert got["hold"]["samples"] >= 0.995 * best, (
            case,
            {p: r["samples"] for p, r in got.items()},
        )
        for r in got.values():
            assert 0 < r["pct_of_capped_bound"] <= 100 + 1e-6
            assert r["decision_max_ms"] >= r["decision_p95_ms"] >= r["decision_median_ms"] >= 0


def test_unknown_case_is_refused():
    res = runner.invoke(app, ["bench", "decisions", "--cases", "nope"])
    assert res.exit_code == 2 and "unknown case" in res.output
