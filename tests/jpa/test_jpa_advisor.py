"""The Job Profiling Advisor inside the real Controller: probes, LAS, bad cases, learning loop."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from malleparsl.allocator import make_policy
from malleparsl.controller import Controller
from malleparsl.errors import SpecError
from malleparsl.jpa import JobProfilingAdvisor, ProbeFirst
from malleparsl.model import JobSpec, ScalingCurve

NODES = [f"n{i:02d}" for i in range(8)]


def make(n_nodes=8, inner="milp", **kw):
    kw.setdefault("warmup_obs", 0)
    jpa = JobProfilingAdvisor(**kw)
    ctl = Controller(policy=ProbeFirst(advisor=jpa, inner=inner), advisor=jpa)
    ctl.add_nodes([f"n{i:02d}" for i in range(n_nodes)], now_s=0)
    return jpa, ctl


def feed(ctl, job, rate, n_times, t, dt=300.0):
    for _ in range(n_times):
        ctl.observe(job, n_nodes=ctl.allocation.size(job), samples_per_s=rate, now_s=t)
        t += dt
    return t


def test_unknown_job_is_probed_at_min_nodes_then_planned_with_its_curve():
    jpa, ctl = make()
    ctl.submit(JobSpec("a", min_nodes=1, max_nodes=8, rescale_up_s=1.0), now_s=0)
    ctl.replan(now_s=0)
    assert ctl.allocation.size("a") == 1 and jpa.probe_requests() == {"a": 1}
    t = feed(ctl, "a", 100.0, 2, 10.0)
    ctl.replan(now_s=t)
    assert jpa.probe_requests() == {}
    assert jpa.predictable(jpa.records["a"])
    # one size known: optimistic (linear from it) up to explore_factor (4) x 1 node, flat beyond
    assert ctl.allocation.size("a") == 4
    t = feed(ctl, "a", 390.0, 2, t)
    ctl.replan(now_s=t)
    assert ctl.allocation.size("a") == 8  # 4 measured: now up to 16 may be tried
    t = feed(ctl, "a", 500.0, 2, t)  # ... where it turns out to be slow
    ctl.replan(now_s=t)
    est = jpa.records["a"].estimate(8, default_noise=0.03)
    assert est.measured == (1, 4, 8) and est.rate(8) == pytest.approx(500.0, rel=0.05)


def test_warmup_readings_after_a_size_change_are_not_used():
    jpa, ctl = make(warmup_obs=1)
    ctl.submit(JobSpec("a", max_nodes=4), now_s=0)
    ctl.replan(now_s=0)
    ctl.observe("a", n_nodes=1, samples_per_s=5.0, now_s=1)  # slow first reading: warm-up
    feed(ctl, "a", 100.0, 2, 2.0)
    assert list(jpa.records["a"].obs[1]) == [100.0, 100.0]


def test_probe_ends_as_soon_as_the_rate_is_stable_not_on_a_fixed_clock():
    jpa, ctl = make(max_obs=4)
    ctl.submit(JobSpec("a", max_nodes=4), now_s=0)
    ctl.replan(now_s=0)
    ctl.observe("a", n_nodes=1, samples_per_s=100.0, now_s=10)
    ctl.observe("a", n_nodes=1, samples_per_s=140.0, now_s=20)  # too far apart: not stable
    ctl.replan(now_s=20)
    assert jpa.probe_requests() == {"a": 1}
    ctl.observe("a", n_nodes=1, samples_per_s=120.0, now_s=30)
    ctl.replan(now_s=40)
    assert jpa.probe_requests() == {"a": 1}  # three readings, still spread out
    ctl.observe("a", n_nodes=1, samples_per_s=121.0, now_s=41)
    ctl.replan(now_s=50)
    assert jpa.probe_requests() == {}  # max_obs readings end a probe whatever their spread


def test_silent_job_times_out_backs_off_and_the_next_unknown_job_goes_first():
    # one probe at a time (8 nodes, max_probe_frac 0.1): "a" never reports, "b" does
    jpa, ctl = make(probe_timeout_s=600.0, probe_share=1.0)
    ctl.submit(JobSpec("a", max_nodes=4), now_s=0)
    ctl.submit(JobSpec("b", max_nodes=4), now_s=0)
    ctl.replan(now_s=0)
    assert jpa.probe_requests() == {"a": 1}
    ctl.replan(now_s=100)  # probe clock starts once "a" holds its node
    ctl.replan(now_s=800)
    assert jpa.records["a"].probe_failures == 1
    assert jpa.probe_requests() == {"b": 1}  # "a" has more service and is backing off
    feed(ctl, "b", 50.0, 2, 810)
    ctl.replan(now_s=1500)
    assert jpa.predictable(jpa.records["b"]) and ctl.allocation.size("b") >= 1
    assert not jpa.predictable(jpa.records["a"])
    assert jpa.records["a"].next_probe_s == pytest.approx(800 + 600 * 2)
    ctl.replan(now_s=2100)
    assert jpa.probe_requests() == {"a": 1}  # retried after the back-off


def test_probe_budget_stops_new_probes_once_spent_while_known_jobs_run():
    jpa, ctl = make(probe_timeout_s=300.0, probe_share=0.0)
    ctl.submit(JobSpec("k", max_nodes=8, curve=ScalingCurve((1, 8), (10.0, 80.0))), now_s=0)
    ctl.submit(JobSpec("a", max_nodes=4), now_s=0)
    ctl.submit(JobSpec("b", max_nodes=4), now_s=0)
    ctl.replan(now_s=0)
    assert jpa.probe_requests() == {"a": 1}
    ctl.replan(now_s=400)  # "a" silent: 400 node-s of probing > the 300 node-s credit
    assert jpa.probe_ns == pytest.approx(400.0)
    assert jpa.probe_requests() == {}  # "b" must wait: the budget is spent
    assert ctl.allocation.size("k") == 8 - 0


def test_probe_clock_stops_while_the_job_holds_no_nodes():
    jpa, ctl = make(n_nodes=2, probe_timeout_s=600.0)
    ctl.submit(JobSpec("a", max_nodes=2), now_s=0)
    ctl.replan(now_s=0)
    ctl.observe("a", n_nodes=1, samples_per_s=10.0, now_s=50)  # one reading, not yet stable
    ctl.remove_nodes(["n00", "n01"], now_s=100)
    ctl.replan(now_s=100)
    ctl.add_nodes(["n02"], now_s=5000)  # hours later: not the job's silence
    ctl.replan(now_s=5000)
    assert jpa.records["a"].probe_failures == 0 and jpa.probe_requests() == {"a": 1}
    ctl.replan(now_s=5700)  # placed at 5000, silent since: now it fails
    assert jpa.records["a"].probe_failures == 1


def test_zero_and_bad_readings_are_dropped_and_never_break_the_fit():
    jpa, ctl = make(probe_timeout_s=300.0)
    ctl.submit(JobSpec("a", max_nodes=4), now_s=0)
    ctl.replan(now_s=0)
    for t, r in [(10, 0.0), (20, 0.0), (30, float("nan")), (40, -3.0), (50, float("inf"))]:
        ctl.observe("a", n_nodes=1, samples_per_s=r, now_s=t)
    plan_t = 400
    ctl.replan(now_s=plan_t)
    ctl.replan(now_s=plan_t + 400)
    rec = jpa.records["a"]
    assert rec.dropped_zero == 5 and not rec.obs
    assert rec.probe_failures == 1 and not jpa.predictable(rec)


def test_job_finishing_mid_probe_frees_its_nodes_and_keeps_a_summary():
    jpa, ctl = make(n_nodes=4)
    ctl.submit(JobSpec("a", max_nodes=4), now_s=0)
    ctl.submit(JobSpec("b", max_nodes=4), now_s=0)
    ctl.replan(now_s=0)
    assert "a" in jpa.probe_requests()
    ctl.observe("a", n_nodes=1, samples_per_s=10.0, now_s=5)
    ctl.replan(now_s=10)
    ctl.finish("a", now_s=20)
    ctl.replan(now_s=20)
    assert "a" not in jpa.records and "a" in jpa.finished
    assert jpa.finished["a"]["probe_ns"] > 0
    assert set(jpa.probe_requests()) <= {"b"}
    ctl.observe("a", n_nodes=1, samples_per_s=10.0, now_s=25)  # a late reading: ignored


def test_measured_rescale_pauses_replace_the_specs():
    jpa, ctl = make()
    ctl.submit(JobSpec("a", max_nodes=4, rescale_up_s=5.0, rescale_down_s=3.0), now_s=0)
    ctl.replan(now_s=0)
    for p in (30.0, 10.0, 20.0):
        ctl.observe_rescale("a", kind="up", pause_s=p)
    ctl.observe_rescale("a", kind="sideways", pause_s=1.0)  # unknown kind: ignored
    view = jpa.views(ctl.snapshot(1), ctl.active_jobs, ctl.allocation)[0]
    assert view.spec.rescale_up_s == 20.0 and view.spec.rescale_down_s == 3.0


def test_a_job_without_pause_hints_inherits_the_pauses_measured_on_others():
    jpa, ctl = make()
    ctl.submit(JobSpec("a", max_nodes=4), now_s=0)
    ctl.submit(JobSpec("b", max_nodes=4, rescale_up_s=7.0), now_s=0)
    ctl.replan(now_s=0)
    ctl.observe_rescale("a", kind="up", pause_s=12.0)
    ctl.observe_rescale("a", kind="down", pause_s=4.0)
    ctl.submit(JobSpec("c", max_nodes=4), now_s=1)
    ctl.replan(now_s=1)
    views = {v.job_id: v for v in jpa.views(ctl.snapshot(2), ctl.active_jobs, ctl.allocation)}
    assert (views["c"].spec.rescale_up_s, views["c"].spec.rescale_down_s) == (12.0, 4.0)
    assert (views["b"].spec.rescale_up_s, views["b"].spec.rescale_down_s) == (7.0, 4.0)


def test_similar_job_inherits_a_prior_and_skips_the_probe():
    jpa, ctl = make()
    ctl.submit(JobSpec("a", max_nodes=8, model="resnet"), now_s=0)
    ctl.replan(now_s=0)
    truth = ScalingCurve.amdahl(rate1=100.0, parallel_fraction=0.9, max_nodes=8)
    t = 10.0
    for _ in range(4):
        t = feed(ctl, "a", truth.rate(ctl.allocation.size("a")), 2, t)
        ctl.replan(now_s=t)
    ctl.finish("a", now_s=t)
    ctl.submit(JobSpec("b", max_nodes=8, model="resnet"), now_s=t)
    ctl.replan(now_s=t)
    assert jpa.probe_requests() == {} and jpa.predictable(jpa.records["b"])
    est = jpa.records["b"].estimate(8, default_noise=0.03)
    assert est.rate(4) == pytest.approx(truth.rate(4), rel=0.05)
    assert ctl.allocation.size("b") > 1


def test_user_curve_is_used_without_probing():
    jpa, ctl = make()
    given_curve = ScalingCurve((1, 2, 4, 8), (10.0, 20.0, 30.0, 31.0))
    ctl.submit(JobSpec("a", max_nodes=8, curve=given_curve), now_s=0)
    ctl.replan(now_s=0)
    assert jpa.probe_requests() == {}
    curve = jpa.planning_curve(jpa.records["a"], 8)
    assert curve.rate(4) == pytest.approx(30.0, rel=0.1)


def test_planning_curve_is_capped_by_linear_and_flat_past_the_explore_limit():
    jpa, ctl = make(explore_factor=2.0)
    ctl.submit(JobSpec("a", max_nodes=8), now_s=0)
    ctl.replan(now_s=0)
    feed(ctl, "a", 100.0, 3, 10.0)
    curve = jpa.planning_curve(jpa.records["a"], 8)
    r = curve.rates_upto(8)
    assert np.all(r <= 100.0 * np.arange(9) + 1e-9)
    assert r[2] == pytest.approx(200.0, rel=0.01) and np.all(r[3:] == r[2])


@pytest.mark.parametrize(
    ("kw", "fragment"),
    [({"explore_factor": 0.5}, "explore_factor"), ({"min_obs": 0}, "min_obs"),
     ({"kappa": -1.0}, "kappa"), ({"probe_timeout_s": 0}, "probe_timeout_s")],
)
def test_bad_options_are_rejected(kw, fragment):
    with pytest.raises(SpecError, match=fragment):
        JobProfilingAdvisor(**kw)


def test_probe_first_needs_an_advisor_with_probes():
    with pytest.raises(SpecError, match="probe_requests"):
        ProbeFirst(advisor=object(), inner=make_policy("greedy"))


def _peaked(r1, peak, max_nodes):
    n = np.arange(1, max_nodes + 1)
    a, c = 1 / r1, 1 / r1 / peak**2
    return ScalingCurve(tuple(n), tuple(1 / (a / n + c * (n - 1))))


def _drop(r1, drop, max_nodes):
    n = np.arange(1, max_nodes + 1)
    a = 1 / r1
    d = a / (1 - drop) - a / 2
    return ScalingCurve(tuple(n), tuple(1 / (a / n + d * (n >= 2))))


CURVES = st.one_of(
    st.builds(lambda r, p: ScalingCurve.amdahl(rate1=r, parallel_fraction=p, max_nodes=16),
              st.floats(10, 1e4), st.floats(0.5, 0.999)),
    st.builds(lambda r, k: ScalingCurve.from_points({n: r * n / (n + k) for n in range(1, 17)}),
              st.floats(100, 1e4), st.floats(1, 32)),
    st.builds(_peaked, st.floats(10, 1e4), st.floats(2.5, 12), st.just(16)),
    st.builds(_drop, st.floats(10, 1e4), st.floats(0.05, 0.5), st.just(16)),
)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(truth=CURVES, noise=st.floats(0, 0.10), seed=st.integers(0, 1000))
def test_learning_loop_finds_a_good_size_for_any_shape(truth, noise, seed):
    """One job alone on 16 nodes: the JPA + MILP must settle near the best size of its curve."""
    rng = np.random.default_rng(seed)
    jpa, ctl = make(n_nodes=16, inner="greedy")
    # no rescale cost: this is about learning; what a pause is worth is the policy's business
    ctl.submit(JobSpec("a", max_nodes=16), now_s=0)
    t, sizes = 0.0, []
    for _ in range(30):
        ctl.replan(now_s=t)
        k = ctl.allocation.size("a")
        sizes.append(k)
        rate = truth.rate(k) * (1 + noise * rng.standard_normal())
        ctl.observe("a", n_nodes=k, samples_per_s=rate, now_s=t + 100)
        t += 300.0
    best = max(truth.rate(k) for k in range(1, 17))
    # the best size among the last few (the policy may still probe one size past the top)
    got = max(truth.rate(k) for k in sizes[-3:])
    assert got >= 0.85 * best, (sizes, got, best)
    est = jpa.records["a"].estimate(16, default_noise=0.03)
    err = [abs(est.rate(k) / truth.rate(k) - 1) for k in set(sizes)]
    # sizes visited once carry one reading: their error scales with the noise (a fixed 10 %
    # failed at 9.4 % noise on main too, e.g. _peaked(10, 7.5, 16), seed 125)
    assert float(np.mean(err)) <= 0.05 + noise, err


def test_an_unpredictable_jobs_placeholder_is_one_object_across_replans():
    """A new placeholder at every replan made the plan profiler's view cache (keyed on the
    advisor's curve object) miss for every job the JPA cannot predict yet."""
    from malleparsl.allocator import ClusterSnapshot

    jpa = JobProfilingAdvisor()
    ctl = Controller(policy=make_policy("milp"), advisor=jpa)
    ctl.add_nodes(["a", "b", "c"], now_s=0)
    ctl.submit(JobSpec("u", max_nodes=3), now_s=0)
    ctl.replan(now_s=0)
    snap = ClusterSnapshot(now_s=1.0, nodes=("a", "b", "c"))
    first = jpa.views(snap, ctl.active_jobs, ctl.allocation)[0].curve
    assert not jpa.predictable(jpa.records["u"])
    assert jpa.views(snap, ctl.active_jobs, ctl.allocation)[0].curve is first
    jpa.forget("u")
    assert "u" not in jpa._placeholders


