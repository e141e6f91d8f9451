"""Atomic, checksummed training checkpoints in one directory per job.

A malleable job is stopped and relaunched many times, and a node may die mid-write, so a
checkpoint must never be half-visible and a damaged one must never be loaded silently:

* **atomic**: the bytes go to a temporary file in the same directory, are ``fsync``-ed, then
  ``os.replace``-d onto their final name (and the directory is ``fsync``-ed), so a reader sees
  the whole file or none of it;
* **checksummed**: every file starts with a magic line and the SHA-256 of the payload; a file
  whose checksum does not match (bit rot, truncation, a copy gone wrong) is skipped with a
  warning and the previous checkpoint is used;
* **safe to load**: the payload is read with ``torch.load(weights_only=True)``, so a checkpoint
  directory cannot run code; keep checkpoint contents to tensors, numbers, strings, lists and
  dicts (model and optimizer ``state_dict()``s qualify).

Files are named ``ckpt-<step:010d>.pt``; the newest ``keep`` are kept.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import logging
import os
import re
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from malleparsl.errors import CheckpointError, SpecError

log = logging.getLogger(__name__)

MAGIC = b"MALLEPARSL-CKPT-1\n"
_NAME = re.compile(r"^ckpt-(\d{10})\.pt$")
_DIGEST_LEN = 64  # hex SHA-256


class CorruptCheckpointWarning(UserWarning):
    """A checkpoint failed its checksum or could not be decoded; an older one is used."""


@dataclass(frozen=True)
class CheckpointInfo:
    """A checkpoint file on disk and the training step it was taken after."""

    path: Path
    step: int


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms without directory fds
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover
        pass
    finally:
        os.close(fd)


class CheckpointStore:
    """Write and read a job's checkpoints in ``directory``.

    Parameters
    ----------
    directory
        Shared by all ranks and all segments of one job (a parallel file system at a site).
    keep
        How many of the newest checkpoints to keep; older ones are deleted after each save. Keep
        at least 2, so a damaged newest file has a fallback.

    >>> import tempfile, torch
    >>> store = CheckpointStore(directory=tempfile.mkdtemp(), keep=2)
    >>> _ = store.save({"w": torch.ones(2)}, step=5)
    >>> step, state = store.load_latest()
    >>> step, state["w"].tolist()
    (5, [1.0, 1.0])
    """

    def __init__(self, *, directory: str | os.PathLike[str], keep: int = 3) -> None:
        if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
            raise SpecError(f"keep must be an integer >= 1, got {keep!r}; use keep=3")
        self.directory = Path(directory)
        self.keep = keep

    def path_for(self, step: int) -> Path:
        return self.directory / f"ckpt-{int(step):010d}.pt"

    def list(self) -> list[CheckpointInfo]:
        """Checkpoints on disk, oldest first (temporary files are ignored)."""
        if not self.directory.is_dir():
            return []
        out = []
        for p in self.directory.iterdir():
            m = _NAME.match(p.name)
            if m:
                out.append(CheckpointInfo(path=p, step=int(m.group(1))))
        return sorted(out, key=lambda c: c.step)

    def save(self, state: dict[str, Any], *, step: int) -> Path:
        """Write ``state`` as the checkpoint after ``step``; returns its path once durable."""
        import torch

        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise SpecError(f"step must be an integer >= 0, got {step!r}")
        buf = io.BytesIO()
        torch.save(state, buf)
        payload = buf.getvalue()
        digest = hashlib.sha256(payload).hexdigest().encode("ascii")
        self.directory.mkdir(parents=True, exist_ok=True)
        final = self.path_for(step)
        fd, tmp = tempfile.mkstemp(prefix=".tmp-ckpt-", dir=self.directory)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(MAGIC)
                f.write(digest + b"\n")
                f.write(payload)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, final)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise
        _fsync_dir(self.directory)
        log.debug("checkpoint step %d written to %s (%d bytes)", step, final, len(payload))
        self._prune()
        return final

    def _prune(self) -> None:
        for info in self.list()[: -self.keep]:
            info.path.unlink(missing_ok=True)  # another writer may have pruned it first

    def read(self, path: str | os.PathLike[str]) -> dict[str, Any]:
        """Read and verify one checkpoint file; raises :class:`CheckpointError` if damaged."""
        import torch

        path = Path(path)
        data = path.read_bytes()
        header_len = len(MAGIC) + _DIGEST_LEN + 1
        if len(data) < header_len or not data.startswith(MAGIC):
            raise CheckpointError(
                f"{path}: not a malleparsl checkpoint (bad header, {len(data)} bytes)"
            )
        digest = data[len(MAGIC) : len(MAGIC) + _DIGEST_LEN].decode("ascii", "replace")
        payload = data[header_len:]
        actual = hashlib.sha256(payload).hexdigest()
        if actual != digest:
            raise CheckpointError(
                f"{path}: checksum mismatch (stored {digest[:12]}..., computed "
                f"{actual[:12]}...); the file is truncated or corrupt"
            )
        try:
            state = torch.load(io.BytesIO(payload), weights_only=True, map_location="cpu")
        except Exception as exc:  # checksum matched but content is not loadable
            raise CheckpointError(f"{path}: checksum ok but torch.load failed: {exc}") from exc
        if not isinstance(state, dict):
            raise CheckpointError(f"{path}: expected a dict, found {type(state).__name__}")
        return state

    def load_latest(self) -> tuple[int, dict[str, Any]] | None:
        """The newest checkpoint that verifies, as ``(step, state)``; ``None`` if there is none.

        Damaged files are skipped with a :class:`CorruptCheckpointWarning` (and a log line).
        If checkpoints exist but none verifies, :class:`CheckpointError` is raised: silently
        restarting from step 0 would discard the job's progress.
        """
        infos = self.list()
        problems = []
        for info in reversed(infos):
            try:
                return info.step, self.read(info.path)
            except (CheckpointError, OSError) as exc:
                problems.append(str(exc))
                msg = f"skipping damaged checkpoint {info.path.name}: {exc}"
                log.warning(msg)
                warnings.warn(msg, CorruptCheckpointWarning, stacklevel=2)
        if infos:
            raise CheckpointError(
                f"none of the {len(infos)} checkpoints in {self.directory} is usable: "
                + "; ".join(problems)
                + ". Remove the directory to restart the job from scratch."
            )
        return None
