"""Example: a residual MLP of repeated blocks trained under whatever execution plan it is given.

The loop is the ordinary malleable loop; :func:`~malleparsl.apps.plans.prepare` applies the
segment's plan (checkpointed blocks, a ZeRO-1 optimizer or FSDP2 shards, micro-batches), so the same function
runs plain data parallel on many nodes and lean on few. Data are generated (a random teacher
network labels Gaussian inputs), so nothing is downloaded.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from malleparsl.apps.plans import prepare


class Block(nn.Module):
    """``x + W2 relu(W1 x)``: a residual feed-forward block (no dropout, no batch norm)."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(width, 2 * width)
        self.fc2 = nn.Linear(2 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(F.relu(self.fc1(x)))


class BlockMLP(nn.Module):
    def __init__(self, *, d_in: int = 32, width: int = 64, depth: int = 4, classes: int = 10) -> None:
        super().__init__()
        self.inp = nn.Linear(d_in, width)
        self.blocks = nn.ModuleList(Block(width) for _ in range(depth))
        self.head = nn.Linear(width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        for b in self.blocks:
            h = b(h)
        return self.head(h)


def teacher_data(*, n: int = 1024, d_in: int = 32, classes: int = 10, seed: int = 0,
                 dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d_in, generator=gen, dtype=dtype)
    w = torch.randn(d_in, classes, generator=gen, dtype=dtype)
    return x, (x @ w).argmax(dim=1)


def loss_sum(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    x, y = batch
    return F.cross_entropy(model(x), y, reduction="sum")


def train_blocks(
    ctx: Any,
    *,
    total_steps: int | None = 40,
    global_batch: int = 48,
    lr: float = 2e-3,
    width: int = 64,
    depth: int = 4,
    dtype: str = "float32",
) -> dict[str, Any]:
    """Train :class:`BlockMLP` with Adam under ``ctx.plan``; return losses and the plans run."""
    dt = getattr(torch, dtype)
    x, y = teacher_data(dtype=dt)
    model = BlockMLP(width=width, depth=depth).to(dt)
    model, opt = prepare(ctx, model, torch.optim.Adam, blocks=model.blocks,
                         global_batch=global_batch, lr=lr)
    loss = float("nan")
    for step in ctx.steps(total_steps, global_batch=global_batch, dataset_size=len(x)):
        opt.zero_grad()
        for idx in step.micro_batches():
            step.backward(loss_sum(model, (x[idx], y[idx])))
        loss = step.sync(model)
        opt.step()
        ctx.report(loss=loss, plan=ctx.plan.name, world_size=ctx.world_size, sharded=opt.sharded)
    return {"loss": loss, "history": ctx.history, "steps": ctx.step}
