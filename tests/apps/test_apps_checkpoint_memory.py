"""What checkpointing leaves in memory: a ZeRO-1 save must not keep the consolidated state.

Fresh processes per rank, real gloo ranks; resident memory read from the kernel (see
malleparsl.apps.memory).
"""

from __future__ import annotations

import gc
from typing import Any

import pytest
import torch

from malleparsl.ports import free_port

pytestmark = pytest.mark.slow  # two fresh gloo ranks: ~30 s on a loaded machine


def _zero1_rank(rank: int, port: int, ckpt_dir: str) -> dict:  # a fresh process per rank

    from malleparsl.apps.context import TrainContext
    from malleparsl.apps.examples_plans import BlockMLP, loss_sum, teacher_data
    from malleparsl.apps.memory import join_gloo, peak_rss_bytes, reset_peak_rss, rss_bytes
    from malleparsl.apps.plans import prepare

    join_gloo(rank, 2, port)
    ctx = TrainContext(rank=rank, world_size=2, ckpt_dir=ckpt_dir,
                       options={"plan": "zero1", "deterministic": False})
    ctx.group = True
    try:
        x, y = teacher_data(n=8, d_in=256)
        model = BlockMLP(d_in=256, width=512, depth=6)
        adam_bytes = 2 * sum(p.numel() * p.element_size() for p in model.parameters())
        model, opt = prepare(ctx, model, torch.optim.Adam, blocks=model.blocks, lr=1e-3)
        held, peaks, paths = [], [], []
        for step in (1, 2):  # a second save consolidates again after the release
            opt.zero_grad()
            loss_sum(model, (x[4 * rank:4 * rank + 4], y[4 * rank:4 * rank + 4])).backward()
            opt.step()  # Adam's state exists (each rank its shard)
            ctx.step = step
            reset_peak_rss()
            base = rss_bytes()
            paths.append(str(ctx.save()))
            peaks.append(peak_rss_bytes() - base)
            held.append(rss_bytes() - base)
        return {"rank": rank, "held": held, "peaks": peaks, "adam_bytes": adam_bytes, "paths": paths}
    finally:
        ctx.close()


def test_zero1_rank0_drops_the_consolidated_state_once_the_checkpoint_is_written(
        tmp_path) -> None:
    """torch's consolidate_state_dict leaves every rank's shard on rank 0 until the next
    consolidation; kept, rank 0 holds the whole Adam state from its first save on (half of it
    more than the memory model counts at 2 ranks)."""
    from malleparsl.apps.checkpoint import CheckpointStore
    from malleparsl.apps.memory import run_fresh

    port = free_port()
    r0, r1 = run_fresh(_zero1_rank, [((r, port, str(tmp_path)), {}) for r in range(2)],
                       timeout_s=300)
    shard = r0["adam_bytes"] / 2  # what rank 0 receives from rank 1
    assert all(h < 0.2 * shard for h in r0["held"]), (r0["held"], shard)
    assert r0["paths"][1].endswith("ckpt-0000000002.pt") and r1["paths"] == ["None", "None"]
    step, payload = CheckpointStore(directory=tmp_path).load_latest()
    state = payload["state"]["optimizer"]["state"]
    assert step == 2 and len(state) == len(payload["state"]["model"])  # both ranks' shards


def test_zero1_consolidation_receives_each_shard_once(tmp_path) -> None:
    """Rank 0 needs the other ranks' shards for the file, and no more: torch's
    consolidate_state_dict pickles a whole shard per rank, so rank 0 held it three times
    while receiving it (its save peaked at 2.9-3.0 shards at 2 ranks, 25.7 MB each)."""
    from malleparsl.apps.memory import run_fresh

    port = free_port()
    r0, r1 = run_fresh(_zero1_rank, [((r, port, str(tmp_path)), {}) for r in range(2)],
                       timeout_s=300)
    shard = r0["adam_bytes"] / 2
    assert all(0.8 * shard < p < 1.4 * shard for p in r0["peaks"]), (r0["peaks"], shard)
    assert all(p < 0.5 * shard for p in r1["peaks"]), (r1["peaks"], shard)  # sends in place


def _zero1_devices_rank(rank: int, port: int, ckpt_dir: str) -> dict:  # a fresh process per rank
    import torch.distributed as dist

    from malleparsl.apps.context import TrainContext
    from malleparsl.apps.examples_plans import BlockMLP, loss_sum, teacher_data
    from malleparsl.apps.memory import join_gloo
    from malleparsl.apps.plans import prepare

    join_gloo(rank, 2, port)
    ctx = TrainContext(rank=rank, world_size=2, ckpt_dir=ckpt_dir,
                       options={"plan": "zero1", "deterministic": False})
    ctx.group = True
    seen: list[str] = []

    def spy(fn):  # calls through; records the device the object goes over
        def call(*a, **kw):
            seen.append(str(kw.get("device")))
            return fn(*a, **kw)
        return call

    for name in ("send_object_list", "recv_object_list"):  # apps.plans imports them from dist
        setattr(dist, name, spy(getattr(dist, name)))
    try:
        x, y = teacher_data(n=8, d_in=16)
        model = BlockMLP(d_in=16, width=8, depth=2)
        model, opt = prepare(ctx, model, torch.optim.Adam, blocks=model.blocks, lr=1e-3)
        paths = [str(ctx.save())]  # before the first step: no optimizer state on any rank
        opt.zero_grad()
        loss_sum(model, (x[4 * rank:4 * rank + 4], y[4 * rank:4 * rank + 4])).backward()
        opt.step()
        ctx.step = 1
        paths.append(str(ctx.save()))
        return {"seen": seen, "device": str(opt.opt._default_device), "paths": paths}
    finally:
        ctx.close()


