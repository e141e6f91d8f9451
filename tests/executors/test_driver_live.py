"""The segment driver and control loop with real processes: Parsl HTEX managers as emulated
nodes, real gloo process groups, real checkpoints (executors.synthetic), real SIGKILL.

One executor serves the whole module (starting nodes is the slow part); each test tops the
node count back up first. Every test checks that the job's future was resolved exactly once
and that no step was lost or counted twice (``total == steps``).
"""

from __future__ import annotations

import datetime
import itertools
import time
import traceback

import pytest

parsl = pytest.importorskip("parsl")
dist = pytest.importorskip("torch.distributed")

from malleparsl.executors.bench_rescale import local_malleable_config  # noqa: E402
from malleparsl.executors.manual_source import ManualNodeSource  # noqa: E402
from malleparsl.executors.options import ControlOptions  # noqa: E402
from malleparsl.executors.synthetic import SyntheticFailure, synthetic_entry  # noqa: E402

pytestmark = [pytest.mark.timeout(300), pytest.mark.slow]
NODE_TIMEOUT_S = 180
_names = itertools.count()


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("driver-live")
    src = ManualNodeSource(nodes=[f"node-{i:02d}" for i in range(3)])
    dfk = parsl.load(local_malleable_config(
        node_source=src, run_dir=str(run_dir / "runinfo"), ckpt_root=str(run_dir / "ckpt"),
        control=ControlOptions(poll_period_s=0.1, release_grace_s=2.0, fail_grace_s=20.0),
    ))
    ex = dfk.executors["malleable"]
    try:
        ex.wait_for_nodes(3, NODE_TIMEOUT_S)
        snap = ex.snapshot()
        store = dist.TCPStore(snap.store_host, snap.store_port, None, False,
                              timeout=datetime.timedelta(seconds=10))
        yield ex, src, store
    finally:
        dfk.cleanup()
        parsl.clear()


def wait_for(cond, timeout_s=NODE_TIMEOUT_S, what="a condition"):
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def exactly(ex, src, n):
    """Lend fresh nodes or take spare ones until exactly ``n`` are ready (no job runs)."""
    missing = n - len(ex.ready_nodes())
    for _ in range(max(0, missing)):
        src.idle(f"node-t{next(_names):02d}")
    for node in sorted(ex.ready_nodes())[n:]:
        src.take(node)
    wait_for(lambda: len(ex.ready_nodes()) == n, what=f"exactly {n} ready nodes")
    # the control thread learns of a ready node asynchronously: a job admitted before it has
    # would start smaller than the test expects
    wait_for(lambda: set(ex.snapshot().nodes) == set(ex.ready_nodes()),
             what=f"the controller to plan with those {n} nodes")
    return sorted(ex.ready_nodes())


RANK_RESULTS: dict[str, list] = {}  # job id -> every (segment, rank) result the driver was handed


def _count_rank_results(job) -> None:
    """Record each rank result the control thread hands the driver, late ones included."""
    seen = RANK_RESULTS.setdefault(job.job_id, [])
    inner = job.on_rank_done

    def counted(segment, rank, fut):
        seen.append((segment, rank))
        return inner(segment, rank, fut)

    job.on_rank_done = counted


def start_job(ex, job_id, *, max_nodes, min_nodes=1, **entry_kwargs):
    fut = ex.submit(synthetic_entry,
                    {"malleable": {"job_id": job_id, "min_nodes": min_nodes, "max_nodes": max_nodes}},
                    **entry_kwargs)
    wait_for(lambda: job_id in ex.snapshot().jobs, 30, "admission")
    # test instrumentation only: count every rank result the control thread hands the driver
    _count_rank_results(ex.control.jobs[job_id])
    return fut, LiveJob(ex, job_id)


class LiveJob:
    """The job's latest ``JobView`` from ``executor.snapshot()``, attribute by attribute."""

    def __init__(self, ex, job_id):
        self.ex, self.job_id = ex, job_id

    def __getattr__(self, name):
        return getattr(self.ex.snapshot().jobs[self.job_id], name)


