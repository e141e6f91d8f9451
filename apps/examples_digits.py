"""Example: an MLP and a small CNN on scikit-learn's bundled digits (8x8 images, no download).

Copy ``train_digits`` as the template of a malleable training function: build the data and the
model, ``ctx.register`` what must survive a rescale, loop over ``ctx.steps(...)``, sum the
per-sample loss of each micro-batch, ``step.sync(model)``, step the optimizer. The same code
runs at any size, and the loss trajectory does not depend on the sizes it ran at.

To run it under Parsl::

    from malleparsl.apps import malleable_app
    from malleparsl.apps.examples_digits import train_digits
    digits = malleable_app(min_nodes=1, max_nodes=4)(train_digits)
    with parsl.load(local_config(nodes=4)):
        print(digits(arch="cnn", total_steps=200).result()["accuracy"])
"""

from __future__ import annotations

from typing import Any

from malleparsl.extras import needs_extra

with needs_extra("malleparsl.apps.examples_digits"):
    import torch
    import torch.nn.functional as F
    from torch import nn


def load_digits_tensors(dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """The 1,797 digits as ``(X, y)``: X is (N, 1, 8, 8) scaled to [0, 1], y the labels."""
    from sklearn.datasets import load_digits

    data = load_digits()
    x = torch.tensor(data.images / 16.0, dtype=dtype).unsqueeze(1)
    return x, torch.tensor(data.target, dtype=torch.long)


class MLP(nn.Module):
    def __init__(self, hidden: int = 64) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class CNN(nn.Module):
    """Two 3x3 convolutions and a linear head; no batch norm or dropout, which would make
    results depend on how the global batch is split."""

    def __init__(self, channels: int = 16) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, channels, 3, padding=1), nn.ReLU(),
            nn.Conv2d(channels, 2 * channels, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        )
        self.head = nn.Linear(2 * channels * 4 * 4, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).flatten(1))


ARCHS = {"mlp": MLP, "cnn": CNN}


def train_digits(
    ctx: Any,
    *,
    arch: str = "mlp",
    total_steps: int | None = 200,
    global_batch: int = 64,
    lr: float = 0.05,
    momentum: float = 0.9,
    dtype: str = "float32",
    fail_at_step: int | None = None,
) -> dict[str, Any]:
    """Train ``arch`` ("mlp" or "cnn") with SGD; return final loss, accuracy and history.

    ``fail_at_step`` raises a ``ValueError`` at that step (to show how errors surface).
    """
    x, y = load_digits_tensors(getattr(torch, dtype))
    x, y = x.to(ctx.device), y.to(ctx.device)
    model = ARCHS[arch]().to(ctx.device, getattr(torch, dtype))
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
    ctx.register(model=model, optimizer=opt)
    loss = float("nan")
    for step in ctx.steps(total_steps, global_batch=global_batch, dataset_size=len(x)):
        if step.index == fail_at_step:
            raise ValueError(f"fail_at_step={fail_at_step} reached (a deliberate user error)")
        opt.zero_grad()
        for idx in step.micro_batches():
            step.backward(F.cross_entropy(model(x[idx]), y[idx], reduction="sum"))
        loss = step.sync(model)
        opt.step()
        ctx.report(loss=loss)
    with torch.no_grad():
        accuracy = (model(x).argmax(1) == y).float().mean().item()
    return {"loss": loss, "accuracy": accuracy, "steps": ctx.step, "history": ctx.history}


def train_mlp(ctx: Any, **kwargs: Any) -> dict[str, Any]:
    """The MLP variant of :func:`train_digits`."""
    return train_digits(ctx, arch="mlp", **kwargs)


def train_cnn(ctx: Any, **kwargs: Any) -> dict[str, Any]:
    """The CNN variant of :func:`train_digits`."""
    return train_digits(ctx, arch="cnn", **kwargs)
