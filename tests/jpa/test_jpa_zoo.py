"""The curve zoo, the JPA's robust estimate on it, priors across jobs, and the zoo bench."""

from __future__ import annotations

import math

import numpy as np
import pytest

from malleparsl.errors import SpecError
from malleparsl.jpa import JobProfilingAdvisor
from malleparsl.jpa.bench_zoo import parse_families, parse_seeds, summarise
from malleparsl.jpa.estimate import estimate, ground_truth
from malleparsl.jpa.models import Samples
from malleparsl.jpa.zoo import FAMILIES, HELD_OUT, PUBLISHED, family_curves, zoo_jobs
from malleparsl.model import JobSpec, ScalingCurve
from malleparsl.sim.engine import simulate
from malleparsl.traces import trace_from_fragments


def rates(c: ScalingCurve, n: int = 64) -> np.ndarray:
    return c.rates_upto(min(n, c.max_measured))


@pytest.mark.parametrize("family", list(FAMILIES))
def test_families_are_seeded_valid_and_repeat_their_models(family):
    a = zoo_jobs(family, seed=3, n_jobs=40, start_s=100.0)
    b = zoo_jobs(family, seed=3, n_jobs=40, start_s=100.0)
    assert [(j.job_id, j.curve, j.total_samples) for j in a] == [
        (j.job_id, j.curve, j.total_samples) for j in b]
    assert len({j.model for j in a}) < len(a)  # models repeat: priors can help
    for j in a:
        r = rates(j.curve)
        assert np.all(np.isfinite(r)) and np.all(r[1:] > 0) and j.submit_s > 100.0
        assert j.max_nodes <= j.curve.max_measured  # never beyond what the curve states
    if family != "published":
        assert zoo_jobs(family, seed=4, n_jobs=5)[0].curve != a[0].curve


def test_dip_loses_at_two_nodes_and_recovers_only_later():
    for c in family_curves("dip", seed=0) + family_curves("dip", seed=1):
        r = rates(c)
        assert 0.55 <= r[2] / r[1] <= 0.8
        first_above = int(np.argmax(r[2:] > r[1])) + 2
        assert 3 <= first_above <= 5


def test_peak_rises_to_a_peak_and_declines():
    peaks = []
    for s in range(4):
        for c in family_curves("peak", seed=s):
            r = rates(c)
            k = int(np.argmax(r))
            assert 4 <= k <= 16 and r[64] < 0.9 * r[k]
            peaks.append(k)
    assert {8, 12} <= set(peaks)


def test_composite_has_every_feature_the_issue_names_in_its_curves():
    """Dips at the first multi-node size, peaks at 8-16 then declines, irregular points, rates
    over four orders of magnitude, a few hours of work at one node, all in one family."""
    cs = [c for s in range(4) for c in family_curves("composite", seed=s)]
    rs = [rates(c) for c in cs]
    assert sum(r[2] < r[1] for r in rs) >= 6  # a drop at 2 nodes...
    assert all(np.max(r[3:]) > r[1] for r in rs)  # ...passed again later
    peaked = [r for r in rs if 8 <= int(np.argmax(r)) <= 20 and r[64] < 0.5 * np.max(r)]
    assert len(peaked) >= 6
    # irregular: second differences of the log rate change sign far more often than a smooth curve's
    flips = [np.mean(np.diff(np.sign(np.diff(np.log(r[1:]), 2))) != 0) for r in rs]
    assert np.median(flips) > 0.3
    r1 = [c.rate(1) for c in cs]
    assert max(r1) / min(r1) > 1e3
    hours = [j.total_samples / j.curve.rate(1) / 3600 for j in zoo_jobs("composite", n_jobs=30)]
    assert min(hours) >= 1.5 and max(hours) <= 6.0
    assert "composite" in HELD_OUT


