"""``TrainContext``: what a malleable training function sees of the system.

A training function takes a ``TrainContext`` and writes an ordinary loop; the context hides
that the loop may be stopped at any step boundary and resumed later at another size::

    def train(ctx, *, lr=0.1, total_steps=300):
        X, y = load_data()
        model = Net().to(ctx.device)
        opt = torch.optim.SGD(model.parameters(), lr=lr)
        ctx.register(model=model, optimizer=opt)       # checkpointed and restored for you
        for step in ctx.steps(total_steps, global_batch=64, dataset_size=len(X)):
            opt.zero_grad()
            for idx in step.micro_batches():           # this rank's share of the batch
                step.backward(F.cross_entropy(model(X[idx]), y[idx], reduction="sum"))
            loss = step.sync(model)                    # all-reduce; the global mean loss
            opt.step()
            ctx.report(loss=loss)
        return {"loss": loss}

At every step boundary rank 0 looks at the job's stop key in the driver's ``TCPStore``; when it
names this segment, all ranks learn it (a broadcast), rank 0 writes a checkpoint, and
``ctx.steps`` raises :class:`RescaleRequested` out of the loop, which
:func:`malleparsl.apps.entry.run_rank` turns into a "stopped" outcome. The driver relaunches
the job at its new size and ``ctx.steps`` resumes at the checkpointed step. Collectives that
fail because a peer vanished raise :class:`GroupBrokenError`, so the driver can tell a lost
node from a bug in user code.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from collections.abc import Iterator, Mapping
from datetime import timedelta
from pathlib import Path
from typing import Any

from malleparsl.apps.checkpoint import (
    CheckpointStore,
    ShardedState,
    layout_difference,
    owned,
    state_layout,
)
from malleparsl.apps.sharding import GlobalBatchSampler, check_global_batch
from malleparsl.apps.step import Step
from malleparsl.errors import CheckpointError, SpecError
from malleparsl.executors.protocol import (
    DEFAULT_KEY_PREFIX,
    GroupBrokenError,
    RankInfo,
    apply_rank_env,
    progress_key,
    stop_key,
)

log = logging.getLogger(__name__)


class RescaleRequested(BaseException):  # noqa: N818 - a control-flow signal, like StopIteration
    """Raised out of :meth:`TrainContext.steps` when the segment must stop for a rescale.

    A ``BaseException`` so that a user's ``except Exception`` does not swallow it; the checkpoint
    is already written when it is raised.
    """


class TrainContext:
    """One rank's view of a malleable training job during one segment.

    Build it with :meth:`from_rank_info` (what :func:`~malleparsl.apps.entry.run_rank` does) or
    :meth:`local` (one process, no process group: for debugging a training function).

    Options read from the job's malleable options (``RankInfo.options``): ``seed`` (0),
    ``device`` ("auto" | "cpu" | "cuda"), ``micro_batch`` (None), ``ckpt_interval_s`` (30),
    ``ckpt_every_steps`` (None), ``ckpt_keep`` (3), ``progress_interval_s`` (1),
    ``pg_timeout_s`` (120), ``torch_threads`` (None: torch's default; use 1 when several
    emulated nodes share a machine), ``deterministic`` (True), ``total_samples`` (None),
    ``pace_s_per_sample`` (0: for demos and tests, each rank sleeps this long per local sample
    every step, emulating a heavier model that scales perfectly), ``resume`` (False: the first
    segment refuses a checkpoint folder that already holds checkpoints; True: continue from
    them, even if another job id wrote them, e.g. the next rung of a trial).

    A checkpoint records the job id and the layout of every registered object
    (:func:`~malleparsl.apps.checkpoint.state_layout`); one of another model or optimizer is
    refused with :class:`~malleparsl.errors.CheckpointError`.
    """

    def __init__(
        self,
        *,
        rank: int = 0,
        world_size: int = 1,
        job_id: str = "local",
        segment: int = 0,
        node: str = "localhost",
        ckpt_dir: str | None = None,
        options: dict[str, Any] | None = None,
        store: Any = None,
        key_prefix: str = DEFAULT_KEY_PREFIX,
        local_rank: int = 0,
        local_world_size: int = 1,
        backend: str | None = None,
    ) -> None:
        import torch

        self.rank, self.world_size = rank, world_size
        self.job_id, self.segment, self.node = job_id, segment, node
        self.key_prefix = key_prefix
        self.local_rank, self.local_world_size = local_rank, local_world_size
        self.options = dict(options or {})
        self.store = store  # the driver's TCPStore (client); None when local
        self.ckpt = CheckpointStore(
            directory=ckpt_dir, keep=int(self.options.get("ckpt_keep", 3))
        ) if ckpt_dir else None
        want = self.options.get("device", "auto")
        cuda = torch.cuda.is_available() and want in ("auto", "cuda")
        # the launch bound this rank to one device (CUDA_/ROCR_VISIBLE_DEVICES,
        # ZE_AFFINITY_MASK): it is device 0 of what this process sees; unbound ranks of one
        # node share the node's devices and pick theirs by local rank
        bound = any(os.environ.get(v) for v in ("CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES"))
        index = 0 if bound else int(self.options.get("local_rank", local_rank))
        self.device = torch.device(f"cuda:{index}" if cuda else "cpu")
        # the backend fits the device: gloo on CPU, the site's choice (nccl, xccl) otherwise
        self.backend = "gloo" if not cuda else (backend if backend not in (None, "gloo") else "nccl")
        self._threads_before = torch.get_num_threads()
        if self.options.get("torch_threads"):
            torch.set_num_threads(int(self.options["torch_threads"]))
        self._det_before = torch.are_deterministic_algorithms_enabled()
        if self.options.get("deterministic", True):
            torch.use_deterministic_algorithms(True, warn_only=True)
        torch.manual_seed(int(self.options.get("seed", 0)))
        self.group = False  # True once a torch.distributed default group is ours
        self.step = 0  # completed optimizer steps of the whole job
        self.samples = 0.0  # samples trained by the whole job
        self.sample_weight = 1  # samples counted per global-batch sample (B for a trial array)
        self.history: list[dict[str, Any]] = []  # ctx.report(...) records, checkpointed
        self.extra: dict[str, Any] = {}  # user data to checkpoint (plain values, tensors)
        self.metrics: dict[str, Any] = {}
        self.samples_per_s: float | None = None
        self.first_step_time: float | None = None
        self.ckpt_load_s = 0.0  # reading the checkpoint at segment start
        self.ckpt_save_s = 0.0  # writing the stop checkpoint
        self.sampler: GlobalBatchSampler | None = None
        self.notice: str | None = None  # what rank 0 tells the driver (ranks with no sample)
        self._objects: dict[str, Any] = {}
        self._begun = False
        self._saved_step: int | None = None
        self._last_ckpt = self._last_progress = self._last_stop_check = time.monotonic()
        self._warm: tuple[float, float] | None = None  # (time, samples) after the 1st step

    # -- construction ------------------------------------------------------------------
    @classmethod
    def from_rank_info(cls, info: RankInfo) -> TrainContext:
        """Join the segment's process group through the driver's ``TCPStore``."""
        import torch.distributed as dist
        from torch.distributed import PrefixStore, TCPStore

        timeout = timedelta(seconds=float(info.options.get("pg_timeout_s", 120)))
        apply_rank_env(info)
        store = TCPStore(info.store_host, info.store_port, is_master=False, timeout=timeout)
        ctx = cls(
            rank=info.rank, world_size=info.world_size, job_id=info.job_id,
            segment=info.segment, node=info.node, ckpt_dir=info.ckpt_dir or None,
            options=info.options, store=store, key_prefix=info.key_prefix,
            local_rank=info.local_rank, local_world_size=info.local_world_size,
            backend=info.backend,
        )
        if dist.is_initialized():  # a previous task in this warm worker died uncleanly
            log.warning("destroying a leftover process group before joining %s", info.store_prefix)
            dist.destroy_process_group()
        dist.init_process_group(
            ctx.backend, store=PrefixStore(info.store_prefix, store),
            rank=info.rank, world_size=info.world_size, timeout=timeout,
        )
        ctx.group = True
        return ctx

    @classmethod
    def local(
        cls, *, ckpt_dir: str | None = None, options: Mapping[str, Any] | None = None,
        **more: Any,
    ) -> TrainContext:
        """A one-rank context without a store or process group (debugging, notebooks).

        ``options`` (a job's malleable options) and ``more`` are its options; a ``ckpt_dir``
        among them is dropped: this run checkpoints in ``ckpt_dir`` (a job's own folder belongs
        to its live ranks, and a trial's to the trial)."""
        opts = {k: v for k, v in {**(options or {}), **more}.items() if k != "ckpt_dir"}
        return cls(ckpt_dir=ckpt_dir, options=opts)

    def close(self) -> None:
        """Leave the process group (unblocks peers) and restore global torch settings."""
        import torch

        if self.group:
            import torch.distributed as dist

            self.group = False
            try:
                dist.destroy_process_group()
            except Exception as exc:  # a broken group may refuse a clean shutdown
                log.debug("destroy_process_group failed: %s", exc)
        torch.use_deterministic_algorithms(self._det_before)
        torch.set_num_threads(self._threads_before)
        self.store = None

    # -- collectives ----------------------------------------------------------------------
    def _collective(self, fn: Any, *args: Any, **kwargs: Any) -> None:
        if self.world_size == 1 or not self.group:
            return
        try:
            fn(*args, **kwargs)
        except Exception as exc:
            raise GroupBrokenError(
                f"process group broken (a peer's connection closed, reset or timed out): rank "
                f"{self.rank}/{self.world_size} of job {self.job_id!r} segment {self.segment} "
                f"lost its peers: {exc}"
            ) from exc

    def all_reduce(self, tensor: Any) -> Any:
        """In-place SUM over all ranks (no-op at size 1)."""
        import torch.distributed as dist

        self._collective(dist.all_reduce, tensor)
        return tensor

    def broadcast(self, tensor: Any, src: int = 0) -> Any:
        import torch.distributed as dist

        self._collective(dist.broadcast, tensor, src)
        return tensor

    def barrier(self) -> None:
        import torch.distributed as dist

        self._collective(dist.barrier)

    # -- state --------------------------------------------------------------------------
    def register(self, **objects: Any) -> None:
        """Objects with ``state_dict``/``load_state_dict`` to checkpoint (model, optimizer...)."""
        for name, obj in objects.items():
            if not (hasattr(obj, "state_dict") and hasattr(obj, "load_state_dict")):
                raise SpecError(
                    f"ctx.register({name}=...): {type(obj).__name__} has no state_dict/"
                    "load_state_dict; put plain values in ctx.extra instead"
                )
            self._objects[name] = obj

    def _payload(self) -> dict[str, Any]:
        return {
            "format": 2, "step": self.step, "samples": self.samples, "job_id": self.job_id,
            "layout": {k: state_layout(o) for k, o in self._objects.items()},
            "state": {k: o.state_dict() for k, o in self._objects.items()},
            "extra": self.extra, "history": self.history,
        }

    def _check_fits(self, step: int, payload: dict[str, Any]) -> None:
        """Refuse a checkpoint of another job (unless resuming was asked) or another layout."""
        where = f"checkpoint of step {step} in {self.ckpt.directory if self.ckpt else '?'}"
        writer = payload.get("job_id")
        if writer is not None and writer != self.job_id and not self.options.get("resume"):
            raise CheckpointError(
                f"{where} was written by job {writer!r}, not this job {self.job_id!r}; pass "
                "resume=True in the malleable options to continue from it, or use a fresh "
                "ckpt_dir"
            )
        if payload.get("format", 1) < 2:
            log.warning("%s has no layout record (written by an older malleparsl)", where)
            return
        layouts = payload.get("layout", {})
        for name, obj in self._objects.items():
            diff = layout_difference(name, list(layouts.get(name, [])), state_layout(obj))
            if diff is not None:
                raise CheckpointError(
                    f"{where} does not fit this job's {name}: {diff}; it was written for "
                    "another model or optimizer. Use a fresh ckpt_dir (or job_id) for a "
                    "changed model"
                )

    def _check_folder_reuse(self) -> None:
        """The first segment of a job starts from scratch unless ``resume`` is asked: a folder
        that already holds checkpoints (an earlier run's) is refused, never silently used."""
        if self.ckpt is None or self.segment != 0 or self.options.get("resume"):
            return
        found = self.ckpt.list()
        if found:
            raise CheckpointError(
                f"checkpoint folder {self.ckpt.directory} already holds {len(found)} "
                f"checkpoint(s) (newest step {found[-1].step}) from an earlier run, and job "
                f"{self.job_id!r} starts fresh; pass resume=True in the malleable options to "
                "continue from them, or use a fresh ckpt_dir / job_id"
            )

    def save(self) -> Path | None:
        """Checkpoint now (rank 0 writes; the state is replicated). Returns the path on rank 0.

        Objects with ``collective_state`` (a sharded optimizer) are consolidated on rank 0
        first, a collective: every rank calls ``save`` at the same steps. Their ``release()``
        (where they have one) drops rank 0's consolidated copy once the file is written, so it
        is not kept for the rest of the segment.
        """
        self._last_ckpt = time.monotonic()
        if self.ckpt is None:
            return None
        sharded = {k: o for k, o in self._objects.items() if getattr(o, "sharded_checkpoint", False)}
        if sharded:
            return self._save_sharded(sharded)
        collective = [o for o in self._objects.values() if getattr(o, "collective_state", False)]
        for obj in collective:
            obj.consolidate()
        try:
            if self.rank != 0 or self._saved_step == self.step:
                return None
            path = self.ckpt.save(self._payload(), step=self.step)
            self._saved_step = self.step
            return path
        finally:
            for obj in collective:
                if callable(getattr(obj, "release", None)):
                    obj.release()

    def _save_sharded(self, sharded: dict[str, Any]) -> Path | None:
        """Every rank writes its own shards (see ``CheckpointStore.save_sharded``)."""
        assert self.ckpt is not None
        if self._saved_step == self.step:  # known on every rank: all ranks saved or restored it
            return None
        rest = {k: o for k, o in self._objects.items() if k not in sharded}
        meta = None
        if self.rank == 0:
            meta = {
                "format": 2, "step": self.step, "samples": self.samples, "job_id": self.job_id,
                "layout": {k: state_layout(o) for k, o in self._objects.items()},
                "state": {k: o.state_dict() for k, o in rest.items()},
                "extra": self.extra, "history": self.history,
            }
        path = self.ckpt.save_sharded(
            meta, {k: o.dcp_state() for k, o in sharded.items()},
            {k: o.checkpoint_kind for k, o in sharded.items()},
            step=self.step, rank=self.rank, world_size=self.world_size)
        self._saved_step = self.step
        return path

    def restore(self) -> bool:
        """Load the newest usable checkpoint into the registered objects; False if none.

        Every rank reads it; a cheap all-reduce checks that all ranks resumed at one step.
        Without a checkpoint, registered modules are broadcast from rank 0 so all replicas
        start equal.

        Where an object keeps a part of its state (``reads_mapped_state``: FSDP2's and
        ZeRO-1's), a plain file is mapped, not read (``load_latest(mmap=True)``): that object
        reads its shards only, instead of every rank holding the whole state at once; the
        other objects get their state read whole (:func:`~malleparsl.apps.checkpoint.owned`),
        so nothing mapped outlives the restore.
        """
        self._begun = True
        t0 = time.monotonic()
        self._check_folder_reuse()
        mapped = any(getattr(o, "reads_mapped_state", False) for o in self._objects.values())
        found = self.ckpt.load_latest(mmap=mapped) if self.ckpt is not None else None
        # before any load: a sharded load and the broadcasts below are collectives, which
        # ranks that found different checkpoints would enter mismatched (a hang, a timeout)
        self._check_same_step(found[0] if found is not None else -1)
        if found is not None:
            step, payload = found
            self._check_fits(step, payload)
            missing = set(self._objects) - set(payload.get("state", {}))
            if missing:
                raise CheckpointError(f"checkpoint at step {step} lacks state for {sorted(missing)}")
            for name, obj in self._objects.items():
                value = payload["state"][name]
                if isinstance(value, ShardedState):  # FSDP2 loads its shard, others it whole
                    if callable(getattr(obj, "load_dcp", None)) and getattr(
                            obj, "sharded_checkpoint", False):
                        obj.load_dcp(value)
                    else:
                        obj.load_state_dict(value.plain())
                elif mapped and not getattr(obj, "reads_mapped_state", False):
                    obj.load_state_dict(owned(value))  # may keep references (an optimizer)
                else:
                    obj.load_state_dict(value)
            self.step, self.samples = int(payload["step"]), float(payload["samples"])
            self.extra.clear()
            self.extra.update(owned(payload.get("extra", {})) if mapped else
                              payload.get("extra", {}))
            self.history[:] = payload.get("history", [])
            self._saved_step = self.step
        self.ckpt_load_s = time.monotonic() - t0
        if found is None:
            for obj in self._objects.values():
                if hasattr(obj, "parameters") and hasattr(obj, "buffers"):
                    for t in [*obj.parameters(), *obj.buffers()]:
                        self.broadcast(t.data)
        return found is not None

    def _check_same_step(self, step: int) -> None:
        """Collective: every rank found the checkpoint of ``step`` (-1: none)."""
        import torch

        t = torch.tensor([step, -step], dtype=torch.float64)
        self.all_reduce_max(t)
        if t[0] != -t[1]:
            raise CheckpointError(
                f"ranks resumed at different steps (max {int(t[0])}, min {int(-t[1])}; -1: none "
                "found); "
                "is the checkpoint directory shared by all nodes?"
            )

    def all_reduce_max(self, tensor: Any) -> Any:
        import torch.distributed as dist

        self._collective(dist.all_reduce, tensor, op=dist.ReduceOp.MAX)
        return tensor

    # -- stop, progress ---------------------------------------------------------------------
    def stop_requested(self) -> bool:
        """Collective: True on every rank when the driver asked this segment to stop."""
        import torch

        flag = 0.0
        if self.rank == 0 and self.store is not None:
            now = time.monotonic()
            if now - self._last_stop_check >= float(self.options.get("stop_check_interval_s", 0)):
                self._last_stop_check = now
                key = stop_key(self.job_id, self.key_prefix)
                if self.store.check([key]) and self.store.get(key).decode() == str(self.segment):
                    flag = 1.0
        if self.world_size == 1:
            return flag > 0
        return bool(self.broadcast(torch.tensor([flag]))[0] > 0)

    def check_stop(self) -> None:
        """For hand-written loops: at a step boundary, checkpoint and stop if asked to."""
        if self.stop_requested():
            t0 = time.monotonic()
            self.save()
            self.ckpt_save_s = time.monotonic() - t0
            self.publish_progress()
            raise RescaleRequested(f"job {self.job_id!r} segment {self.segment} stopped at step {self.step}")

    def report(self, **metrics: Any) -> None:
        """Record metrics for the current step (kept in ``ctx.history``, checkpointed, and
        published with the progress)."""
        clean = {k: (float(v) if hasattr(v, "__float__") else v) for k, v in metrics.items()}
        self.metrics = clean
        self.history.append({"step": self.step, **clean})

    def publish_progress(self) -> None:
        """Rank 0 writes ``{"step", "samples", "samples_per_s", "time", ...}`` to the store."""
        self._last_progress = time.monotonic()
        if self.rank != 0 or self.store is None:
            return
        doc = {
            "step": self.step, "samples": self.samples, "samples_per_s": self.samples_per_s,
            "time": time.time(), "segment": self.segment, "world_size": self.world_size,
            "first_step_time": self.first_step_time, "ckpt_load_s": self.ckpt_load_s,
            "metrics": {k: v for k, v in self.metrics.items() if isinstance(v, (int, float, str))},
        }
        if self.notice:
            doc["notice"] = self.notice
        if self.sampler is not None:  # the controller caps a job that did not name it
            doc["global_batch"] = self.sampler.global_batch
        self.store.set(progress_key(self.job_id, self.segment, self.key_prefix), json.dumps(doc))

    def _after_step(self, global_batch: int) -> None:
        now = time.monotonic()
        self.step += 1
        self.samples += global_batch * self.sample_weight
        if self._warm is None:  # the first step pays for warm-up; measure from its end
            self._warm = (now, self.samples)
        elif now > self._warm[0]:
            self.samples_per_s = (self.samples - self._warm[1]) / (now - self._warm[0])
        if now - self._last_progress >= float(self.options.get("progress_interval_s", 1.0)):
            self.publish_progress()

    def _periodic_checkpoint_due(self) -> bool:
        every = self.options.get("ckpt_every_steps")
        if every and self.step % int(every) == 0:
            return True
        due = time.monotonic() - self._last_ckpt >= float(self.options.get("ckpt_interval_s", 30))
        if any(getattr(o, "collective_state", False) for o in self._objects.values()):
            import torch  # a collective save: all ranks must agree (rank 0's clock decides)

            due = bool(self.broadcast(torch.tensor([float(due)]))[0] > 0)
        return due

    @property
    def plan(self) -> Any:
        """This segment's execution plan (option ``plan``, default ``dp``); see
        :mod:`malleparsl.apps.plans`. ``"auto"`` reaches the ranks only when the job has no
        automatic plans (no ``memory_profile``; the driver names the chosen plan otherwise):
        plain ``dp``, as the submit check accepted it."""
        from malleparsl.plans import parse_plan

        name = self.options.get("plan")
        return parse_plan(None if name == "auto" else name)

    # -- the loop -------------------------------------------------------------------------
    def steps(
        self,
        total_steps: int | None = None,
        *,
        global_batch: int | None = None,
        dataset_size: int,
        micro_batch: int | None = None,
        seed: int | None = None,
    ) -> Iterator[Step]:
        """Yield :class:`Step` objects from the restored step up to ``total_steps``.

        ``total_steps`` defaults to ``ceil(total_samples / global_batch)`` from the job's
        options, ``global_batch`` to the option ``global_batch`` (which also caps the job's size
        so that every rank gets a sample; a different value here is a ``SpecError``). Ranks
        past the global batch's samples train nothing: rank 0 warns, in its log and through the
        driver's (:func:`~malleparsl.apps.sharding.check_global_batch`). Restores the latest
        checkpoint first (unless :meth:`restore` was called).
        """
        from malleparsl.plans import UnevenSplitError, global_batch_option, splits_for

        option = global_batch_option(self.options)
        if global_batch is None:
            if option is None:
                raise SpecError("ctx.steps(): give global_batch=..., or global_batch in "
                                "@malleable_app(...)")
            global_batch = option
        self.notice = check_global_batch(global_batch, self.world_size, option=option,
                                         ranks_per_node=self.local_world_size)
        if self.notice and self.rank == 0:
            log.warning("job %r segment %d: %s", self.job_id, self.segment, self.notice)
        if total_steps is None:
            total = self.options.get("total_samples")
            if not total:
                raise SpecError(
                    "ctx.steps(): give total_steps, or total_samples in @malleable_app(...)"
                )
            total_steps = math.ceil(float(total) / global_batch)
        if not splits_for(self.plan, global_batch, self.world_size):
            fix = (f"pass global_batch={global_batch} in the app's malleable options (e.g. "
                   f"@malleable_app(global_batch={global_batch}, ...)): the size is the "
                   "controller's choice, and with the option it gives the job only node counts "
                   "whose ranks split the batch evenly" if option is None else
                   "run another plan or size")
            why = (f"plan {self.plan.name!r} needs the global batch to split evenly over the "
                   f"ranks (every rank runs as many passes: FSDP2's collectives are inside them); "
                   f"global_batch={global_batch} over {self.world_size} ranks does not: {fix}")
            if option is None:  # the controller's size: the executor re-runs at one that splits
                raise UnevenSplitError(why, global_batch, step=self.step)
            raise SpecError(why)
        self.sampler = GlobalBatchSampler(
            dataset_size=dataset_size, global_batch=global_batch, world_size=self.world_size,
            rank=self.rank, micro_batch=_smallest(
                micro_batch or self.options.get("micro_batch"), self.plan.micro_batch),
            seed=int(self.options.get("seed", 0) if seed is None else seed),
        )
        if not self._begun:
            self.restore()
        self._last_ckpt = time.monotonic()
        pace = float(self.options.get("pace_s_per_sample", 0.0))
        while self.step < total_steps:
            self.check_stop()
            if self.step and self._periodic_checkpoint_due():
                self.save()
            if self.first_step_time is None:
                self.first_step_time = time.time()
            yield Step(self, self.step, self.sampler)
            if pace:  # emulate a heavier model: compute time proportional to local samples
                time.sleep(pace * self.local_batch)
            self._after_step(global_batch)
        self.publish_progress()

    @property
    def local_batch(self) -> int:
        """Samples this rank processes per step (set once :meth:`steps` has started)."""
        return self.sampler.plan.local_batch if self.sampler else 0

    @property
    def accumulation(self) -> int:
        """Micro-batches (gradient-accumulation passes) per step on this rank."""
        return self.sampler.plan.accumulation if self.sampler else 0

    def __repr__(self) -> str:
        return (
            f"TrainContext(job_id={self.job_id!r}, segment={self.segment}, rank={self.rank}, "
            f"world_size={self.world_size}, device={str(self.device)!r}, step={self.step})"
        )


def _smallest(*caps: int | None) -> int | None:
    """The tightest micro-batch cap (the user's and the plan's); None if neither sets one."""
    given = [int(c) for c in caps if c]
    return min(given) if given else None
