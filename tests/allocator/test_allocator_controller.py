"""The allocator policies inside the one controller: events in, valid plans out."""

import logging

import pytest
from allocator_cases import shaped_curve

from malleparsl.controller import Controller
from malleparsl.model import JobSpec


@pytest.mark.parametrize("policy", ["milp", "milp-horizon", "milp-node", "greedy", "equal-share"])
def test_event_sequence_gives_valid_plans(policy, caplog):
    from malleparsl.allocator import make_policy

    caplog.set_level(logging.ERROR, logger="malleparsl.controller")
    c = Controller(policy=make_policy(policy))
    curves = [shaped_curve(s, 50.0, 8) for s in ("linear", "saturating", "drop-at-two")]
    c.add_nodes([f"n{i}" for i in range(6)], now_s=0)
    for i, curve in enumerate(curves):
        c.submit(
            JobSpec(f"j{i}", max_nodes=8, rescale_up_s=5, rescale_down_s=3, curve=curve), now_s=0
        )
    first = c.replan(now_s=0)
    assert first.start and not first.stop
    held = {j: set(ns) for j, ns in c.allocation.assignment.items()}
    lost = c.remove_nodes(["n0", "n1"], now_s=30)
    assert lost == {j: frozenset(h & {"n0", "n1"}) for j, h in held.items() if h & {"n0", "n1"}}
    c.replan(now_s=30)
    c.add_nodes([f"m{i}" for i in range(4)], now_s=60, end_s={"m0": 65.0, "m1": 5000.0})
    c.replan(now_s=60)
    c.finish("j0", now_s=90)
    c.replan(now_s=90)
    assert not [r for r in caplog.records if "invalid allocation" in r.getMessage()]
    assert "n0" not in c.allocation.used_nodes and "n1" not in c.allocation.used_nodes
    assert c.allocation.used_nodes <= set(c.nodes)


def test_horizon_policy_in_controller_skips_a_node_about_to_vanish():
    from malleparsl.allocator import make_policy

    curve = shaped_curve("linear", 100.0, 8)
    c = Controller(policy=make_policy("milp-horizon"))
    c.add_nodes(["a"], now_s=0)
    c.submit(JobSpec("j", max_nodes=8, rescale_up_s=25, curve=curve), now_s=0)
    assert c.replan(now_s=0).start == {"j": frozenset({"a"})}
    c.add_nodes(["soon"], now_s=100, end_s={"soon": 120.0})
    assert c.replan(now_s=100).empty  # 20 s of +100/s does not repay a 25 s pause
    c.add_nodes(["later"], now_s=110, end_s={"later": 2000.0})
    plan = c.replan(now_s=110)
    assert plan.grow == {"j": frozenset({"later"})}


def test_policy_sees_how_many_jobs_wait_behind_the_cap():
    """The snapshot handed to the policy counts the jobs the cap (``max_active``) keeps queued."""
    from malleparsl.allocator import make_policy

    seen = []

    class Recording:
        def __init__(self, policy):
            self.policy = policy

        def allocate(self, snapshot, jobs):
            seen.append((snapshot.queued, len(jobs)))
            return self.policy.allocate(snapshot, jobs)

    curve = shaped_curve("linear", 100.0, 8)
    c = Controller(policy=Recording(make_policy("greedy")), max_active=2)
    c.add_nodes(["a", "b", "c"], now_s=0)
    for i in range(4):
        c.submit(JobSpec(f"j{i}", max_nodes=8, curve=curve), now_s=0)
    c.replan(now_s=0)
    c.finish("j0", now_s=10)
    c.replan(now_s=10)
    c.finish("j1", now_s=20)
    c.finish("j2", now_s=20)
    c.replan(now_s=20)
    assert seen == [(2, 2), (1, 2), (0, 1)]
    assert c.snapshot(20).queued == 0
