"""The private data cache: user folder, checksums, corrupt and planted files never used."""

from __future__ import annotations

import os
import stat

import numpy as np
import pytest

from malleparsl import cache


@pytest.fixture()
def xdg(tmp_path, monkeypatch):
    monkeypatch.delenv("MALLEPARSL_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    return tmp_path / "xdg" / "malleparsl"


def _derive_counter():
    calls = []

    def derive():
        calls.append(1)
        return {"x": np.arange(5, dtype=np.float64), "y": np.array([1, 2, 3])}

    return derive, calls


def test_cache_lives_in_the_users_cache_folder_and_is_private(xdg) -> None:
    derive, calls = _derive_counter()
    a = cache.cached_arrays("t-v1", derive)
    b = cache.cached_arrays("t-v1", derive)
    assert len(calls) == 1 and a["x"].tolist() == b["x"].tolist() == [0, 1, 2, 3, 4]
    assert cache.cache_dir() == xdg and (xdg / "t-v1.npz").exists()
    assert stat.S_IMODE(xdg.stat().st_mode) == 0o700


def test_home_cache_without_xdg(monkeypatch, tmp_path) -> None:
    monkeypatch.delenv("MALLEPARSL_CACHE", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert cache.cache_dir() == tmp_path / ".cache" / "malleparsl"


def test_a_corrupt_entry_is_derived_again(xdg) -> None:
    derive, calls = _derive_counter()
    cache.cached_arrays("t-v1", derive)
    np.savez(xdg / "t-v1.npz", x=np.arange(5, dtype=np.float64) + 1e-9, y=np.array([1, 2, 3]))
    got = cache.cached_arrays("t-v1", derive)  # content changed behind the checksum
    assert len(calls) == 2 and got["x"].tolist() == [0, 1, 2, 3, 4]
    raw = (xdg / "t-v1.npz").read_bytes()
    (xdg / "t-v1.npz").write_bytes(raw[: len(raw) // 2])  # truncated
    assert cache.cached_arrays("t-v1", derive)["y"].tolist() == [1, 2, 3] and len(calls) == 3


def test_a_planted_entry_without_the_right_checksum_is_never_used(xdg) -> None:
    derive, calls = _derive_counter()
    xdg.mkdir(parents=True, mode=0o700)
    np.savez(xdg / "t-v1.npz", x=np.full(5, 666.0), y=np.array([6, 6, 6]))
    (xdg / "t-v1.sha256").write_text("0" * 64)
    got = cache.cached_arrays("t-v1", derive)
    assert len(calls) == 1 and got["x"].tolist() == [0, 1, 2, 3, 4]


def test_a_folder_others_can_write_is_not_trusted(xdg) -> None:
    derive, calls = _derive_counter()
    cache.cached_arrays("t-v1", derive)
    planted = {"x": np.full(5, 666.0), "y": np.array([6, 6, 6])}
    np.savez(xdg / "t-v1.npz", **planted)
    (xdg / "t-v1.sha256").write_text(cache.digest(planted))  # even with a matching sum
    os.chmod(xdg, 0o777)
    got = cache.cached_arrays("t-v1", derive)
    assert len(calls) == 2 and got["x"].tolist() == [0, 1, 2, 3, 4]


def test_the_digits_split_no_longer_uses_the_shared_temp_folder(xdg, monkeypatch) -> None:
    import tempfile

    from malleparsl.workflows import digits

    digits.load_split.cache_clear()
    before = set(os.listdir(tempfile.gettempdir()))
    Xtr, ytr, Xte, yte = digits.load_split(0)
    assert len(Xtr) + len(Xte) == 1797 and (xdg / "digits-v2-seed0.npz").exists()
    assert not [
        n
        for n in set(os.listdir(tempfile.gettempdir())) - before
        if n.startswith("malleparsl-digits")
    ]
    digits.load_split.cache_clear()
