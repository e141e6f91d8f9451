"""Global-batch-constant data sharding: the same samples in the same order at every job size.

A malleable job changes its number of ranks several times during training. For the result not
to depend on that schedule, step ``t`` must see the same *global* batch whatever the size, and
the gradient must be the same function of it:

* the order of samples is a function of ``(seed, epoch)`` only: epoch ``e`` is
  ``randperm(dataset_size)`` drawn from a generator seeded with ``seed + e``, and the stream of
  epochs is cut into consecutive global batches of ``global_batch`` samples (a batch may span an
  epoch boundary);
* rank ``r`` of ``k`` takes a contiguous slice of that global batch (sizes differ by at most
  one), split into micro-batches of at most ``micro_batch`` samples (gradient accumulation);
* each rank sums per-sample losses (``reduction="sum"``), the gradients are all-reduced as a
  SUM and divided by ``global_batch`` (see :meth:`malleparsl.apps.step.Step.sync`).

So step ``t`` computes the mean gradient over the same ``global_batch`` samples at any size;
only the floating-point summation order differs (~1e-7 relative).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from malleparsl.errors import SpecError
from malleparsl.plans import batch_below_node, batch_max_nodes


def _positive_int(value: Any, name: str, fix: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise SpecError(f"{name} must be an integer >= 1, got {value!r}; {fix}")
    return value


def check_global_batch(global_batch: int, world_size: int, *, option: int | None = None,
                       ranks_per_node: int = 1) -> str | None:
    """What the user must hear about splitting ``global_batch`` over ``world_size`` ranks.

    A :class:`SpecError` when the job's malleable option ``global_batch`` (``option``, what the
    controller caps the job's size with) disagrees with the batch the loop trains. A notice
    (returned) when the ranks outnumber the batch's samples: the ranks past them get a local
    batch of 0, add zero gradients and train nothing, so the result is right but their nodes
    are wasted. That can only happen when the options do not name the global batch: the
    controller could not know it. It is not an error: the size is the controller's choice, not
    a mistake of the running job, and failing the job there would lose its training.
    """
    _positive_int(global_batch, "global_batch", "e.g. global_batch=64")  # compared below
    if option is not None and option != global_batch:
        raise SpecError(
            f"ctx.steps(global_batch={global_batch}) disagrees with the malleable option "
            f"global_batch={option}: the controller sizes the job from the option (every rank "
            f"needs a sample: at most {batch_max_nodes(option, ranks_per_node)} node(s) of "
            f"{ranks_per_node} rank(s)) while the loop would split {global_batch}; pass the "
            "same value to both (or leave global_batch out of ctx.steps: it takes the option's)"
        )
    if world_size <= global_batch:
        return None
    fix = batch_below_node(global_batch, ranks_per_node) or (
        f"Pass global_batch={global_batch} in the app's malleable options (e.g. "
        f"@malleable_app(global_batch={global_batch}, ...)) so the controller never sizes the "
        f"job past {batch_max_nodes(global_batch, ranks_per_node)} node(s) of "
        f"{ranks_per_node} rank(s)")
    return (
        f"global_batch={global_batch} feeds only {global_batch} of world_size={world_size} "
        f"ranks: {world_size - global_batch} rank(s) train nothing (a local batch of 0; the "
        f"result stays right) and hold their node(s) for nothing. {fix}"
    )


@dataclass(frozen=True)
class ShardPlan:
    """How one rank's part of every global batch is cut, for a given size.

    ``local_batch``: samples this rank handles per step (``global_batch`` split over ranks,
    rounded down for the later ranks); ``accumulation``: micro-batches per step.
    """

    global_batch: int
    world_size: int
    rank: int
    micro_batch: int

    @property
    def bounds(self) -> tuple[int, int]:
        """``[start, stop)`` of this rank's slice inside the global batch."""
        base, extra = divmod(self.global_batch, self.world_size)
        start = self.rank * base + min(self.rank, extra)
        return start, start + base + (1 if self.rank < extra else 0)

    @property
    def local_batch(self) -> int:
        start, stop = self.bounds
        return stop - start

    @property
    def accumulation(self) -> int:
        return math.ceil(self.local_batch / self.micro_batch) if self.local_batch else 0


