"""The demo's training function: a small MLP or CNN on scikit-learn's digits, malleable.

``train_digits(ctx, config)`` is what a scientist writes for malleparsl: an ordinary training
loop over ``ctx.steps(...)`` (which shards each global batch across however many nodes the job
holds now, stops at a step boundary for a rescale and resumes from the checkpoint), then an
evaluation. The budget arrives as an ordinary hyperparameter, ``config["epochs"]`` (or
``config["samples"]``), so a trial promoted by ASHA to a larger budget simply continues from
its last checkpoint to the new end.

The digits set (1,797 8x8 images) is split once, deterministically: 80 % train, 20 % test.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from typing import Any

from malleparsl.errors import SpecError

from .nas import build_model
from .scheduler import Budget
from .space import Choice, LogUniform, SearchSpace


def default_space() -> SearchSpace:
    """The demo's search space: learning rate, weight decay and width of a one-layer MLP.

    Mostly per-trial hyperparameters, few shapes: trials of one width share a fused array.
    """
    return SearchSpace({
        "lr": LogUniform(3e-4, 3e-2),
        "weight_decay": Choice([0.0, 1e-4, 1e-3]),
        "width": Choice([64, 128]),
    })


def default_budget(*, quick: bool = False) -> Budget:
    """Epochs per rung: 2 -> 6 -> 18 (quick: 2 -> 6). An epoch is 1,437 samples: cheap."""
    return Budget(unit="epochs", min_budget=2, max_budget=6 if quick else 18, eta=3)


@functools.lru_cache(maxsize=1)
def load_split(seed: int = 0) -> tuple[Any, Any, Any, Any]:
    """``(X_train, y_train, X_test, y_test)`` as float/long tensors, pixels scaled to [0, 1].

    The split is kept in the user's private, checksummed cache (:mod:`malleparsl.cache`):
    importing scikit-learn costs seconds on every fresh worker, reading the cache milliseconds.
    """
    import torch

    from malleparsl.cache import cached_arrays

    def derive() -> dict[str, Any]:
        from sklearn.datasets import load_digits
        from sklearn.model_selection import train_test_split

        X, y = load_digits(return_X_y=True)
        Xtr, Xte, ytr, yte = train_test_split(X / 16.0, y, test_size=0.2, random_state=seed,
                                              stratify=y)
        return {"Xtr": Xtr, "ytr": ytr, "Xte": Xte, "yte": yte}

    z = cached_arrays(f"digits-v2-seed{int(seed)}", derive)
    Xtr, ytr, Xte, yte = z["Xtr"], z["ytr"], z["Xte"], z["yte"]
    f = functools.partial(torch.tensor, dtype=torch.float32)
    return f(Xtr), torch.tensor(ytr), f(Xte), torch.tensor(yte)


def arch_of(config: Mapping[str, Any]) -> dict[str, Any]:
    """The architecture a config asks for: ``config["arch"]`` (NAS) or an MLP of width x depth."""
    if "arch" in config:
        return dict(config["arch"])
    return {"kind": "mlp", "layers": [int(config.get("width", 64))] * int(config.get("depth", 1)),
            "activation": str(config.get("activation", "relu"))}


def global_batch_of(config: Mapping[str, Any]) -> int:
    """The global batch :func:`train_digits` (and :func:`train_digits_array`) pass to
    ``ctx.steps`` for ``config``: the trial runners put it in each job's malleable options, so
    the controller never sizes a trial past it (``AppTrialRunner(global_batch_of=...)``)."""
    return int(config.get("batch_size", 64))


def total_steps(config: Mapping[str, Any], dataset_size: int) -> int:
    """Optimizer steps for the budget in ``config`` (``epochs`` or ``samples``)."""
    batch = global_batch_of(config)
    if "samples" in config:
        return max(1, math.ceil(float(config["samples"]) / batch))
    if "epochs" in config:
        return max(1, math.ceil(float(config["epochs"]) * dataset_size / batch))
    raise SpecError(
        f"config {dict(config)!r} gives no budget; add 'epochs' or 'samples' (the workflow "
        "runner does this for each rung)"
    )


def train_digits(ctx: Any, config: Mapping[str, Any]) -> dict[str, float]:
    """Train ``arch_of(config)`` with Adam on the digits training split; return test metrics."""
    import torch
    import torch.nn.functional as F

    Xtr, ytr, Xte, yte = load_split()
    torch.manual_seed(int(config.get("seed", 0)))
    model = build_model(arch_of(config)).to(ctx.device)
    from malleparsl.apps.fused_optim import TrialHparams

    # Adam with the config's lr (and weight_decay, betas...): the update a fused array applies
    opt = TrialHparams.from_config({"lr": 1e-2, **config}).torch_optimizer(model.parameters())
    ctx.register(model=model, optimizer=opt)
    loss = math.nan
    batch = global_batch_of(config)
    delay = float(ctx.options.get("step_delay_s", 0.0))  # emulate a heavier model (tests, demos)
    if delay:  # a step costs one node ``delay`` seconds, n nodes delay / n: it scales as compute
        ctx.options["pace_s_per_sample"] = delay / max(1, batch)
    for step in ctx.steps(total_steps(config, len(Xtr)), global_batch=batch,
                          dataset_size=len(Xtr)):
        opt.zero_grad()
        for idx in step.micro_batches():
            step.backward(F.cross_entropy(model(Xtr[idx]), ytr[idx], reduction="sum"))
        loss = step.sync(model)
        opt.step()
        ctx.report(loss=loss)
    ctx.save()  # the end of a rung: a promoted trial resumes from here
    if math.isnan(loss) and ctx.history:  # resumed at the end: the loop had nothing left to do
        loss = float(ctx.history[-1].get("loss", math.nan))
    model.eval()
    with torch.no_grad():
        acc = float((model(Xte).argmax(1) == yte).float().mean())
    return {"accuracy": acc, "loss": float(loss), "steps": int(ctx.step),
            "samples": float(ctx.samples)}


def build_digits(config: Mapping[str, Any]) -> Any:
    """The model of a configuration, for trial arrays (fused) and the array sizer."""
    return build_model(arch_of(config))


def train_digits_array(ctx: Any, *, trials: list[dict[str, Any]], stops: list[int]
                       ) -> dict[str, Any]:
    """:func:`train_digits` for many trials at once: one fused array (same architecture and
    batch size; each trial its own learning rate, seed, parameters and Adam state). Each
    trial trains exactly as ``train_digits`` would train it alone."""
    from malleparsl.apps.fused import train_array

    trials = [{**t, "config": {"lr": 1e-2, **t["config"]}} for t in trials]  # as train_digits
    batch = global_batch_of(trials[0]["config"])
    delay = float(ctx.options.get("step_delay_s", 0.0))
    if delay:  # the emulated heavier model costs each trial its delay: no free speed-up
        ctx.options["pace_s_per_sample"] = delay * len(trials) / max(1, batch)
    return train_array(ctx, trials=trials, build=build_digits, data=load_split,
                       global_batch=batch, stops=stops)


@functools.lru_cache(maxsize=1)
def _n_train() -> int:
    """Rows of the training split (loading it reads and checksums the cached arrays)."""
    return len(load_split()[0])


def steps_of(config: Mapping[str, Any]) -> int:
    """Steps a configuration trains in all (its budget over the training split)."""
    return total_steps(config, _n_train())