def stepping(job, size):
    view = job.ex.snapshot().jobs[job.job_id]
    return len(view.nodes) == size and view.state == "running" and view.stepping


def check_result(fut, job, steps):
    res = fut.result(timeout=120)
    assert res["steps"] == steps and res["total"] == float(steps)
    # wait until every rank ever launched has reported (however late): none may resolve again
    launched = lambda: sum(len(n) for n in job.history)  # noqa: E731
    wait_for(lambda: len(RANK_RESULTS[job.job_id]) >= launched(), 120,
             "every rank's result to reach the driver")
    wait_for(lambda: job.state == "done", 60, "the snapshot to show the job done")
    assert job.resolutions == 1
    return res


def test_job_grows_onto_a_node_lent_while_it_runs(live):
    ex, src, store = live
    k = len(exactly(ex, src, 2))
    fut, job = start_job(ex, "grow", max_nodes=k + 1, steps=10**6, step_s=0.03,
                         progress_every_s=0.1, finish_key="test/grow/finish")
    wait_for(lambda: stepping(job, k), what=f"the job to step at size {k}")
    src.idle(f"node-t{next(_names):02d}")
    wait_for(lambda: stepping(job, k + 1), what=f"the job to step at size {k + 1}")
    store.set("test/grow/finish", "1")
    res = fut.result(timeout=120)
    assert res["sizes"] == [k, k + 1]
    assert res["total"] == float(res["steps"]) and res["starts"][1] > 0
    up = [r for r in job.rescales if r.kind == "up"]
    assert len(up) == 1 and up[0].pause_s > 0  # its size: `malleparsl bench executor`
    assert job.resolutions == 1


def test_job_shrinks_off_a_taken_node_and_the_pilot_is_released(live):
    ex, src, _ = live
    nodes = exactly(ex, src, 3)
    fut, job = start_job(ex, "shrink", max_nodes=3, steps=400, step_s=0.03, progress_every_s=0.1)
    wait_for(lambda: stepping(job, 3), what="the job to step at size 3")
    victim = job.nodes[1]
    src.take(victim)
    res = check_result(fut, job, 400)
    assert res["sizes"] == [3, 2] and res["starts"][1] > 0
    assert [r.kind for r in job.rescales] == ["down"] and victim not in job.history[1]
    assert victim in nodes
    wait_for(lambda: victim not in ex.ready_nodes(), 30, "the taken node's pilot to go")


@pytest.mark.parametrize("how", ["sigkill", "pilot-cancelled"])
def test_node_lost_mid_step_resumes_from_checkpoint_on_the_rest(live, how):
    ex, src, _ = live
    exactly(ex, src, 3)
    job_id = f"lost-{how}"
    fut, job = start_job(ex, job_id, max_nodes=3, steps=500, step_s=0.03, ckpt_every=10,
                         progress_every_s=0.1)
    wait_for(lambda: stepping(job, 3),
             what="the job to step at size 3")
    time.sleep(0.5)
    victim = job.nodes[2]
    if how == "sigkill":
        ex.kill_node(victim)
    else:  # the batch scheduler cancels the pilot job behind the executor's back
        ex.provider.cancel([ex.node_table.get(victim).job_id])
    res = check_result(fut, job, 500)
    assert res["sizes"] == [3, 2] and victim not in job.history[1]
    assert job.restarts == 1 and [r.kind for r in job.rescales] == ["restart"]
    resumed = res["starts"][1]
    assert resumed > 0 and resumed % 10 == 0  # from the last periodic checkpoint, not scratch
    assert victim not in ex.ready_nodes()


