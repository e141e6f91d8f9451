"""A small, real malleable entry for the executor's own tests and the rescale benchmark.

The executor layer cannot import the apps layer (imports point down), yet its driver must be
exercised with real ranks. :func:`synthetic_entry` is such a rank: it joins a real gloo process
group on the segment's store prefix, takes "steps" that are an ``allreduce`` plus a sleep
(``step_s / world_size``: a fixed global batch split over the ranks), honours the stop key at
every step boundary (rank 0 reads it and broadcasts the decision), checkpoints its tiny state
atomically (write, fsync, rename) and resumes from it. Its result lets a test check that no
step was lost or counted twice: ``total`` equals ``steps`` exactly when every restart resumed
from a consistent checkpoint.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import time
from typing import Any

from malleparsl.errors import CheckpointError, CheckpointWriteError
from malleparsl.executors.protocol import (
    GroupBrokenError,
    RankInfo,
    SegmentOutcome,
    apply_rank_env,
)

STATE_FILE = "synthetic_state.json"


class SyntheticFailure(RuntimeError):
    """Raised on purpose by :func:`synthetic_entry` when asked to (``fail_at_step``)."""


def _load(ckpt_dir: str) -> dict[str, Any]:
    """The newest readable state: the last checkpoint, else the one before it (kept as
    ``.prev`` by :func:`_save`), else a fresh start when neither exists.

    A corrupt or truncated file with no readable predecessor raises ``CheckpointError``
    naming it: resuming from scratch would silently count steps twice.
    """
    path = os.path.join(ckpt_dir, STATE_FILE)
    bad: list[str] = []
    for p in (path, path + ".prev"):
        if not os.path.exists(p):
            continue
        try:
            with open(p) as fh:
                state = json.load(fh)
            if not isinstance(state, dict) or not {"step", "total", "sizes"} <= state.keys():
                raise ValueError("missing step/total/sizes")
            return state
        except (OSError, ValueError) as exc:
            bad.append(f"{p}: {exc}")
    if bad:
        raise CheckpointError(f"no readable checkpoint in {ckpt_dir}: " + "; ".join(bad))
    return {"step": 0, "total": 0.0, "sizes": []}


def _save(ckpt_dir: str, state: dict[str, Any]) -> None:
    """Write atomically (temporary file, fsync, rename): a failed write keeps the old state."""
    path = os.path.join(ckpt_dir, STATE_FILE)
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        with open(tmp, "w") as fh:
            json.dump(state, fh)
            fh.flush()
            os.fsync(fh.fileno())
        if os.path.exists(path):
            os.replace(path, path + ".prev")  # keep one predecessor for a corrupt newest file
        os.replace(tmp, path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise CheckpointWriteError(
            f"could not write checkpoint {path} ({exc.strerror or exc}); the previous "
            "checkpoint, if any, is kept"
        ) from exc


def _wait(work: Any, what: str, info: RankInfo) -> None:
    """Wait for a collective; a peer that died, hung or left raises ``GroupBrokenError``."""
    try:
        work.wait()
    except RuntimeError as exc:
        raise GroupBrokenError(
            f"{what} failed on rank {info.rank}/{info.world_size} of job {info.job_id!r} "
            f"segment {info.segment}: {exc}"
        ) from exc


def synthetic_entry(
    info: RankInfo,
    *,
    steps: int = 100,
    step_s: float = 0.02,
    ckpt_every: int = 10,
    fail_at_step: int | None = None,
    fail_rank: int = -1,
    progress_every_s: float = 0.5,
    finish_key: str | None = None,
    timeout_s: float = 30.0,
    fail_error: BaseException | None = None,
) -> SegmentOutcome:
    """Run one segment of a synthetic training job; see the module docstring.

    ``fail_at_step``: the rank ``fail_rank`` (``-1``: the last one) raises
    :class:`SyntheticFailure` when the job reaches that step, to test user exceptions.
    ``finish_key``: the job also finishes (at a step boundary) once this store key exists,
    so a test can end an open-ended job when it has seen what it wanted.
    ``fail_error``: raise this exception instead of :class:`SyntheticFailure` (a user's own
    ``TimeoutError``, say).
    """
    import torch
    import torch.distributed as dist

    apply_rank_env(info)
    timeout = datetime.timedelta(seconds=timeout_s)
    root = dist.TCPStore(info.store_host, info.store_port, None, False, timeout=timeout)
    pg = dist.ProcessGroupGloo(
        dist.PrefixStore(info.store_prefix, root), info.rank, info.world_size, timeout
    )
    try:
        t0 = time.perf_counter()
        state = _load(info.ckpt_dir)
        load_s = time.perf_counter() - t0
        state["sizes"] = [*state["sizes"], info.world_size]
        state["starts"] = [*state.get("starts", []), int(state["step"])]
        step, total = int(state["step"]), float(state["total"])
        first_step_time, t_start, steps_here = None, time.time(), 0
        last_progress, save_s = 0.0, 0.0
        skey, pkey = info.stop_key, info.progress_key
        flag = torch.zeros(1)
        ones = torch.ones(4)
        while step < steps:
            flag.zero_()
            if info.rank == 0:
                if root.check([skey]) and root.get(skey) == str(info.segment).encode():
                    flag.fill_(1.0)
                elif finish_key and root.check([finish_key]):
                    flag.fill_(2.0)
            _wait(pg.broadcast(flag, 0), "broadcast", info)
            if flag.item() == 2.0:
                break
            if flag.item() == 1.0:
                t1 = time.perf_counter()
                if info.rank == 0:
                    _save(info.ckpt_dir, {**state, "step": step, "total": total})
                _wait(pg.barrier(), "barrier", info)
                save_s = time.perf_counter() - t1
                return SegmentOutcome(
                    "stopped", info.rank, step, step, _rate(steps_here, t_start),
                    first_step_time=first_step_time,
                    ckpt_save_s=save_s, ckpt_load_s=load_s,
                )
            if step == fail_at_step and info.rank == fail_rank % info.world_size:
                if fail_error is not None:
                    raise fail_error
                raise SyntheticFailure(f"synthetic failure at step {step} on rank {info.rank}")
            buf = ones.clone()
            _wait(pg.allreduce([buf]), "allreduce", info)
            time.sleep(step_s / info.world_size)
            total += float(buf[0]) / info.world_size
            step += 1
            steps_here += 1
            if first_step_time is None:
                first_step_time = time.time()
            if ckpt_every and step % ckpt_every == 0 and info.rank == 0:
                _save(info.ckpt_dir, {**state, "step": step, "total": total})
            if info.rank == 0 and time.time() - last_progress > progress_every_s:
                last_progress = time.time()
                root.set(pkey, json.dumps({
                    "step": step, "samples": step, "samples_per_s": _rate(steps_here, t_start),
                    "time": last_progress, "first_step_time": first_step_time,
                    "ckpt_load_s": load_s,
                }))
        if info.rank == 0:
            _save(info.ckpt_dir, {**state, "step": step, "total": total})
        _wait(pg.barrier(), "barrier", info)
        result = {"steps": step, "total": total, "sizes": state["sizes"], "starts": state["starts"]}
        return SegmentOutcome(
            "finished", info.rank, step, step, _rate(steps_here, t_start),
            result=result if info.rank == 0 else None, first_step_time=first_step_time,
            ckpt_save_s=save_s, ckpt_load_s=load_s,
        )
    finally:
        with contextlib.suppress(Exception):  # best effort at teardown
            pg.abort()  # close the sockets now, so peers fail fast instead of timing out
        del pg


synthetic_entry.malleparsl_entry = True  # type: ignore[attr-defined]  # already an entry


def _rate(steps: int, t_start: float) -> float | None:
    dt = time.time() - t_start
    return steps / dt if steps and dt > 0 else None

