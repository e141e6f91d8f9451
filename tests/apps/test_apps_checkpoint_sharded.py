"""Sharded (FSDP2, torch.distributed.checkpoint) checkpoints keep the store's guarantees.

torch's reader loads a flipped byte in a ``.distcp`` file silently: the store must refuse it,
naming the file, before loading anything. Two real gloo ranks in fresh processes write them.
"""

from __future__ import annotations

import os

import pytest
import torch

from malleparsl.apps.checkpoint import CheckpointStore, CorruptCheckpointWarning, ShardedState
from malleparsl.errors import CheckpointError
from malleparsl.ports import free_port

pytestmark = pytest.mark.slow  # two fresh gloo ranks


def _writer_rank(rank: int, port: int, ckpt_dir: str) -> dict:  # a fresh process per rank
    from malleparsl.apps.context import TrainContext
    from malleparsl.apps.examples_plans import BlockMLP, loss_sum, teacher_data
    from malleparsl.apps.memory import join_gloo
    from malleparsl.apps.plans import prepare

    join_gloo(rank, 2, port)
    ctx = TrainContext(rank=rank, world_size=2, ckpt_dir=ckpt_dir,
                       options={"plan": "fsdp", "deterministic": False})
    ctx.group = True
    try:
        x, y = teacher_data(n=8, d_in=16)
        model = BlockMLP(d_in=16, width=32, depth=2)
        model, opt = prepare(ctx, model, torch.optim.Adam, blocks=model.blocks, lr=1e-3)
        paths, firsts = [], []
        for step in (1, 2):
            opt.zero_grad()
            loss_sum(model, (x[4 * rank:4 * rank + 4], y[4 * rank:4 * rank + 4])).backward()
            opt.step()
            ctx.step = step
            ctx.extra["note"] = f"after {step}"
            paths.append(str(ctx.save()))
            firsts.append(next(iter(model.state_dict().values())).full_tensor().tolist())
        return {"paths": paths, "firsts": firsts}
    finally:
        ctx.close()


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    from malleparsl.apps.memory import run_fresh

    d = tmp_path_factory.mktemp("sharded")
    port = free_port()
    r0, r1 = run_fresh(_writer_rank, [((r, port, str(d)), {}) for r in range(2)], timeout_s=300)
    assert [p.rsplit("/", 1)[1] for p in r0["paths"]] == ["ckpt-0000000001.dcp",
                                                           "ckpt-0000000002.dcp"]
    assert r1["paths"] == ["None", "None"]
    return d, r0["firsts"]


def _copy(src, dst):
    import shutil

    shutil.copytree(src, dst)
    return dst


def test_sharded_checkpoint_is_listed_verified_and_read_whole(written, tmp_path) -> None:
    d, firsts = written
    store = CheckpointStore(directory=_copy(d, tmp_path / "c"))
    assert [(c.step, c.path.suffix) for c in store.list()] == [(1, ".dcp"), (2, ".dcp")]
    assert not any(p.name.startswith(".tmp") for p in store.directory.iterdir())
    step, payload = store.load_latest()
    assert step == 2 and payload["extra"] == {"note": "after 2"}
    assert isinstance(payload["state"]["model"], ShardedState)
    first = next(iter(payload["state"]["model"].plain().values()))
    assert first.tolist() == firsts[1]
    opt = payload["state"]["optimizer"].plain()
    assert sorted(opt["state"]) == list(range(len(opt["state"])))  # the plain numbering


