"""Trial arrays: B hyperparameter trials of one architecture trained as one malleable job.

:func:`train_array` is a malleable training function (``fn(ctx, ...)``, run by
``@malleable_app`` or :class:`~malleparsl.apps.local_runner.LocalRunner` like any other): it
builds every trial's model with the trial's own seed, fuses them
(:class:`~malleparsl.apps.fused_layers.FusedSequential`), and trains them with one
:class:`~malleparsl.apps.fused_optim.FusedOptimizer`. Each trial keeps its own parameters,
optimizer state, hyperparameters, data order (its ``seed``), loss and metrics; the job is
data-parallel over its nodes exactly like a single trial (every rank takes its contiguous
slice of each trial's global batch; one flat SUM all-reduce carries all gradients and the B
losses), so a rescale does not change any trial's trajectory.

Trials come and go at step boundaries:

* **leave**: write trial ids to ``<ckpt_dir>/drop.json`` (:func:`request_drop`); at the next
  step boundary rank 0 reads it, all ranks drop those slices, and each dropped trial is
  exported to its own folder, so a trial paused by ASHA can be promoted later.
* **rung boundaries** (``stops``): at each one every trial is evaluated, exported to its own
  checkpoint folder in :class:`~malleparsl.apps.context.TrainContext`'s format (a plain
  training function can resume it alone, or another array can re-pack it) and its metrics are
  written to ``<ckpt_dir>/results/<trial>.s<step>.json`` for the workflow to read while the
  array trains on.

The job counts ``B x global_batch`` samples per step (``ctx.sample_weight``), so the allocator
and the JPA see one job whose rate is the sum over its trials.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from malleparsl.apps.checkpoint import CheckpointStore, state_layout
from malleparsl.apps.fused_layers import FusedSequential
from malleparsl.apps.fused_optim import FusedOptimizer, TrialHparams
from malleparsl.apps.sharding import GlobalBatchSampler
from malleparsl.errors import CheckpointError, SpecError

DROP_FILE = "drop.json"
RESULTS_DIR = "results"


def request_drop(array_dir: str | os.PathLike[str], trial_ids: Sequence[str]) -> None:
    """Ask the array checkpointing into ``array_dir`` to drop ``trial_ids`` at its next step."""
    path = Path(array_dir) / DROP_FILE
    old = set(json.loads(path.read_text())) if path.exists() else set()
    _write_json(path, sorted(old | set(trial_ids)))


def result_path(array_dir: str | os.PathLike[str], trial_id: str, step: int) -> Path:
    return Path(array_dir) / RESULTS_DIR / f"{trial_id}.s{step}.json"


class ArrayState:
    """The array's checkpointable state: trial ids, fused model, optimizer, per-trial history."""

    def __init__(self, ids: list[str], model: FusedSequential, opt: FusedOptimizer,
                 templates: dict[str, torch.nn.Module]) -> None:
        self.ids, self.model, self.opt, self.templates = ids, model, opt, templates
        self.history: dict[str, list[dict[str, Any]]] = {t: [] for t in ids}
        self.dropped: list[str] = []

    def select(self, keep_ids: Sequence[str]) -> None:
        pos = [self.ids.index(t) for t in keep_ids]
        self.model.select(pos)
        self.opt.select(pos, list(self.model.parameters()))
        self.dropped += [t for t in self.ids if t not in keep_ids]
        self.ids = list(keep_ids)

    def checkpoint_layout(self) -> list[str]:
        """What a checkpoint of this array must fit: its trials and each one's plain model.

        Stable while trials leave (the fused tensors shrink then), so a checkpoint written
        after a drop still fits the array rebuilt from the same trials; which of them it still
        holds is checked by :meth:`load_state_dict`.
        """
        out = [f"class:{type(self).__qualname__}"]
        for tid in sorted(self.templates):
            out += [f"{tid}.{e}" for e in state_layout(self.templates[tid])[1:]]
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"ids": list(self.ids), "model": self.model.state_dict(),
                "optimizer": self.opt.state_dict(), "history": self.history,
                "dropped": list(self.dropped)}

    def load_state_dict(self, sd: Mapping[str, Any]) -> None:
        unknown = [t for t in sd["ids"] if t not in self.ids]
        if unknown:
            raise CheckpointError(f"array checkpoint holds trials {unknown} this array lacks")
        self.select(list(sd["ids"]))
        self.model.load_state_dict(sd["model"])
        self.opt.load_state_dict(sd["optimizer"])
        self.history = {k: list(v) for k, v in sd["history"].items()}
        self.dropped = list(sd["dropped"])

    def export(self, i: int, step: int, samples: float, directory: str) -> None:
        """Trial ``i`` as a plain training function's checkpoint (model + torch.optim state)."""
        tid = self.ids[i]
        plain = self.templates[tid]
        payload = {"format": 1, "step": step, "samples": samples,
                   "state": {"model": self.model.trial_state_dict(i),
                             "optimizer": self.opt.trial_state(i, list(plain.parameters()))},
                   "extra": {}, "history": self.history[tid]}
        CheckpointStore(directory=directory, keep=4).save(payload, step=step)


