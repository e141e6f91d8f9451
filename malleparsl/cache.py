"""A private, checksummed cache for data that is slow to derive (the demo's digits split).

A cache in the shared temporary folder at a predictable name is anyone's to plant or damage:
a corrupt file crashed every run and a planted one became training data. This cache instead

* lives in the user's own cache folder: ``$MALLEPARSL_CACHE``, else
  ``$XDG_CACHE_HOME/malleparsl``, else ``~/.cache/malleparsl`` (the XDG rule platformdirs
  follows on Linux), created with mode ``0700``;
* is used only while that folder and the file are owned by this user and not writable by
  group or others (otherwise nothing in it is read: the data is derived afresh);
* stores beside each ``.npz`` the SHA-256 of its arrays (names, dtypes, shapes and bytes) and
  re-derives, with a warning, any entry whose content does not match (truncated, bit rot,
  replaced);
* writes atomically (a temporary file, then ``os.replace``) so readers see all or nothing.
"""

from __future__ import annotations

import hashlib
import logging
import os
import stat
import tempfile
import zipfile
from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np

log = logging.getLogger(__name__)

Arrays = dict[str, np.ndarray]


def cache_dir() -> Path:
    """The user's malleparsl cache folder (not created here)."""
    if os.environ.get("MALLEPARSL_CACHE"):
        return Path(os.environ["MALLEPARSL_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "malleparsl"


def _private(path: Path) -> bool:
    """Owned by us and not writable by group or others (so nobody else can plant a file)."""
    try:
        st = path.lstat()
    except OSError:
        return False
    if stat.S_ISLNK(st.st_mode) or st.st_uid != os.getuid():
        return False
    return not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)


def _prepare(folder: Path) -> bool:
    """Create ``folder`` (0700) if needed; True if it is private and so usable."""
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as exc:
        log.warning(
            "cache folder %s cannot be created (%s); deriving data without a cache", folder, exc
        )
        return False
    if not _private(folder):
        log.warning(
            "cache folder %s is not private to this user (owner or permissions); "
            "its files are not trusted and the data is derived afresh",
            folder,
        )
        return False
    return True


def digest(arrays: Mapping[str, np.ndarray]) -> str:
    """SHA-256 over the arrays' names, dtypes, shapes and bytes, in name order."""
    h = hashlib.sha256()
    for name in sorted(arrays):
        a = np.ascontiguousarray(arrays[name])
        h.update(f"{name}|{a.dtype.str}|{a.shape}|".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def _read(path: Path, sums: Path) -> Arrays | None:
    if not (path.exists() and _private(path) and _private(sums)):
        return None
    try:
        with np.load(path, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
        expected = sums.read_text().strip()
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as exc:
        log.warning("cache entry %s is unreadable (%s); deriving it again", path, exc)
        return None
    if digest(arrays) != expected:
        log.warning("cache entry %s fails its checksum; deriving it again", path)
        return None
    return arrays


def _write(folder: Path, path: Path, sums: Path, arrays: Arrays) -> None:
    try:
        for target, write in (
            (path, lambda f: np.savez(f, **arrays)),
            (sums, lambda f: f.write(digest(arrays).encode())),
        ):
            fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=folder)
            try:
                with os.fdopen(fd, "wb") as f:
                    write(f)
                os.replace(tmp, target)
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise
    except OSError as exc:  # a full or read-only cache is no reason to fail the run
        log.warning("cannot write cache entry %s (%s)", path, exc)


def cached_arrays(name: str, derive: Callable[[], Arrays]) -> Arrays:
    """The arrays cached under ``name``, or ``derive()``'s (then cached) when there is no
    trustworthy entry. ``name`` should carry a version, e.g. ``"digits-v2-seed0"``.

    >>> import numpy as np
    >>> cached_arrays("doc-example-v1", lambda: {"x": np.arange(3)})["x"].tolist()
    [0, 1, 2]
    """
    if not name or "/" in name or name.startswith("."):
        raise ValueError(f"cache entry name {name!r} must be a plain file name")
    folder = cache_dir()
    usable = _prepare(folder)
    path, sums = folder / f"{name}.npz", folder / f"{name}.sha256"
    if usable:
        found = _read(path, sums)
        if found is not None:
            return found
    arrays = {k: np.asarray(v) for k, v in derive().items()}
    if usable:
        _write(folder, path, sums, arrays)
    return arrays
