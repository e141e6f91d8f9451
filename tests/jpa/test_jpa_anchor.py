"""Measured points as ground truth only beyond their noise; a given curve is planned as given."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from malleparsl.jpa.advisor import JobProfilingAdvisor
from malleparsl.jpa.estimate import MISFIT_SIGMAS, estimate, ground_truth
from malleparsl.jpa.models import Samples
from malleparsl.jpa.zoo import zoo_jobs
from malleparsl.model import JobSpec, ScalingCurve

SIZES = [1, 2, 4, 8, 16]


def _fit(p: float, n_max: int = 32):
    truth = ScalingCurve.amdahl(rate1=100.0, parallel_fraction=p, max_nodes=n_max)
    pts = Samples.of(SIZES, [truth.rate(k) for k in SIZES], [2] * len(SIZES))
    return truth, estimate(pts, n_max=n_max, noise_rel=0.03)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(p=st.floats(0.5, 0.999), eps=st.lists(st.floats(-0.99, 0.99), min_size=5, max_size=5))
def test_readings_within_their_noise_do_not_bend_the_fit(p, eps):
    """Points that agree with the fit within 3 standard errors leave it as it is."""
    _, est = _fit(p)
    se = 0.03 / np.sqrt(2)
    # the misfit rule measures the fit relative to the reading: fit / reading - 1
    rates = [est.rate(k) / (1 + e * MISFIT_SIGMAS * se) for k, e in zip(SIZES, eps)]
    pts = Samples.of(SIZES, rates, [2] * len(SIZES))
    assert ground_truth(est, pts, noise_rel=0.03) is est


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(p=st.floats(0.5, 0.999), at=st.sampled_from(SIZES), off=st.floats(0.07, 0.3),
       sign=st.sampled_from([-1.0, 1.0]))
def test_a_point_beyond_its_noise_is_planned_as_measured(p, at, off, sign):
    """A point the fit misses by more than its noise is ground truth (model-free)."""
    _, est = _fit(p)
    rates = [est.rate(k) * (1 + sign * off if k == at else 1.0) for k in SIZES]
    pts = Samples.of(SIZES, rates, [2] * len(SIZES))
    got = ground_truth(est, pts, noise_rel=0.03)
    assert got.model_free
    for k, r in zip(SIZES, rates):
        assert got.rate(k) == pytest.approx(r, rel=1e-9)
    assert got.rel_sigma(at) <= 0.03  # known to its standard error there


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(r1=st.floats(1.0, 1e4), drop=st.floats(0.2, 0.5), p=st.floats(0.8, 0.99))
def test_a_given_curve_is_planned_as_given(r1, drop, p):
    """A user's curve (or a prior measured at every size) is not replaced by a smoother fit."""
    amd = ScalingCurve.amdahl(rate1=r1, parallel_fraction=p, max_nodes=32)
    rates = [amd.rate(k) * (1 - drop if k == 2 else 1.0) for k in range(1, 33)]
    curve = ScalingCurve(tuple(range(1, 33)), tuple(rates))
    jpa = JobProfilingAdvisor()
    jpa.register(JobSpec("u", max_nodes=32, curve=curve, total_samples=1e12), now_s=0.0)
    est = jpa.records["u"].estimate(32, default_noise=jpa.default_noise)
    np.testing.assert_allclose(est.mean[1:], rates, rtol=1e-9)


def test_zoo_curves_given_as_user_curves_keep_their_best_size():
    """Measured on the zoo: the structure fit put a 12-node peak's best size at 30 nodes and a
    2-node dip at half the one-node rate; now the curve is planned as given, within the noise
    of a user's point (5 % default noise over a weight of 4: 2.5 %, times z)."""
    jpa = JobProfilingAdvisor()
    for job in zoo_jobs("short", seed=1, n_jobs=12, start_s=0.0):
        jpa.register(job, now_s=0.0)
        rec = jpa.records[job.job_id]
        est = rec.estimate(job.max_nodes, default_noise=jpa.default_noise)
        truth = np.array([job.curve.rate(k) for k in range(1, job.max_nodes + 1)])
        np.testing.assert_allclose(est.mean[1:], truth, rtol=MISFIT_SIGMAS * 0.025)
        assert truth[int(np.argmax(est.mean[1:]))] >= 0.98 * truth.max()


def test_a_priors_points_count_in_the_misfit_check():
    """Points the fit misses count even when they are all a prior's (no own reading yet)."""
    pts = Samples.of([1, 2, 3, 4, 8], [100.0, 60.0, 105.0, 140.0, 250.0], [0.5] * 5)
    est = ground_truth(estimate(pts, n_max=16, noise_rel=0.03), pts, noise_rel=0.03)
    assert est.model_free
    assert est.rate(2) == pytest.approx(60.0)


# ---- jobs queued before their model was measured ---------------------------------------
def _ctl(n_nodes=8):
    from malleparsl.controller import Controller
    from malleparsl.jpa import ProbeFirst

    jpa = JobProfilingAdvisor(warmup_obs=0)  # adopt_priors is the default
    ctl = Controller(policy=ProbeFirst(advisor=jpa, inner="milp"), advisor=jpa)
    ctl.add_nodes([f"n{i:02d}" for i in range(n_nodes)], now_s=0)
    return jpa, ctl