def test_user_exception_fails_the_future_with_its_traceback_and_no_relaunch(live):
    ex, src, _ = live
    exactly(ex, src, 2)
    fut, job = start_job(ex, "boom", max_nodes=2, steps=200, step_s=0.02, fail_at_step=7)
    with pytest.raises(SyntheticFailure, match="synthetic failure at step 7") as info:
        fut.result(timeout=120)
    frames = "".join(traceback.format_tb(info.value.__traceback__))
    assert "synthetic_entry" in frames  # the original remote traceback, not a wrapper
    wait_for(lambda: job.state == "done", 10, "the snapshot to show the job done")
    assert len(job.history) == 1 and job.restarts == 0
    assert job.resolutions == 1
    wait_for(lambda: not ex.snapshot().used_nodes, 10, "nodes freed")


def test_apps_training_grows_under_parsl_and_matches_an_unrescaled_run(live, tmp_path):
    """The apps layer's real entry (``@malleable_app`` on the digits MLP) through this driver:
    it starts on 2 nodes, grows to 3 when a blocking job frees its node, and its loss trajectory
    equals a run without rescales (global batch constant across sizes)."""
    apps = pytest.importorskip("malleparsl.apps")
    from malleparsl.apps.entry import RankEntry
    from malleparsl.apps.examples_digits import train_digits

    ex, src, store = live
    exactly(ex, src, 3)
    steps, opts = 150, {"progress_interval_s": 0.2, "torch_threads": 1, "ckpt_interval_s": 1e9}
    blocker, bjob = start_job(ex, "blocker", max_nodes=1, steps=10**6, step_s=0.05,
                              progress_every_s=0.1, finish_key="test/blocker/finish")
    wait_for(lambda: stepping(bjob, 1), what="the blocking job to run")
    app = apps.malleable_app(min_nodes=1, max_nodes=3, job_id="digits", **opts)(train_digits)
    fut = app(arch="mlp", total_steps=steps)
    wait_for(lambda: "digits" in ex.snapshot().jobs, 30, "admission")
    job = LiveJob(ex, "digits")
    wait_for(lambda: stepping(job, 2), what="digits to step at size 2")
    store.set("test/blocker/finish", "1")
    blocker.result(timeout=60)
    res = fut.result(timeout=240)
    wait_for(lambda: job.state == "done", 10, "the snapshot to show the job done")
    assert [len(n) for n in job.history] == [2, 3] and job.resolutions == 1
    assert [r.kind for r in job.rescales] == ["up"]
    ref = RankEntry(train_digits).local(arch="mlp", total_steps=steps, ckpt_dir=str(tmp_path))
    got = [h["loss"] for h in res["history"]]
    want = [h["loss"] for h in ref["history"]]
    assert len(got) == len(want) == steps
    assert max(abs(a - b) for a, b in zip(got, want)) < 1e-5


@pytest.mark.parametrize("policy", ["milp", "jpa"])
def test_registered_policies_drive_the_live_loop(live, policy):
    """The executor's default MILP, and the JPA learning an uncurved job's scaling online: the
    job starts (the JPA probes it at min_nodes), then grows onto every node once the policy
    sees that more nodes pay off."""
    from malleparsl.executors.bench_rescale import KeepAndFillPolicy

    ex, src, store = live
    exactly(ex, src, 3)
    ex.control.set_policy(policy)
    try:
        fut, job = start_job(ex, f"policy-{policy}", max_nodes=3, steps=10**6, step_s=0.1,
                             progress_every_s=0.2, finish_key=f"test/{policy}/finish")
        wait_for(lambda: stepping(job, 3), 120, "the job to step on 3 nodes")
        store.set(f"test/{policy}/finish", "1")
        res = fut.result(timeout=60)
        wait_for(lambda: job.state == "done", 10, "the snapshot to show the job done")
        assert res["total"] == float(res["steps"]) and job.resolutions == 1
        if policy == "jpa":
            assert len(job.history[0]) == 1  # probed at min_nodes first
            assert ex.control.controller.advisor.__class__.__name__ == "JobProfilingAdvisor"
    finally:
        ex.control.set_policy(KeepAndFillPolicy())