def _load_trial(model: torch.nn.Module, directory: str | None, at_most: int | None = None
                ) -> tuple[int, dict | None, list]:
    """Load a trial's own checkpoint (if any; the newest at step <= ``at_most``) into
    ``model``; returns (step, optimizer state, history)."""
    if not directory:
        return 0, None, []
    store = CheckpointStore(directory=directory)
    if at_most is None:
        found = store.load_latest()
    else:
        infos = [c for c in store.list() if c.step <= at_most]
        found = (infos[-1].step, store.read(infos[-1].path)) if infos else None
    if found is None:
        return 0, None, []
    step, payload = found
    model.load_state_dict(payload["state"]["model"])
    return int(step), payload["state"].get("optimizer"), list(payload.get("history", []))


def _write_json(path: Path, doc: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(doc))
    os.replace(tmp, path)


def train_array(
    ctx: Any,
    *,
    trials: Sequence[Mapping[str, Any]],
    build: Callable[[Mapping[str, Any]], torch.nn.Module],
    data: Callable[[], tuple[Any, Any, Any, Any]],
    global_batch: int,
    stops: Sequence[int],
) -> dict[str, Any]:
    """Train ``trials`` (dicts with ``trial_id``, ``config``, optional ``seed``, ``dir`` and
    ``start_step``: resume from the trial's checkpoint in ``dir`` at that step or before)
    together up to ``stops[-1]`` steps; evaluate and export every trial at each stop.

    ``build(config)`` returns the trial's ``nn.Sequential`` (called after seeding torch with
    the trial's seed); ``data()`` returns ``(X_train, y_train, X_test, y_test)``; optimizer
    settings come from each config (:class:`TrialHparams`: ``optimizer``, ``lr``,
    ``weight_decay``, ``momentum``...). Returns ``{"trials": {id: metrics}, "dropped": [...]}``.
    """
    if not trials:
        raise SpecError("train_array needs at least one trial")
    stops = sorted(int(s) for s in stops)
    ids = [str(t["trial_id"]) for t in trials]
    if len(set(ids)) != len(ids):
        raise SpecError(f"trial ids in one array must be unique, got {ids}")
    Xtr, ytr, Xte, yte = data()
    # the executor rehearses an entry on a fresh node with a scratch checkpoint folder while the
    # real array runs: a rehearsal neither reads the trials' own folders (the running array
    # rewrites them, so they may hold trials at different steps: a SpecError below, and a
    # node warmed for nothing) nor writes into them (it would export them mid-rung)
    rehearsal = bool(ctx.options.get("rehearsal"))
    def load(t: Mapping[str, Any], at_most: int | None) -> tuple[torch.nn.Module, int, Any, list]:
        torch.manual_seed(int(t.get("seed", 0)))
        m = build(t["config"])
        return (m, *_load_trial(m, None if rehearsal else t.get("dir"), at_most))

    models, templates, starts, opt_states, hists = [], {}, [], [], []
    for t in trials:
        m, step0, opt_sd, hist = load(t, t.get("start_step"))
        models.append(m)
        templates[str(t["trial_id"])] = build(t["config"])
        starts.append(step0), opt_states.append(opt_sd), hists.append(hist)
    while len(set(starts)) != 1 and not rehearsal:
        # a trial promoted from an array that trained it past the rung's stop before the
        # promotion has newer checkpoints than the others (the demo: t003 at 46, t000 and
        # t005 at 45): every trial starts from the newest step they all have, a few steps
        # redone rather than the trials' results lost
        target = min(starts)
        for i, t in enumerate(trials):
            if starts[i] != target:
                models[i], starts[i], opt_states[i], hists[i] = load(t, target)
    if len(set(starts)) != 1:
        raise SpecError(f"trials of one array must start at one step, got {dict(zip(ids, starts))}")
    fm = FusedSequential.from_models(models).to(ctx.device)
    opt = FusedOptimizer(list(fm.parameters()), [TrialHparams.from_config(t["config"]) for t in trials])
    for i, sd in enumerate(opt_states):
        if sd:
            opt.load_trial_state(i, sd)
    state = ArrayState(ids, fm, opt, templates)
    state.history = dict(zip(ids, hists))
    seeds = {tid: int(t.get("seed", 0)) for tid, t in zip(ids, trials)}
    dirs = {tid: (None if rehearsal else t.get("dir")) for tid, t in zip(ids, trials)}
    ctx.register(array=state)
    if not ctx.restore():
        ctx.step, ctx.samples = starts[0], float(starts[0] * global_batch)
    array_dir = Path(ctx.ckpt.directory) if ctx.ckpt is not None else None
    samplers: dict[int, GlobalBatchSampler] = {}
    drop_seen = [0.0]
    results: dict[str, dict[str, Any]] = {}

    def sampler(seed: int) -> GlobalBatchSampler:
        if seed not in samplers:
            samplers[seed] = GlobalBatchSampler(dataset_size=len(Xtr), global_batch=global_batch,
                                                world_size=ctx.world_size, rank=ctx.rank,
                                                micro_batch=global_batch, seed=seed)
        return samplers[seed]

    def drops() -> list[str]:
        """Collective: the trials to drop now (rank 0 reads the file, everyone learns)."""
        mask = torch.zeros(len(state.ids))
        path = array_dir / DROP_FILE if array_dir is not None else None
        mtime = None
        if ctx.rank == 0 and path is not None:  # one stat per step: this runs every step
            with contextlib.suppress(FileNotFoundError):
                mtime = path.stat().st_mtime
        if mtime is not None and mtime != drop_seen[0]:
            drop_seen[0] = mtime
            asked = set(json.loads(path.read_text()))
            mask = torch.tensor([1.0 if t in asked else 0.0 for t in state.ids])
        ctx.broadcast(mask)
        return [t for t, m in zip(state.ids, mask.tolist()) if m > 0]

    def evaluate(step: int) -> None:
        fm.eval()
        with torch.no_grad():
            out = fm(Xte.to(ctx.device).unsqueeze(0).expand(fm.B, *Xte.shape))
            acc = (out.argmax(-1) == yte.to(ctx.device)).float().mean(1).tolist()
        fm.train()
        for i, tid in enumerate(state.ids):
            loss = state.history[tid][-1]["loss"] if state.history[tid] else float("nan")
            doc = {"trial_id": tid, "accuracy": acc[i], "loss": loss, "steps": step,
                   "samples": float(step * global_batch)}
            results[tid] = doc
            if ctx.rank == 0:
                if dirs[tid]:
                    state.export(i, step, step * global_batch, dirs[tid])
                if array_dir is not None:
                    _write_json(result_path(array_dir, tid, step), doc)

    def sync_losses(loss_sums: torch.Tensor) -> list[float]:
        params = list(fm.parameters())
        flat = torch.cat([p.grad.reshape(-1) for p in params] + [loss_sums.detach()])
        ctx.all_reduce(flat)
        flat /= global_batch
        off = 0
        for p in params:
            p.grad.copy_(flat[off: off + p.numel()].view_as(p))
            off += p.numel()
        return flat[off:].tolist()

    ctx.sample_weight = fm.B
    for step in ctx.steps(stops[-1], global_batch=global_batch, dataset_size=len(Xtr)):
        leaving = drops()
        if leaving:
            for tid in leaving:
                if ctx.rank == 0 and dirs[tid]:
                    state.export(state.ids.index(tid), ctx.step, ctx.step * global_batch, dirs[tid])
            state.select([t for t in state.ids if t not in leaving])
            ctx.sample_weight = fm.B
            if not state.ids:
                ctx.save()
                break
        idx = torch.stack([sampler(seeds[t]).local_indices(step.index) for t in state.ids])
        opt.zero_grad()
        if idx.shape[1]:
            xb, yb = Xtr[idx].to(ctx.device), ytr[idx].to(ctx.device)  # (B, n, ...), (B, n)
            out = fm(xb)
            loss_sums = F.cross_entropy(out.reshape(-1, out.shape[-1]), yb.reshape(-1),
                                        reduction="none").view(fm.B, -1).sum(1)
            loss_sums.sum().backward()
        else:  # a rank past the global batch's samples (check_global_batch): it adds zeros
            # (the fused layers cannot reshape an empty batch)
            p0 = next(fm.parameters())
            loss_sums = torch.zeros(fm.B, dtype=p0.dtype, device=p0.device)
            for p in fm.parameters():
                p.grad = torch.zeros_like(p)
        losses = sync_losses(loss_sums)
        opt.step()
        for tid, loss in zip(state.ids, losses):
            state.history[tid].append({"step": step.index, "loss": loss})
        ctx.report(loss=sum(losses) / len(losses), trials=len(losses))
        if step.index + 1 in stops:
            evaluate(step.index + 1)
    if any(results.get(t, {}).get("steps") != ctx.step for t in state.ids):
        evaluate(ctx.step)  # resumed at the end: nothing was left to train
    ctx.save()
    return {"trials": {t: {**results[t], "history": state.history[t]} for t in state.ids},
            "dropped": list(state.dropped), "steps": ctx.step, "time": time.time()}
