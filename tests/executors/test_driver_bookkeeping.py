"""Pure bookkeeping of the segment driver and control-loop helpers, without processes.

A dict stands in for the TCPStore and a recorder for ``submit_to_node``: these tests check the
driver's decisions (which segment, which nodes, which outcome) for every combination of rank
results. The same paths run with real Parsl nodes and gloo groups in test_driver_live.py.
"""

from __future__ import annotations

from concurrent.futures import Future

import pytest
from fake_store import DictStore
from parsl.executors.high_throughput.errors import ManagerLost, WorkerLost

from malleparsl.allocator.base import ClusterSnapshot, JobView
from malleparsl.controller import JobState as CtlJobState
from malleparsl.errors import CheckpointWriteError, SpecError
from malleparsl.executors.bench_rescale import KeepAndFillPolicy
from malleparsl.executors.driver import (
    DriverEvent,
    JobAbortedError,
    JobState,
    MalleableJob,
    RankHungError,
    RestartLimitError,
    is_collateral,
    is_node_loss,
)
from malleparsl.executors.manual_source import ManualNodeSource
from malleparsl.executors.planning import LinearPlaceholderAdvisor, build_policy, spec_from_options
from malleparsl.executors.protocol import GroupBrokenError, SegmentOutcome, stop_key
from malleparsl.model import Allocation, JobSpec


class Recorder:
    """Records ``submit_to_node`` calls; the test resolves the futures."""

    def __init__(self):
        self.calls = []

    def submit_to_node(self, node, func, info, *args, **kwargs):
        fut = Future()
        self.calls.append((node, info, args, kwargs, fut))
        return fut


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


def entry(info, *a, **k):  # never called here: the recorder does not run tasks
    raise AssertionError("not run")


@pytest.fixture
def rig(tmp_path):
    ex, store, posted, clock = Recorder(), DictStore(), [], Clock()
    job = MalleableJob(
        spec=JobSpec("j1", min_nodes=1, max_nodes=4), entry=entry, args=(1,), kwargs={"lr": 0.1},
        options={"job_id": "j1", "extra": "x"}, executor=ex, store=store, store_host="h",
        store_port=1234, ckpt_dir=str(tmp_path / "ck"), post=posted.append, clock=clock,
        max_restarts=2, fail_grace_s=5.0,
    )
    return job, ex, store, posted, clock


def out(status, rank, *, result=None, first=None, save=0.0, load=0.0):
    return SegmentOutcome(status, rank, 10, 10.0, 5.0, result=result, first_step_time=first,
                          ckpt_save_s=save, ckpt_load_s=load)


def finish_segment(job, ex, posted, results):
    """Resolve the last len(results) submitted futures; feed the posted events to the job."""
    calls = ex.calls[-len(results):]
    events = []
    for (_, _, _, _, fut), res in zip(calls, results):
        if isinstance(res, BaseException):
            fut.set_exception(res)
        else:
            fut.set_result(res)
    for ev in posted:
        _, job_id, seg, rank, fut = ev
        assert job_id == job.job_id
        events.append(job.on_rank_done(seg, rank, fut))
    posted.clear()
    return [e for e in events if e is not None]


def test_launch_pins_one_rank_per_node_in_sorted_order_with_full_rank_info(rig, tmp_path):
    job, ex, _, _, _ = rig
    job.reconcile(frozenset({"n2", "n1"}))
    assert job.state is JobState.RUNNING and job.nodes == ("n1", "n2")
    infos = [c[1] for c in ex.calls]
    assert [(c[0], i.rank, i.world_size, i.node) for c, i in zip(ex.calls, infos)] == [
        ("n1", 0, 2, "n1"), ("n2", 1, 2, "n2")]
    assert all(i.store_host == "h" and i.store_port == 1234 and i.segment == 0 for i in infos)
    assert infos[0].options["extra"] == "x" and infos[0].ckpt_dir == str(tmp_path / "ck")
    assert ex.calls[0][2] == (1,) and ex.calls[0][3] == {"lr": 0.1}
    assert (tmp_path / "ck").is_dir()


