"""Issue 7, item 5b fed by a real scheduler: Slurm says an idle node is needed again in 20 s
(a reservation), the scavenger turns that into ``end_s``, and the controller's
``milp-horizon`` policy declines to grow a job onto it because the 25 s rescale pause costs
more than 20 s on it would earn; a node Slurm leaves idle for 10 minutes is taken instead."""

from __future__ import annotations

import time

import pytest

from malleparsl.allocator import make_policy
from malleparsl.controller import Controller
from malleparsl.model import JobSpec, ScalingCurve
from malleparsl.scavenger.slurm import SlurmScavenger
from malleparsl.scavenger.slurm_provider import ScavengingSlurmProvider

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(120)]

CURVE = ScalingCurve.from_points({n: 100.0 * n for n in range(1, 9)})  # 100 samples/s per node


def test_controller_declines_a_node_slurm_needs_back_in_20_s(slurm, tmp_path):
    facility = slurm.sbatch("-p main -w n[04-08] -N 5 -J facility", "sleep 600")
    deadline = time.monotonic() + 20
    while slurm.job_state(facility) != "RUNNING":  # then only n01-n03 are idle
        assert time.monotonic() < deadline, "the facility job did not start"
        time.sleep(0.1)
    slurm.run("scontrol create reservation reservationname=soon starttime=now+20 duration=5 "
              "nodes=n02 user=root flags=ignore_jobs")
    slurm.run("scontrol create reservation reservationname=later starttime=now+600 duration=5 "
              "nodes=n03 user=root flags=ignore_jobs")
    slurm.wait_idle(["n01", "n02", "n03"])
    prov = ScavengingSlurmProvider(partition="scavenger", node_cap=8, run=slurm.runner(),
                                   signal_dir=str(tmp_path / "term"))
    prov.script_dir = str(tmp_path)
    src = SlurmScavenger(provider=prov, query_period_s=0)
    now = 1000.0
    ends = {e.node: e.end_s for e in src.poll(now) if e.kind == "idle"}
    assert set(ends) == {"n01", "n02", "n03"}
    assert ends["n01"] is None
    assert ends["n02"] == pytest.approx(now + 20, abs=2)
    assert ends["n03"] == pytest.approx(now + 600, abs=2)

    ctl = Controller(policy=make_policy("milp-horizon"))
    ctl.submit(JobSpec("j", max_nodes=8, rescale_up_s=25.0, curve=CURVE), now_s=now)
    ctl.add_nodes(["n01"], now_s=now)
    assert ctl.replan(now_s=now).start == {"j": frozenset({"n01"})}
    ctl.add_nodes(["n02"], now_s=now, end_s={"n02": ends["n02"]})
    assert ctl.replan(now_s=now).empty  # 20 s * 100/s = 2,000 < 25 s * 100/s = 2,500
    ctl.add_nodes(["n03"], now_s=now, end_s={"n03": ends["n03"]})
    plan = ctl.replan(now_s=now)
    assert plan.grow == {"j": frozenset({"n03"})}  # grows onto the long-idle node only
    assert ctl.allocation.nodes_of("j") == {"n01", "n03"}
