"""The JPA in the simulator (curves hidden) and the ProbeFirst wrapper on its own."""

from __future__ import annotations

import math

import pytest

from malleparsl.allocator import ClusterSnapshot, JobView, make_policy
from malleparsl.errors import SpecError
from malleparsl.jpa import JobProfilingAdvisor, ProbeFirst
from malleparsl.jpa.bench import SHAPES, curve_errors, run_comparison, shaped_curve, shaped_jobs
from malleparsl.model import JobSpec, ScalingCurve
from malleparsl.sim.setups import make_setup, setup_names
from malleparsl.sim.workloads import synthetic_fragments
from malleparsl.traces import trace_from_fragments


class FixedProbes:
    def __init__(self, probes):
        self.probes = probes

    def probe_requests(self):
        return dict(self.probes)


def view(job, nodes, per_node, hi=4):
    curve = ScalingCurve.from_points({k: per_node * k for k in range(1, hi + 1)})
    return JobView(JobSpec(job, max_nodes=hi), curve, frozenset(nodes))


def test_probe_takes_free_nodes_first_then_from_the_cheapest_donor():
    snap = ClusterSnapshot(now_s=0, nodes=("n0", "n1", "n2", "n3", "n4"))
    jobs = [view("fast", {"n0", "n1"}, 100.0), view("slow", {"n2", "n3"}, 1.0),
            JobView(JobSpec("u", max_nodes=4), ScalingCurve((1,), (1e-6,)), frozenset(), 2, 2)]
    got = ProbeFirst(advisor=FixedProbes({"u": 2}), inner=make_policy("greedy")).allocate(snap, jobs)
    assert got.nodes_of("u") == {"n4", "n2"}  # the free node, then one of the slow job's
    assert got.nodes_of("fast") == {"n0", "n1"}


def test_probe_that_cannot_be_placed_leaves_the_inner_answer_alone():
    snap = ClusterSnapshot(now_s=0, nodes=("n0",))
    jobs = [view("a", {"n0"}, 10.0),
            JobView(JobSpec("u", max_nodes=4), ScalingCurve((1,), (1e-6,)), frozenset(), 2, 2)]
    got = ProbeFirst(advisor=FixedProbes({"u": 2}), inner="greedy").allocate(snap, jobs)
    assert got.size("u") == 0 and got.nodes_of("a") == {"n0"}


def test_jpa_policy_by_name_needs_an_advisor():
    with pytest.raises(SpecError, match="milp\\+jpa"):
        make_policy("jpa")
    pol = make_policy("jpa", advisor=JobProfilingAdvisor(), inner="greedy")
    assert isinstance(pol, ProbeFirst)


def test_setups_are_registered_and_hide_curves():
    names = setup_names()
    assert {"milp+jpa", "milp+jpa-nopriors", "milp-linear", "milp-perturbed", "jpa"} <= set(names)
    pol, adv, hide = make_setup("milp+jpa")
    assert isinstance(pol, ProbeFirst) and isinstance(adv, JobProfilingAdvisor) and hide
    assert adv.warmup_obs == 0  # the simulator drops warm-up itself
    _, lin, hide = make_setup("milp-linear")
    assert not hide and type(lin).__name__ == "LinearFromOneNode"


def test_linear_from_one_node_views_carry_the_reported_progress():
    """Like KnownCurves and the JPA: a policy valuing a grow over the job's remaining time
    (hold, priorities) must see the samples left, not the spec's total."""
    from malleparsl.allocator.base import ClusterSnapshot
    from malleparsl.controller import JobState
    from malleparsl.jpa.sim_setups import LinearFromOneNode
    from malleparsl.model import Allocation, JobSpec, ScalingCurve

    spec = JobSpec("a", max_nodes=4, total_samples=1e6, curve=ScalingCurve((1, 4), (10.0, 40.0)))
    snap = ClusterSnapshot(now_s=0.0, nodes=("n0", "n1"))
    (v,) = LinearFromOneNode(noise=0.0).views(snap, [JobState(spec, done_samples=4e5)],
                                              Allocation({}))
    assert v.remaining == pytest.approx(6e5) and v.attained_samples == 4e5
    assert v.curve.rate(4) == pytest.approx(40.0)  # linear from the one-node rate