@pytest.mark.parametrize("damage", ["flip", "truncate"])
def test_a_damaged_shard_is_refused_naming_the_file_and_the_older_one_used(
        written, tmp_path, damage) -> None:
    d, firsts = written
    store = CheckpointStore(directory=_copy(d, tmp_path / "c"))
    bad = store.sharded_path_for(2) / "__1_0.distcp"
    size = bad.stat().st_size
    with open(bad, "r+b") as f:
        if damage == "flip":  # torch's reader alone loads this silently
            f.seek(size // 2)
            b = f.read(1)
            f.seek(size // 2)
            f.write(bytes([b[0] ^ 0xFF]))
        else:
            f.truncate(size - 100)
    with pytest.raises(CheckpointError, match="__1_0.distcp"):
        store.read(store.sharded_path_for(2))
    with pytest.warns(CorruptCheckpointWarning, match="ckpt-0000000002.dcp"):
        step, payload = store.load_latest()
    assert step == 1
    assert next(iter(payload["state"]["model"].plain().values())).tolist() == firsts[0]


def test_missing_manifest_is_refused(written, tmp_path) -> None:
    d, _ = written
    store = CheckpointStore(directory=_copy(d, tmp_path / "c"))
    os.unlink(store.sharded_path_for(2) / "manifest.json")
    with pytest.raises(CheckpointError, match="manifest"):
        store.read(store.sharded_path_for(2))


@pytest.mark.parametrize("field,to", [("files", "fkles"), ("sha256", "sha25v"),
                                      ("sharded", "sharled"), ("optimizer", "optimizes")])
def test_a_bit_flip_in_a_manifest_name_is_refused_and_the_older_one_used(
        written, tmp_path, field, to) -> None:
    """manifest.json has no checksum of its own: a flipped byte in one of its names keeps it
    valid JSON, and was a KeyError out of load_latest (the job failed instead of resuming from
    the older checkpoint) or, in a kind, a state handed over in the wrong format."""
    d, firsts = written
    store = CheckpointStore(directory=_copy(d, tmp_path / "c"))
    man = store.sharded_path_for(2) / "manifest.json"
    text = man.read_text()
    assert f'"{field}"' in text
    man.write_text(text.replace(f'"{field}"', f'"{to}"'))
    with pytest.raises(CheckpointError, match="manifest"):
        store.read(store.sharded_path_for(2))
    with pytest.warns(CorruptCheckpointWarning, match="ckpt-0000000002.dcp"):
        step, payload = store.load_latest()
    assert step == 1
    assert next(iter(payload["state"]["model"].plain().values())).tolist() == firsts[0]


def test_plain_and_sharded_checkpoints_are_pruned_together(written, tmp_path) -> None:
    d, _ = written
    store = CheckpointStore(directory=_copy(d, tmp_path / "c"), keep=2)
    store.save({"w": torch.ones(2)}, step=3)
    assert [(c.step, c.path.suffix) for c in store.list()] == [(2, ".dcp"), (3, ".pt")]
    assert not store.sharded_path_for(1).exists()
    assert store.load_latest()[0] == 3


@pytest.mark.parametrize("newer", [".pt", ".dcp"])
def test_a_plain_and_a_sharded_checkpoint_of_one_step_resume_from_the_newer(
        written, tmp_path, newer) -> None:
    """Both exist after a crash between a save's publish and its prune; prune keeps the new
    one, so resuming must pick it too, not whichever the directory listing gives first."""
    d, _ = written
    store = CheckpointStore(directory=_copy(d, tmp_path / "c"))
    pt = store.path_for(2)
    store.save({"w": torch.ones(2)}, step=3)  # a plain file, then made step 2's by hand
    os.replace(store.path_for(3), pt)
    dcp = store.sharded_path_for(2)
    old, new = (dcp, pt) if newer == ".pt" else (pt, dcp)
    os.utime(old, ns=(1_000_000_000, 1_000_000_000))
    os.utime(new, ns=(2_000_000_000, 2_000_000_000))
    step, payload = store.load_latest()
    assert step == 2
    assert ("w" in payload) == (newer == ".pt")


def _disk_full_rank(port: int, ckpt_dir: str) -> dict:  # a fresh process: one gloo rank
    import errno

    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException, _wrap_exception

    from malleparsl.errors import CheckpointWriteError

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        def full(*_a, **_k):  # what DCP raises when a rank's write hits a full disk
            err = OSError(errno.ENOSPC, "No space left on device")
            raise CheckpointException("write failed", {0: _wrap_exception(err)})

        dcp.save = full
        store = CheckpointStore(directory=ckpt_dir)
        try:
            store.save_sharded({"step": 3}, {"model": {"w": torch.zeros(4)}}, {"model": "model"},
                               step=3, rank=0, world_size=1)
        except CheckpointWriteError as exc:
            return {"error": "CheckpointWriteError", "text": str(exc),
                    "left": sorted(os.listdir(ckpt_dir))}
        except BaseException as exc:  # noqa: BLE001
            return {"error": type(exc).__name__, "text": str(exc), "left": []}
        return {"error": None}
    finally:
        dist.destroy_process_group()


def test_disk_full_during_a_sharded_save_is_a_write_error(tmp_path) -> None:
    """As for plain files: a full disk gives CheckpointWriteError naming the step and the
    folder, and no temporary directory is left behind (DCP wraps the OSError per rank)."""
    from malleparsl.apps.memory import run_fresh

    (got,) = run_fresh(_disk_full_rank, [((free_port(), str(tmp_path)), {})],
                       timeout_s=120)
    assert got["error"] == "CheckpointWriteError", got
    assert "disk full" in got["text"] and "step 3" in got["text"] and str(tmp_path) in got["text"]
    assert got["left"] == []


def _publish_fails_rank(rank: int, port: int, ckpt_dir: str) -> dict:  # a fresh process
    import errno
    import time
    from datetime import timedelta

    import torch.distributed as dist

    import malleparsl.apps.checkpoint as ck

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=2, timeout=timedelta(seconds=20))
    try:
        if rank == 0:  # the disk fills while rank 0 writes the manifest, after DCP's save
            def full(*_a, **_k):
                raise OSError(errno.ENOSPC, "No space left on device")
            ck.json.dump = full
        store = CheckpointStore(directory=ckpt_dir)
        t0 = time.monotonic()
        try:
            store.save_sharded({"step": 3} if rank == 0 else None,
                               {"model": {"w": torch.full((4,), float(rank))}},
                               {"model": "module"}, step=3, rank=rank, world_size=2)
        except BaseException as exc:  # noqa: BLE001
            return {"error": type(exc).__name__, "text": str(exc),
                    "s": time.monotonic() - t0, "left": sorted(os.listdir(ckpt_dir))}
        return {"error": None, "s": time.monotonic() - t0}
    finally:
        dist.destroy_process_group()


def test_rank_0_failing_to_publish_fails_every_rank_at_once(tmp_path) -> None:
    """Rank 0 writes the manifest and publishes after the collective save: when that fails,
    the other ranks used to wait in the closing barrier for the group timeout and then fail
    with a timeout that does not say why; now they get rank 0's error at once."""
    from malleparsl.apps.memory import run_fresh

    port = free_port()
    r0, r1 = run_fresh(_publish_fails_rank, [((r, port, str(tmp_path)), {}) for r in range(2)],
                       timeout_s=120)
    assert r0["error"] == "CheckpointWriteError", r0
    assert r1["error"] == "CheckpointWriteError" and "step 3" in r1["text"], r1
    assert r1["s"] < 10, r1  # not the 20 s group timeout
    assert r0["left"] == [], r0  # no temporary directory, nothing published


def _diverging_reader_rank(rank: int, port: int, dirs: list) -> dict:  # a fresh process
    from datetime import timedelta

    from malleparsl.apps.context import TrainContext
    from malleparsl.apps.examples_plans import BlockMLP
    from malleparsl.apps.memory import join_gloo
    from malleparsl.apps.plans import prepare

    join_gloo(rank, 2, port, timeout=timedelta(seconds=20))
    ctx = TrainContext(rank=rank, world_size=2, ckpt_dir=dirs[rank],
                       options={"plan": "fsdp", "deterministic": False, "resume": True})
    ctx.group = True
    try:
        model = BlockMLP(d_in=16, width=32, depth=2)
        prepare(ctx, model, torch.optim.Adam, blocks=model.blocks, lr=1e-3)
        try:
            ctx.restore()
        except BaseException as exc:  # noqa: BLE001
            return {"error": type(exc).__name__, "text": str(exc)}
        return {"error": None}
    finally:
        ctx.close()


def test_ranks_that_find_different_checkpoints_refuse_before_loading(written, tmp_path) -> None:
    """Rank 1 sees no checkpoint (a folder not shared, or a listing not yet visible) while
    rank 0 finds step 2: rank 0's collective DCP load then met rank 1's broadcasts, mismatched
    collectives. The step check must come before any load, so both refuse with a clear error."""
    from malleparsl.apps.memory import run_fresh

    d, _ = written
    dirs = [str(_copy(d, tmp_path / "r0")), str(tmp_path / "r1")]
    port = free_port()
    r0, r1 = run_fresh(_diverging_reader_rank, [((r, port, dirs), {}) for r in range(2)],
                       timeout_s=120)
    for r in (r0, r1):
        assert r["error"] == "CheckpointError" and "different steps" in r["text"], (r0, r1)
