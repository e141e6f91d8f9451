"""End to end through Parsl: @malleable_app on MalleableExecutor with emulated local nodes.

One executor (3 emulated nodes from a ManualNodeSource) serves the module. The scenario test
walks one real training job (the digits MLP, paced so that events land mid-training) through
grow (a short job frees its node), shrink (a node is taken back by the source), and a node
killed with SIGKILL mid-step; its loss trajectory must still equal an unrescaled in-process
run within 1e-5, and its future must resolve once with that result. Then a user exception
must fail its app future with the user's own traceback.
"""

from __future__ import annotations

import time

import pytest

parsl = pytest.importorskip("parsl")
dist = pytest.importorskip("torch.distributed")

from live_parsl import live_executor  # noqa: E402

from malleparsl.apps import malleable_app  # noqa: E402
from malleparsl.apps.entry import RankEntry  # noqa: E402
from malleparsl.apps.examples_digits import train_mlp  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]
NODE_TIMEOUT_S = 300
STEPS = 600
WARM = ("torch.distributed", "malleparsl.apps.examples_digits", "sklearn.datasets")


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    with live_executor(tmp_path_factory.mktemp("apps-e2e"), ["n0", "n1", "n2"], warm=WARM) as got:
        yield got


def wait_for(cond, what, ex=None, timeout_s=NODE_TIMEOUT_S):
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            state = "" if ex is None else _describe(ex)
            raise AssertionError(f"timed out waiting for {what}; {state}")
        time.sleep(0.02)


def _describe(ex) -> str:
    snap = ex.snapshot()
    jobs = {
        j: (jb.state, jb.segment, jb.nodes, [(r.kind, r.from_size, r.to_size) for r in jb.rescales])
        for j, jb in snap.jobs.items()
    }
    return f"nodes in use {sorted(snap.used_nodes)}, jobs {jobs}"


def view_of(ex, job_id):
    return ex.snapshot().jobs.get(job_id)


def segment_of(ex, job_id):
    """The job's view while a segment runs (``.nodes``), else None."""
    view = view_of(ex, job_id)
    return view if view is not None and view.segment is not None else None


def step_of(ex, job_id) -> int:
    """The job's last reported step in its current segment (-1 if none yet)."""
    view = view_of(ex, job_id)
    return -1 if view is None or view.step is None else view.step


def running_at(ex, job_id, size, min_step=0):
    """The job runs at ``size`` and its rank 0 has reported step >= ``min_step``."""
    seg = segment_of(ex, job_id)
    return seg is not None and len(seg.nodes) == size and step_of(ex, job_id) >= min_step


def test_grow_shrink_kill_keeps_the_trajectory_and_resolves_once(live) -> None:
    ex, src = live
    baseline = RankEntry(train_mlp).local(total_steps=STEPS, dtype="float64",
                                          options={"torch_threads": 1})
    # a short, high-value job holds one node, so the long job starts at 2 and grows to 3
    short = malleable_app(min_nodes=1, max_nodes=1, curve=[[1, 100.0]], torch_threads=1,
                          pace_s_per_sample=5e-3)(train_mlp)
    fs = short(total_steps=10, malleable_options={"job_id": "short"})
    wait_for(lambda: running_at(ex, "short", 1), "the short job to start", ex)
    app = malleable_app(min_nodes=1, max_nodes=3, curve=[[1, 1.0], [2, 2.0], [3, 3.0]],
                        torch_threads=1, pace_s_per_sample=2e-3, ckpt_every_steps=20)(train_mlp)
    fut = app(total_steps=STEPS, dtype="float64", malleable_options={"job_id": "long"})
    done_calls = []
    fut.add_done_callback(done_calls.append)

    wait_for(lambda: segment_of(ex, "long") is not None, "the long job to start", ex)
    assert len(segment_of(ex, "long").nodes) == 2  # the short job holds the third node
    assert fs.result(timeout=NODE_TIMEOUT_S)["steps"] == 10
    wait_for(lambda: running_at(ex, "long", 3, 1), "growth to 3 nodes", ex)
    seg, at = segment_of(ex, "long"), step_of(ex, "long")
    wait_for(lambda: running_at(ex, "long", 3, at + 10), "10 steps at 3 nodes", ex)
    src.take(seg.nodes[-1])  # the source reclaims a node: shrink
    wait_for(lambda: running_at(ex, "long", 2, 1), "shrink to 2 nodes", ex)
    seg, at = segment_of(ex, "long"), step_of(ex, "long")
    wait_for(lambda: running_at(ex, "long", 2, at + 25), "25 steps at 2 nodes", ex)
    ex.kill_node(seg.nodes[1])  # SIGKILL mid-step: resume from the last checkpoint
    result = fut.result(timeout=NODE_TIMEOUT_S)

    assert result["steps"] == STEPS
    got = [h["loss"] for h in result["history"]]
    want = [h["loss"] for h in baseline["history"]]
    assert len(got) == len(want) == STEPS
    assert max(abs(a - b) for a, b in zip(got, want)) < 1e-5
    wait_for(lambda: view_of(ex, "long").state == "done", "the snapshot to show it done", ex)
    rescales = view_of(ex, "long").rescales
    print("rescales:", [(r.kind, r.from_size, r.to_size, r.pause_s) for r in rescales])
    kinds = [r.kind for r in rescales]
    assert "up" in kinds and "down" in kinds and "restart" in kinds, kinds
    time.sleep(0.5)
    assert len(done_calls) == 1


def test_user_exception_fails_the_app_future_with_its_traceback(live) -> None:
    ex, _ = live
    app = malleable_app(min_nodes=1, max_nodes=3, curve=[[1, 1.0]], torch_threads=1)(train_mlp)
    fut = app(total_steps=50, fail_at_step=7, malleable_options={"job_id": "buggy"})
    with pytest.raises(ValueError, match="fail_at_step=7") as info:
        fut.result(timeout=NODE_TIMEOUT_S)
    assert "train_digits" in [tb.name for tb in info.traceback]
