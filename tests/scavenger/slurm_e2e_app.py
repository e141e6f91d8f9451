"""The training function of the Slurm end-to-end test: digits MLP that logs every step.

Lives in its own module (not the test file) so Slurm pilots can import it by name: the test's
``worker_init`` puts this directory on ``PYTHONPATH``. Each step appends
``<wall time> <segment> <world size> <step index>`` to ``log_path`` (rank 0 only), which is how
the test sees when the job ran at which size and how many steps a preemption made it redo.
"""

from __future__ import annotations

import time
from typing import Any


def train_logged(ctx: Any, *, log_path: str, total_steps: int, step_sleep_s: float = 0.05,
                 global_batch: int = 64) -> dict[str, Any]:
    import torch
    import torch.nn.functional as F

    from malleparsl.apps.examples_digits import MLP, load_digits_tensors

    x, y = load_digits_tensors()
    model = MLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    ctx.register(model=model, optimizer=opt)
    loss = float("nan")
    for step in ctx.steps(total_steps, global_batch=global_batch, dataset_size=len(x)):
        opt.zero_grad()
        for idx in step.micro_batches():
            step.backward(F.cross_entropy(model(x[idx]), y[idx], reduction="sum"))
        loss = step.sync(model)
        opt.step()
        ctx.report(loss=loss)
        if ctx.rank == 0:
            with open(log_path, "a") as fh:
                fh.write(f"{time.time():.3f} {ctx.segment} {ctx.world_size} {step.index}\n")
        time.sleep(step_sleep_s)  # keep the job alive long enough for the scenario
    with torch.no_grad():
        accuracy = (model(x).argmax(1) == y).float().mean().item()
    return {"loss": loss, "accuracy": accuracy, "steps": ctx.step}