def test_rescale_sets_stop_key_then_relaunches_and_times_the_pause(rig):
    job, ex, store, posted, clock = rig
    job.reconcile(frozenset({"a", "b"}))
    clock.t = 1010.0
    job.reconcile(frozenset({"a", "b", "c"}))
    assert job.state is JobState.STOPPING and store.get(stop_key("j1")) == b"0"
    evs = finish_segment(job, ex, posted, [out("stopped", 0, save=0.5), out("stopped", 1, save=0.4)])
    assert evs == [DriverEvent.STOPPED] and job.state is JobState.WAITING
    job.reconcile(frozenset({"a", "b", "c"}))
    assert job.nodes == ("a", "b", "c") and ex.calls[-1][1].segment == 1
    evs = finish_segment(job, ex, posted, [
        out("finished", 0, result={"acc": 1}, first=1012.0, load=0.25),
        out("finished", 1, first=1012.5, load=0.2), out("finished", 2, first=1012.1)])
    assert evs == [DriverEvent.FINISHED] and job.future.result() == {"acc": 1}
    (rec,) = job.rescales
    assert (rec.kind, rec.from_size, rec.to_size, rec.segment) == ("up", 2, 3, 1)
    assert rec.pause_s == pytest.approx(1012.5 - 1010.0 - 0.5 - 0.25)
    assert job.take_measured_rescales() == [rec] and job.take_measured_rescales() == []
    assert job.resolutions == 1


def test_unchanged_target_does_not_stop_a_running_segment(rig):
    job, ex, store, _, _ = rig
    job.reconcile(frozenset({"a"}))
    job.reconcile(frozenset({"a"}))
    assert job.state is JobState.RUNNING and not store.check([stop_key("j1")])
    assert len(ex.calls) == 1


def test_user_exception_wins_over_collateral_gloo_errors_and_is_not_relaunched(rig):
    job, ex, _, posted, _ = rig
    job.reconcile(frozenset({"a", "b", "c"}))
    boom = ValueError("bad learning rate")
    gloo = GroupBrokenError("[gloo] Connection closed by peer [127.0.0.1]:4242")
    evs = finish_segment(job, ex, posted, [gloo, boom, out("stopped", 2)])
    assert evs == [DriverEvent.FAILED]
    with pytest.raises(ValueError, match="bad learning rate"):
        job.future.result()
    job.reconcile(frozenset({"a", "b", "c"}))
    assert len(ex.calls) == 3 and job.state is JobState.DONE


def test_group_broken_with_only_gloo_errors_restarts_from_checkpoint_not_fails(rig):
    # regression: a preemption racing a regrow left every rank with a gloo timeout and no
    # node reported lost; the job must restart, not fail as if the user's code were wrong
    job, ex, _, posted, _ = rig
    job.reconcile(frozenset({"a", "b"}))
    evs = finish_segment(
        job, ex, posted,
        [GroupBrokenError("[gloo] Timed out waiting"), GroupBrokenError("gloo: Timed out")],
    )
    assert evs == [DriverEvent.LOST] and job.restarts == 1 and not job.future.done()
    job.reconcile(frozenset({"a", "b"}))
    assert job.rescales[-1].kind == "restart"


@pytest.mark.parametrize("lost", [ManagerLost(b"m1", "host"), WorkerLost(3, "host")])
def test_lost_node_restarts_from_checkpoint_on_the_rest(rig, lost):
    job, ex, _, posted, _ = rig
    job.reconcile(frozenset({"a", "b"}))
    gloo = RuntimeError("gloo: Connection reset by peer")
    evs = finish_segment(job, ex, posted, [gloo, lost])
    assert evs == [DriverEvent.LOST] and job.last_lost == {"b"} and job.restarts == 1
    job.reconcile(frozenset({"a"}))
    assert job.nodes == ("a",) and job.rescales[-1].kind == "restart"
    assert not job.future.done()


def test_node_reported_lost_fails_the_segment_even_if_ranks_only_see_gloo_errors(rig):
    job, ex, store, posted, _ = rig
    job.reconcile(frozenset({"a", "b"}))
    job.node_lost("b")
    assert store.get(stop_key("j1")) == b"0"  # survivors are told to stop at once
    evs = finish_segment(job, ex, posted, [RuntimeError("gloo timeout"), RuntimeError("gloo")])
    assert evs == [DriverEvent.LOST] and job.last_lost == {"b"}