def test_a_family_added_later_leaves_the_others_curves_as_they_were():
    """Each family draws from its own stream: every figure in docs/jpa-log.md stays reproducible."""
    assert family_curves("dip", seed=0)[0].rate(2) == pytest.approx(1779.2949509724212, rel=1e-12)
    assert family_curves("step", seed=0)[0].rate(1) == pytest.approx(1930.9752392674798, rel=1e-12)
    assert family_curves("rates", seed=0)[0].rate(1) == pytest.approx(0.715178175073471, rel=1e-12)
    short = zoo_jobs("short", seed=1, n_jobs=3)[2]
    assert short.job_id == "Z0002-short-1-3"
    assert short.total_samples == pytest.approx(3474674.680481874, rel=1e-12)


def test_rates_span_four_orders_of_magnitude_and_short_long_jobs():
    r1 = [c.rate(1) for s in range(4) for c in family_curves("rates", seed=s)]
    assert max(r1) / min(r1) > 1e3
    hours = [j.total_samples / j.curve.rate(1) / 3600 for j in zoo_jobs("short", n_jobs=30)]
    assert min(hours) >= 1.0 and max(hours) <= 4.0
    hours = [j.total_samples / j.curve.rate(1) / 3600 for j in zoo_jobs("long", n_jobs=30)]
    assert min(hours) >= 30.0


def test_published_curves_are_the_cited_measurements():
    cs = {c.name: c for c in family_curves("published")}
    assert set(cs) == set(PUBLISHED)
    assert cs["bert-b32-tf1"].rate(16) == pytest.approx(1090.20)
    assert cs["rn50-oneflow"].rate(32) == pytest.approx(11711.18)
    assert "published" in HELD_OUT


def test_unknown_family_and_bad_specs_are_named():
    with pytest.raises(SpecError, match="nosuch"):
        zoo_jobs("nosuch")
    with pytest.raises(SpecError, match="nosuch"):
        parse_families("zoo:nosuch")
    assert set(parse_families("zoo:held-out")) == HELD_OUT
    assert parse_seeds("0-3") == [0, 1, 2, 3] and parse_seeds("1,5") == [1, 5]
    assert parse_seeds("0-1,24-25,7") == [0, 1, 24, 25, 7]  # ranges and seeds together
    assert parse_seeds("2,0-3") == [2, 0, 1, 3]
    for bad in ("a-b", "3-0", "0-3,", "", "1-2-3"):
        with pytest.raises(SpecError, match="seeds"):
            parse_seeds(bad)


# ---- the robust estimate ----------------------------------------------------------------
def test_measured_points_win_when_no_structure_fits():
    # one-node rate 100, 40 % lost at 2 nodes, above 100 again only at 3: no cost model fits
    own = Samples.of([1, 2, 4], [100.0, 60.0, 150.0], [2, 2, 2])
    est = ground_truth(estimate(own, n_max=16, noise_rel=0.03), own, noise_rel=0.03)
    assert est.model_free
    for n, r in zip([1, 2, 4], [100.0, 60.0, 150.0]):
        assert est.rate(n) == pytest.approx(r)
        assert est.rel_sigma(n) < 0.05  # measured: known to the measurement error
    assert est.rate(3) == pytest.approx(105.0)  # joined linearly
    assert est.rel_sigma(3) > 0.1  # ... with an explicit uncertainty between points
    assert est.rate(16) == pytest.approx(150.0)  # flat beyond measured: growth not assumed
    assert est.sigma[16] > est.sigma[8] > est.sigma[4]  # uncertainty grows per doubling


def test_a_structure_that_fits_is_kept():
    truth = ScalingCurve.amdahl(rate1=100.0, parallel_fraction=0.9, max_nodes=16)
    own = Samples.of([1, 2, 4], [truth.rate(k) for k in (1, 2, 4)], [2, 2, 2])
    fitted = estimate(own, n_max=16, noise_rel=0.03)
    assert ground_truth(fitted, own, noise_rel=0.03) is fitted