def test_views_carry_the_reported_progress_like_known_curves():
    """A policy that values a grow over the job's remaining time (hold, priorities) must see the
    samples left, not the spec's total, whether the job is probed or planned."""
    from malleparsl.allocator.base import ClusterSnapshot
    from malleparsl.controller import JobState
    from malleparsl.model import Allocation

    jpa = JobProfilingAdvisor(warmup_obs=0)
    a = JobSpec("a", max_nodes=8, total_samples=1e6)
    b = JobSpec("b", max_nodes=8, total_samples=1e6)
    jpa.register(a, 0.0)
    jpa.register(b, 0.0)
    for t in (10.0, 20.0):
        jpa.observe("b", 1, 100.0, t)  # b is predictable, a will be probed
    snap = ClusterSnapshot(now_s=30.0, nodes=tuple(NODES))
    views = jpa.views(snap, [JobState(a, done_samples=4e5), JobState(b, done_samples=9e5)],
                      Allocation({}))
    by = {v.job_id: v for v in views}
    assert by["a"].lo == by["a"].hi == 1  # a probe
    assert by["a"].remaining == pytest.approx(6e5) and by["a"].attained_samples == 4e5
    assert by["b"].remaining == pytest.approx(1e5) and by["b"].attained_samples == 9e5


def test_below_its_smallest_own_size_a_job_is_bounded_by_its_priors_per_node_rates():
    """A job started from its model's prior at a size past the peak (slow per node there): its
    own per-node rate must not cap the sizes its prior measured as faster; before, 8 nodes were
    planned at 8 x 700/32 = 175/s although the prior measured 600/s there."""
    from malleparsl.jpa.estimate import CurveEstimate

    jpa = JobProfilingAdvisor(warmup_obs=0)
    n = np.arange(33, dtype=float)
    mean = np.interp(n, [0, 1, 2, 4, 8, 32], [0, 100, 190, 360, 600, 600])
    jpa.priors["bert"] = CurveEstimate(mean=mean, sigma=0.02 * mean, measured=(1, 2, 4, 8))
    jpa.register(JobSpec("b", max_nodes=32, model="bert"), 0.0)
    for t in (10.0, 20.0):
        jpa.observe("b", 32, 700.0, t)
    curve = jpa.planning_curve(jpa.records["b"], 32)
    assert curve.rate(8) > 0.9 * 600.0
    assert curve.rate(4) <= 1.1 * 4 * 100.0  # no super-linear promise from the prior's 1 node