def test_restart_limit_fails_the_future_with_the_loss_as_cause(rig):
    job, ex, _, posted, _ = rig
    for _ in range(3):
        job.reconcile(frozenset({"a"}))
        evs = finish_segment(job, ex, posted, [ManagerLost(b"m", "h")])
    assert evs == [DriverEvent.FAILED]
    with pytest.raises(RestartLimitError, match="max_restarts=2") as info:
        job.future.result()
    assert isinstance(info.value.__cause__, ManagerLost)


def test_silent_ranks_are_given_up_after_the_grace_period(rig):
    job, ex, _, posted, clock = rig
    job.reconcile(frozenset({"a", "b"}))
    ex.calls[0][4].set_exception(ManagerLost(b"m", "h"))
    assert job.on_rank_done(*posted.pop()[2:]) is None  # rank 1 still silent
    clock.t += 4.0
    assert job.tick() is None
    clock.t += 2.0
    assert job.tick() is DriverEvent.LOST and job.state is JobState.WAITING
    ex.calls[1][4].set_result(out("stopped", 1))
    assert job.on_rank_done(*posted.pop()[2:]) is None  # late result of an ended segment


def test_entry_returning_something_else_fails_with_a_clear_error(rig):
    job, ex, _, posted, _ = rig
    job.reconcile(frozenset({"a"}))
    assert finish_segment(job, ex, posted, [42]) == [DriverEvent.FAILED]
    with pytest.raises(TypeError, match="expected a SegmentOutcome"):
        job.future.result()


def test_abort_resolves_once_and_later_results_are_ignored(rig):
    job, ex, store, posted, _ = rig
    job.reconcile(frozenset({"a"}))
    job.abort(RuntimeError("shutdown"))
    job.abort(RuntimeError("again"))
    assert store.get(stop_key("j1")) == b"0" and job.resolutions == 1
    assert finish_segment(job, ex, posted, [out("finished", 0, result=1)]) == []
    with pytest.raises(RuntimeError, match="shutdown"):
        job.future.result()


def test_is_node_loss_classifies_parsl_losses_only():
    assert is_node_loss(ManagerLost(b"m", "h")) and is_node_loss(WorkerLost(1, "h"))
    assert not is_node_loss(RuntimeError("gloo")) and not is_node_loss(KeyError("x"))


def test_spec_from_options_builds_specs_and_rejects_bad_input():
    spec = spec_from_options({"min_nodes": 2, "max_nodes": 4, "curve": [[1, 10.0], [2, 18.0]]})
    assert spec.job_id.startswith("job-") and (spec.min_nodes, spec.max_nodes) == (2, 4)
    assert spec.curve.rate(2) == 18.0
    assert spec_from_options({"min_nodes": 3}).max_nodes == 3
    with pytest.raises(SpecError, match=r"list of \[nodes, samples_per_s\]"):
        spec_from_options({"curve": "fast"})
    with pytest.raises(SpecError, match="min_nodes"):
        spec_from_options({"min_nodes": 5, "max_nodes": 2})
    with pytest.raises(SpecError, match="must be a dict"):
        spec_from_options([("min_nodes", 1)])


def test_placeholder_advisor_uses_the_given_curve_else_linear():
    a, b = spec_from_options({"job_id": "a", "max_nodes": 3}), spec_from_options(
        {"job_id": "b", "max_nodes": 2, "curve": [[1, 5.0]]})
    views = LinearPlaceholderAdvisor().views(
        ClusterSnapshot(0, ("n1",)), [CtlJobState(a), CtlJobState(b)], Allocation({"a": {"n1"}}))
    assert [v.curve.rate(3) for v in views] == [3.0, 5.0] and views[0].current == {"n1"}


def test_keep_and_fill_keeps_survivors_fills_to_max_and_respects_min():
    snap = ClusterSnapshot(0, ("n1", "n2", "n3", "n4"))
    j1 = JobView(JobSpec("j1", 1, 2), curve=None, current=frozenset({"n3"}))  # type: ignore[arg-type]
    j2 = JobView(JobSpec("j2", 3, 4), curve=None)  # type: ignore[arg-type]
    alloc = KeepAndFillPolicy().allocate(snap, [j1, j2])
    assert alloc.nodes_of("j1") == {"n3", "n1"} and alloc.nodes_of("j2") == frozenset()
    alloc = KeepAndFillPolicy().allocate(snap, [j2, j1])
    assert alloc.nodes_of("j2") == {"n1", "n2", "n4"} and alloc.nodes_of("j1") == {"n3"}