def test_model_free_job_is_extrapolated_as_far_as_a_fitted_one():
    # it used to be held to one doubling (flat past 8 here): the decision efficiency showed
    # that cap blocking growths the true curves pay for, never gaining in the same state
    jpa = JobProfilingAdvisor(warmup_obs=0)
    jpa.register(JobSpec("d", max_nodes=32, total_samples=1e12), now_s=0)
    for k, r in [(1, 100.0), (2, 60.0), (4, 150.0)]:
        for t in range(2):
            jpa.observe("d", k, r, now_s=float(t))
    rec = jpa.records["d"]
    assert rec.estimate(32, default_noise=0.05).model_free
    r = jpa.planning_curve(rec, 32).rates_upto(32)
    assert r[16] > r[8] > r[4] and r[17] == pytest.approx(r[16]) and r[32] == pytest.approx(r[16])
    assert r[16] < 16 * 100.0 and r[8] < 2 * 150.0  # flat mean, modest optimism, linear bound
    assert r[2] <= 2 * 60.0  # the measured dip is not planned away


def test_nearly_done_job_is_not_sent_to_unmeasured_sizes():
    jpa = JobProfilingAdvisor(warmup_obs=0, explore_min_s=3600.0)
    jpa.register(JobSpec("s", max_nodes=16, total_samples=100.0 * 1800), now_s=0)
    for t in range(2):
        jpa.observe("s", 2, 100.0, now_s=float(t))
    r = jpa.planning_curve(jpa.records["s"], 16).rates_upto(16)
    assert r[16] == pytest.approx(r[2])  # 30 min of work left at 2 nodes: stays measured


# ---- priors across jobs ---------------------------------------------------------------------
def test_a_job_of_a_running_model_starts_from_its_measurements():
    jpa = JobProfilingAdvisor(warmup_obs=0)
    jpa.register(JobSpec("a", max_nodes=8, model="m"), now_s=0)
    for k, r in [(1, 100.0), (4, 300.0)]:
        for t in range(2):
            jpa.observe("a", k, r, now_s=float(t))
    jpa.register(JobSpec("b", max_nodes=8, model="m"), now_s=10)
    rec = jpa.records["b"]
    assert jpa.predictable(rec) and set(rec.explored()) == {1, 4}
    assert jpa.probe_requests() == {}
    jpa.register(JobSpec("c", max_nodes=8, model="other"), now_s=10)
    assert not jpa.predictable(jpa.records["c"])


def test_a_poorly_explored_finished_job_does_not_replace_a_rich_prior():
    jpa = JobProfilingAdvisor(warmup_obs=0)
    for jid, sizes in [("a", (1, 2, 4, 8)), ("b", (1,))]:
        jpa.register(JobSpec(jid, max_nodes=8, model="m"), now_s=0)
        for k in sizes:
            for t in range(2):
                jpa.observe(jid, k, 100.0 * k**0.8, now_s=float(t))
    jpa.forget("a")
    jpa.forget("b")
    assert jpa.priors["m"].measured == (1, 2, 4, 8)


# ---- simulator progress and the bench summary ---------------------------------------------------
def test_normalised_progress_counts_each_job_once():
    tr = trace_from_fragments([("n1", 0, 1000), ("n2", 0, 1000)])
    lin = ScalingCurve((1, 2), (1.0, 2.0))
    fast = ScalingCurve((1, 2), (1000.0, 2000.0))
    jobs = [JobSpec("slow", max_nodes=1, total_samples=2000.0, curve=lin),
            JobSpec("fast", max_nodes=1, total_samples=2e6, curve=fast)]
    r = simulate(tr, jobs, policy="static")
    done = r.jobs.set_index("job")["samples"]
    assert r.progress == pytest.approx(done["slow"] / 2000.0 + done["fast"] / 2e6)
    assert 0 < r.summary()["progress"] <= 2.0


