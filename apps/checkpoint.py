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
* **read on demand** (``read(..., mmap=True)``): the payload's tensors are mapped from the
  file, not read, and a caller reads what it keeps (:func:`read_rows`, :func:`owned`): an
  FSDP2 or ZeRO-1 rank restoring a plain file reads its shards and no more (read whole, every
  rank held the whole state at once). The checksum is still computed over the whole file
  first, in chunks.
* **fail-safe when the disk is full**: a write that fails with ``ENOSPC``/``EDQUOT`` removes its
  temporary file, keeps the previous checkpoint and raises :class:`CheckpointWriteError` (a
  system fault, not a user error).

Files are named ``ckpt-<step:010d>.pt``; the newest ``keep`` are kept, never the file just
written.

**Sharded checkpoints** (FSDP2): ``ckpt-<step:010d>.dcp`` is a directory written by every rank
with ``torch.distributed.checkpoint`` (each rank writes its own shards, so no rank gathers the
whole state). Each rank SHA-256s its own files, rank 0 writes ``meta.pt`` (the unsharded part of
the payload) and ``manifest.json`` (every file's size and digest), and publishes the directory
by ``os.replace`` of a temporary one. A read checks every file against the manifest before
loading anything (torch's reader loads a flipped byte silently). The sharded entries come back
as :class:`ShardedState`: an FSDP2 object loads its shard from it in place, any other reads the
plain state whole (:meth:`ShardedState.plain`, one process, no collectives). Both kinds are
listed, pruned and resumed from side by side. :func:`state_layout` describes what a checkpoint holds (keys, shapes, dtypes and
classes) so a resumed job can refuse a checkpoint of another model or optimizer.
"""

from __future__ import annotations

import contextlib
import copy
import errno
import hashlib
import io
import json
import logging
import os
import re
import shutil
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from malleparsl.errors import CheckpointError, CheckpointWriteError, SpecError

log = logging.getLogger(__name__)

MAGIC = b"MALLEPARSL-CKPT-1\n"
_NAME = re.compile(r"^ckpt-(\d{10})\.(pt|dcp)$")
MANIFEST = "manifest.json"
META = "meta.pt"
_DCP_FORMAT = "malleparsl-dcp-1"
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


def _disk_full_error(exc: BaseException) -> OSError | None:
    """The disk-full ``OSError`` behind ``exc``: in its cause/context chain, or among the
    per-rank failures a ``torch.distributed.checkpoint`` CheckpointException carries."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno in _DISK_FULL:
            return e
        failures = getattr(e, "failures", None)
        if isinstance(failures, dict):
            todo.extend(f[0] if isinstance(f, tuple) else f for f in failures.values())
        todo.extend((e.__cause__, e.__context__))
    return None


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


_SOURCE = "_malleparsl_source"  # on a mapped tensor: (path, inode, file offset of its data)


def _load_mapped(path: Path, f: Any, start: int) -> Any:
    """The payload of the open checkpoint ``f`` (at ``path``, from byte ``start``) with every
    tensor a copy-on-write mapping of the file (what ``torch.load(mmap=True)`` does for a bare
    torch file, past the header, which torch's own mmap path cannot skip), tagged with where
    its data lies in the file for :func:`read_rows`.

    Private torch API (checked against torch 2.13); where it is missing, or the file system
    cannot map the file, the payload is read whole, as without ``mmap``. A file of the other
    byte order is mapped (torch swaps the mapped copy) but not tagged: its bytes on disk are
    not the tensors'."""
    import sys

    import torch
    import torch.serialization as ser

    def whole_read(why: str) -> Any:
        log.warning("reading %s whole, not mapped: %s", path, why)
        return torch.load(_Payload(f, start), weights_only=True, map_location="cpu")

    load = getattr(ser, "_load", None)
    reader = getattr(ser, "_open_zipfile_reader", None)
    unpickler = getattr(ser, "_weights_only_unpickler", None)
    if load is None or reader is None or unpickler is None:  # pragma: no cover - other torch
        return whole_read(f"torch {torch.__version__} has no mapped load")
    ino = os.fstat(f.fileno()).st_ino
    try:
        whole = torch.UntypedStorage.from_file(os.fspath(path), False,
                                               os.fstat(f.fileno()).st_size)
    except (OSError, RuntimeError) as exc:  # a file system without mmap
        return whole_read(f"mapping failed ({exc})")
    if os.stat(path).st_ino != ino:  # replaced since it was hashed: not the bytes checked
        raise CheckpointError(f"{path}: replaced while it was read; read it again")
    with reader(_Payload(f, start)) as archive:
        order = (bytes(archive.get_record("byteorder")) if archive.has_record("byteorder")
                 else b"little")  # torch's default for files that do not say
        state = load(archive, "cpu", unpickler, overall_storage=whole[start:])
    if order.decode() == sys.byteorder:
        _tag(state, (os.fspath(path), ino, whole.data_ptr()))
    return state


def _bytes_are_values(t: Any) -> bool:
    """A plain dense tensor whose bytes in the file are its values: not sparse (no storage,
    no data pointer), nested (rows of their own lengths), quantized (scale and zero point),
    conjugate or negative views (a bit on the tensor, not in its bytes), nor a subclass such
    as ``nn.Parameter`` or one that requires grad (a read gives a plain tensor)."""
    import torch

    return (type(t) is torch.Tensor and t.layout == torch.strided and not t.is_nested
            and not t.is_quantized and not t.is_conj() and not t.is_neg()
            and not t.requires_grad)


def _tag(value: Any, source: tuple[str, int, int]) -> None:
    import torch

    if isinstance(value, torch.Tensor):
        if _bytes_are_values(value):  # others are copied whole (owned) or sliced (_shard_like)
            path, ino, base = source
            setattr(value, _SOURCE, (path, ino, value.data_ptr() - base))
    elif isinstance(value, dict):
        for v in value.values():
            _tag(v, source)
    elif isinstance(value, (list, tuple)):
        for v in value:
            _tag(v, source)


def read_rows(tensor: Any, start: int, stop: int) -> Any:
    """Rows ``[start, stop)`` of a tensor of a mapped checkpoint (``read(..., mmap=True)``),
    read from its file into memory of their own; ``None`` for any other tensor (or one not
    contiguous, or 0-d, or whose bytes are not its values: sparse, nested, quantized, a
    conjugate view, a ``Parameter``). Rows beyond the tensor are a ``ValueError``, not other bytes.

    A read, not a touch of the mapping: a page cache's large folios map whole megabytes per
    fault, so touching half of each tensor maps most of the file (measured on ext4, Linux
    6.18: 36.6 MB resident for half of a 33.5 MB file); this reads the rows' bytes only."""
    import torch

    source = getattr(tensor, _SOURCE, None)
    if source is None or tensor.dim() == 0 or not tensor.is_contiguous():
        return None
    if not 0 <= start <= stop <= len(tensor):  # past its end the file holds other bytes
        raise ValueError(f"rows [{start}, {stop}) of a tensor of {len(tensor)} rows")
    path, ino, offset = source
    row = tensor[0].numel() * tensor.element_size() if len(tensor) else 0
    out = torch.empty((stop - start, *tensor.shape[1:]), dtype=tensor.dtype)
    if not out.numel():  # nothing to read (an empty tensor's data pointer is no offset)
        return out
    buf = out.reshape(-1).view(torch.uint8).numpy()
    try:
        with open(path, "rb") as f:
            if os.fstat(f.fileno()).st_ino != ino:
                raise CheckpointError(f"{path}: replaced while its state was being restored")
            f.seek(offset + start * row)
            got = f.readinto(buf)
    except OSError as exc:
        raise CheckpointError(f"{path}: reading a tensor's rows failed: {exc}") from exc
    if got != buf.nbytes:
        raise CheckpointError(f"{path}: {got} bytes where {buf.nbytes} were expected; "
                              "the file is truncated")
    return out


def owned(value: Any) -> Any:
    """``value`` (a state from ``read(..., mmap=True)``) with every tensor in memory of its
    own: read from the file (not touched in the mapping, see :func:`read_rows`)."""
    import torch

    if isinstance(value, torch.Tensor):
        tagged = getattr(value, _SOURCE, None) is not None and value.dim()
        part = read_rows(value, 0, len(value)) if tagged else None
        if part is not None:
            return part
        if type(value) is not torch.Tensor:  # a Parameter stays one, as torch.load made it
            return copy.deepcopy(value)
        # sparse, quantized and conjugate tensors keep what they are; a leaf stays a leaf
        return value.detach().clone().requires_grad_(value.requires_grad)
    if isinstance(value, dict):
        return {k: owned(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(owned(v) for v in value)
    return value


def _sha256_file(path: Path) -> str:
    sha = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            sha.update(chunk)
    return sha.hexdigest()


def _remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def plain_optimizer_state(state: dict[str, Any]) -> dict[str, Any]:
    """An optimizer state dict keyed by parameter names (``get_optimizer_state_dict``'s) in the
    plain optimizer's format: parameters numbered in the order of their groups."""
    names = [n for g in state["param_groups"] for n in g["params"]]
    index = {n: i for i, n in enumerate(names)}
    return {"state": {index[n]: v for n, v in state["state"].items()},
            "param_groups": [{**g, "params": [index[n] for n in g["params"]]}
                             for g in state["param_groups"]]}


@dataclass(frozen=True)
class ShardedState:
    """One registered object's state in a verified sharded checkpoint, read on demand."""

    path: Path
    key: str
    kind: str  # "module" or "optimizer" (saved keyed by parameter names)

    def load_into(self, state_dict: dict[str, Any]) -> None:
        """Fill ``state_dict`` (DTensor shards or tensors) in place; a collective when
        ``torch.distributed`` is initialised (every rank of the group calls it)."""
        import torch.distributed as dist
        import torch.distributed.checkpoint as dcp

        dcp.load({self.key: state_dict}, checkpoint_id=self.path,
                 no_dist=not (dist.is_available() and dist.is_initialized()))

    def plain(self) -> dict[str, Any]:
        """The whole state in the plain format, read by this process alone."""
        from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner
        from torch.distributed.checkpoint.filesystem import FileSystemReader
        from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

        sd: dict[str, Any] = {}  # filled from the metadata (what _load_state_dict_from_keys
        try:                     # does, without its collectives when a group exists)
            _load_state_dict(sd, storage_reader=FileSystemReader(self.path), no_dist=True,
                             planner=_EmptyStateDictLoadPlanner(keys={self.key}))
        except Exception as exc:
            raise CheckpointError(f"{self.path}: reading {self.key!r} failed: {exc}") from exc
        state = sd[self.key]
        return plain_optimizer_state(state) if self.kind == "optimizer" else state


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

    def sharded_path_for(self, step: int) -> Path:
        return self.directory / f"ckpt-{int(step):010d}.dcp"

    def list(self) -> list[CheckpointInfo]:
        """Checkpoints on disk, oldest first (temporary files are ignored)."""
        if not self.directory.is_dir():
            return []
        out = []
        for p in self.directory.iterdir():
            m = _NAME.match(p.name)
            if m:
                try:  # a plain file and a directory of one step: the newer counts as newer
                    mtime = p.stat().st_mtime_ns
                except FileNotFoundError:  # pruned meanwhile by another writer
                    continue
                out.append((int(m.group(1)), mtime, CheckpointInfo(path=p, step=int(m.group(1)))))
        return [c for _, _, c in sorted(out, key=lambda t: t[:2])]

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
                _remove(info.path)
        older = [c for c in infos if mine is not None and c.step < mine]
        for info in older[: max(0, len(older) - (self.keep - 1))]:
            _remove(info.path)  # another writer may have pruned it first
        for info in infos:  # a plain and a sharded checkpoint of one step: keep the new one
            if mine is not None and info.step == mine and info.path != written:
                _remove(info.path)

    def save_sharded(self, meta: dict[str, Any] | None, sharded: dict[str, Any],
                     kinds: dict[str, str], *, step: int, rank: int,
                     world_size: int) -> Path | None:
        """Collective: write ``sharded`` (state dicts of DTensor shards) with every rank's own
        files, and ``meta`` (rank 0's, the rest of the payload) beside them; returns the
        directory on rank 0 once published, ``None`` elsewhere."""
        import torch
        import torch.distributed as dist
        import torch.distributed.checkpoint as dcp

        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise SpecError(f"step must be an integer >= 0, got {step!r}")
        final = self.sharded_path_for(step)
        tmp = self.directory / f".tmp-ckpt-{int(step):010d}.dcp"
        try:
            if rank == 0:
                self.directory.mkdir(parents=True, exist_ok=True)
                _remove(tmp)
                tmp.mkdir()
            dist.barrier()
            dcp.save(sharded, checkpoint_id=tmp)
            mine = {p.name: (_sha256_file(p), p.stat().st_size)
                    for p in tmp.iterdir() if p.name.startswith(f"__{rank}_")}
            every: list[Any] = [None] * world_size
            dist.all_gather_object(every, mine)
            failed: BaseException | None = None
            if rank == 0:  # publish; the other ranks learn the outcome, not a timeout
                try:
                    with open(tmp / META, "wb") as f:
                        torch.save(meta, f)
                        f.flush()
                        os.fsync(f.fileno())
                    files = {k: v for d in every for k, v in d.items()}
                    for p in tmp.iterdir():  # rank 0's share: DCP's metadata and meta.pt
                        if not re.match(r"^__\d+_", p.name):
                            files[p.name] = (_sha256_file(p), p.stat().st_size)
                    manifest = {"format": _DCP_FORMAT, "step": step, "world_size": world_size,
                                "sharded": kinds,
                                "files": {k: {"sha256": h, "bytes": b} for k, (h, b) in files.items()}}
                    with open(tmp / MANIFEST, "w") as f:
                        json.dump(manifest, f, indent=1, sort_keys=True)
                        f.flush()
                        os.fsync(f.fileno())
                    _fsync_dir(tmp)
                    _remove(final)  # a stale one of this step (a failed run's) is replaced
                    os.replace(tmp, final)
                    _fsync_dir(self.directory)
                except BaseException as exc:
                    failed = exc
            status: list[Any] = [None if failed is None else
                                 (f"{type(failed).__name__}: {failed}",
                                  _disk_full_error(failed) is not None)]
            dist.broadcast_object_list(status, src=0)
            if failed is not None:
                raise failed
            if status[0] is not None:
                text, full_disk = status[0]
                cls = CheckpointWriteError if full_disk else CheckpointError
                raise cls(f"rank 0 failed to publish the sharded checkpoint of step {step} "
                          f"to {self.directory}: {text}")
        except BaseException as exc:
            if rank == 0:
                _remove(tmp)
            full = _disk_full_error(exc)
            if full is not None:  # as the plain path: name it, keep the previous checkpoint
                prev = [c.step for c in self.list() if c.path != final]
                kept = f"step {prev[-1]}" if prev else "none: there was no earlier one"
                raise CheckpointWriteError(
                    f"disk full while writing the sharded checkpoint of step {step} to "
                    f"{self.directory} ({full.strerror}); the previous checkpoint is kept "
                    f"({kept}); free space there or give the job another ckpt_dir"
                ) from exc
            raise
        if rank != 0:  # the broadcast above: no rank returns before the directory is published
            return None
        log.debug("sharded checkpoint step %d written to %s", step, final)
        self._prune(written=final)
        return final

    def _verify_sharded(self, path: Path) -> dict[str, Any]:
        """The manifest of a sharded checkpoint once every file it lists matches it."""
        try:
            manifest = json.loads((path / MANIFEST).read_text())
        except (OSError, ValueError) as exc:
            raise CheckpointError(f"{path / MANIFEST}: unreadable manifest ({exc})") from exc
        if not isinstance(manifest, dict) or manifest.get("format") != _DCP_FORMAT:
            raise CheckpointError(f"{path / MANIFEST}: not a malleparsl sharded checkpoint")
        try:  # it has no checksum of its own: a flipped byte in a name must not be a KeyError
            files = {str(n): (str(r["sha256"]), int(r["bytes"]))
                     for n, r in manifest["files"].items()}
            kinds = manifest["sharded"]
            bad = {k: v for k, v in kinds.items() if v not in ("module", "optimizer")}
        except (KeyError, TypeError, AttributeError, ValueError) as exc:
            raise CheckpointError(f"{path / MANIFEST}: malformed manifest ({exc!r})") from exc
        if bad or META not in files:
            raise CheckpointError(f"{path / MANIFEST}: malformed manifest (kinds {bad}, "
                                  f"{META} listed: {META in files})")
        for name, (digest, nbytes) in sorted(files.items()):
            f = path / name
            if not f.is_file():
                raise CheckpointError(f"{f}: missing from the sharded checkpoint")
            size = f.stat().st_size
            if size != nbytes:
                raise CheckpointError(f"{f}: {size} bytes, the manifest says {nbytes}; "
                                      "the file is truncated or corrupt")
            actual = _sha256_file(f)
            if actual != digest:
                raise CheckpointError(
                    f"{f}: checksum mismatch (stored {digest[:12]}..., computed "
                    f"{actual[:12]}...); the file is corrupt"
                )
        return manifest

    def _read_sharded(self, path: Path) -> dict[str, Any]:
        import torch

        manifest = self._verify_sharded(path)
        try:
            with open(path / META, "rb") as f:
                meta = torch.load(f, weights_only=True, map_location="cpu")
        except Exception as exc:
            raise CheckpointError(f"{path / META}: checksum ok but torch.load failed: {exc}") from exc
        if not isinstance(meta, dict):
            raise CheckpointError(f"{path / META}: expected a dict, found {type(meta).__name__}")
        state = dict(meta.get("state", {}))
        for key, kind in manifest["sharded"].items():
            state[key] = ShardedState(path=path, key=key, kind=kind)
        return {**meta, "state": state}

    def read(self, path: str | os.PathLike[str], *, mmap: bool = False) -> dict[str, Any]:
        """Read and verify one checkpoint file; raises :class:`CheckpointError` if damaged.

        A sharded checkpoint (a directory) is verified whole; its sharded entries are returned
        as :class:`ShardedState`, loaded by the caller.

        The checksum is computed over the file in chunks and the payload is then loaded from
        the file itself, so reading holds the loaded state and no copy of its bytes. With
        ``mmap`` a plain file's tensors are mapped from it (see :func:`_load_mapped`), and
        nothing is read until used: :func:`read_rows` reads a part of one (an FSDP2 rank's
        shard), :func:`owned` a whole state. Keep no mapped tensor beyond the restore, or the
        mapping holds the file's disk space after it is pruned.
        """
        import torch

        path = Path(path)
        if path.is_dir():
            return self._read_sharded(path)
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
                if mmap:
                    state = _load_mapped(path, f, header_len)
                else:
                    state = torch.load(_Payload(f, header_len), weights_only=True,
                                       map_location="cpu")
            except CheckpointError:
                raise
            except Exception as exc:  # checksum matched but content is not loadable
                raise CheckpointError(f"{path}: checksum ok but torch.load failed: {exc}") from exc
        if not isinstance(state, dict):
            raise CheckpointError(f"{path}: expected a dict, found {type(state).__name__}")
        return state

    def load_latest(self, *, mmap: bool = False) -> tuple[int, dict[str, Any]] | None:
        """The newest checkpoint that verifies, as ``(step, state)``; ``None`` if there is none.
        ``mmap``: a plain file's tensors are mapped, not read (see :meth:`read`).

        Damaged files are skipped with a :class:`CorruptCheckpointWarning` (and a log line).
        If checkpoints exist but none verifies, :class:`CheckpointError` is raised: silently
        restarting from step 0 would discard the job's progress.
        """
        infos = self.list()
        problems = []
        for info in reversed(infos):
            try:
                return info.step, self.read(info.path, mmap=mmap)
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
