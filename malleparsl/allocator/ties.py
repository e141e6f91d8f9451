"""``tie_seed``: take the jobs in a seeded random order, so a policy may return another answer
of equal value. One mechanism for ``milp``, ``milp-node`` and ``greedy`` (docs/allocator.md:
how much a replay moves with tie-breaking alone)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from malleparsl.allocator.base import JobView
from malleparsl.errors import SpecError

__all__ = ["TieShuffle"]


class TieShuffle:
    """``tie_seed`` of a policy: ``None`` keeps the jobs in the order given (today's answers);
    an integer takes them in a fresh random order at every decision (one generator, seeded
    once), so that among answers of equal value a different one may be taken. For measuring
    how much a replay moves with tie-breaking alone (docs/allocator.md), not for production.
    """

    def __init__(self, tie_seed: int | None) -> None:
        if tie_seed is not None and (isinstance(tie_seed, bool) or not isinstance(tie_seed, int)):
            raise SpecError(f"tie_seed must be an integer or None, got {tie_seed!r}")
        self.tie_seed = tie_seed
        self._rng = None if tie_seed is None else np.random.default_rng(tie_seed)

    def __call__(self, jobs: Sequence[JobView]) -> Sequence[JobView]:
        if self._rng is None:
            return jobs
        return [jobs[int(i)] for i in self._rng.permutation(len(jobs))]