def test_summary_reports_held_out_families_apart():
    rows = []
    for fam, pct in [("dip", 90.0), ("step", 80.0)]:
        for seed in (0, 1):
            rows.append({"kind": "run", "family": fam, "nodes": "0:128", "seed": seed,
                         "setup": "milp+jpa", "pct_samples": pct + seed, "pct_progress": pct,
                         "profiling_share": 0.01, "mape_decision": 0.1})
    out = summarise(rows)
    fam = {f["family"]: f for f in out if f["kind"] == "family"}
    assert fam["dip"]["pct_samples_mean"] == 90.5 and fam["dip"]["pct_samples_min"] == 90.0
    assert fam["step"]["held_out"] and not fam["dip"]["held_out"]
    pooled = {p["part"]: p for p in out if p["kind"] == "pooled"}
    assert pooled["held-out"]["pct_samples_mean"] == 80.5
    assert pooled["tuned"]["pct_progress_min"] == 90.0
    assert not math.isnan(pooled["tuned"]["profiling_share_max"])


@pytest.mark.slow
def test_bench_jpa_on_the_zoo_prints_rows_and_the_held_out_summary():
    from typer.testing import CliRunner

    from malleparsl.cli import app

    res = CliRunner().invoke(app, [
        "bench", "jpa", "--jobs", "zoo:dip,step", "--nodes", "0:32", "--hours", "14",
        "--seeds", "0", "--setups", "milp,milp+jpa,milp-linear", "--json"])
    assert res.exit_code == 0, res.output
    rows = [__import__("json").loads(line) for line in res.output.splitlines() if line.strip()]
    runs = [r for r in rows if r["kind"] == "run"]
    assert {(r["family"], r["setup"]) for r in runs} == {
        (f, s) for f in ("dip", "step") for s in ("milp", "milp+jpa", "milp-linear")}
    oracle = [r["pct_samples"] for r in runs if r["setup"] == "milp"]
    assert all(p is None or p == pytest.approx(100.0) for p in oracle)  # None: no idle node
    assert any(p is not None for p in oracle)
    jpa = next(r for r in runs if r["setup"] == "milp+jpa" and r["progress"] > 0)
    assert 0 <= jpa["profiling_share"] <= 1
    parts = {r["part"] for r in rows if r["kind"] == "pooled"}
    assert parts == {"tuned", "held-out"}
    bad = CliRunner().invoke(app, ["bench", "jpa", "--jobs", "zoo:nope", "--nodes", "0:16"])
    assert bad.exit_code != 0


def test_nearly_done_uses_the_reported_progress_else_its_own_estimate():
    """The remaining-work check reads the controller's reported progress where there is one:
    the JPA's own integral (``done_est``) only counts the node-time it saw allocated, so a job
    whose progress came from before (or off) its accounting looked 10 h from done."""
    from malleparsl.allocator.base import ClusterSnapshot
    from malleparsl.controller import JobState
    from malleparsl.model import Allocation

    spec = JobSpec("s", max_nodes=16, total_samples=100.0 * 36000)  # 10 h at 2 nodes
    snap = ClusterSnapshot(now_s=10.0, nodes=tuple(f"n{i}" for i in range(16)))

    def plan(done):
        jpa = JobProfilingAdvisor(warmup_obs=0, explore_min_s=3600.0)
        jpa.register(spec, now_s=0)
        for t in range(2):
            jpa.observe("s", 2, 100.0, now_s=float(t))
        return jpa.views(snap, [JobState(spec, done_samples=done)], Allocation({}))[0].curve

    near = plan(spec.total_samples - 100.0 * 1800)  # 30 min left at 2 nodes
    assert near.rate(16) == pytest.approx(near.rate(2))  # stays where measured
    far = plan(0.0)  # no report: the estimate (nothing done) -> worth measuring more sizes
    assert far.rate(16) > far.rate(2)
