"""PBS Pro scavenging on recorded command output (tests/scavenger/fixtures/)."""

from __future__ import annotations

from pathlib import Path

import pytest

from malleparsl.errors import SpecError, TraceFormatError
from malleparsl.scavenger.pbs import PBSScavenger, ScavengingPBSProProvider
from malleparsl.scavenger.pbs_parse import (
    free_nodes,
    parse_pbs_rstat,
    parse_pbs_time,
    parse_pbsnodes,
    parse_qstat_f,
    parse_records,
    pbs_idle_ends,
)
from malleparsl.scavenger.pilots import NodeCapError
from malleparsl.scavenger.shell import CommandResult

FIX = Path(__file__).parent / "fixtures"
S = "polaris-pbs-01.hsn.cm.polaris.alcf.anl.gov"
NOW = parse_pbs_time("Fri Nov 10 12:30:00 2023")


def _text(name: str) -> str:
    return (FIX / name).read_text()


class RecordedPBS:
    """Serves the recorded outputs; qsub hands out job ids; qdel is recorded."""

    def __init__(self):
        self.out = {"pbsnodes -av": _text("pbsnodes_av.txt"), "qstat -f": _text("qstat_f.txt"),
                    "pbs_rstat -f": _text("pbs_rstat_f.txt")}
        self.pilot_states = _text("qstat_x_f_pilots.txt")
        self.cmds: list[str] = []
        self.ids = iter(["8998", "8999", "9005", "9006", "9010", "9011"])
        self.scripts: list[str] = []

    def __call__(self, argv: list[str]) -> CommandResult:
        assert isinstance(argv, list), f"commands are argument lists, got {argv!r}"
        cmd = " ".join(argv)
        self.cmds.append(cmd)
        if cmd in self.out:
            return CommandResult(0, self.out[cmd], "")
        if cmd.startswith("qsub"):
            self.scripts.append(Path(cmd.split()[-1]).read_text())
            return CommandResult(0, f"{next(self.ids)}.{S}\n", "")
        if cmd.startswith("qstat -x -f"):
            return CommandResult(0, self.pilot_states, "")
        if cmd.startswith("qdel"):
            return CommandResult(0, "", "")
        raise AssertionError(f"unexpected command {cmd!r}")


def test_pbsnodes_parsing_finds_only_wholly_free_nodes():
    nodes = {n.name: n for n in parse_pbsnodes(_text("pbsnodes_av.txt"))}
    assert len(nodes) == 10
    assert nodes["x3004c0s1b0n0"].jobs == (f"8998.{S}",)
    assert nodes["x3004c0s7b0n0"].resv == (f"R9100.{S}",)
    assert nodes["x3004c0s25b1n0"].state == "state-unknown,down"
    assert free_nodes(list(nodes.values())) == ["x3004c0s1b1n0", "x3004c0s7b0n0", "x3004c0s7b1n0"]


def test_qstat_and_rstat_parsing():
    jobs = {j.job_id.split(".")[0]: j for j in parse_qstat_f(_text("qstat_f.txt"))}
    assert [j.state for j in jobs.values()] == ["R", "R", "R", "Q", "Q"]
    q = jobs["9003"]
    assert q.est_nodes == ("x3004c0s1b1n0", "x3004c0s1b0n0")
    assert q.est_start == parse_pbs_time("Fri Nov 10 13:00:00 2023")
    assert jobs["9004"].est_start is None and jobs["9004"].est_nodes == ()
    assert jobs["8998"].exec_nodes == ("x3004c0s1b0n0",) and jobs["8998"].queue == "preemptable"
    recs = dict(parse_records(_text("qstat_f.txt"), header="Job Id:"))
    assert recs[f"9003.{S}"]["Variable_List"].endswith("PBS_O_QUEUE=prod")  # wrapped value
    resv = {r.resv_id.split(".")[0]: r for r in parse_pbs_rstat(_text("pbs_rstat_f.txt"))}
    assert resv["R9100"].nodes == ("x3004c0s7b0n0",) and resv["R9100"].state == "RESV_CONFIRMED"
    assert resv["R9100"].end - resv["R9100"].start == 4 * 3600
    with pytest.raises(TraceFormatError, match="line 2"):
        parse_records("Job Id: 1.x\n    garbage without equals\n", header="Job Id:")


