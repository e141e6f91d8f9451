"""Simulator job sets with memory profiles: DP-only needs several nodes, plan-aware does not."""

from __future__ import annotations

import pytest

from malleparsl.data import load_jobset
from malleparsl.sim.engine import simulate
from malleparsl.sim.plans import mean_jct_all_h, plan_jobsets, unused_node_h
from malleparsl.traces import trace_from_fragments


def test_a_third_of_the_jobs_need_several_nodes_under_dp_only() -> None:
    jobs = load_jobset("imagenet", limit=30)
    dp_only, aware = plan_jobsets(jobs, dp_nodes=(4, 16))
    large = [(d, a) for d, a in zip(dp_only, aware) if d.meta.get("memory_profile")]
    assert len(large) == 10
    assert all(d.min_nodes >= 3 for d, _ in large)  # "need" is drawn in 4..16, met to +-1
    assert sum(d.min_nodes for d, _ in large) / len(large) >= 6
    assert all(a.min_nodes == 1 for _, a in large)  # accumulation / checkpointing fit one node
    for d, a in large:  # where plain DP fits, the plan-aware curve is DP's rate
        n = d.min_nodes
        assert a.curve.rate(n) == pytest.approx(d.curve.rate(n), rel=1e-12)
        assert 0 < a.curve.rate(1) < d.curve.rate(1)  # one node works, slower than DP would


def test_plan_aware_job_runs_on_a_fragment_dp_only_cannot_use() -> None:
    jobs = load_jobset("imagenet", limit=3)
    dp_only, aware = plan_jobsets(jobs, dp_nodes=(4, 4))
    big = dp_only[2].job_id
    t0 = dp_only[2].submit_s
    tr = trace_from_fragments([(f"n{i}", t0, t0 + 7200) for i in range(2)])
    got = {name: simulate(tr, [j for j in js if j.job_id == big], policy="milp")
           for name, js in (("dp", dp_only), ("aware", aware))}
    assert got["dp"].samples == 0  # 2 idle nodes < the 4 plain DP needs
    assert got["aware"].samples > 0


def test_unused_capacity_and_jct_over_all_jobs() -> None:
    """DP-only leaves the 2-node fragment idle while its job waits; plan-aware uses it. The
    all-jobs JCT counts the unfinished DP-only job up to the window's end."""
    jobs = load_jobset("imagenet", limit=3)
    dp_only, aware = plan_jobsets(jobs, dp_nodes=(4, 4))
    big = dp_only[2].job_id
    t0 = dp_only[2].submit_s
    tr = trace_from_fragments([(f"n{i}", t0, t0 + 7200) for i in range(2)])
    got = {name: simulate(tr, [j for j in js if j.job_id == big], policy="milp")
           for name, js in (("dp", dp_only), ("aware", aware))}
    assert unused_node_h(got["dp"]) == pytest.approx(2 * 2.0, rel=1e-6)  # 2 nodes for 2 h
    assert unused_node_h(got["aware"]) < 0.1  # only the start's pause
    assert got["dp"].summary()["mean_jct_h"] is None  # nothing finished
    assert mean_jct_all_h(got["dp"]) == pytest.approx(2.0, rel=1e-6)
    assert mean_jct_all_h(got["aware"]) <= 2.0 + 1e-9


def test_bench_plans_simulator_options() -> None:
    """``bench plans --no-cpu``: the comparison with every job large and no cap, as JSON."""
    import json

    from typer.testing import CliRunner

    from malleparsl.cli import app

    runner = CliRunner()
    res = runner.invoke(app, [
        "bench", "plans", "--no-cpu", "--json", "--sim-limit", "6", "--sim-hours", "6",
        "--sim-samples-scale", "0.01", "--sim-large-every", "1", "--sim-max-active", "0",
        "--sim-dp-nodes", "8:12",
    ])
    assert res.exit_code == 0, res.output
    row = json.loads(res.stdout.strip().splitlines()[-1])
    assert row["large_jobs"] == 6 and row["limit"] == 6
    for key in ("jct_ratio_vs_dp_only", "jct_all_ratio_vs_dp_only", "samples_ratio_vs_dp_only"):
        assert row[key] is not None and row[key] > 0, key
    assert row["plan_aware"]["unused_node_h"] <= row["dp_only"]["unused_node_h"]
    bad = runner.invoke(app, ["bench", "plans", "--no-cpu", "--sim-dp-nodes", "5:3"])
    assert bad.exit_code == 2 and "--sim-dp-nodes" in bad.output