def test_jobs_of_one_model_queued_together_are_probed_once():
    """Three jobs of one model registered before any was measured: once the first has a stable
    rate, the others take its points as their prior and are not probed themselves."""
    jpa, ctl = _ctl()
    for j in ("a", "b", "c"):
        ctl.submit(JobSpec(j, max_nodes=8, model="bert", total_samples=1e12), now_s=0)
    ctl.submit(JobSpec("x", max_nodes=8, model="other", total_samples=1e12), now_s=0)
    ctl.replan(now_s=0)
    first = next(iter(jpa.probe_requests()))
    assert first == "a" and all(jpa.records[j].prior is None for j in "abc")
    for t in (10.0, 310.0):
        ctl.observe("a", n_nodes=ctl.allocation.size("a"), samples_per_s=100.0, now_s=t)
    ctl.replan(now_s=320.0)
    for j in ("b", "c"):
        rec = jpa.records[j]
        assert rec.prior is not None and jpa.predictable(rec) and rec.probe is None
        assert rec.estimate(8, default_noise=0.03).rate(1) == pytest.approx(100.0, rel=0.05)
    assert jpa.records["x"].prior is None  # another model learns nothing from "bert"
    assert "b" not in jpa.probe_requests() and "c" not in jpa.probe_requests()


def test_without_adopt_priors_queued_jobs_are_probed_on_their_own():
    from malleparsl.controller import Controller
    from malleparsl.jpa import ProbeFirst

    jpa = JobProfilingAdvisor(warmup_obs=0, adopt_priors=False, share_readings=False)
    ctl = Controller(policy=ProbeFirst(advisor=jpa, inner="milp"), advisor=jpa)
    ctl.add_nodes([f"n{i:02d}" for i in range(8)], now_s=0)
    for j in ("a", "b"):
        ctl.submit(JobSpec(j, max_nodes=8, model="bert", total_samples=1e12), now_s=0)
    ctl.replan(now_s=0)
    for t in (10.0, 310.0):
        ctl.observe("a", n_nodes=ctl.allocation.size("a"), samples_per_s=100.0, now_s=t)
    ctl.replan(now_s=320.0)
    assert jpa.records["b"].prior is None


def test_a_better_explored_prior_replaces_a_thinner_one_but_never_a_users_curve():
    jpa, ctl = _ctl()
    user = ScalingCurve((1, 2, 4, 8), (10.0, 19.0, 36.0, 60.0))
    ctl.submit(JobSpec("a", max_nodes=8, model="m", total_samples=1e12), now_s=0)
    ctl.submit(JobSpec("b", max_nodes=8, model="m", total_samples=1e12), now_s=0)
    ctl.submit(JobSpec("u", max_nodes=8, model="m", curve=user, total_samples=1e12), now_s=0)
    ctl.replan(now_s=0)
    rec_a = jpa.records["a"]
    t = 10.0
    for n, r in ((1, 100.0), (2, 180.0)):
        for _ in range(2):
            rec_a.add_rate(n, r, t)
            t += 300.0
    ctl.replan(now_s=t)
    b = jpa.records["b"]
    assert b.prior is not None and set(b.prior.measured) >= {1, 2}
    for _ in range(2):
        rec_a.add_rate(4, 320.0, t)
        t += 300.0
    ctl.replan(now_s=t)
    assert set(b.prior.measured) >= {1, 2, 4}
    assert jpa.records["u"].prior_is_user
    np.testing.assert_allclose(jpa.records["u"].prior.mean[[1, 2, 4, 8]], user.rates)


def test_share_readings_tells_a_running_job_what_another_measures_now():
    """Two jobs of one model run at once; "b" reads at 2, then at 4 nodes, sizes "a" never
    ran: with ``share_readings`` each replan gives "a" a prior of b's readings so far."""
    from malleparsl.controller import Controller
    from malleparsl.jpa import ProbeFirst

    jpa = JobProfilingAdvisor(warmup_obs=0, share_readings=True)
    ctl = Controller(policy=ProbeFirst(advisor=jpa, inner="milp"), advisor=jpa)
    ctl.add_nodes([f"n{i:02d}" for i in range(8)], now_s=0)
    for j in ("a", "b"):
        ctl.submit(JobSpec(j, max_nodes=8, model="bert", total_samples=1e12), now_s=0)
    ctl.replan(now_s=0)
    t = 10.0
    for job, n, rate in (("a", 1, 100.0), ("a", 1, 100.0), ("b", 2, 190.0), ("b", 2, 190.0)):
        jpa.observe(job, n, rate, t)
        t += 300.0
    ctl.replan(now_s=t)
    a = jpa.records["a"]
    assert a.prior.measured == (2,)
    jpa.observe("b", 4, 360.0, t)
    jpa.observe("b", 4, 360.0, t + 300.0)
    ctl.replan(now_s=t + 310.0)
    assert a.prior.measured == (2, 4)
    assert a.estimate(8, default_noise=0.03).rate(4) == pytest.approx(360.0, rel=0.05)
