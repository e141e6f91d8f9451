"""SlurmScavenger against a real local Slurm: discovery, pinning, caps, idle ends, preemption."""

from __future__ import annotations

import shutil
import time

import pytest

from malleparsl.errors import SpecError
from malleparsl.scavenger.localslurm import LocalSlurm
from malleparsl.scavenger.slurm import SlurmScavenger
from malleparsl.scavenger.slurm_parse import expand_hostlist
from malleparsl.scavenger.slurm_provider import NodeCapError, ScavengingSlurmProvider

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(120)]


def _provider(slurm, tmp_path, **kw):
    kw.setdefault("partition", "scavenger")
    kw.setdefault("node_cap", 6)
    prov = ScavengingSlurmProvider(walltime="00:10:00", run=slurm.runner(),
                                   signal_dir=str(tmp_path / "preempt"), **kw)
    prov.script_dir = str(tmp_path)
    return prov


def _poll_until(src, pred, timeout_s=15.0):
    """Poll until ``pred(events so far)`` holds; return the events."""
    events, deadline = [], time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        events += src.poll(time.monotonic())
        if pred(events):
            return events
        time.sleep(0.2)
    raise AssertionError(f"condition not met in {timeout_s} s; events: {events}")


def _running_nodes(slurm, job_ids):
    out = slurm.run(f"squeue -h -j {','.join(job_ids)} -o '%i|%T|%N'").stdout
    rows = [ln.split("|") for ln in out.splitlines() if ln]
    return {r[0]: r[2] for r in rows if r[1] == "RUNNING"}


def test_discovers_idle_nodes_up_to_cap_and_pins_pilots(slurm, tmp_path):
    prov = _provider(slurm, tmp_path, node_cap=6)
    src = SlurmScavenger(provider=prov, query_period_s=0)
    events = src.poll(0.0)
    assert [e.kind for e in events] == ["idle"] * 6
    nodes = [e.node for e in events]
    assert len(set(nodes)) == 6 and set(nodes) <= set(slurm.node_names)
    assert all(e.end_s is None for e in events)  # nothing planned on this cluster
    jobs = [prov.submit("sleep 600", 1, "parsl.test") for _ in nodes]
    assert [prov.node_of(j) for j in jobs] == nodes
    deadline = time.monotonic() + 10
    while len(_running_nodes(slurm, jobs)) < 6 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _running_nodes(slurm, jobs) == dict(zip(jobs, nodes))  # each on its pinned node
    assert src.poll(1.0) == []  # at the cap: the two other idle nodes are not announced
    prov.pin("n08")
    with pytest.raises(NodeCapError, match="node_cap=6"):
        prov.submit("sleep 600", 1, "parsl.test")
    partitions = slurm.run(f"squeue -h -j {','.join(jobs)} -o %P").stdout.split()
    assert set(partitions) == {"scavenger"}


def test_preemption_reported_as_taken_and_release_is_silent(slurm, tmp_path):
    prov = _provider(slurm, tmp_path, node_cap=8)
    src = SlurmScavenger(provider=prov, query_period_s=0.5, cooldown_s=60)
    events = src.poll(0.0)
    jobs = {prov.submit("sleep 600", 1, "parsl.test"): e.node for e in events}
    assert len(jobs) == 8
    _poll_until(src, lambda ev: len(_running_nodes(slurm, list(jobs))) == 8)
    released_job, released_node = next(iter(jobs.items()))
    prov.cancel([released_job])
    hp = slurm.sbatch("-p main -N 3 -t 1 -J hp", "sleep 30")  # 1 node free: must preempt 2+
    taken = _poll_until(src, lambda ev: any(e.kind == "taken" for e in ev))
    # how fast is a figure of `malleparsl bench slurm`; here: every preemption is reported.
    # The scheduler may preempt in more than one pass, so wait for the two sets to agree.
    deadline = time.monotonic() + 60
    while True:
        states = dict(ln.split("|") for ln in slurm.run(
            f"squeue -h -t all -j {','.join(jobs)} -o '%i|%T'").stdout.splitlines())
        preempted = {jobs[j] for j, s in states.items() if s == "PREEMPTED"}
        taken_nodes = {e.node for e in taken if e.kind == "taken"}
        if "RUNNING" in slurm.job_state(hp) and len(preempted) >= 2 and preempted == taken_nodes:
            break
        assert time.monotonic() < deadline, (states, taken)
        time.sleep(0.2)
        taken += src.poll(time.monotonic())
    assert released_node not in taken_nodes  # our own release is not a preemption
    hp_nodes = set(expand_hostlist(slurm.run(f"squeue -h -j {hp} -o %N").stdout))
    assert len(hp_nodes) == 3 and taken_nodes <= hp_nodes  # it runs where pilots were
    # the released node is not announced again during its cooldown, nor are preempted ones
    assert all(e.node != released_node for e in src.poll(10.0) if e.kind == "idle")


