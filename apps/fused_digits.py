"""Digits models for trial arrays, and the same trial trained alone (the exactness reference).

``build_mlp`` / ``build_cnn`` turn a trial configuration into an ``nn.Sequential`` that
:func:`malleparsl.apps.fused.train_array` can fuse; ``digits_data`` is the data callable it
takes. :func:`train_alone` trains one trial the ordinary way (its own ``torch.optim``
optimizer, the same data order and mean-over-global-batch loss), which is what every fused
trial must reproduce.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from malleparsl.apps.fused_layers import SeededDropout
from malleparsl.apps.fused_optim import TrialHparams
from malleparsl.apps.sharding import GlobalBatchSampler

N_TRAIN = 1437  # the first 80 % of the 1,797 digits train, the rest test


@functools.lru_cache(maxsize=1)
def digits_data() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(X_train, y_train, X_test, y_test)``; X is (N, 1, 8, 8) in [0, 1]."""
    from malleparsl.apps.examples_digits import load_digits_tensors

    x, y = load_digits_tensors()
    return x[:N_TRAIN], y[:N_TRAIN], x[N_TRAIN:], y[N_TRAIN:]


def _act(config: Mapping[str, Any]) -> nn.Module:
    return {"relu": nn.ReLU, "gelu": nn.GELU, "tanh": nn.Tanh}[config.get("activation", "relu")]()


def build_mlp(config: Mapping[str, Any]) -> nn.Sequential:
    """64 -> width [-> BatchNorm] -> act [-> dropout] (x depth) -> 10."""
    mods: list[nn.Module] = [nn.Flatten()]
    width = 64
    for _ in range(int(config.get("depth", 1))):
        w = int(config.get("width", 64))
        # a bias just before BatchNorm has no effect but, with Adam, a gradient that is zero up
        # to rounding, so it drifts by noise and trajectories stop being reproducible
        mods.append(nn.Linear(width, w, bias=not config.get("batchnorm")))
        if config.get("batchnorm"):
            mods.append(nn.BatchNorm1d(w))
        mods.append(_act(config))
        if config.get("dropout"):
            mods.append(SeededDropout(float(config["dropout"]), int(config.get("seed", 0))))
        width = w
    return nn.Sequential(*mods, nn.Linear(width, 10))


def build_cnn(config: Mapping[str, Any]) -> nn.Sequential:
    """Two 3x3 convolutions (optional BatchNorm after the first), pooling, a linear head."""
    c = int(config.get("channels", 16))
    mods: list[nn.Module] = [nn.Conv2d(1, c, 3, padding=1, bias=not config.get("batchnorm"))]
    if config.get("batchnorm"):
        mods.append(nn.BatchNorm2d(c))
    mods += [_act(config), nn.MaxPool2d(2), nn.Conv2d(c, 2 * c, 3, padding=1), _act(config),
             nn.MaxPool2d(2), nn.Flatten(), nn.Linear(2 * c * 2 * 2, 10)]
    return nn.Sequential(*mods)


BUILDERS: dict[str, Callable[[Mapping[str, Any]], nn.Sequential]] = {
    "mlp": build_mlp, "cnn": build_cnn,
}


def train_alone(
    config: Mapping[str, Any],
    *,
    seed: int,
    steps: int,
    global_batch: int,
    build: Callable[[Mapping[str, Any]], nn.Module],
    data: Callable[[], tuple[Any, Any, Any, Any]] = digits_data,
) -> tuple[list[float], nn.Module]:
    """One trial trained the ordinary way for ``steps`` steps; (losses per step, model)."""
    Xtr, ytr, _, _ = data()
    torch.manual_seed(seed)
    model = build(config)
    opt = TrialHparams.from_config(config).torch_optimizer(model.parameters())
    sampler = GlobalBatchSampler(dataset_size=len(Xtr), global_batch=global_batch,
                                 world_size=1, rank=0, micro_batch=global_batch, seed=seed)
    losses = []
    for step in range(steps):
        idx = sampler.global_indices(step)
        opt.zero_grad()
        loss = F.cross_entropy(model(Xtr[idx]), ytr[idx], reduction="sum") / global_batch
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    return losses, model