def test_a_prior_from_a_smaller_job_of_the_model_is_not_levelled_past_its_largest_size():
    """Jobs of one model may differ in max_nodes: a finished job of 16 nodes at most leaves a
    prior flat past 16; a job of 64 reading 4400/s at 44 (the same 100/s per node) was planned
    at 290/s on one node (the prior levelled 2.7x up by 4400 / 1600)."""
    jpa = JobProfilingAdvisor(warmup_obs=0)
    jpa.register(JobSpec("a", max_nodes=16, model="bert"), 0.0)
    t = 0.0
    for k in (1, 2, 4, 8, 16):
        for _ in range(3):
            t += 10.0
            jpa.observe("a", k, 100.0 * k, t)
    jpa.forget("a")
    jpa.register(JobSpec("b", max_nodes=64, model="bert"), t)
    for _ in range(2):
        t += 10.0
        jpa.observe("b", 44, 4400.0, t)
    est = jpa.records["b"].estimate(64, default_noise=0.03)
    for k in (1, 4, 16):
        assert est.mean[k] == pytest.approx(100.0 * k, rel=0.1)


def _flat_past_16(release_flat: bool, n_nodes: int):
    """A job measured at 1, 8, 16 and 32 nodes, as fast at 32 as at 16, holding 32 nodes."""
    from malleparsl.allocator.base import ClusterSnapshot
    from malleparsl.controller import JobState
    from malleparsl.model import Allocation

    jpa = JobProfilingAdvisor(warmup_obs=0, release_flat=release_flat)
    spec = JobSpec("j", max_nodes=64, total_samples=1e12)
    jpa.register(spec, 0.0)
    t = 0.0
    for n, rate in ((1, 100.0), (8, 700.0), (16, 1200.0), (32, 1200.0)):
        for _ in range(2):
            t += 300.0
            jpa.observe("j", n, rate, t)
    nodes = tuple(f"n{i:02d}" for i in range(n_nodes))
    snap = ClusterSnapshot(now_s=t, nodes=nodes)
    view = jpa.views(snap, [JobState(spec)], Allocation({"j": set(nodes[:32])}))[0]
    return jpa, view