class GlobalBatchSampler:
    """Indices of the samples of global step ``t``, and this rank's micro-batches of them.

    Parameters
    ----------
    dataset_size
        Number of samples; indices are ``0..dataset_size-1``.
    global_batch
        Samples per optimizer step, the same at every job size.
    world_size, rank
        This segment's size and this rank.
    micro_batch
        Largest forward/backward batch on one rank (memory bound); ``None`` means the whole
        local batch in one pass.
    seed
        Seeds the per-epoch shuffles (``seed + epoch``).

    >>> s = GlobalBatchSampler(dataset_size=10, global_batch=4, world_size=2, rank=1, seed=0)
    >>> whole = GlobalBatchSampler(dataset_size=10, global_batch=4, world_size=1, rank=0, seed=0)
    >>> bool((whole.global_indices(3)[2:] == s.local_indices(3)).all())
    True
    """

    def __init__(
        self,
        *,
        dataset_size: int,
        global_batch: int,
        world_size: int,
        rank: int,
        micro_batch: int | None = None,
        seed: int = 0,
    ) -> None:
        _positive_int(dataset_size, "dataset_size", "pass len(your_dataset)")
        _positive_int(global_batch, "global_batch", "e.g. global_batch=64")
        _positive_int(world_size, "world_size", "a segment has at least one rank")
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < world_size:
            raise SpecError(f"rank must be in [0, {world_size}), got {rank!r}")
        if micro_batch is None:
            micro_batch = global_batch
        _positive_int(micro_batch, "micro_batch", "or None for no gradient accumulation")
        self.dataset_size = dataset_size
        self.global_batch = global_batch
        self.world_size = world_size
        self.rank = rank
        self.micro_batch = micro_batch
        self.seed = int(seed)
        self.plan = ShardPlan(global_batch, world_size, rank, micro_batch)
        self._perm_cache: dict[int, Any] = {}

    def _epoch_perm(self, epoch: int) -> Any:
        import torch

        perm = self._perm_cache.get(epoch)
        if perm is None:
            gen = torch.Generator().manual_seed(self.seed + epoch)
            perm = torch.randperm(self.dataset_size, generator=gen)
            # keep this epoch and its predecessor (a global batch may span the boundary)
            self._perm_cache = {e: p for e, p in self._perm_cache.items() if e >= epoch - 1}
            self._perm_cache[epoch] = perm
        return perm

    def _positions(self, start: int, stop: int) -> Any:
        """Dataset indices at stream positions ``[start, stop)`` (epochs laid end to end)."""
        import torch

        parts = []
        pos = start
        while pos < stop:
            epoch, off = divmod(pos, self.dataset_size)
            take = min(stop - pos, self.dataset_size - off)
            parts.append(self._epoch_perm(epoch)[off : off + take])
            pos += take
        return torch.cat(parts) if parts else torch.empty(0, dtype=torch.long)

    def epoch_of(self, step: int) -> float:
        """Epochs completed before global step ``step`` (fractional)."""
        return step * self.global_batch / self.dataset_size

    def global_indices(self, step: int) -> Any:
        """All ``global_batch`` dataset indices of global step ``step``."""
        base = step * self.global_batch
        return self._positions(base, base + self.global_batch)

    def local_indices(self, step: int) -> Any:
        """This rank's contiguous slice of the global batch of ``step``."""
        lo, hi = self.plan.bounds
        base = step * self.global_batch
        return self._positions(base + lo, base + hi)

    def micro_batches(self, step: int) -> list[Any]:
        """This rank's slice of ``step`` cut into micro-batches of at most ``micro_batch``."""
        idx = self.local_indices(step)
        return [idx[i : i + self.micro_batch] for i in range(0, len(idx), self.micro_batch)]