def test_manual_source_queues_events_once_and_checks_names():
    src = ManualNodeSource(nodes=["a"])
    src.take("a")
    assert [(e.kind, e.node) for e in src.poll(0)] == [("idle", "a"), ("taken", "a")]
    assert src.poll(1) == []
    with pytest.raises(SpecError, match="non-empty string"):
        src.idle("")


def test_build_policy_pairs_the_jpa_with_its_advisor_and_defaults_to_the_placeholder():
    from malleparsl.jpa import JobProfilingAdvisor

    pol, adv = build_policy("jpa", {}, None)
    assert isinstance(adv, JobProfilingAdvisor) and pol.advisor is adv
    pol, adv = build_policy("milp", {}, None)
    assert pol.name == "milp" and isinstance(adv, LinearPlaceholderAdvisor)
    with pytest.raises(KeyError, match="valid policies are"):
        build_policy("no-such-policy", {}, None)


def test_node_warmer_holds_a_node_until_each_distinct_entry_is_warm():
    from types import SimpleNamespace

    from malleparsl.executors.warmup import NodeWarmer, warm_entry

    subs, posted, clock = [], [], Clock()

    def submit(node, func, *args):
        fut = Future()
        subs.append((node, func, args, fut))
        return fut

    def job(e, name="j"):
        return SimpleNamespace(entry=e, job_id=name, args=(), kwargs={}, options={})

    w = NodeWarmer(submit=submit, post=posted.append, rehearse=False, timeout_s=10, clock=clock)
    assert not w.start("n1", [])  # nothing to warm: usable at once
    assert w.start("n1", [job(entry), job(entry), job(spec_from_options)])  # 2 distinct entries
    assert [(s[0], s[1], s[2]) for s in subs] == [("n1", warm_entry, (entry,)),
                                                    ("n1", warm_entry, (spec_from_options,))]
    subs[0][3].set_result(1)
    subs[1][3].set_exception(RuntimeError("import failed"))  # a failed warm-up does not block
    assert [w.done(*p[1:]) for p in posted] == [False, True] and not w.warming("n1")
    assert not w.start("n1", [job(entry)])  # already warm for that code
    assert w.start("n2", [job(entry)]) and w.expired() == []
    clock.t += 11
    assert w.expired() == ["n2"] and not w.warming("n2")
    w.forget("n1")
    assert w.start("n1", [job(entry)])  # a reused name starts cold


def test_rehearsal_runs_one_private_rank_and_is_stopped_after_its_first_progress():
    from types import SimpleNamespace

    from malleparsl.executors.protocol import progress_key
    from malleparsl.executors.warmup import NodeWarmer, rehearse_entry

    subs, store, clock = [], DictStore(), Clock()

    def submit(node, func, *args):
        subs.append((node, func, args))
        return Future()

    w = NodeWarmer(submit=submit, post=lambda ev: None, store=store, store_host="h",
                   store_port=7, timeout_s=60, rehearsal_stop_s=20, clock=clock)
    j = SimpleNamespace(entry=entry, job_id="j1", args=(3,), kwargs={"lr": 1}, options={"a": 1})
    assert w.start("n5", [j])
    ((node, func, (ent, info, args, kwargs)),) = subs
    assert (node, func, ent, args, kwargs) == ("n5", rehearse_entry, entry, (3,), {"lr": 1})
    assert (info.job_id, info.world_size, info.rank, info.nodes) == ("j1.rehearsal.n5", 1, 0, ("n5",))
    assert info.options == {"a": 1, "job_id": "j1.rehearsal.n5", "rehearsal": True}
    w.poll()
    assert not store.check([stop_key("j1.rehearsal.n5")])  # still starting up
    store.set(progress_key("j1.rehearsal.n5", 0), "{}")
    w.poll()
    assert store.get(stop_key("j1.rehearsal.n5")) == b"0"
    assert stop_key("j1") not in store.data  # the real job is never touched