def test_with_no_node_idle_a_job_past_its_knee_is_held_to_the_size_as_fast():
    """Nodes past a plateau add nothing, but the allocator keeps them (a shrink costs a pause):
    on the zoo at 0:512 the JPA held 10-16 % of its node-seconds past the jobs' knees, most
    while no node was idle (docs/jpa-log.md, session 9). With ``release_flat`` and every node
    held, the job's view is capped at the smallest size expected as fast as it measured."""
    jpa, view = _flat_past_16(True, 32)
    assert 8 < view.hi < 32
    assert jpa.released() == {"j": view.hi}
    # nodes idle: the excess costs nobody anything, no cap; nor without the option
    for flag, n in ((True, 40), (False, 32)):
        jpa, view = _flat_past_16(flag, n)
        assert view.hi == 64 and jpa.released() == {}


def test_the_audit_does_not_count_the_jpas_release_cap_as_the_jobs_bound():
    """The cap is the JPA's belief, not a constraint of the job: the true optimum may keep the
    job at its size, so what the release costs shows in decision efficiency."""
    from malleparsl.allocator.base import ClusterSnapshot
    from malleparsl.jpa.audit import DecisionAudit
    from malleparsl.model import Allocation

    jpa, view = _flat_past_16(True, 32)
    truth = JobSpec("j", max_nodes=64, total_samples=1e12, rescale_up_s=10.0, rescale_down_s=10.0,
                    curve=ScalingCurve((1, 8, 16, 32, 64), (100.0, 700.0, 1200.0, 1200.0, 1200.0)))
    audit = DecisionAudit({"j": truth}, advisor=jpa)
    nodes = tuple(f"n{i:02d}" for i in range(32))
    snap = ClusterSnapshot(now_s=1e4, nodes=nodes)
    d = audit._score(snap, [view], Allocation({"j": set(nodes[: view.hi])}))
    assert d.best > d.chosen  # the optimum keeps 32 nodes (no pause); the release pays one


