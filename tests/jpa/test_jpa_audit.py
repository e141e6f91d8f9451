"""Decision efficiency: each decision of the JPA-driven policy scored by the true curves."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from malleparsl.allocator import ClusterSnapshot, JobView, make_policy
from malleparsl.allocator.objective import allocation_objective, best_count_objective
from malleparsl.errors import SpecError
from malleparsl.jpa import JobProfilingAdvisor
from malleparsl.jpa.audit import DecisionAudit, best_value
from malleparsl.jpa.sim_setups import SIM_DEFAULTS
from malleparsl.jpa.zoo import zoo_jobs
from malleparsl.model import JobSpec, ScalingCurve
from malleparsl.sim.engine import SimOptions, simulate
from malleparsl.sim.workloads import synthetic_fragments
from malleparsl.traces import trace_from_fragments

PEAK = ScalingCurve.from_points({1: 100.0, 2: 190.0, 3: 270.0, 4: 300.0, 5: 200.0, 6: 100.0,
                                 7: 50.0, 8: 20.0})
LINEAR = ScalingCurve.from_points({k: 100.0 * k for k in range(1, 9)})
FLAT = ScalingCurve.from_points({k: 60.0 * k for k in range(1, 9)})


def test_best_value_is_the_published_optimum_and_honours_fixed_sizes():
    rng = np.random.default_rng(0)
    nodes = tuple(f"n{i}" for i in range(12))
    for _ in range(20):
        views = []
        for j in range(4):
            r = np.cumsum(rng.uniform(0, 100, 8))
            spec = JobSpec(f"j{j}", max_nodes=8, rescale_up_s=float(rng.uniform(0, 30)),
                           rescale_down_s=float(rng.uniform(0, 15)))
            cur = frozenset(nodes[3 * j: 3 * j + int(rng.integers(0, 4))])
            views.append(JobView(spec, ScalingCurve.from_points(dict(enumerate(r, 1))), cur))
        snap = ClusterSnapshot(now_s=0, nodes=nodes)
        assert best_value(views, 12, 10.0) == pytest.approx(best_count_objective(snap, views)[0])
        got = best_value(views, 12, 10.0, fixed={"j0": 0})
        assert got == pytest.approx(best_count_objective(snap, views[1:])[0]
                                    + allocation_objective(snap, views[:1], _sizes({})))


def _sizes(counts):
    from malleparsl.model import Allocation

    return Allocation({j: frozenset(f"x{j}{i}" for i in range(k)) for j, k in counts.items()})


class PlanWith:
    """A policy planning with given (possibly wrong) curves instead of the views'."""

    def __init__(self, curves):
        self.curves, self.inner = curves, make_policy("milp")

    def allocate(self, snapshot, jobs):
        return self.inner.allocate(snapshot, [dataclasses.replace(v, curve=self.curves[v.job_id])
                                              for v in jobs])


def test_a_wrong_curve_costs_efficiency_the_true_one_does_not():
    truth = {"p": JobSpec("p", max_nodes=8, curve=PEAK), "f": JobSpec("f", max_nodes=8, curve=FLAT)}
    snap = ClusterSnapshot(now_s=0, nodes=tuple(f"n{i}" for i in range(8)))
    views = [JobView(dataclasses.replace(s, curve=None), LINEAR) for s in truth.values()]
    right = DecisionAudit(truth, PlanWith({"p": PEAK, "f": FLAT}))
    right.allocate(snap, views)
    wrong = DecisionAudit(truth, PlanWith({"p": LINEAR, "f": FLAT}))  # p believed linear
    got = wrong.allocate(snap, views)
    assert got.size("p") == 8  # the wrong belief sends every node to p, past its peak
    assert right.summary(100.0)["decision_eff"] == pytest.approx(100.0)
    s = wrong.summary(100.0)
    # the optimum: p at 3 nodes (270/s), f on the other 5 (300/s); chosen: p at 8 (20/s)
    assert s["decision_eff"] == pytest.approx(100 * 20 / 570)
    assert s["de_loss_estimate"] == pytest.approx(100 - s["decision_eff"])  # no advisor: no split
    # a growth the truth does not repay: its pause is the loss, the rate is the same
    spec = JobSpec("g", max_nodes=8, rescale_up_s=5.0,
                   curve=ScalingCurve.from_points({1: 100.0, 2: 200.0, 8: 200.0}))
    held = [JobView(dataclasses.replace(spec, curve=None), LINEAR, frozenset({"n0", "n1"}))]
    grow = DecisionAudit({"g": spec}, PlanWith({"g": LINEAR}))
    assert grow.allocate(snap, held).size("g") == 8
    s = grow.summary(100.0)
    assert s["decision_eff"] == pytest.approx(50.0)  # 10 s x 200/s - 5 s x 200/s of 2000
    assert s["de_loss_pause"] == pytest.approx(50.0) and s["rate_eff"] == pytest.approx(100.0)
    with pytest.raises(SpecError, match="true curve"):
        DecisionAudit({"a": JobSpec("a")})