def test_rehearse_entry_runs_the_real_entry_in_a_scratch_dir_until_told_to_stop(
    tmp_path, monkeypatch
):
    """In-process, with a real TCPStore and a one-rank gloo group (the synthetic entry)."""
    import datetime
    import tempfile
    import threading
    import time

    dist = pytest.importorskip("torch.distributed")
    from malleparsl.executors.protocol import RankInfo, progress_key
    from malleparsl.executors.synthetic import synthetic_entry
    from malleparsl.executors.warmup import rehearse_entry

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the scratch dir goes here
    import socket
    import subprocess
    import sys

    from malleparsl.executors.warmup import SCRATCH_PREFIX

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # a rehearsal killed before: its directory is swept by this one
    (tmp_path / f"{SCRATCH_PREFIX}{socket.gethostname()}-{gone.pid}-old").mkdir()

    master = dist.TCPStore("127.0.0.1", 0, None, True,
                           timeout=datetime.timedelta(seconds=10), wait_for_workers=False)
    info = RankInfo("j.rehearsal.n1", 0, 0, 1, "n1", ("n1",), "127.0.0.1", master.port,
                    ckpt_dir="", options={"rehearsal": True})

    def stopper():
        deadline = time.monotonic() + 30
        while not master.check([progress_key(info.job_id, 0)]) and time.monotonic() < deadline:
            time.sleep(0.01)
        master.set(stop_key(info.job_id), "0")

    t = threading.Thread(target=stopper)
    t.start()
    out = rehearse_entry(synthetic_entry, info, (), {"steps": 10**6, "step_s": 0.01,
                                                     "progress_every_s": 0.0})
    t.join()
    assert out["status"] == "stopped" and out["seconds"] > 0  # stopped by its key, not its end
    assert list(tmp_path.iterdir()) == []  # its scratch directory and the killed one's are gone


def test_scratch_dirs_of_rehearsals_killed_on_this_host_are_swept(tmp_path):
    """A worker killed mid-rehearsal never removes its scratch directory (its ``finally`` does
    not run): the next rehearsal on the host removes those of dead workers, only this host's
    (a shared temporary directory holds other hosts' pids) and never a live worker's."""
    import os
    import socket
    import subprocess
    import sys

    from malleparsl.executors.warmup import SCRATCH_PREFIX, sweep_stale_scratch

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # a pid that no longer runs
    host = socket.gethostname()
    names = {
        "dead": f"{SCRATCH_PREFIX}{host}-{gone.pid}-abc",
        "live": f"{SCRATCH_PREFIX}{host}-{os.getppid()}-def",
        "other host": f"{SCRATCH_PREFIX}elsewhere.{host}-{gone.pid}-ghi",
        "a host named like ours and more": f"{SCRATCH_PREFIX}{host}-7-{gone.pid}-mno",
        "not ours": f"something-{gone.pid}-jkl",
    }
    for name in names.values():
        (tmp_path / name).mkdir()
        (tmp_path / name / "ckpt.pt").write_bytes(b"x")
    removed = sweep_stale_scratch(str(tmp_path))
    assert removed == [str(tmp_path / names["dead"])]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        v for k, v in names.items() if k != "dead")


# ---- errors by type, not text; deadlines (issue 12) ------------------------------------------
@pytest.mark.parametrize("user_error", [
    TimeoutError("the data loader timed out"),
    RuntimeError("my own gloo wrapper: connection reset"),
])
def test_user_error_whose_text_looks_like_a_broken_group_fails_the_job_unretried(rig, user_error):
    # regression: the driver matched "timed out"/"gloo" in messages and relaunched user errors
    job, ex, _, posted, _ = rig
    job.reconcile(frozenset({"a", "b"}))
    peer = GroupBrokenError("allreduce failed: Connection closed by peer")
    evs = finish_segment(job, ex, posted, [user_error, peer])
    assert evs == [DriverEvent.FAILED] and job.restarts == 0
    assert job.future.exception() is user_error
    job.reconcile(frozenset({"a", "b"}))
    assert len(ex.calls) == 2


def test_untyped_errors_with_a_node_known_lost_restart(rig):
    job, ex, _, posted, _ = rig
    job.reconcile(frozenset({"a", "b"}))
    job.node_lost("b")
    evs = finish_segment(job, ex, posted, [RuntimeError("[gloo] reset"), RuntimeError("gone")])
    assert evs == [DriverEvent.LOST] and job.last_lost == {"b"} and not job.future.done()


