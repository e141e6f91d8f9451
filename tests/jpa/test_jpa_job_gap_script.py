"""``scripts/jpa_job_gap.py``: the per-job split of a run's gap is exact, and the advisor's view
is printed at the decisions asked for (docs/jpa-log.md, session 22)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "jpa_job_gap.py"


@pytest.fixture(scope="module")
def gap():
    spec = importlib.util.spec_from_file_location("jpa_job_gap", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_jobs_gaps_sum_to_the_runs_gap(gap):
    seen = []
    trace, specs = gap.case("dip", "0:128", 0)
    oracle, jpa = gap.replay(trace, specs, 0, on_views=lambda t, v, a: seen.append(t))
    rows = gap.job_gaps(oracle, jpa, specs)
    assert len(rows) == len(oracle.jobs) and seen  # every job, and the hook saw decisions
    assert rows.progress_gap.sum() == pytest.approx(jpa.progress - oracle.progress, rel=1e-9)
    assert (rows.samples_jpa - rows.samples_oracle).sum() == pytest.approx(
        jpa.samples - oracle.samples, rel=1e-9)
    assert (rows.node_s_jpa >= rows.run_s_jpa - 1e-6).all()
    assert list(rows.progress_gap) == sorted(rows.progress_gap)  # largest losses first


def test_the_script_prints_the_gap_a_jobs_sizes_and_the_advisors_view(gap, capsys):
    gap.main(["--family", "dip", "--nodes", "0:128", "--seed", "0", "--top", "2",
              "--job", "Z0014-dip-0-0", "--window", "73896:73897"])
    out = capsys.readouterr().out
    assert "dip 0:128 seed 0: samples" in out and "Z0014-dip-0-0" in out
    assert "--- t = 73896 s" in out and "plan [" in out and "true [" in out
    assert out.count("\noracle: ") == 1 and out.count("\njpa: ") == 1


def test_a_window_with_nothing_trained_is_an_error_not_a_division_by_zero(gap):
    with pytest.raises(SystemExit, match="trained nothing"):
        gap.main(["--family", "dip", "--nodes", "0:128", "--seed", "0", "--hours", "1"])
