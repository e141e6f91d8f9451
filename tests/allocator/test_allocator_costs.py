"""Cost rules shared by the accounting and the policies; ``milp``'s work value."""

import numpy as np
import pytest

from malleparsl.allocator import ClusterSnapshot, JobView, make_policy
from malleparsl.allocator.costs import OLD_RATE, PAUSE, costs_named
from malleparsl.allocator.countmodel import build_options
from malleparsl.allocator.hold import HoldPolicy
from malleparsl.allocator.milp import work_weights
from malleparsl.allocator.objective import best_count_objective
from malleparsl.allocator.placement import node_horizons
from malleparsl.allocator.value_table import hold_value_table
from malleparsl.errors import SpecError
from malleparsl.model import JobSpec, ScalingCurve
from malleparsl.sim.bftrainer import COSTS, simulate_bftrainer
from malleparsl.traces import trace_from_fragments

LIN = ScalingCurve((1, 2, 4), (10.0, 20.0, 40.0))
RATES = np.array([0.0, 10.0, 20.0, 30.0, 40.0])


def spec(jid, curve=LIN, hi=4):
    return JobSpec(jid, max_nodes=hi, rescale_up_s=5.0, rescale_down_s=2.0, curve=curve)


def test_old_rate_start_is_free_pause_is_not():
    sizes = np.array([0, 1, 2, 4])
    assert OLD_RATE.rescale(sizes, 0, RATES, 5.0, 2.0).tolist() == [0, 0, 0, 0]
    assert PAUSE.rescale(sizes, 0, RATES, 5.0, 2.0).tolist() == [0, 50, 100, 200]
    # from 2 nodes: a shrink pays down_s, a grow up_s, at the old or the new rate
    assert OLD_RATE.rescale(sizes, 2, RATES, 5.0, 2.0).tolist() == [40, 40, 0, 100]
    assert PAUSE.rescale(sizes, 2, RATES, 5.0, 2.0).tolist() == [0, 20, 0, 200]
    assert OLD_RATE.preemption(30.0, 2.0) == 60.0
    assert costs_named("pause") is PAUSE and costs_named(OLD_RATE) is OLD_RATE
    with pytest.raises(SpecError, match="costs must be one of"):
        costs_named("free")


def test_count_model_values_follow_the_cost_rule():
    job = JobView(spec("a"), LIN, frozenset({"n1"}))
    snap = ClusterSnapshot(now_s=0, nodes=("n1", "n2", "n3"))
    hz = node_horizons(snap)
    for rule in (OLD_RATE, PAUSE):
        t = build_options(snap, [job], hz, costs=rule)
        for k, v in zip(t.size, t.value):
            pay = rule.rescale(np.array([k]), 1, RATES, 5.0, 2.0)[0]
            assert v == pytest.approx(10.0 * RATES[k] - pay)
    # the default (BFTrainer's objective) is still the published one
    pol = make_policy("milp")
    assert pol.costs is OLD_RATE
    value, counts = best_count_objective(snap, [job])
    assert pol.allocate(snap, [job]).sizes() == {"a": counts["a"]}


def test_bftrainer_replay_hands_its_cost_rule_to_the_policy(monkeypatch):
    seen = []
    import malleparsl.allocator.milp as milp

    orig = milp.MilpPolicy.allocate

    def spy(self, snapshot, jobs):
        seen.append(self.costs)
        return orig(self, snapshot, jobs)

    monkeypatch.setattr(milp.MilpPolicy, "allocate", spy)
    tr = trace_from_fragments([("n1", 0, 100), ("n2", 50, 100)])
    # milp's default and an explicit request for the same rule both plan with COSTS
    simulate_bftrainer(tr, [spec("a")], policy="milp")
    simulate_bftrainer(tr, [spec("a")], policy="milp", policy_options={"costs": "old-rate"})
    assert seen and all(c is COSTS for c in seen) and COSTS is OLD_RATE
    # hold plans with "pause" by default; the replay hands it COSTS too
    hold = []
    orig_hold = HoldPolicy.allocate

    def spy_hold(self, snapshot, jobs):
        hold.append(self.costs)
        return orig_hold(self, snapshot, jobs)

    monkeypatch.setattr(HoldPolicy, "allocate", spy_hold)
    simulate_bftrainer(tr, [spec("a")], policy="hold")
    assert hold and all(c is COSTS for c in hold)


@pytest.mark.parametrize("policy", ["milp", "hold"])
def test_bftrainer_replay_refuses_a_conflicting_cost_rule(policy):
    tr = trace_from_fragments([("n1", 0, 100), ("n2", 50, 100)])
    with pytest.raises(SpecError, match=r"costs='pause' conflicts with --semantics bftrainer"):
        simulate_bftrainer(tr, [spec("a")], policy=policy, policy_options={"costs": "pause"})
    with pytest.raises(SpecError, match="costs must be one of"):
        simulate_bftrainer(tr, [spec("a")], policy=policy, policy_options={"costs": "free"})