def test_restart_limit_after_broken_groups_carries_the_last_cause(rig):
    # regression: with no ManagerLost among the errors the RestartLimitError had no __cause__
    job, ex, _, posted, _ = rig
    for i in range(3):
        job.reconcile(frozenset({"a", "b"}))
        evs = finish_segment(job, ex, posted, [GroupBrokenError(f"broken {i}"),
                                               GroupBrokenError(f"broken {i}")])
    assert evs == [DriverEvent.FAILED]
    err = job.future.exception()
    assert isinstance(err, RestartLimitError) and isinstance(err.__cause__, GroupBrokenError)
    assert "broken 2" in str(err.__cause__) and "broken 2" in str(err)


def test_a_stop_not_honoured_in_time_restarts_without_the_hung_node(rig):
    job, ex, store, posted, clock = rig
    job.stop_timeout_s = 60.0
    job.reconcile(frozenset({"a", "b", "c"}))
    job.reconcile(frozenset({"a", "b"}))  # shrink: stop requested
    assert job.state is JobState.STOPPING
    ex.calls[0][4].set_result(out("stopped", 0))
    ex.calls[1][4].set_result(out("stopped", 1))
    for ev in posted:
        assert job.on_rank_done(*ev[2:]) is None  # rank 2 (on c) never answers
    posted.clear()
    clock.t += 59.0
    assert job.tick() is None
    clock.t += 2.0
    assert job.tick() is DriverEvent.LOST
    assert job.last_hung == {"c"} and "c" in job.last_lost and job.state is JobState.WAITING


def test_hung_rank_at_the_restart_limit_names_the_hang_as_cause(rig):
    job, ex, _, posted, clock = rig
    job.max_restarts = 0
    job.reconcile(frozenset({"a", "b"}))
    ex.calls[0][4].set_exception(GroupBrokenError("peer silent"))
    assert job.on_rank_done(*posted.pop()[2:]) is None
    clock.t += 6.0  # past fail_grace_s
    assert job.tick() is DriverEvent.FAILED
    err = job.future.exception()
    assert isinstance(err, RestartLimitError) and isinstance(err.__cause__, RankHungError)
    assert "'b'" in str(err.__cause__)


def test_ranks_silent_after_a_node_loss_keep_their_healthy_nodes(rig):
    # rank 0's node is lost; rank 1 waits on it in a collective (up to its own timeout, longer
    # than fail_grace_s): the segment is concluded, but b is not taken for hung and killed
    job, ex, _, posted, clock = rig
    job.reconcile(frozenset({"a", "b"}))
    ex.calls[0][4].set_exception(ManagerLost(b"m", "h"))
    assert job.on_rank_done(*posted.pop()[2:]) is None
    clock.t += 6.0  # past fail_grace_s
    assert job.tick() is DriverEvent.LOST
    assert job.last_hung == set() and job.last_lost == {"a"}
    job.reconcile(frozenset({"b"}))
    assert job.nodes == ("b",)


def test_checkpoint_write_error_fails_the_job_as_a_system_error_not_retried(rig):
    job, ex, _, posted, _ = rig
    job.reconcile(frozenset({"a", "b"}))
    full = CheckpointWriteError("could not write checkpoint: No space left on device")
    evs = finish_segment(job, ex, posted, [GroupBrokenError("peer failed"), full])
    assert evs == [DriverEvent.FAILED] and job.restarts == 0
    assert job.future.exception() is full


def test_is_collateral_goes_by_type_only():
    assert is_collateral(GroupBrokenError("x"))
    assert not is_collateral(TimeoutError("timed out"))
    assert not is_collateral(RuntimeError("[gloo] Connection closed by peer"))


def test_rank_failed_by_a_broken_executor_aborts_the_job_naming_the_cause(rig):
    from parsl.executors.errors import BadStateException

    job, ex, _, posted, _ = rig
    job.reconcile(frozenset({"a"}))
    owner = type("Ex", (), {"label": "malleable"})()
    bad = BadStateException(owner, RuntimeError("the interchange was killed by SIGKILL"))
    assert finish_segment(job, ex, posted, [bad]) == [DriverEvent.FAILED]
    err = job.future.exception()
    assert isinstance(err, JobAbortedError) and err.__cause__ is bad
    assert "SIGKILL" in str(err) and job.restarts == 0
