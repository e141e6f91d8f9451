"""A trial array through Parsl: @malleable_app(train_array) on MalleableExecutor, shrunk from
2 emulated nodes to 1 mid-training (real worker processes, a real gloo group); every trial's
loss trajectory must still equal that trial trained alone within 1e-5, and the job's rate must
count the samples of all its trials."""

from __future__ import annotations

import time

import pytest

parsl = pytest.importorskip("parsl")

from live_parsl import live_executor  # noqa: E402

from malleparsl.apps import malleable_app  # noqa: E402
from malleparsl.apps.fused import train_array  # noqa: E402
from malleparsl.apps.fused_digits import build_mlp, digits_data, train_alone  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]
WARM = ("torch.distributed", "malleparsl.apps.fused_digits", "sklearn.datasets")
STEPS, GB = 160, 32
NODE_TIMEOUT_S = 300


def wait_for(cond, what, ex, timeout_s=NODE_TIMEOUT_S):
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def view(ex, job_id):
    """The job as the control loop last published it (``executor.snapshot()``)."""
    return ex.snapshot().jobs.get(job_id)


def running_at(ex, job_id, size, min_step=0):
    job = view(ex, job_id)
    return (job is not None and len(job.nodes) == size and job.stepping
            and job.step is not None and job.step >= min_step)


def test_array_shrinks_from_2_to_1_node_and_every_trial_keeps_its_trajectory(tmp_path) -> None:
    with live_executor(tmp_path, ["f0", "f1"], warm=WARM) as (ex, src):
        trials = [{"trial_id": f"t{i}", "seed": 3 + i, "dir": str(tmp_path / f"t{i}"),
                   "config": {"width": 32, "optimizer": "adam", "lr": 2e-3 * (i + 1)}}
                  for i in range(3)]
        app = malleable_app(min_nodes=1, max_nodes=2, curve=[[1, 1.0], [2, 2.0]],
                            torch_threads=1, pace_s_per_sample=2e-3, ckpt_every_steps=20)(
            train_array)
        fut = app(trials=trials, build=build_mlp, data=digits_data, global_batch=GB,
                  stops=[STEPS // 2, STEPS], malleable_options={"job_id": "array"})
        wait_for(lambda: running_at(ex, "array", 2, 15), "the array at 2 nodes", ex)
        job = view(ex, "array")
        doc = {"samples": job.samples, "step": job.step}
        src.take(job.nodes[-1])  # the source reclaims a node: the array shrinks
        wait_for(lambda: running_at(ex, "array", 1, 1), "shrink to 1 node", ex)
        result = fut.result(timeout=NODE_TIMEOUT_S)
        kinds = [r.kind for r in view(ex, "array").rescales]
    assert "down" in kinds, kinds
    # the job counts the samples of all 3 trials: 3 x global batch per step
    assert doc["samples"] == pytest.approx(3 * GB * doc["step"])
    for t in trials:
        got = [h["loss"] for h in result["trials"][t["trial_id"]]["history"]]
        want, _ = train_alone(t["config"], seed=t["seed"], steps=STEPS, global_batch=GB,
                              build=build_mlp)
        assert len(got) == STEPS
        assert max(abs(a - b) for a, b in zip(got, want)) <= 1e-5