def _finish_jobs_of_one_model(pool: bool, runs):
    truth = ScalingCurve.amdahl(rate1=100.0, parallel_fraction=0.95, max_nodes=16)
    jpa = JobProfilingAdvisor(warmup_obs=0, pool_priors=pool)
    t = 0.0
    for name, sizes in runs:
        jpa.register(JobSpec(name, max_nodes=16, model="bert"), t)
        for n in sizes:
            for _ in range(2):
                jpa.observe(name, n, truth.rate(n), t)
                t += 300.0
        jpa.forget(name)
    return jpa, truth, t


def test_a_models_prior_keeps_the_sizes_all_its_jobs_measured():
    """A model's prior was the last (better-explored) job's own sizes only: a job that measured
    8 and 16 nodes after a prior of 1, 2 and 4 left no trace (two sizes < three), and one that
    measured three other sizes would have erased the first three (session 11: pooled)."""
    jpa, truth, t = _finish_jobs_of_one_model(True, [("a", [1, 2, 4]), ("b", [8, 16])])
    assert jpa.priors["bert"].measured == (1, 2, 4, 8, 16)
    jpa.register(JobSpec("c", max_nodes=16, model="bert"), t)
    est = jpa.records["c"].estimate(16, default_noise=0.03)
    for n in (2, 8, 16):
        assert est.rate(n) == pytest.approx(truth.rate(n), rel=0.05)
    last, _, _ = _finish_jobs_of_one_model(False, [("a", [1, 2, 4]), ("b", [8, 16])])
    assert last.priors["bert"].measured == (1, 2, 4)  # the old rule: b's sizes are lost
    again, _, _ = _finish_jobs_of_one_model(True, [("a", [1, 2, 4]), ("b", [8, 12, 16])])
    assert again.priors["bert"].measured == (1, 2, 4, 8, 12, 16)


def _register_and_read(jpa, truth, plan, *, t=0.0):
    """Register each ``(name, sizes[, level])`` in turn and read it twice at every size, at
    ``level`` x the truth (1 by default); returns the time after the last reading."""
    for name, sizes, *level in plan:
        jpa.register(JobSpec(name, max_nodes=16, model="bert"), t)
        for n in sizes:
            for _ in range(2):
                jpa.observe(name, n, (level[0] if level else 1.0) * truth.rate(n), t)
                t += 300.0
    return t


def test_a_queued_job_adopts_the_pooled_prior_of_a_running_job():
    """``adopt_priors``: a job queued before its model was measured takes the best prior there
    is. A running job that started from a finished job's prior (1, 2, 4 nodes) and measured 8
    and 16 itself knows five sizes, not two: before session 12 its own two lost to the three."""
    truth = ScalingCurve.amdahl(rate1=100.0, parallel_fraction=0.95, max_nodes=16)
    jpa = JobProfilingAdvisor(warmup_obs=0, adopt_priors=True)
    jpa.register(JobSpec("queued", max_nodes=16, model="bert"), 0.0)
    _register_and_read(jpa, truth, [("done", [1, 2, 4]), ("running", [8, 16])])
    jpa.forget("done")
    assert jpa.records["running"].prior.measured == (1, 2, 4)
    queued = jpa.records["queued"]
    assert queued.prior is None
    jpa._adopt_prior(queued)
    assert queued.prior.measured == (1, 2, 4, 8, 16)
    est = queued.estimate(16, default_noise=0.03)
    for n in (2, 8, 16):
        assert est.rate(n) == pytest.approx(truth.rate(n), rel=0.05)
    jpa._adopt_prior(jpa.records["running"])  # a job never adopts its own estimate
    assert jpa.records["running"].prior.measured == (1, 2, 4)


