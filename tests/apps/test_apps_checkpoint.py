"""Atomic checksummed checkpoints: round trip, fallback on damage, safe loading."""

from __future__ import annotations

import os
import pickle

import pytest
import torch

from malleparsl.apps.checkpoint import CheckpointStore, CorruptCheckpointWarning
from malleparsl.errors import CheckpointError, SpecError


def _state(v: float) -> dict:
    return {"w": torch.full((3,), v), "step_meta": {"lr": 0.1, "names": ["a", "b"]}}


def test_round_trip_and_keep_newest(tmp_path) -> None:
    store = CheckpointStore(directory=tmp_path, keep=2)
    for step in (10, 20, 30):
        store.save(_state(step), step=step)
    assert [c.step for c in store.list()] == [20, 30]
    step, state = store.load_latest()
    assert step == 30 and state["w"].tolist() == [30.0] * 3
    assert state["step_meta"] == {"lr": 0.1, "names": ["a", "b"]}
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp")]


def test_empty_directory_has_no_checkpoint(tmp_path) -> None:
    assert CheckpointStore(directory=tmp_path / "missing").load_latest() is None


@pytest.mark.parametrize("damage", ["flip_byte", "truncate", "empty", "garbage_header"])
def test_damaged_newest_falls_back_to_previous_with_warning(tmp_path, damage: str) -> None:
    store = CheckpointStore(directory=tmp_path, keep=3)
    store.save(_state(1.0), step=1)
    newest = store.save(_state(2.0), step=2)
    data = bytearray(newest.read_bytes())
    if damage == "flip_byte":
        data[-5] ^= 0xFF
    elif damage == "truncate":
        data = data[: len(data) // 2]
    elif damage == "empty":
        data = bytearray()
    else:
        data[:5] = b"XXXXX"
    newest.write_bytes(bytes(data))
    with pytest.warns(CorruptCheckpointWarning, match="ckpt-0000000002"):
        step, state = store.load_latest()
    assert step == 1 and state["w"].tolist() == [1.0] * 3


def test_all_damaged_raises_instead_of_restarting_from_scratch(tmp_path) -> None:
    store = CheckpointStore(directory=tmp_path)
    path = store.save(_state(1.0), step=1)
    path.write_bytes(path.read_bytes()[:-1])
    with pytest.warns(CorruptCheckpointWarning), pytest.raises(CheckpointError, match="none of"):
        store.load_latest()


def test_checkpoint_cannot_smuggle_code(tmp_path) -> None:
    """weights_only=True: a pickled arbitrary object is refused even with a valid checksum."""
    import hashlib

    from malleparsl.apps import checkpoint as ck

    class Evil:
        def __reduce__(self):
            return (os.system, ("echo pwned",))

    payload = pickle.dumps({"x": Evil()}, protocol=2)
    digest = hashlib.sha256(payload).hexdigest().encode()
    (tmp_path / "ckpt-0000000005.pt").write_bytes(ck.MAGIC + digest + b"\n" + payload)
    with pytest.raises(CheckpointError, match="torch.load failed"):
        CheckpointStore(directory=tmp_path).read(tmp_path / "ckpt-0000000005.pt")


def test_bad_arguments(tmp_path) -> None:
    with pytest.raises(SpecError, match="keep"):
        CheckpointStore(directory=tmp_path, keep=0)
    with pytest.raises(SpecError, match="step"):
        CheckpointStore(directory=tmp_path).save({}, step=-1)


def _old_format(state: dict) -> bytes:
    """A checkpoint file as the code before streamed saves wrote it (serialised in memory)."""
    import hashlib
    import io

    from malleparsl.apps import checkpoint as ck

    buf = io.BytesIO()
    torch.save(state, buf)
    payload = buf.getvalue()
    return ck.MAGIC + hashlib.sha256(payload).hexdigest().encode() + b"\n" + payload


def test_a_checkpoint_written_by_the_old_code_still_loads(tmp_path) -> None:
    (tmp_path / "ckpt-0000000007.pt").write_bytes(_old_format(_state(7.0)))
    step, state = CheckpointStore(directory=tmp_path).load_latest()
    assert step == 7 and state["w"].tolist() == [7.0] * 3
    assert state["step_meta"] == {"lr": 0.1, "names": ["a", "b"]}


def test_streamed_save_writes_the_same_bytes_as_the_old_code(tmp_path) -> None:
    """Same header, digest and payload: old readers read new files and the reverse."""
    state = {"w": torch.arange(100_000, dtype=torch.float32), "n": 3}
    path = CheckpointStore(directory=tmp_path).save(state, step=1)
    assert path.read_bytes() == _old_format(state)


@pytest.mark.parametrize("where", ["header_digest", "middle", "last_byte"])
def test_a_flipped_byte_anywhere_is_refused_naming_the_file(tmp_path, where: str) -> None:
    store = CheckpointStore(directory=tmp_path)
    path = store.save({"w": torch.randn(300_000)}, step=3)  # > 1 MiB: the hash runs in chunks
    data = bytearray(path.read_bytes())
    data[{"header_digest": 20, "middle": len(data) // 2, "last_byte": -1}[where]] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=r"ckpt-0000000003\.pt: checksum mismatch"):
        store.read(path)


def test_save_and_load_hold_no_serialised_copy_of_the_state() -> None:
    """Rank 0 saving a 48 MiB state: the save used to peak at one more copy of it (the
    serialised payload), and reading at three (file bytes, payload slice, loaded tensors)."""
    from malleparsl.apps.bench_checkpoint import measure_store

    row = measure_store(48)
    assert row["file_bytes"] > 48 * 2**20
    assert row["save_extra_bytes"] < 0.1 * row["file_bytes"], row
    assert row["loaded_bytes"] > 0.9 * row["file_bytes"], row  # the measurement saw the state
    assert row["load_peak_bytes"] < 1.2 * row["file_bytes"], row
