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

* **streamed**: ``torch.save`` writes into the temporary file through the hash (the digest is
  filled into the header last) and a read hashes the file in chunks, then loads the payload
  from the file; neither holds a serialised copy of the state (the save used to add one copy
  of it to rank 0's peak, a read three), and the file format is unchanged.
* **fail-safe when the disk is full**: a write that fails with ``ENOSPC``/``EDQUOT`` removes its
  temporary file, keeps the previous checkpoint and raises :class:`CheckpointWriteError` (a
  system fault, not a user error).

Files are named ``ckpt-<step:010d>.pt``; the newest ``keep`` are kept, never the file just
written. :func:`state_layout` describes what a checkpoint holds (keys, shapes, dtypes and
classes) so a resumed job can refuse a checkpoint of another model or optimizer.
"""

from __future__ import annotations

import contextlib
import errno
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

from malleparsl.errors import CheckpointError, CheckpointWriteError, SpecError

log = logging.getLogger(__name__)

MAGIC = b"MALLEPARSL-CKPT-1\n"
_NAME = re.compile(r"^ckpt-(\d{10})\.pt$")
_DIGEST_LEN = 64  # hex SHA-256
_DISK_FULL = {errno.ENOSPC, errno.EDQUOT}
_CHUNK = 1 << 20  # bytes hashed per read


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


class _HashingWriter:
    """A write-only stream that hashes and counts what ``torch.save`` streams through it."""

    def __init__(self, f: Any) -> None:
        self._f = f
        self.sha256 = hashlib.sha256()
        self.size = 0
        self.error: OSError | None = None  # torch.save may re-raise it as a RuntimeError

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        self.sha256.update(view)
        try:
            self._f.write(view)
        except OSError as exc:
            self.error = exc
            raise
        self.size += view.nbytes
        return view.nbytes

    def flush(self) -> None:
        self._f.flush()


class _Payload(io.RawIOBase):
    """The payload of an open checkpoint file as a file of its own (positions from its start),
    for ``torch.load`` to read in place."""

    def __init__(self, f: Any, start: int) -> None:
        super().__init__()
        self._f = f
        self._start = start
        f.seek(start)

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        return self._f.readinto(b)

    def seek(self, pos: int, whence: int = io.SEEK_SET) -> int:
        if whence == io.SEEK_SET:
            pos += self._start
        return self._f.seek(pos, whence) - self._start

    def tell(self) -> int:
        return self._f.tell() - self._start


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
        """Write ``state`` as the checkpoint after ``step``; returns its path once durable.

        The payload is streamed to the temporary file through a SHA-256 (the header's digest
        is filled in last), so saving holds no serialised copy of the state in memory.
        """
        import torch

        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise SpecError(f"step must be an integer >= 0, got {step!r}")
        self.directory.mkdir(parents=True, exist_ok=True)
        final = self.path_for(step)
        tmp = None
        out = None
        try:
            fd, tmp = tempfile.mkstemp(prefix=".tmp-ckpt-", dir=self.directory)
            with os.fdopen(fd, "wb") as f:
                f.write(MAGIC)
                f.write(b"0" * _DIGEST_LEN + b"\n")  # placeholder: the digest is known last
                out = _HashingWriter(f)
                torch.save(state, out)
                f.seek(len(MAGIC))
                f.write(out.sha256.hexdigest().encode("ascii"))
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, final)
        except BaseException as exc:
            if tmp is not None:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)
            if not isinstance(exc, OSError) and out is not None and out.error is not None:
                exc = out.error  # a failed write inside torch.save, re-raised by torch
            if isinstance(exc, OSError) and exc.errno in _DISK_FULL:
                prev = [c.step for c in self.list() if c.path != final]
                kept = f"step {prev[-1]}" if prev else "none: there was no earlier one"
                written = out.size if out is not None else 0
                raise CheckpointWriteError(
                    f"disk full while writing the checkpoint of step {step} to "
                    f"{self.directory} ({exc.strerror}, after {written} bytes); the previous "
                    f"checkpoint is kept ({kept}); free space there or give the job another "
                    "ckpt_dir"
                ) from exc
            raise
        _fsync_dir(self.directory)
        log.debug("checkpoint step %d written to %s (%d bytes)", step, final, out.size)
        self._prune(written=final)
        return final

    def _prune(self, *, written: Path) -> None:
        """Keep ``written`` (the file just saved) and the ``keep - 1`` checkpoints before it.

        A file of a *higher* step cannot belong to this run's past (steps only grow): it is a
        stale or damaged leftover, and is removed so that it can never be resumed from.
        """
        infos = self.list()
        mine = next((c.step for c in infos if c.path == written), None)
        for info in infos:
            if mine is not None and info.step > mine:
                log.warning("removing %s: a higher step than the checkpoint just written", info.path)
                info.path.unlink(missing_ok=True)
        older = [c for c in infos if mine is not None and c.step < mine]
        for info in older[: max(0, len(older) - (self.keep - 1))]:
            info.path.unlink(missing_ok=True)  # another writer may have pruned it first

    def read(self, path: str | os.PathLike[str]) -> dict[str, Any]:
        """Read and verify one checkpoint file; raises :class:`CheckpointError` if damaged.

        The checksum is computed over the file in chunks and the payload is then loaded from
        the file itself, so reading holds the loaded state and no copy of its bytes.
        """
        import torch

        path = Path(path)
        header_len = len(MAGIC) + _DIGEST_LEN + 1
        with open(path, "rb") as f:
            head = f.read(header_len)
            if len(head) < header_len or not head.startswith(MAGIC):
                size = os.fstat(f.fileno()).st_size
                raise CheckpointError(
                    f"{path}: not a malleparsl checkpoint (bad header, {size} bytes)"
                )
            digest = head[len(MAGIC) : len(MAGIC) + _DIGEST_LEN].decode("ascii", "replace")
            sha = hashlib.sha256()
            while chunk := f.read(_CHUNK):
                sha.update(chunk)
            actual = sha.hexdigest()
            if actual != digest:
                raise CheckpointError(
                    f"{path}: checksum mismatch (stored {digest[:12]}..., computed "
                    f"{actual[:12]}...); the file is truncated or corrupt"
                )
            try:
                state = torch.load(_Payload(f, header_len), weights_only=True,
                                   map_location="cpu")
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


def _holds_tensor(value: Any) -> bool:
    import torch

    if isinstance(value, torch.Tensor):
        return True
    if isinstance(value, dict):
        return any(_holds_tensor(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return any(_holds_tensor(v) for v in value)
    return False


def _leaf_layout(prefix: str, value: Any, out: list[str]) -> None:
    import torch

    if isinstance(value, torch.Tensor):
        out.append(f"{prefix}:{tuple(value.shape)}:{value.dtype}")
    elif isinstance(value, dict):
        for k in sorted(value, key=str):
            _leaf_layout(f"{prefix}.{k}" if prefix else str(k), value[k], out)
    elif isinstance(value, (list, tuple)):
        if not any(_holds_tensor(v) for v in value):
            out.append(f"{prefix}:{type(value).__name__}")  # plain data (a history): any length
            return
        for i, v in enumerate(value):
            _leaf_layout(f"{prefix}[{i}]", v, out)
    else:
        out.append(f"{prefix}:{type(value).__name__}")


def state_layout(obj: Any) -> list[str]:
    """What ``obj``'s checkpointed state looks like: its class, then keys, shapes and dtypes.

    For an optimizer (anything with ``param_groups``) the layout is the shapes and dtypes of
    the parameters of each group, since its per-parameter state appears only after a step.
    Lists of plain data (a history) count as one entry whatever their length; an object with a
    ``checkpoint_layout()`` method gives its own (a trial array, whose tensors shrink as trials
    leave).
    Values are not part of it: a layout says whether a checkpoint *fits*, not what it holds.

    >>> import torch
    >>> state_layout(torch.nn.Linear(2, 1))
    ['class:Linear', 'bias:(1,):torch.float32', 'weight:(1, 2):torch.float32']
    """
    own = getattr(obj, "checkpoint_layout", None)
    if callable(own):  # an object whose state changes shape legitimately says what must fit
        return list(own())
    out = [f"class:{type(obj).__qualname__}"]
    groups = getattr(obj, "param_groups", None)
    if isinstance(groups, list):
        for g, group in enumerate(groups):
            for i, p in enumerate(group.get("params", [])):
                out.append(f"group{g}[{i}]:{tuple(p.shape)}:{p.dtype}")
        return out
    _leaf_layout("", obj.state_dict(), out)
    return out


def layout_difference(name: str, stored: list[str], current: list[str]) -> str | None:
    """``None`` when the layouts match; else a short description of the first difference."""
    if stored == current:
        return None
    for i, (a, b) in enumerate(zip(stored, current)):
        if a != b:
            return f"{name}: entry {i} is {a!r} in the checkpoint but {b!r} here"
    longer, n = ("checkpoint", len(stored)) if len(stored) > len(current) else ("job", len(current))
    extra = (stored if len(stored) > len(current) else current)[min(len(stored), len(current))]
    return (
        f"{name}: the checkpoint has {len(stored)} entries, this job {len(current)} (the "
        f"{longer}'s {n} include {extra!r})"
    )