def test_the_running_donor_is_the_one_whose_prior_knows_most_sizes():
    """Of two running jobs of a model, a new job starts from the one whose prior would know
    more sizes, its inherited ones included: "deep" measured 8 and 16 after starting from
    "wide"'s 1, 2 and 3. Before session 13 "wide" won on its own three sizes against two."""
    truth = ScalingCurve.amdahl(rate1=100.0, parallel_fraction=0.95, max_nodes=16)
    jpa = JobProfilingAdvisor(warmup_obs=0)
    t = _register_and_read(jpa, truth, [("wide", [1, 2, 3]), ("deep", [8, 16])])
    assert jpa.records["deep"].prior.measured == (1, 2, 3)
    jpa.register(JobSpec("new", max_nodes=16, model="bert"), t)
    assert jpa.records["new"].prior.measured == (1, 2, 3, 8, 16)
    assert jpa.records["new"].estimate(16, default_noise=0.03).rate(16) == pytest.approx(
        truth.rate(16), rel=0.05)


def test_share_readings_gives_each_running_job_the_others_readings():
    """``share_readings``: two running jobs of a model measured different sizes; each one's
    prior is the other's readings (and a new job's is both), not what one knew at its start.
    The second job trains at half the rate (another batch size): its readings join the pool
    at the first one's level, so the first is not pulled down, and a job at its level gets a
    prior at its level."""
    truth = ScalingCurve.amdahl(rate1=100.0, parallel_fraction=0.95, max_nodes=16)
    jpa = JobProfilingAdvisor(warmup_obs=0, share_readings=True)
    t = _register_and_read(jpa, truth, [("a", [1, 2, 4]), ("b", [4, 8, 16], 0.5)])
    a, b = jpa.records["a"], jpa.records["b"]
    assert jpa._share_readings(a) and jpa._share_readings(b)
    assert (a.prior.measured, b.prior.measured) == ((4, 8, 16), (1, 2, 4))  # the others' sizes
    jpa.register(JobSpec("c", max_nodes=16, model="bert"), t)
    assert jpa._share_readings(jpa.records["c"])
    assert jpa.records["c"].prior.measured == (1, 2, 4, 8, 16)
    for n in (8, 16):  # a never ran there: b's readings, at a's level
        assert a.estimate(16, default_noise=0.03).rate(n) == pytest.approx(truth.rate(n), rel=0.05)
    for n in (1, 2):  # b never ran there: a's readings, at b's level
        assert b.estimate(16, default_noise=0.03).rate(n) == pytest.approx(
            0.5 * truth.rate(n), rel=0.05)
    pool = a.prior
    assert jpa._share_readings(a) and a.prior is pool  # unchanged readings: the same prior
    jpa.observe("b", 12, 0.5 * truth.rate(12), t)
    assert jpa._share_readings(a) and 12 in a.prior.measured  # a new size reaches a at once
    jpa.forget("b")
    assert not jpa._share_readings(a)  # nobody else runs: a keeps what it had
    assert "b" not in jpa._pools


def test_share_readings_never_replaces_a_users_curve():
    user = ScalingCurve.amdahl(rate1=50.0, parallel_fraction=0.5, max_nodes=8)
    jpa = JobProfilingAdvisor(warmup_obs=0, share_readings=True)
    jpa.register(JobSpec("mine", max_nodes=8, model="bert", curve=user), 0.0)
    jpa.register(JobSpec("other", max_nodes=8, model="bert"), 0.0)
    jpa.observe("other", 2, 180.0, 0.0)
    assert not jpa._share_readings(jpa.records["mine"])
    assert jpa.records["mine"].prior_is_user


def test_a_pool_levels_another_job_only_where_the_reference_measured():
    """A job that shares no size with the pool's reference job is taken at its level: the
    reference's curve between its measured sizes is a guess. Measured on the zoo (``dip``
    0:512 seed 3): a reference read at 1 and 10 nodes, interpolated through the two-node dip,
    expected 4.0x the one-node rate at 4 nodes where another job read 1.47x, so that job's
    reading was scaled 2.7x up and, once the planning job read 1.47x itself, every point of
    its prior 2.7x down (10 nodes planned at 1.4x the one-node rate instead of 3.8x)."""
    truth = ScalingCurve((1, 2, 3, 4, 6, 8, 10, 12, 16),
                         (100.0, 62.0, 105.0, 147.0, 229.0, 308.0, 383.0, 459.0, 601.0))
    jpa = JobProfilingAdvisor(warmup_obs=0)
    t = _register_and_read(jpa, truth, [("ref", [1, 10]), ("other", [4])])
    jpa.register(JobSpec("new", max_nodes=16, model="bert"), t)
    new = jpa.records["new"]
    assert jpa._share_readings(new)
    assert new.prior.measured == (1, 4, 10)
    for n in (1, 4, 10):
        assert new.prior.rate(n) == pytest.approx(truth.rate(n), rel=0.05)
    for _ in range(2):
        jpa.observe("new", 4, truth.rate(4), t)
    assert new.estimate(16, default_noise=0.03).rate(10) == pytest.approx(truth.rate(10), rel=0.1)


