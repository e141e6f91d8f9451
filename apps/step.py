"""``Step``: one optimizer step of a malleable job, and its size-independent gradient sync.

Each rank back-propagates the *summed* per-sample loss of its micro-batches; :meth:`Step.sync`
then all-reduces every gradient and the loss in one flat SUM and divides by the global batch
(under FSDP2 the gradients arrive summed and sharded from backward's reduce-scatter).
The result is the mean gradient over the same global batch at any job size (see
:mod:`malleparsl.apps.sharding`), which is what makes a rescaled run reproduce an unrescaled
one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from malleparsl.apps.sharding import GlobalBatchSampler
from malleparsl.errors import SpecError

if TYPE_CHECKING:
    from malleparsl.apps.context import TrainContext


class Step:
    """One optimizer step: this rank's micro-batches, loss accumulation and gradient sync."""

    def __init__(self, ctx: TrainContext, index: int, sampler: GlobalBatchSampler) -> None:
        self.ctx = ctx
        self.index = index  # global step number, 0-based, the same at every job size
        self.sampler = sampler
        self.loss_sum = 0.0

    @property
    def epoch(self) -> float:
        return self.sampler.epoch_of(self.index)

    def micro_batches(self) -> list[Any]:
        """Index tensors of this rank's micro-batches (CPU ``LongTensor``s)."""
        return self.sampler.micro_batches(self.index)

    def backward(self, loss_sum: Any) -> None:
        """Back-propagate a micro-batch's *summed* per-sample loss and accumulate its value."""
        loss_sum.backward()
        self.loss_sum += float(loss_sum.detach())

    def sync(self, model: Any) -> float:
        """All-reduce gradients (SUM, then divide by the global batch); return the mean loss.

        One flat all-reduce carries every gradient and the loss. Parameters without a gradient
        (a rank with no samples this step) contribute zeros.
        """
        import torch

        params = [p for p in model.parameters() if p.requires_grad]
        if not params:
            raise SpecError("step.sync(model): the model has no trainable parameters")
        if _sharded(params):
            # FSDP2: backward already reduce-scattered the summed gradients (divide factor 1,
            # see apps.plans.shard_model); only the loss is all-reduced, one division each.
            # The loss goes on the shards' device: NCCL (on GPUs) cannot reduce a CPU tensor
            loss = torch.tensor([self.loss_sum], dtype=torch.float64,
                                device=params[0].to_local().device)
            self.ctx.all_reduce(loss)
            for p in params:
                if p.grad is not None:
                    p.grad.div_(self.sampler.global_batch)
            return float(loss[0]) / self.sampler.global_batch
        dtype = params[0].dtype
        flat = torch.cat(
            [
                (p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1).to(dtype)
                for p in params
            ]
            + [torch.tensor([self.loss_sum], dtype=dtype, device=params[0].device)]
        )
        self.ctx.all_reduce(flat)
        flat /= self.sampler.global_batch
        offset = 0
        for p in params:
            n = p.numel()
            chunk = flat[offset : offset + n].view_as(p).to(p.dtype)
            if p.grad is None:
                p.grad = chunk.clone()
            else:
                p.grad.copy_(chunk)
            offset += n
        return float(flat[-1])


def _sharded(params: list[Any]) -> bool:
    """Whether the parameters are FSDP2's ``DTensor`` shards. Only asked of torch builds with
    distributed support: ``torch.distributed.tensor`` does not import without it, and plain
    data parallelism must not need it."""
    import torch.distributed

    if not torch.distributed.is_available():
        return False
    from torch.distributed.tensor import DTensor

    return any(isinstance(p, DTensor) for p in params)
