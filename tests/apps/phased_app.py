"""A training loop in phases of different global batches, for the live learnt-cap test (the
test puts this folder on the pilots' PYTHONPATH so the ranks can import it)."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812

from malleparsl.apps.examples_digits import ARCHS, load_digits_tensors


def train_phases(ctx: Any, *, phases: tuple[tuple[int, int], ...] = ((60, 2), (400, 6)),
                 lr: float = 0.05, dtype: str = "float64") -> dict[str, Any]:
    """The digits MLP with SGD; each ``(until_step, global_batch)`` phase calls ``ctx.steps``
    again with its own batch (a restored step past a phase skips it)."""
    dt = getattr(torch, dtype)
    x, y = load_digits_tensors(dt)
    model = ARCHS["mlp"]().to(ctx.device, dt)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    ctx.register(model=model, optimizer=opt)
    for until, batch in phases:
        for step in ctx.steps(until, global_batch=batch, dataset_size=len(x)):
            opt.zero_grad()
            for idx in step.micro_batches():
                step.backward(F.cross_entropy(model(x[idx]), y[idx], reduction="sum"))
            loss = step.sync(model)
            opt.step()
            ctx.report(loss=loss, batch=batch, world_size=ctx.world_size)
    return {"steps": ctx.step, "history": ctx.history}
