"""SlurmScavenger decisions and parsers on recorded command output (no Slurm needed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from malleparsl.errors import SpecError
from malleparsl.scavenger.shell import CommandResult
from malleparsl.scavenger.slurm import SlurmScavenger
from malleparsl.scavenger.slurm_parse import (
    expand_hostlist,
    idle_ends,
    idle_nodes,
    parse_reservations,
    parse_sinfo_nodes,
    parse_squeue_start,
)
from malleparsl.scavenger.slurm_provider import NodeCapError, ScavengingSlurmProvider


class FakeSlurm:
    """Answers scheduler commands from editable state; records every command."""

    def __init__(self):
        self.nodes = {f"n{i:02d}": "idle" for i in range(1, 5)}
        self.jobs: dict[str, list[str]] = {}  # id -> [STATE, node]
        self.start = ""  # squeue --start output
        self.resv = ""
        self.fail = False
        self.cmds: list[str] = []
        self.next_id = 100

    def __call__(self, argv: list[str]) -> CommandResult:
        assert isinstance(argv, list), f"commands are argument lists, got {argv!r}"
        cmd = " ".join(argv)
        self.cmds.append(cmd)
        if self.fail and not cmd.startswith("scancel"):
            return CommandResult(1, "", "slurm_load_jobs error: Socket timed out")
        if cmd.startswith("sacct"):
            return CommandResult(1, "", "Slurm accounting storage is disabled")
        if cmd.startswith("sinfo"):
            return CommandResult(0, "".join(f"{n}|{s}\n" for n, s in self.nodes.items()), "")
        if "--start" in cmd:
            return CommandResult(0, self.start, "")
        if "show reservation" in cmd:
            return CommandResult(0, self.resv, "")
        if "show partition" in cmd:
            mode = "OFF" if "main" in cmd else "CANCEL"
            return CommandResult(0, f"PartitionName=x PriorityTier=1 PreemptMode={mode}\n", "")
        if cmd.startswith("sbatch"):
            self.next_id += 1
            return CommandResult(0, f"Submitted batch job {self.next_id}\n", "")
        if cmd.startswith("scancel"):
            for j in cmd.split()[1:]:
                if j in self.jobs:
                    self.jobs[j][0] = "CANCELLED"
            return CommandResult(0, "", "")
        if cmd.startswith("squeue"):
            ids = cmd.split("-j ")[1].split()[0].split(",")
            rows = [f"{j}|{self.jobs[j][0]}|{self.jobs[j][1]}" for j in ids if j in self.jobs]
            err = "" if len(rows) == len(ids) else "slurm_load_jobs error: Invalid job id specified"
            return CommandResult(0 if not err or rows else 1, "\n".join(rows) + "\n", err)
        raise AssertionError(f"unexpected command {cmd!r}")


@pytest.fixture
def fake(tmp_path):
    f = FakeSlurm()
    prov = ScavengingSlurmProvider(partition="scavenger", node_cap=3, run=f,
                                   signal_dir=str(tmp_path / "term"))
    prov.script_dir = str(tmp_path)
    return f, prov


def _submit(f, prov, state="RUNNING"):
    job = prov.submit("true", 1, "parsl.t")
    f.jobs[job] = [state, prov.node_of(job)]
    return job


def test_hostlists_and_parsers():
    assert expand_hostlist("n[01-03,07],gpu[1-2]x") == ["n01", "n02", "n03", "n07", "gpu1x", "gpu2x"]
    assert expand_hostlist("x1000c0s[0-1]b0n[0-1]") == [
        "x1000c0s0b0n0", "x1000c0s0b0n1", "x1000c0s1b0n0", "x1000c0s1b0n1"]
    with pytest.raises(SpecError, match="unbalanced"):
        expand_hostlist("n[01-02")
    states = parse_sinfo_nodes("n[01-02]|idle\nn03|idle*\nn04|planned\nn05|mixed\n")
    assert idle_nodes(states) == ["n01", "n02", "n04"]
    planned = parse_squeue_start("7|1000|n[01-02]\n8|N/A|(null)\n9|2000|n01\n")
    assert [(p.job_id, p.start, p.nodes) for p in planned] == [("7", 1000.0, ("n01", "n02")),
                                                                 ("9", 2000.0, ("n01",))]
    resv = parse_reservations(
        "ReservationName=m StartTime=1500 EndTime=1800 Duration=5 Nodes=n0[2-3] NodeCnt=2\n")
    assert resv[0].nodes == ("n02", "n03") and resv[0].start == 1500.0
    ends = idle_ends(["n01", "n02", "n03", "n04"], planned, resv, now=900.0)
    assert ends == {"n01": 1000.0, "n02": 1000.0, "n03": 1500.0}


def test_announces_up_to_cap_longest_idle_first_with_end_on_callers_clock(fake):
    f, prov = fake
    f.start = "7|1100|n01\n"
    src = SlurmScavenger(provider=prov, query_period_s=0, wall_clock=lambda: 1000.0)
    events = src.poll(now_s=50.0)
    assert [(e.kind, e.node, e.end_s) for e in events] == [
        ("idle", "n02", None), ("idle", "n03", None), ("idle", "n04", None)]
    f.nodes["n04"] = "allocated"
    assert src.poll(now_s=51.0) == []  # cap of 3 reached
    jobs = [_submit(f, prov) for _ in range(3)]
    assert [f.jobs[j][1] for j in jobs] == ["n02", "n03", "n04"]
    assert any("--nodelist=n02" in Path(p).read_text() for p in _scripts(prov))
    prov.pin("n01")
    with pytest.raises(NodeCapError):
        prov.submit("true", 1, "parsl.t")


def _scripts(prov):
    import glob
    return [p for p in glob.glob(prov.script_dir + "/parsl.t*") if not p.endswith(("out", "err"))]


def test_end_estimate_used_when_only_soon_nodes_remain(fake):
    f, prov = fake
    f.nodes = {"n01": "idle", "n02": "planned"}
    f.start = "7|1030|n02\n"
    src = SlurmScavenger(provider=prov, query_period_s=0, wall_clock=lambda: 1000.0,
                         min_idle_s=10)
    assert [(e.node, e.end_s) for e in src.poll(now_s=0.0)] == [("n01", None), ("n02", 30.0)]
    src2 = SlurmScavenger(provider=prov, query_period_s=0, wall_clock=lambda: 1000.0,
                          min_idle_s=60)
    assert [e.node for e in src2.poll(now_s=0.0)] == ["n01"]


def test_preempted_gone_and_requeued_pilots_are_taken_released_ones_silent(fake):
    f, prov = fake
    src = SlurmScavenger(provider=prov, query_period_s=0, cooldown_s=100, retake_after_s=0,
                         wall_clock=lambda: 1000.0)
    src.poll(0.0)
    a, b, c = (_submit(f, prov) for _ in range(3))
    assert src.poll(1.0) == []
    f.jobs[a][0] = "PREEMPTED"
    del f.jobs[b]  # purged from squeue
    prov.cancel([c])  # our own release
    taken = src.poll(2.0)
    assert sorted(e.node for e in taken if e.kind == "taken") == ["n01", "n02"]
    # n03 rests (cooldown) although idle again; n01, n02 come back as idle nodes
    for n in f.nodes:
        f.nodes[n] = "idle"
    again = [e.node for e in src.poll(3.0) if e.kind == "idle"]
    assert "n03" not in again and set(again) <= {"n01", "n02", "n04"}


def test_requeued_pilot_is_cancelled_and_taken(fake):
    f, prov = fake
    src = SlurmScavenger(provider=prov, query_period_s=0, wall_clock=lambda: 1000.0)
    src.poll(0.0)
    job = _submit(f, prov)
    src.poll(1.0)
    f.jobs[job][0] = "PENDING"  # requeued after preemption
    taken = [e for e in src.poll(2.0) if e.kind == "taken"]
    assert [e.node for e in taken] == [f.jobs[job][1]]
    assert f.jobs[job][0] == "CANCELLED" and any(cmd == f"scancel {job}" for cmd in f.cmds)


def test_unclaimed_announcement_expires(fake):
    f, prov = fake
    clock = [1000.0]
    src = SlurmScavenger(provider=prov, query_period_s=0, claim_timeout_s=5,
                         wall_clock=lambda: clock[0])
    first = src.poll(0.0)
    clock[0] += 6
    f.nodes = {n: "allocated" for n in f.nodes}
    taken = src.poll(6.0)
    assert {e.node for e in taken} == {e.node for e in first}
    assert all(e.kind == "taken" for e in taken)
    with pytest.raises(SpecError, match="no node to pin"):
        prov.submit("true", 1, "parsl.t")  # the pins were dropped too


def test_sigterm_marker_reports_before_squeue(fake, tmp_path):
    f, prov = fake
    src = SlurmScavenger(provider=prov, query_period_s=1e9, wall_clock=lambda: 1000.0)
    src.poll(0.0)
    job = _submit(f, prov)
    (tmp_path / "term").mkdir()
    (tmp_path / "term" / f"{job}.term").touch()
    n_cmds = len(f.cmds)
    taken = src.poll(1.0)
    assert [(e.kind, e.node) for e in taken] == [("taken", f.jobs[job][1])]
    assert len(f.cmds) == n_cmds  # no scheduler query was needed
    assert src.poll(2.0) == []  # reported once


def test_scheduler_failure_yields_no_events_and_no_exception(fake):
    f, prov = fake
    src = SlurmScavenger(provider=prov, query_period_s=0, wall_clock=lambda: 1000.0)
    src.poll(0.0)
    job = _submit(f, prov)
    f.fail = True
    assert src.poll(1.0) == []
    f.fail = False
    assert src.poll(2.0) == [] and f.jobs[job][0] == "RUNNING"


def test_refuses_nonpreemptible_partition_and_missing_partition(fake):
    f, _ = fake
    prov = ScavengingSlurmProvider(partition="main", run=f)
    prov.script_dir = "/tmp"
    prov.pin("n01")
    with pytest.raises(SpecError, match="allow_nonpreemptible=True"):
        prov.submit("true", 1, "parsl.t")
    with pytest.raises(SpecError, match="partition= or qos="):
        ScavengingSlurmProvider(run=f)
    with pytest.raises(SpecError, match="node_cap"):
        ScavengingSlurmProvider(partition="scavenger", node_cap=0, run=f)


def test_cap_frees_up_as_soon_as_a_preemption_is_seen(fake):
    f, prov = fake
    src = SlurmScavenger(provider=prov, query_period_s=0, wall_clock=lambda: 1000.0)
    src.poll(0.0)
    jobs = [_submit(f, prov) for _ in range(3)]
    f.jobs[jobs[0]][0] = "PREEMPTED"
    f.nodes[f.jobs[jobs[0]][1]] = "allocated"
    events = src.poll(1.0)
    assert [e.kind for e in events] == ["taken", "idle"]  # n04 takes the freed slot
    assert len(prov.active_pilots()) == 2  # Parsl has not polled status yet; we know anyway
    _submit(f, prov)
    assert f.jobs[max(f.jobs)][1] == "n04"


def test_submit_to_node_pins_that_node_and_consumes_its_announcement(fake):
    f, prov = fake
    src = SlurmScavenger(provider=prov, query_period_s=0, wall_clock=lambda: 1000.0)
    announced = [e.node for e in src.poll(0.0)]
    job = prov.submit_to_node("true", 1, "parsl.t", node=announced[1])
    assert prov.node_of(job) == announced[1]
    rest = [prov.node_of(prov.submit("true", 1, "parsl.t")) for _ in range(2)]
    assert rest == [announced[0], announced[2]]  # the FIFO skipped the node taken by name


def test_holds_only_what_jobs_need_and_returns_unused_surplus(fake):
    f, prov = fake
    clock = [1000.0]
    want = [2]
    src = SlurmScavenger(provider=prov, query_period_s=0, wall_clock=lambda: clock[0],
                         demand=lambda: want[0], in_use=lambda: {"n01"}, return_after_s=10,
                         cooldown_s=100)
    assert [e.node for e in src.poll(0.0)] == ["n01", "n02"]  # 2 wanted, 4 idle, cap 3
    jobs = [_submit(f, prov) for _ in range(2)]
    want[0] = 0  # the jobs finished (n01 still listed in use, e.g. a rank stopping)
    assert src.poll(1.0) == []  # surplus seen; wait return_after_s before giving back
    clock[0] += 11
    back = src.poll(2.0)
    assert [(e.kind, e.node) for e in back] == [("taken", "n02")]  # n01 is in use: kept
    clock[0] += 1
    assert src.poll(3.0) == []  # nothing announced while no job wants nodes
    want[0] = None  # unknown demand: up to the cap again (n02 rests in its cooldown)
    assert {e.node for e in src.poll(4.0)} == {"n03", "n04"}
    assert prov.node_of(jobs[1]) == "n02"


def test_planned_node_without_a_known_start_is_not_taken(fake):
    """Regression: during a preemption Slurm shows the victims' nodes "planned" for the
    preemptor before squeue --start lists it; announcing them made the executor re-add a node
    it still held."""
    f, prov = fake
    f.nodes = {"n01": "planned", "n02": "planned", "n03": "idle"}
    f.start = "9|1500|n02\n"
    src = SlurmScavenger(provider=prov, query_period_s=0, wall_clock=lambda: 1000.0)
    assert [(e.node, e.end_s) for e in src.poll(0.0)] == [("n03", None), ("n02", 500.0)]


@pytest.mark.parametrize("answer, ok", [
    (CommandResult(0, "preempt|REQUEUE\n", ""), True),
    (CommandResult(0, "normal|OFF\n", ""), False),
    (CommandResult(1, "", "sacctmgr: error: Problem talking to the database"), False),
])
def test_qos_must_be_shown_preemptible_by_sacctmgr(answer, ok):
    def run(argv):
        cmd = " ".join(argv)
        if cmd.startswith("sacctmgr"):
            return answer
        return FakeSlurm()(argv)

    prov = ScavengingSlurmProvider(qos="preempt", run=run)
    if ok:
        prov.check_preemptible()
    else:
        with pytest.raises(SpecError, match="cannot confirm that QOS 'preempt' is preemptible"):
            prov.check_preemptible()
    assert ScavengingSlurmProvider(qos="preempt", run=run, allow_nonpreemptible=True
                                   ).check_preemptible() is None
