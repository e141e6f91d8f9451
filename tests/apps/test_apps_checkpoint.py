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