@pytest.mark.parametrize("shape", SHAPES)
def test_generated_shapes_are_what_they_claim(shape):
    import numpy as np

    c = shaped_curve(np.random.default_rng(1), shape, 64, shape)
    r = c.rates_upto(64)
    if shape == "two-node-drop":
        assert r[2] < 2 * r[1]
    if shape == "peaked":
        assert r[64] < max(r)
    assert all(math.isfinite(v) and v >= 0 for v in r)


@pytest.mark.slow
def test_jpa_with_hidden_curves_gets_close_to_the_oracle_on_generated_shapes():
    # more nodes than jobs, so sizes (where linear scaling is wrong) matter; nobody finishes
    frags = synthetic_fragments(n_nodes=32, duration_s=6 * 3600, mean_idle_s=4000,
                                mean_busy_s=4000, seed=3)
    tr = trace_from_fragments(frags, start_s=0.0, end_s=6 * 3600)
    jobs = shaped_jobs(n_jobs=6, start_s=0.0, seed=5, max_nodes=32, mean_interarrival_s=60)
    rows = {r["setup"]: r for r in run_comparison(
        tr, jobs, setups=["milp", "milp+jpa-nopriors", "milp-linear", "equal-share"])}
    jpa = rows["milp+jpa-nopriors"]
    print({k: (round(v["pct_of_oracle"], 1), v.get("profiling_share")) for k, v in rows.items()})
    assert jpa["pct_of_oracle"] >= 85.0
    assert jpa["samples"] > rows["milp-linear"]["samples"]
    assert jpa["samples"] > rows["equal-share"]["samples"]
    assert jpa["profiling_share"] <= 0.05
    assert jpa["mape_final"] <= 0.10


def test_curve_errors_compare_against_the_truth():
    jpa = JobProfilingAdvisor(warmup_obs=0)
    truth = ScalingCurve.amdahl(rate1=100.0, parallel_fraction=0.9, max_nodes=8)
    jpa.register(JobSpec("a", max_nodes=8), now_s=0)
    for k in (1, 2, 4):
        jpa.observe("a", k, truth.rate(k) * 1.05, now_s=k)  # 5 % high everywhere
    jpa.records["a"].ran_ns.update({1: 10.0, 4: 10.0})
    final, decision = curve_errors(jpa, {"a": truth})
    assert final == pytest.approx(0.05, abs=0.02) and math.isnan(decision)


def test_bench_jpa_on_a_users_job_set_reports_both_measures_in_strict_json(tmp_path):
    """A user's own measured curves (a job CSV and its ``_curves.csv``, as the issue's held-out
    set comes): the table shows % of the oracle in samples and in normalised progress (it
    showed samples only), and ``--json`` stays strict JSON when no oracle ran (it printed NaN)."""
    import json

    from typer.testing import CliRunner

    from malleparsl.cli import app

    (tmp_path / "mine_curves.csv").write_text(
        "model,nodes,samples_per_s\n"
        + "".join(f"dipper,{n},{r}\n" for n, r in [(0, 0), (1, 100), (2, 60), (3, 120), (8, 300)])
        + "".join(f"peaker,{n},{r}\n" for n, r in [(0, 0), (1, 2), (4, 7), (8, 12), (16, 6)]))
    jobs = tmp_path / "mine.csv"  # submitted 12 h in: before that, 0:32 has no idle node
    jobs.write_text("job,model,min_nodes,max_nodes,total_samples,rescale_up_s,rescale_down_s,submit_s\n"
                    + "".join(f"J{i},{m},1,16,{t},10,5,{43200 + 600 * i}\n"
                              for i, (m, t) in enumerate([("dipper", 2e6), ("peaker", 4e4)] * 3)))
    run = CliRunner().invoke(app, ["bench", "jpa", "--jobs", str(jobs), "--nodes", "0:32",
                                   "--hours", "6", "--setups", "milp,milp+jpa"])
    assert run.exit_code == 0, run.output
    lines = run.output.splitlines()
    head = next(line for line in lines if line.startswith("setup"))
    assert "% oracle" in head and "% progress" in head
    oracle = next(line for line in lines if line.startswith("milp "))
    assert oracle.count("100.0%") == 2
    alone = CliRunner().invoke(app, ["bench", "jpa", "--jobs", str(jobs), "--nodes", "0:32",
                                     "--hours", "6", "--setups", "milp+jpa", "--json"])
    assert alone.exit_code == 0, alone.output
    row = json.loads(alone.output.strip().splitlines()[-1],
                     parse_constant=lambda c: pytest.fail(f"not strict JSON: {c}"))
    assert row["pct_of_oracle"] is None and row["pct_progress"] is None
    assert row["progress"] > 0 and 0 <= row["profiling_share"] <= 1


