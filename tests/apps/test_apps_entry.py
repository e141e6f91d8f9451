"""run_rank in this process against a real TCPStore (size 1): finish, stop, resume, progress."""

from __future__ import annotations

import json

import pytest

dist = pytest.importorskip("torch.distributed")

from malleparsl.apps import run_rank  # noqa: E402
from malleparsl.apps.examples_digits import train_mlp  # noqa: E402
from malleparsl.executors.protocol import RankInfo, progress_key, stop_key  # noqa: E402


@pytest.fixture()
def store():
    return dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)


def info(store, tmp_path, segment: int, **options) -> RankInfo:
    return RankInfo(job_id="j", segment=segment, rank=0, world_size=1, node="here",
                    nodes=("here",), store_host="127.0.0.1", store_port=store.port,
                    ckpt_dir=str(tmp_path), options={"torch_threads": 1, **options})


def test_finish_returns_result_and_publishes_progress(store, tmp_path) -> None:
    out = run_rank(info(store, tmp_path, 0, progress_interval_s=0), train_mlp, total_steps=6,
                   parsl_resource_specification={"malleable": {}})
    assert out.status == "finished" and out.step == 6 and out.samples == 6 * 64
    assert out.result["steps"] == 6 and out.first_step_time is not None
    prog = json.loads(store.get(progress_key("j", 0)))
    assert prog["step"] == 6 and prog["samples_per_s"] > 0
    assert not dist.is_initialized()  # the group was torn down


def test_stop_key_stops_at_a_boundary_with_checkpoint_then_resume(store, tmp_path) -> None:
    store.set(stop_key("j"), "0")
    out = run_rank(info(store, tmp_path, 0), train_mlp, total_steps=6)
    assert out.status == "stopped" and out.step == 0 and out.result is None
    assert (tmp_path / "ckpt-0000000000.pt").exists()
    # a stop key naming an older segment does not stop the next one
    out = run_rank(info(store, tmp_path, 1), train_mlp, total_steps=6)
    assert out.status == "finished" and out.step == 6


def test_user_exception_propagates_and_leaves_no_group(store, tmp_path) -> None:
    with pytest.raises(ValueError, match="fail_at_step=2"):
        run_rank(info(store, tmp_path, 0), train_mlp, total_steps=6, fail_at_step=2)
    assert not dist.is_initialized()


def hand_written_loop(ctx, *, total=5):
    """A loop without ctx.steps(): explicit restore, stop checks and saves; plain extra data."""
    import torch

    w = torch.nn.Linear(2, 1)
    ctx.register(w=w)
    ctx.restore()
    ctx.extra.setdefault("seen", [])
    while ctx.step < total:
        ctx.check_stop()
        ctx.extra["seen"].append(ctx.step)
        ctx.step += 1
        ctx.save()
    return list(ctx.extra["seen"])


def test_hand_written_loop_resumes_with_its_extra_state(store, tmp_path) -> None:
    first = run_rank(info(store, tmp_path, 0), hand_written_loop, total=3)
    assert first.result == [0, 1, 2]
    out = run_rank(info(store, tmp_path, 1), hand_written_loop, total=5)
    assert out.status == "finished" and out.result == [0, 1, 2, 3, 4]


def test_register_rejects_objects_without_state_dict(store, tmp_path) -> None:
    from malleparsl.errors import SpecError

    def bad(ctx):
        ctx.register(lr=0.1)

    with pytest.raises(SpecError, match="ctx.extra"):
        run_rank(info(store, tmp_path, 0), bad)
