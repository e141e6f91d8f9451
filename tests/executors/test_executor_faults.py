"""Faults on real processes (issue 12): a killed interchange, a SIGSTOPped rank, user errors
that look like broken groups.

Real Parsl managers as emulated nodes, real gloo groups (executors.synthetic). No timed
assertions: every wait is on a condition with a generous deadline.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
import traceback

import pytest

parsl = pytest.importorskip("parsl")
dist = pytest.importorskip("torch.distributed")

from parsl.dataflow.dflow import DataFlowKernel  # noqa: E402

from malleparsl.executors.bench_rescale import local_malleable_config  # noqa: E402
from malleparsl.executors.manual_source import ManualNodeSource  # noqa: E402
from malleparsl.executors.options import ControlOptions  # noqa: E402
from malleparsl.executors.synthetic import synthetic_entry  # noqa: E402
from malleparsl.executors.watchdog import InterchangeLostError  # noqa: E402
from malleparsl.procs import process_alive  # noqa: E402

pytestmark = [pytest.mark.timeout(600), pytest.mark.slow]
DEADLINE_S = 300  # generous: pilots start slowly on a loaded machine


def wait_for(cond, timeout_s=DEADLINE_S, what="a condition"):
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def start(run_dir, nodes, **control):
    src = ManualNodeSource(nodes=[f"node-{i:02d}" for i in range(nodes)])
    dfk = DataFlowKernel(local_malleable_config(
        node_source=src, run_dir=str(run_dir / "runinfo"), ckpt_root=str(run_dir / "ckpt"),
        control=ControlOptions(poll_period_s=0.1, **control),
    ))
    ex = dfk.executors["malleable"]
    ex.wait_for_nodes(nodes, DEADLINE_S)
    wait_for(lambda: set(ex.control.controller.nodes) == set(ex.ready_nodes()),
             what="the controller to plan with the ready nodes")
    return dfk, ex, src


def stepping(job, size):
    seg = job.segment
    return (seg is not None and len(seg.nodes) == size and job.state.value == "running"
            and seg.last_progress_time is not None)


def error_of(fut, timeout_s=DEADLINE_S):
    wait_for(fut.done, timeout_s, "the future to resolve")
    return fut.exception()


def test_killed_interchange_fails_every_future_refuses_new_work_and_shuts_down(tmp_path):
    dfk, ex, _ = start(tmp_path, 2)
    try:
        job = ex.submit(synthetic_entry, {"malleable": {"job_id": "ic", "min_nodes": 2,
                                                         "max_nodes": 2}},
                        steps=10**6, step_s=0.05, progress_every_s=0.1)
        wait_for(lambda: "ic" in ex.control.jobs and stepping(ex.control.jobs["ic"], 2),
                 what="the job to step on 2 nodes")
        queued = ex.submit(time.sleep, {}, 3600)  # every worker runs a rank: this one waits
        pinned = ex.submit_to_node("node-00", time.sleep, 3600)
        os.kill(ex.interchange_proc.pid, signal.SIGKILL)
        for fut in (job, queued, pinned):
            exc = error_of(fut)
            assert exc is not None and "interchange" in str(exc) and "SIGKILL" in str(exc), exc
        with pytest.raises(InterchangeLostError, match="SIGKILL"):
            ex.submit(time.sleep, {}, 1)
        with pytest.raises(InterchangeLostError):
            ex.submit_to_node("node-01", time.sleep, 1)
    finally:
        done = threading.Event()
        threading.Thread(target=lambda: (dfk.cleanup(), done.set()), daemon=True).start()
        assert done.wait(DEADLINE_S), "shutdown did not complete after the interchange died"
    wait_for(lambda: not subprocess.run(["pgrep", "-f", str(tmp_path)], capture_output=True,
                                        text=True).stdout.strip(),
             60, "the pilots to exit")


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    dfk, ex, src = start(tmp_path_factory.mktemp("faults-live"), 3,
                         fail_grace_s=15.0, stop_timeout_s=30.0)
    try:
        yield ex, src
    finally:
        dfk.cleanup()


def test_sigstopped_rank_is_killed_and_the_job_finishes_without_its_node(live):
    ex, src = live
    wait_for(lambda: len(ex.ready_nodes()) >= 3, what="3 ready nodes")
    fut = ex.submit(synthetic_entry, {"malleable": {"job_id": "hang", "min_nodes": 1,
                                                     "max_nodes": 3}},
                    steps=400, step_s=0.03, ckpt_every=10, progress_every_s=0.1, timeout_s=5.0)
    wait_for(lambda: "hang" in ex.control.jobs, 30, "admission")
    job = ex.control.jobs["hang"]
    wait_for(lambda: stepping(job, 3), what="the job to step on 3 nodes")
    victim = job.nodes[2]
    pid = ex.node_info(victim)["pid"]
    os.kill(pid, signal.SIGSTOP)
    res = fut.result(timeout=DEADLINE_S)
    assert res["steps"] == 400 and res["total"] == 400.0  # nothing lost or counted twice
    assert len(job.history) == 2 and len(job.history[1]) == 2
    assert victim not in job.history[1] and job.restarts == 1
    wait_for(lambda: victim not in ex.ready_nodes(), 60, "the hung node to be released")

    wait_for(lambda: not process_alive(pid), 60, "the stopped worker to be killed")
    src.idle("node-10")  # top the pool back up for the next test


@pytest.mark.parametrize("err", [TimeoutError("reading shard 3 timed out"),
                                 RuntimeError("my gloo wrapper: Connection closed by peer")],
                         ids=["user-timeout", "gloo-in-message"])
def test_user_error_that_reads_like_a_broken_group_reaches_the_future_unretried(live, err):
    ex, _ = live
    wait_for(lambda: len(ex.ready_nodes()) >= 2, what="2 ready nodes")
    job_id = f"user-{type(err).__name__}"
    fut = ex.submit(synthetic_entry, {"malleable": {"job_id": job_id, "min_nodes": 2,
                                                     "max_nodes": 2}},
                    steps=200, step_s=0.02, fail_at_step=7, fail_error=err, timeout_s=5.0)
    with pytest.raises(type(err), match=str(err)) as info:
        fut.result(timeout=DEADLINE_S)
    frames = "".join(traceback.format_tb(info.value.__traceback__))
    assert "synthetic_entry" in frames  # the original remote traceback
    job = ex.control.jobs[job_id]
    assert job.restarts == 0 and job.next_index == 1 and job.resolutions == 1