def _small_case():
    frags = synthetic_fragments(n_nodes=16, duration_s=3 * 3600, mean_idle_s=3000,
                                mean_busy_s=3000, seed=2)
    tr = trace_from_fragments(frags, start_s=0.0, end_s=3 * 3600)
    return tr, shaped_jobs(n_jobs=4, start_s=0.0, seed=4, max_nodes=16, mean_interarrival_s=60)


def test_perturbed_curves_with_no_error_replay_the_oracle_exactly():
    """``milp-perturbed`` is the yardstick of what the figures resolve: at error 0 it must be
    the oracle itself, run for run, and at 20 % it must plan differently."""
    tr, jobs = _small_case()
    rows = {r["setup"]: r for r in run_comparison(
        tr, jobs, setups=["milp", "milp-perturbed:error=0", "milp-perturbed:error=0.2"])}
    assert rows["milp-perturbed:error=0"]["samples"] == rows["milp"]["samples"]
    assert rows["milp-perturbed:error=0"]["rescales"] == rows["milp"]["rescales"]
    assert rows["milp-perturbed:error=0.2"]["samples"] != rows["milp"]["samples"]


def test_perturbed_curves_err_by_the_given_amount_per_job_and_size():
    from malleparsl.jpa.sim_setups import PerturbedCurves

    truth = ScalingCurve.amdahl(rate1=50.0, parallel_fraction=0.95, max_nodes=400)
    specs = [JobSpec(f"j{i}", max_nodes=400, curve=truth) for i in range(5)]
    adv = PerturbedCurves(error=0.05, seed=3)
    rel = [adv.curve(s).rate(n) / truth.rate(n) - 1 for s in specs for n in range(1, 401)]
    sd = math.sqrt(sum(r * r for r in rel) / len(rel))
    assert 0.045 < sd < 0.055 and abs(sum(rel) / len(rel)) < 0.005
    # a job's draw depends on the seed and its id, not on which jobs came before it
    again = PerturbedCurves(error=0.05, seed=3)
    assert again.curve(specs[4]) == adv.curve(specs[4])
    assert PerturbedCurves(error=0.05, seed=4).curve(specs[4]) != adv.curve(specs[4])
    assert PerturbedCurves(error=0.05, seed=3, draw=1).curve(specs[4]) != adv.curve(specs[4])
    assert adv.curve(specs[0]).rate(401) == adv.curve(specs[0]).rate(400)  # flat past max_nodes


def test_perturbed_curves_need_the_true_curves_and_a_sane_error():
    from malleparsl.jpa.sim_setups import PerturbedCurves

    with pytest.raises(SpecError, match="error must be"):
        make_setup("milp-perturbed", error=float("nan"))
    with pytest.raises(SpecError, match="draw must be"):
        make_setup("milp-perturbed", draw=-1)
    with pytest.raises(SpecError, match="no curve to perturb"):
        PerturbedCurves().curve(JobSpec("blind", max_nodes=4))


def test_a_labelled_jpa_setup_passes_its_options_to_the_advisor():
    """``milp+jpa:kappa=2`` in ``bench jpa --setups`` is the same replay as advisor_options
    (and not the default one: on this case ``kappa=0`` happens to replay the default)."""
    tr, jobs = _small_case()
    (lab,) = run_comparison(tr, jobs, setups=["milp+jpa:kappa=2"])
    (opt,) = run_comparison(tr, jobs, setups=["milp+jpa"], advisor_options={"kappa": 2})
    (dflt,) = run_comparison(tr, jobs, setups=["milp+jpa"])
    assert lab["setup"] == "milp+jpa:kappa=2"
    assert (lab["samples"], lab["rescales"]) == (opt["samples"], opt["rescales"])
    assert (lab["samples"], lab["rescales"]) != (dflt["samples"], dflt["rescales"])