def test_idle_ends_from_estimates_and_reservations():
    free = ["x3004c0s1b1n0", "x3004c0s7b0n0", "x3004c0s7b1n0"]
    ends = pbs_idle_ends(free, parse_qstat_f(_text("qstat_f.txt")),
                         parse_pbs_rstat(_text("pbs_rstat_f.txt")), now=NOW)
    assert ends == {"x3004c0s1b1n0": NOW + 1800, "x3004c0s7b0n0": NOW + 5400}


@pytest.fixture
def pbs(tmp_path):
    rec = RecordedPBS()
    prov = ScavengingPBSProProvider(queue="preemptable", account="MyProject", node_cap=3,
                                    cpus_per_node=64, select_options="ngpus=4", run=rec,
                                    signal_dir=str(tmp_path / "term"))
    prov.script_dir = str(tmp_path)
    return rec, prov


def test_announces_free_nodes_longest_idle_first_with_ends(pbs):
    rec, prov = pbs
    src = PBSScavenger(provider=prov, query_period_s=0, wall_clock=lambda: NOW)
    events = src.poll(now_s=100.0)
    assert [(e.kind, e.node, e.end_s) for e in events] == [
        ("idle", "x3004c0s7b1n0", None),
        ("idle", "x3004c0s7b0n0", 100.0 + 5400),
        ("idle", "x3004c0s1b1n0", 100.0 + 1800),
    ]
    src2 = PBSScavenger(provider=prov, query_period_s=0, wall_clock=lambda: NOW, min_idle_s=3600)
    assert [e.node for e in src2.poll(0.0)] == ["x3004c0s7b1n0", "x3004c0s7b0n0"]


def test_pilots_are_pinned_capped_and_in_the_preemptable_queue(pbs):
    rec, prov = pbs
    src = PBSScavenger(provider=prov, query_period_s=0, wall_clock=lambda: NOW)
    nodes = [e.node for e in src.poll(0.0)]
    jobs = [prov.submit_to_node("process_worker_pool.py", 1, "parsl.m", node=n) for n in nodes]
    assert [prov.node_of(j) for j in jobs] == nodes
    for script, node in zip(rec.scripts, nodes):
        assert f"#PBS -l select=1:ncpus=64:ngpus=4:host={node}" in script
        assert "trap 'touch" in script and "$PBS_JOBID.term" in script
    assert all("-q preemptable -A MyProject" in c for c in rec.cmds if c.startswith("qsub"))
    with pytest.raises(NodeCapError, match="node_cap=3"):
        prov.submit_to_node("x", 1, "parsl.m", node="x3004c0s13b0n0")


def test_preempted_suspended_and_requeued_pilots_are_taken(pbs):
    rec, prov = pbs
    src = PBSScavenger(provider=prov, query_period_s=0, wall_clock=lambda: NOW, retake_after_s=0)
    src.poll(0.0)
    # pilot ids come from the recording: 8998 R, 8999 F (preempted), 9005 S (suspended)
    jobs = [prov.submit("w", 1, "parsl.m") for _ in range(3)]
    for j in jobs:
        src.held[prov.node_of(j)].running_wall = NOW - 60  # all three had been running
    events = src.poll(1.0)
    taken = sorted(e.node for e in events if e.kind == "taken")
    assert taken == sorted([prov.node_of(jobs[1]), prov.node_of(jobs[2])])
    assert f"qdel {jobs[2]}" in rec.cmds  # the suspended pilot is deleted
    assert f"qdel {jobs[1]}" not in rec.cmds  # the finished one needs nothing


def test_refuses_a_queue_not_known_preemptable():
    with pytest.raises(SpecError, match="allow_nonpreemptible=True"):
        ScavengingPBSProProvider(queue="prod", run=RecordedPBS())
    prov = ScavengingPBSProProvider(queue="prod", allow_nonpreemptible=True, run=RecordedPBS())
    assert prov.queue == "prod"
