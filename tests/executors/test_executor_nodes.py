"""Node bookkeeping rules of the MalleableExecutor, without processes."""

from __future__ import annotations

import os

import pytest

from malleparsl.errors import SpecError
from malleparsl.executors.nodes import NodeTable, probe_node, tolerant_error_handler


def mgr(block: str, manager: str = "m", active: bool = True) -> dict:
    return {"block_id": block, "manager": manager, "active": active}


def test_node_lifecycle_pending_probing_ready_lost():
    t = NodeTable()
    t.add("n0", block_id="0", job_id="j0", end_s=None)
    probe, events = t.reconcile([], [])
    assert probe == [] and events == [] and t.get("n0").state == "pending"
    probe, events = t.reconcile([mgr("0", "abc")], [])
    assert [r.name for r in probe] == ["n0"] and events == []
    assert t.get("n0").state == "probing" and t.get("n0").manager_id == "abc"
    # a second reconcile does not probe again
    assert t.reconcile([mgr("0", "abc")], []) == ([], [])
    assert t.probed("n0", {"pid": 1}) == [("ready", "n0")]
    assert t.ready() == {"n0"}
    # the manager vanishes (heartbeat expired): one lost event, then nothing
    assert t.reconcile([], [])[1] == [("lost", "n0")]
    assert t.reconcile([], [])[1] == []
    assert t.ready() == set() and not t.get("n0").alive


def test_lost_is_emitted_only_for_nodes_that_were_ready():
    t = NodeTable()
    t.add("a", block_id="1", job_id="j", end_s=None)
    t.add("b", block_id="2", job_id="k", end_s=None)
    t.reconcile([mgr("1")], [])  # a is probing
    _, events = t.reconcile([], ["2"])  # a's manager gone, b's pilot ended before registering
    assert events == []
    assert t.get("a").state == "gone" and t.get("b").state == "gone"
    assert "before registering" in t.get("b").gone_reason


def test_inactive_manager_counts_as_gone():
    t = NodeTable()
    t.add("a", block_id="1", job_id="j", end_s=None)
    t.reconcile([mgr("1")], [])
    t.probed("a", {})
    assert t.reconcile([mgr("1", active=False)], [])[1] == [("lost", "a")]


def test_gone_is_idempotent_and_probe_after_gone_is_ignored():
    t = NodeTable()
    t.add("a", block_id="1", job_id="j", end_s=5.0)
    t.reconcile([mgr("1")], [])
    assert t.gone("a", "released") == []  # it never became ready
    assert t.gone("a", "again") == []
    assert t.probed("a", {}) == []
    assert t.get("a").gone_reason == "released" and t.get("a").end_s == 5.0


def test_names_can_be_reused_only_after_the_node_is_gone():
    t = NodeTable()
    t.add("a", block_id="1", job_id="j", end_s=None)
    with pytest.raises(SpecError, match="already pending"):
        t.check_new_name("a")
    t.gone("a", "released")
    t.check_new_name("a")
    t.add("a", block_id="7", job_id="j7", end_s=None)
    assert t.by_block("7").name == "a" and t.get("a").block_id == "7"
    with pytest.raises(SpecError, match="non-empty string"):
        t.check_new_name("")


def test_auto_names_are_unique():
    t = NodeTable()
    n1 = t.auto_name("3", "malleable")
    t.add(n1, block_id="3", job_id="x", end_s=None)
    n2 = t.auto_name("3", "malleable")
    assert n1 == "malleable-b3" and n2 != n1


def test_probe_reports_this_process_and_imports_modules():
    info = probe_node(("json",))
    assert info["pid"] == os.getpid() and info["pgid"] == os.getpgid(0)
    with pytest.raises(ModuleNotFoundError):
        probe_node(("no_such_module_malleparsl",))


def test_nodes_stuck_probing_are_reported_after_the_timeout():
    t = NodeTable()
    t.add("a", block_id="1", job_id="j", end_s=None)
    t.add("b", block_id="2", job_id="k", end_s=None)
    t.reconcile([mgr("1"), mgr("2")], [])
    t.probed("b", {})
    registered = t.get("a").registered_at
    assert t.stuck_probing(60, now=registered + 30) == []
    assert t.stuck_probing(60, now=registered + 61) == ["a"]  # b answered: not stuck


class FakeExecutor:
    def __init__(self, table: NodeTable) -> None:
        self.node_table, self.bad = table, None

    def set_bad_state_and_fail_all(self, exc: Exception) -> None:
        self.bad = exc


def _status(*states):
    from parsl.jobs.states import JobStatus

    return {str(i): JobStatus(s) for i, s in enumerate(states)}


def test_error_handler_gives_up_only_when_no_pilot_ever_worked():
    from parsl.jobs.states import JobState

    ex = FakeExecutor(NodeTable())
    tolerant_error_handler(ex, _status(JobState.FAILED, JobState.FAILED))
    assert ex.bad is None  # fewer than three failures: keep trying
    tolerant_error_handler(ex, _status(JobState.FAILED, JobState.RUNNING, JobState.FAILED))
    assert ex.bad is None  # one pilot still runs
    tolerant_error_handler(ex, _status(JobState.FAILED, JobState.MISSING, JobState.FAILED))
    assert ex.bad is not None  # a broken launch: fail the tasks instead of hanging


def test_error_handler_gives_up_at_once_when_the_worker_command_cannot_run():
    from parsl.jobs.states import JobState, JobStatus

    for code in (126, 127):
        ex = FakeExecutor(NodeTable())
        tolerant_error_handler(ex, {"0": JobStatus(JobState.FAILED, exit_code=code)})
        assert ex.bad is not None and f"EXIT CODE: {code}" in str(ex.bad)
    ex = FakeExecutor(NodeTable())
    tolerant_error_handler(ex, {"0": JobStatus(JobState.FAILED, exit_code=127),
                                "1": JobStatus(JobState.RUNNING)})
    assert ex.bad is None  # another pilot may still come up
    tolerant_error_handler(ex, {"0": JobStatus(JobState.FAILED, exit_code=143)})
    assert ex.bad is None  # a killed pilot (preemption) is no configuration error


def test_error_handler_tolerates_losing_every_node_after_one_worked():
    from parsl.jobs.states import JobState

    table = NodeTable()
    table.add("a", block_id="0", job_id="j", end_s=None)
    table.reconcile([mgr("0")], [])
    table.probed("a", {})
    ex = FakeExecutor(table)
    tolerant_error_handler(ex, _status(JobState.FAILED, JobState.FAILED, JobState.FAILED))
    assert ex.bad is None  # preempted nodes are normal in a malleable pool