def test_the_optimum_honours_the_views_bounds_and_plan_holes_not_a_probes():
    """A size the job cannot run at (a plan hole, a bound the controller set) is no optimum
    either; before, the audit dropped them and charged the policy for not choosing it. A
    probe's bounds are dropped on purpose: the probe's cost is ``de_loss_probe``."""
    spec = JobSpec("a", max_nodes=8, curve=LINEAR)
    snap = ClusterSnapshot(now_s=0, nodes=tuple(f"n{i}" for i in range(3)))
    hidden = dataclasses.replace(spec, curve=None)
    for view in (JobView(hidden, LINEAR, sizes=(1, 2, 4)), JobView(hidden, LINEAR, max_nodes=2)):
        audit = DecisionAudit({"a": spec}, make_policy("milp"))
        assert audit.allocate(snap, [view]).size("a") == 2  # 3 is a hole / out of bounds
        assert audit.summary(10.0)["decision_eff"] == pytest.approx(100.0)  # was 2/3

    class Probing:  # an advisor probing "a" at 1 node (the JPA's interface the audit reads)
        records: dict = {}

        def probe_requests(self):
            return {"a": 1}

    audit = DecisionAudit({"a": spec}, make_policy("milp"), Probing())
    assert audit.allocate(snap, [JobView(hidden, LINEAR, min_nodes=1, max_nodes=1)]).size("a") == 1
    s = audit.summary(10.0)
    assert s["decision_eff"] == pytest.approx(100 / 3) and s["de_loss_probe"] == pytest.approx(200 / 3)


def _run(jobs, *, hide, truth=None, **adv_kw):
    frags = synthetic_fragments(n_nodes=24, duration_s=5 * 3600, mean_idle_s=5000,
                                mean_busy_s=2000, seed=2)
    tr = trace_from_fragments(frags, start_s=0.0, end_s=5 * 3600)
    adv = JobProfilingAdvisor(**{**SIM_DEFAULTS, **adv_kw})
    audit = DecisionAudit(truth or {j.job_id: j for j in jobs})
    res = simulate(tr, jobs, policy="milp+jpa", options=SimOptions(seed=1),
                   policy_options={"advisor": adv, "audit": audit, "hide_curves": hide})
    return res, audit.summary(res.end_s)


def test_decision_efficiency_in_the_simulator():
    jobs = zoo_jobs("peak", seed=1, n_jobs=8, start_s=0.0, mean_interarrival_s=300)
    # the true curves handed to the advisor: every decision is the oracle's (up to optimism)
    _, known = _run(jobs, hide=False, kappa=0.0)
    assert known["decisions"] > 5 and known["decision_eff"] >= 99.5
    # hidden curves: probes and estimates cost something, the parts sum to the loss
    res, hidden = _run(jobs, hide=True)
    assert 30 < hidden["decision_eff"] < 99.5
    parts = hidden["de_loss_probe"] + hidden["de_loss_unknown"] + hidden["de_loss_estimate"]
    assert parts == pytest.approx(100 - hidden["decision_eff"])
    assert min(hidden["de_loss_probe"], hidden["de_loss_unknown"], hidden["de_loss_estimate"]) >= -1e-9
    assert hidden["de_probing_time"] > 0 and hidden["de_loss_probe"] > 0
    # the audit only watches: the same replay without it trains the same samples
    adv = JobProfilingAdvisor(**SIM_DEFAULTS)
    frags = synthetic_fragments(n_nodes=24, duration_s=5 * 3600, mean_idle_s=5000,
                                mean_busy_s=2000, seed=2)
    tr = trace_from_fragments(frags, start_s=0.0, end_s=5 * 3600)
    plain = simulate(tr, jobs, policy="milp+jpa", options=SimOptions(seed=1),
                     policy_options={"advisor": adv})
    assert plain.samples == res.samples
    # the advisor given curves that are not the truth (each job another's): the audit sees it
    wrong = [dataclasses.replace(j, curve=jobs[i - 1].curve, max_nodes=min(
        j.max_nodes, jobs[i - 1].max_nodes)) for i, j in enumerate(jobs)]
    _, lied = _run(wrong, hide=False, truth={j.job_id: j for j in jobs}, kappa=0.0)
    assert lied["decision_eff"] < known["decision_eff"] - 5


@pytest.mark.parametrize("opts", [{"inner": "milp-horizon"}, {"inner_options": {"value": "work"}}])
def test_the_audit_refuses_a_policy_with_another_objective(opts):
    """It scores with plain milp's objective; against another one its figures mean nothing."""
    from malleparsl.sim.setups import make_setup

    spec = JobSpec("a", curve=ScalingCurve((1, 2), (1.0, 2.0)))
    with pytest.raises(SpecError, match="plain milp"):
        make_setup("milp+jpa", audit=DecisionAudit({"a": spec}), **opts)