def test_a_job_that_read_a_drop_at_two_nodes_is_planned_past_it():
    """The zoo's ``dip`` and the issue's real model: a third of the one-node rate lost at 2
    nodes, passed again at 3. Read at 1 and 2 nodes only, every strong-scaling structure fits
    the two points and falls past them, so the plan offered nothing above one node (at most
    0.63x its rate at 8) and the jobs of the model stayed on one node while the oracle grew
    them to 16-22. With the ``net`` structure the plan past 2 nodes is worth trying: a job
    starting (no pause to repay) starts there, and its reading tells every job of the model."""
    jpa = JobProfilingAdvisor(warmup_obs=0)
    spec = JobSpec("j", max_nodes=16, total_samples=1e12)
    jpa.register(spec, 0.0)
    t = 0.0
    for n, rate in ((1, 100.0), (1, 101.0), (2, 57.0), (2, 58.0)):
        t += 300.0
        jpa.observe("j", n, rate, t)
    curve = jpa.planning_curve(jpa.records["j"], 16)
    assert curve.rate(2) < curve.rate(1)  # the drop it read stands
    assert max(curve.rate(k) for k in range(3, 9)) > 1.5 * curve.rate(1)


def test_a_job_that_read_a_weak_rise_at_two_nodes_is_planned_past_it():
    """The zoo's ``step`` (session 25): 1.08x at 2 nodes read, linear at 59 % beyond. Without
    the ``net`` structure the plan offered at most 1.6x at any size up to 8 and the job stayed
    on one node for 24,000 s while the oracle ran it at 14-26."""
    jpa = JobProfilingAdvisor(warmup_obs=0)
    jpa.register(JobSpec("j", max_nodes=16, total_samples=1e12), 0.0)
    t = 0.0
    for n, rate in ((1, 100.0), (1, 100.0), (2, 108.0), (2, 108.0)):
        t += 300.0
        jpa.observe("j", n, rate, t)
    curve = jpa.planning_curve(jpa.records["j"], 16)
    assert curve.rate(2) == pytest.approx(108.0, rel=0.03)  # the reading stands
    assert max(curve.rate(k) for k in range(3, 9)) > 2.0 * curve.rate(1)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n_jobs=st.integers(2, 6), extra=st.integers(0, 30))
@example(n_jobs=4, extra=20)  # 24 nodes: 8, 8, 7 (a linear placeholder gave 23, 0, 0)
def test_spare_nodes_spread_evenly_for_any_queue_and_machine(n_jobs, extra):
    """Nodes no predictable job gains from go to the unknown jobs the probe budget leaves
    waiting: one each, then evenly, whatever the number of jobs and of spare nodes. A linear
    placeholder made every split worth the same and the solver gave all of them to one job
    (its first reading at that size, the others none)."""
    n_nodes = n_jobs + extra
    jpa, ctl = make(n_nodes=n_nodes, max_probe_frac=1.0 / n_nodes)  # room for one probe
    names = [f"j{i}" for i in range(n_jobs)]
    for j in names:
        ctl.submit(JobSpec(j, min_nodes=1, max_nodes=n_nodes, rescale_up_s=1.0), now_s=0)
    ctl.replan(now_s=0)
    probed = set(jpa.probe_requests())
    assert len(probed) == 1
    sizes = [ctl.allocation.size(j) for j in names if j not in probed]
    assert sum(sizes) == n_nodes - 1 and max(sizes) - min(sizes) <= 1, sizes


def _staircase_read(n_nodes: int, *, total: float = 1e12, busy: bool = False,
                    sizes: tuple[int, ...] | None = None, **kw):
    """A job that read 1.0x, 1.55x and 1.59x at 1, 2 and 3 nodes (zoo ``step``: pairs of nodes,
    truly 3.1x at 4 and 4.6x at 6), in a controller; ``busy``: another job holds every other
    node; ``sizes``: the only node counts the job runs at (``Controller.limit_sizes``).
    Returns the advisor, the controller and the clock after two replans."""
    jpa, ctl = make(n_nodes=n_nodes, probe_share=1.0, **kw)  # budget: not what is tested
    ctl.submit(JobSpec("j", max_nodes=16, rescale_up_s=1.0, total_samples=total), now_s=0)
    if sizes is not None:
        ctl.limit_sizes("j", sizes, why="a fixed plan (test)")
    if busy:
        ctl.submit(JobSpec("b", min_nodes=n_nodes - 3, max_nodes=n_nodes - 3, rescale_up_s=1.0,
                           curve=ScalingCurve((1, n_nodes - 3), (100.0, 100.0 * (n_nodes - 3)))),
                   now_s=0)
    ctl.replan(now_s=0)
    t = 0.0
    for n, rate in ((1, 100.0), (1, 100.0), (2, 155.0), (2, 155.0), (3, 159.0), (3, 159.0)):
        t += 300.0
        jpa.observe("j", n, rate, t)
    for _ in range(2):  # the first replan fits the readings, the second sees its estimate
        t += 1800.0  # (node-seconds used for the probing budget: the check adds 3 nodes)
        ctl.replan(now_s=t)
    return jpa, ctl, t


