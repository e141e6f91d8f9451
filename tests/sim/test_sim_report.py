"""Report helpers and the horizon estimator: numbers checked by hand."""

import numpy as np
import pandas as pd
import pytest

from malleparsl.controller import Controller
from malleparsl.errors import SpecError
from malleparsl.report import binned_mean, plot_nodes_per_job, table_markdown
from malleparsl.sim.horizon import FragmentHorizon
from malleparsl.sim.setups import make_setup


def test_binned_mean_is_time_weighted():
    # 10 on [0, 5), 20 on [5, 10): bins of 2.5 s -> 10, 10, 20, 20; one bin -> 15
    x, y = binned_mean(np.array([0.0, 5.0]), np.array([10.0, 20.0]), 0, 10, bins=4)
    assert list(x) == [0, 2.5, 5, 7.5] and list(y) == pytest.approx([10, 10, 20, 20])
    _, y = binned_mean(np.array([0.0, 5.0]), np.array([10.0, 20.0]), 0, 10, bins=1)
    assert y[0] == pytest.approx(15)
    _, y = binned_mean(np.array([2.0, 4.0]), np.array([10.0, 0.0]), 0, 4, bins=2)
    assert list(y) == pytest.approx([0, 10])  # nothing before the first step


def test_table_markdown_formats_missing_values():
    md = table_markdown([{"policy": "milp", "samples": 1.5e9, "pct_of_upper_bound": None}])
    assert md.splitlines()[2].startswith("| milp | 1.5e+09 | - |")


def test_nodes_per_job_plot_writes_png(tmp_path):
    sizes = pd.DataFrame([(0, "a", 2), (5, "b", 1), (8, "a", 0)], columns=["time_s", "job", "nodes"])
    p = plot_nodes_per_job(sizes, 0, 10, tmp_path / "n.png", top=1)
    assert p.read_bytes()[:4] == b"\x89PNG"


def test_horizon_is_the_mean_residual_life():
    h = FragmentHorizon(min_samples=1, prior_s=777)
    assert h.remaining(np.array([0.0]))[0] == 777  # nothing seen yet: the prior
    for length in [100] * 50 + [1000] * 50:
        h.record(length)
    r = h.remaining(np.array([0.0, 500.0, 5000.0]))
    assert r[0] == pytest.approx(550, rel=0.01)  # E[L]
    assert r[1] == pytest.approx(500, rel=0.01)  # E[L - 500 | L > 500] = 1000 - 500
    assert r[2] == pytest.approx(5000)  # older than anything seen: as long again


def test_horizon_fills_controller_snapshots_and_keeps_known_ends():
    h = FragmentHorizon(min_samples=1)
    for _ in range(10):
        h.record(600)
    c = Controller(policy=make_setup("static")[0], horizon=h)
    c.add_nodes(["a"], now_s=0, end_s={"a": 50.0})
    c.add_nodes(["b"], now_s=100)
    snap = c.snapshot(400)
    assert snap.node_end_s["a"] == 50.0
    assert snap.node_end_s["b"] == pytest.approx(400 + 300, rel=0.03)


def test_history_pretrains_the_horizon_like_one_record_per_fragment():
    lengths = np.array([50.0, 120.0, 120.0, 4000.0, 9e5])
    a, b = FragmentHorizon(min_samples=1), FragmentHorizon(min_samples=1)
    a.record_many(lengths)
    for x in lengths:
        b.record(x)
    ages = np.array([0.0, 100.0, 3000.0])
    assert a.samples == b.samples == 5
    assert a.remaining(ages) == pytest.approx(b.remaining(ages))


def test_horizon_quantiles_of_the_remaining_time():
    h = FragmentHorizon(min_samples=1, quantile=0.25)
    h.record_many(np.array([100.0] * 50 + [1000.0] * 50))
    assert h.remaining(np.array([0.0]))[0] == pytest.approx(100, rel=0.03)
    assert h.remaining(np.array([500.0]))[0] == pytest.approx(500, rel=0.03)
    h.quantile = 0.75
    assert h.remaining(np.array([0.0]))[0] == pytest.approx(1000, rel=0.03)
    with pytest.raises(SpecError, match="quantile"):
        FragmentHorizon(quantile=1.5)



def _render(rows, width):
    from rich.console import Console

    from malleparsl.report import rich_table

    console = Console(width=width, record=True, color_system=None)
    console.print(rich_table(rows))
    return console.export_text()


def test_terminal_table_keeps_policy_names_whole():
    # the figures of `malleparsl simulate --hours 24` (summit 0:128, imagenet), milp's row
    row = {"samples": 1.307e9, "samples_per_s": 15124, "pct_of_upper_bound": 51.5,
           "pct_of_capped_bound": 93.7, "utilisation": 1.0, "rescales": 427, "pause_s": 7420,
           "preempt_pause_s": 973, "jobs_done": 7, "mean_jct_h": 8.79, "solver_median_ms": 2.0,
           "solver_p95_ms": 3.0, "solver_max_ms": 26, "wall_s": 1.2}
    rows = [{**row, "policy": p} for p in ("milp", "equal-share", "upper-bound", "upper-bound-capped")]
    for width in (120, 180):
        text = _render(rows, width)
        for p in ("equal-share", "upper-bound-capped", "upper-bound "):
            assert p in text, (width, text)  # before: both upper-bound rows read "upper-bou…"
    # at the width `malleparsl simulate` prints with when piped, no cell is cut at all
    assert "…" not in _render(rows, 180)