def test_hold_takes_its_cost_rule_by_name_and_uses_it():
    assert make_policy("hold").costs is PAUSE
    assert make_policy("hold-jct", costs="old-rate").costs is OLD_RATE
    with pytest.raises(SpecError, match="costs must be one of old-rate, pause, got 'free'"):
        make_policy("hold", costs="free")
    # a grow from 1 to 4 nodes pays its pause at the new rate (PAUSE) or the old one
    view = JobView(spec("a"), LIN, frozenset({"n1"}))
    (pause,) = hold_value_table([view], 4, 100.0, [100.0], np.ones(1), PAUSE)
    (old,) = hold_value_table([view], 4, 100.0, [100.0], np.ones(1), OLD_RATE)
    assert old[4] - pause[4] == pytest.approx(5.0 * (40.0 - 10.0))


def test_work_value_spends_nodes_where_they_do_most_of_a_job():
    fast = ScalingCurve((1, 2), (100.0, 150.0))
    slow = ScalingCurve((1, 2), (10.0, 20.0))
    jobs = [JobView(spec("fast", fast, 2), fast), JobView(spec("slow", slow, 2), slow)]
    snap = ClusterSnapshot(now_s=0, nodes=("n1", "n2"))
    # samples: 150 (fast on both) beats 110; work: 1.5 node-s/s beats 2 (one each)
    assert make_policy("milp").allocate(snap, jobs).sizes() == {"fast": 2}
    assert make_policy("milp-work").allocate(snap, jobs).sizes() == {"fast": 1, "slow": 1}
    w = work_weights(jobs, 2)
    assert w[0] == pytest.approx(1 / 100 + 1e-3 / 100) and w[1] == pytest.approx(1 / 10 + 1e-3 / 100)


def test_work_ties_go_to_the_faster_model():
    fast = ScalingCurve((1, 2), (100.0, 110.0))
    slow = ScalingCurve((1, 2), (10.0, 11.0))
    jobs = [JobView(spec("slow", slow, 2), slow), JobView(spec("fast", fast, 2), fast)]
    snap = ClusterSnapshot(now_s=0, nodes=("n1",))
    assert make_policy("milp-work").allocate(snap, jobs).sizes() == {"fast": 1}


def test_milp_refuses_an_unknown_value():
    with pytest.raises(SpecError, match="value must be one of"):
        make_policy("milp", value="speed")


def _no_solution(monkeypatch):
    """Force the solver fallback: no answer from the solver, no proof from the LP bound."""
    import malleparsl.allocator.milp as milp
    from malleparsl.allocator.solvers import SolveResult

    monkeypatch.setattr(milp, "solve", lambda *a, **k: SolveResult("none", 9.9, None, "timeout"))
    monkeypatch.setattr(milp, "_proved", lambda *a: False)


def test_milp_work_fallback_keeps_the_work_value(monkeypatch):
    fast = ScalingCurve((1, 2), (100.0, 150.0))
    slow = ScalingCurve((1, 2), (10.0, 20.0))
    jobs = [JobView(spec("fast", fast, 2), fast), JobView(spec("slow", slow, 2), slow)]
    snap = ClusterSnapshot(now_s=0, nodes=("n1", "n2"))
    _no_solution(monkeypatch)
    pol = make_policy("milp-work", reduce=False, dp=False)
    assert pol.allocate(snap, jobs).sizes() == {"fast": 1, "slow": 1}  # not {"fast": 2}
    assert pol.last_fallback and pol.last_stats["fallback"] == "greedy"
    plain = make_policy("milp", reduce=False, dp=False)
    assert plain.allocate(snap, jobs).sizes() == {"fast": 2} and plain.last_fallback


def test_milp_fallback_keeps_the_cost_rule(monkeypatch):
    """A start paying 15 s of pause at its new rate is worth less than 10 s of training: with
    ``costs="pause"`` the fallback starts nothing, as the exact model; old-rate starts are free."""
    slow_start = JobSpec("a", max_nodes=4, rescale_up_s=15.0, rescale_down_s=2.0, curve=LIN)
    jobs = [JobView(slow_start, LIN)]
    snap = ClusterSnapshot(now_s=0, nodes=("n1", "n2", "n3"))
    exact = {
        c: make_policy("milp", costs=c).allocate(snap, jobs).sizes() for c in ("pause", "old-rate")
    }
    assert exact == {"pause": {}, "old-rate": {"a": 3}}
    _no_solution(monkeypatch)
    for c, want in exact.items():
        pol = make_policy("milp", costs=c, reduce=False, dp=False)
        assert pol.allocate(snap, jobs).sizes() == want and pol.last_fallback