def test_a_long_job_whose_estimate_expects_no_gain_past_its_largest_size_is_checked_there():
    """Flat from 2 to 3 nodes, every structure that fits peaks, and the plan offered nothing
    past 3 nodes: the allocator never went there, so nothing contradicted it (zoo ``step``
    0:128 seed 18: held at 2 nodes for 10,000 s, the oracle ran the job at 16-38). A check
    runs it once at twice its largest size, on idle nodes, and the reading stands after (a
    flat estimate past it may check the next doubling, never the same size twice)."""
    jpa, ctl, t = _staircase_read(16, check_beyond=True)
    rec = jpa.records["j"]
    assert jpa._last_pred["j"][6] < 159.0  # the estimate: no gain at 6 nodes
    assert jpa.probe_requests() == {"j": 6} and rec.probe.check and rec.probe.base >= 1
    assert ctl.allocation.size("j") == 6
    t = feed(ctl, "j", 460.0, 2, t)
    ctl.replan(now_s=t)
    assert 6 in rec.checked and jpa.probe_requests() in ({}, {"j": 12})  # never 6 again
    assert jpa.planning_curve(rec, 16).rate(6) == pytest.approx(460.0, rel=0.05)
    assert jpa.probe_ns <= 5 * (t - 0)  # a check counts the nodes it added, not the job's own
    off, _, _ = _staircase_read(16, check_beyond=False)
    assert off.probe_requests() == {} and not off.records["j"].checked


def test_a_job_that_runs_at_some_sizes_only_is_checked_at_one_of_them():
    """A fixed FSDP2 plan runs only where its ranks split the batch: twice the largest measured
    size (6) is not one of them, so the check goes to the largest that is, up to there (a check
    at 6 would never be placed, and was dropped at the next replan)."""
    jpa, ctl, _ = _staircase_read(16, sizes=(1, 2, 3, 5, 8, 16), check_beyond=True)
    assert jpa.probe_requests() == {"j": 5} and jpa.records["j"].probe.check
    assert ctl.allocation.size("j") == 5


@pytest.mark.parametrize("case", ["short", "busy"])
def test_a_check_is_not_made_for_a_short_job_nor_on_nodes_others_hold(case):
    """A check holds its size for two readings: a job with less than ``CHECK_MIN_S`` of work
    left does not repay it; and it is made only on idle nodes, which no job's plan wanted."""
    from malleparsl.jpa.advisor import CHECK_MIN_S

    total = 0.5 * CHECK_MIN_S * 159.0 if case == "short" else 1e12
    jpa, ctl, _ = _staircase_read(16, total=total, busy=case == "busy", check_beyond=True)
    assert jpa.probe_requests() == {} and not jpa.records["j"].checked


def _peak_read(**kw):
    """A job that read a rise to a 12-node peak and a fall at 16 nodes (zoo ``peak``)."""
    jpa, ctl = make(n_nodes=64, **kw)
    ctl.submit(JobSpec("p", max_nodes=64, rescale_up_s=1.0), now_s=0)
    ctl.replan(now_s=0)
    t = 0.0
    for n, rate in ((1, 100.0), (2, 190.0), (4, 360.0), (8, 600.0), (12, 700.0), (16, 560.0)):
        for _ in range(2):
            t += 300.0
            jpa.observe("p", n, rate, t)
    return jpa, jpa.records["p"]


def test_past_a_measured_fall_no_size_is_planned_above_the_best_rate_read():
    """Sigma growing per doubling past the largest size planned a job that had read its peak
    and a fall after it at up to 1.7x its best rate 3-4x further out (``peak`` 0:512 seed 0: a
    12-node peak sent to 42 and 44 nodes, where it ran at 5 % of that plan)."""
    jpa, rec = _peak_read(fall_cap=True)
    plan = jpa.planning_curve(rec, 64).rates_upto(64)
    assert plan[17:].max() <= 700.0 * 1.001
    assert plan[12] == pytest.approx(700.0, rel=0.05)  # measured sizes keep what they read
    off, rec_off = _peak_read(fall_cap=False)
    assert off.planning_curve(rec_off, 64).rates_upto(64)[17:].max() > 1.2 * 700.0


def test_a_fall_from_one_node_is_a_dip_and_leaves_the_plan_past_it_optimistic():
    """A drop when the job first spans two nodes is the network joining (zoo ``dip``: it passes
    the one-node rate again at 3-5 nodes): no cap there (capped, ``dip`` 0:128 lost 1.9 points)."""
    jpa, ctl = make(n_nodes=16, fall_cap=True)
    ctl.submit(JobSpec("d", max_nodes=16, rescale_up_s=1.0), now_s=0)
    ctl.replan(now_s=0)
    t = 0.0
    for n, rate in ((1, 100.0), (1, 100.0), (2, 70.0), (2, 70.0)):
        t += 300.0
        jpa.observe("d", n, rate, t)
    plan = jpa.planning_curve(jpa.records["d"], 16).rates_upto(16)
    assert plan[4] > 1.1 * 100.0  # the mean there is below one node's rate; its sigma may lift it