def test_idle_end_from_reservation_and_planned_start(slurm, tmp_path):
    slurm.run("scontrol create reservation reservationname=maint starttime=now+60 "
              "duration=5 nodes=n08 user=root flags=ignore_jobs")
    a = slurm.sbatch("-p main -N 5 -t 1 -J big", "sleep 120")  # holds n01-n05 up to 60 s
    b = slurm.sbatch("-p main -N 7 -t 1 -J next", "sleep 5")  # planned once `big` ends
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if "RUNNING" in slurm.job_state(a) and slurm.run(
                f"squeue -h --start -j {b} -o %Y").stdout.strip() not in ("", "(null)"):
            break
        time.sleep(0.2)
    prov = _provider(slurm, tmp_path, node_cap=8)
    src = SlurmScavenger(provider=prov, query_period_s=0)
    now = 1000.0
    ends = {e.node: e.end_s for e in src.poll(now)}
    assert set(ends) == {"n06", "n07", "n08"}
    assert ends["n08"] == pytest.approx(now + 60, abs=5)  # the reservation
    planned = expand_hostlist(slurm.run(f"squeue -h --start -j {b} -o %Y").stdout)
    assert {"n06", "n07"} <= set(planned)  # backfill keeps them for `next`...
    for n in ("n06", "n07"):
        assert ends[n] == pytest.approx(now + 60, abs=5)  # ...which starts when `big` ends


def test_min_idle_skips_nodes_needed_soon(slurm, tmp_path):
    slurm.run("scontrol create reservation reservationname=soon starttime=now+20 "
              "duration=5 nodes=n01,n02 user=root flags=ignore_jobs")
    prov = _provider(slurm, tmp_path, node_cap=8)
    src = SlurmScavenger(provider=prov, query_period_s=0, min_idle_s=60)
    nodes = {e.node for e in src.poll(0.0)}
    assert nodes == set(slurm.node_names) - {"n01", "n02"}


def test_refuses_nonpreemptible_partition_unless_allowed(slurm, tmp_path):
    prov = _provider(slurm, tmp_path, partition="main")
    prov.pin("n01")
    with pytest.raises(SpecError, match="PreemptMode=OFF"):
        prov.submit("sleep 5", 1, "parsl.test")
    allowed = _provider(slurm, tmp_path, partition="main", allow_nonpreemptible=True)
    allowed.pin("n01")
    job = allowed.submit("sleep 5", 1, "parsl.test")
    assert slurm.run(f"squeue -h -j {job} -o %P").stdout.strip() == "main"


def test_requeued_pilots_are_cancelled_and_reported_taken(slurm_cluster, tmp_path):
    """A site whose scavenger partition requeues preempted jobs: the requeued pilot must not
    sit in the queue holding a claim; it is cancelled and its node reported taken."""
    with LocalSlurm(nodes=4, preempt_mode="REQUEUE") as slurm:
        prov = _provider(slurm, tmp_path, node_cap=4)
        src = SlurmScavenger(provider=prov, query_period_s=0.3)
        jobs = {prov.submit("sleep 600", 1, "parsl.test"): e.node for e in src.poll(0.0)}
        _poll_until(src, lambda ev: len(_running_nodes(slurm, list(jobs))) == 4)
        requeue = slurm.run("scontrol show partition scavenger -o").stdout
        assert "PreemptMode=REQUEUE" in requeue
        shutil.rmtree(tmp_path / "preempt", ignore_errors=True)  # test the squeue path only
        prov.signal_dir = str(tmp_path / "unused")
        slurm.sbatch("-p main -N 2 -t 1 -J hp", "sleep 30")
        taken = _poll_until(src, lambda ev: len([e for e in ev if e.kind == "taken"]) >= 2)
        lost = [j for j, n in jobs.items() if n in {e.node for e in taken}]
        time.sleep(0.5)
        states = slurm.run(f"squeue -h -t all -j {','.join(lost)} -o %T").stdout.split()
        assert states and all(s == "CANCELLED" for s in states), states  # not left requeued