def test_zero1_consolidation_sends_objects_on_the_optimizer_device(tmp_path) -> None:
    """NCCL sends no CPU tensor and, without ``device``, an object goes over
    ``torch.cuda.current_device()``, which nothing sets (a rank bound to cuda:1 would send
    from cuda:0): the structure must go over the optimizer's device, as torch's own
    consolidation does. A save before the first step (no state yet) must not hang."""
    from malleparsl.apps.memory import run_fresh

    port = free_port()
    r0, r1 = run_fresh(_zero1_devices_rank, [((r, port, str(tmp_path)), {}) for r in range(2)],
                       timeout_s=300)
    assert len(r0["seen"]) == len(r1["seen"]) == 2  # one structure per save
    assert set(r0["seen"]) == set(r1["seen"]) == {r0["device"]}, (r0, r1)
    assert r0["paths"][1].endswith("ckpt-0000000001.pt")


def _plain_to_sharded_rank(rank: int, port: int, ckpt_dir: str, plan: str) -> dict:  # fresh
    import torch.distributed as dist

    from malleparsl.apps.context import TrainContext
    from malleparsl.apps.examples_plans import BlockMLP, loss_sum, teacher_data
    from malleparsl.apps.memory import join_gloo, peak_rss_bytes, reset_peak_rss, rss_bytes
    from malleparsl.apps.plans import prepare

    join_gloo(rank, 2, port)
    x, y = teacher_data(n=8, d_in=256)

    def segment(plan: str, seg: int) -> tuple[TrainContext, Any, Any]:
        ctx = TrainContext(rank=rank, world_size=2, segment=seg, ckpt_dir=ckpt_dir,
                           options={"plan": plan, "deterministic": False})
        ctx.group = seg == 1  # the second segment closes the group
        model = BlockMLP(d_in=256, width=512, depth=6)
        model, opt = prepare(ctx, model, torch.optim.Adam, blocks=model.blocks, lr=1e-3)
        return ctx, model, opt

    ctx, model, opt = segment("dp", 0)  # a replicated plan writes the plain file
    ctx.restore()
    opt.zero_grad()
    loss_sum(model, (x[4 * rank:4 * rank + 4], y[4 * rank:4 * rank + 4])).backward()
    for p in model.parameters():  # equal replicas (the step's all-reduce, by hand)
        dist.all_reduce(p.grad)
    opt.step()
    ctx.step = 1
    path = str(ctx.save())
    state_bytes = 3 * sum(p.numel() * p.element_size() for p in model.parameters())  # w P, Adam
    want = [p.detach().clone() for p in model.parameters()]
    ctx.close()
    del model, opt
    dist.barrier()  # the file is written before rank 1 looks for it
    ctx, model, opt = segment(plan, 1)  # the next segment restores the plain file
    gc.collect()
    reset_peak_rss()
    base = rss_bytes()
    try:
        assert ctx.restore()
        peak = peak_rss_bytes() - base
        got = [p.full_tensor() if plan == "fsdp" else p for p in model.parameters()]
        same = all(torch.equal(a, b) for a, b in zip(want, got))
        steps = sorted({float(s["step"]) for s in opt.opt.state.values() if s})
        return {"peak": peak, "state_bytes": state_bytes, "same": same, "path": path,
                "steps": steps, "after": rss_bytes() - base}
    finally:
        ctx.close()


@pytest.mark.parametrize("plan", ["fsdp", "zero1"])
def test_a_sharded_plan_restoring_a_plain_checkpoint_reads_only_its_shards(
        tmp_path, plan) -> None:
    """The first FSDP2 (ZeRO-1) segment after a replicated one restores a plain file: read
    whole, every rank held the model and its Adam state (3 w P) at once before keeping its
    half, beyond what the memory model counts (measured 102.9 / 77.1 MB at 2 ranks, w P =
    25.7 MB). Now each rank reads its shards from the file: the restore adds its half of
    Adam's state (created by the load) and, under ZeRO-1, the replicated model's state while
    it is copied into the parameters (w P each; measured 26.7-26.9 / 26.3-26.8 MB)."""
    from malleparsl.apps.memory import run_fresh

    port = free_port()
    r0, r1 = run_fresh(_plain_to_sharded_rank,
                       [((r, port, str(tmp_path), plan), {}) for r in range(2)], timeout_s=300)
    assert r0["path"].endswith("ckpt-0000000001.pt") and r1["path"] == "None"
    for r in (r0, r1):
        assert r["same"] and r["steps"] == [1.0], r
        adam_shard = r["state_bytes"] * 2 / 3 / 2  # s w P / n = w P: what the rank keeps
        assert r["peak"] < 1.2 * adam_shard, (r["peak"], adam_shard)
