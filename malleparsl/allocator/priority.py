"""Per-job priority weights for objectives beyond throughput (used by the ``hold`` policy).

- ``"throughput"`` (BFTrainer's, the default): every sample is worth the same; weight 1.
- ``"jct"`` (mean job completion time, after AITurbo): a *predictable* job (finite total
  samples and a known curve) is weighted by the inverse of its remaining time at its best
  size, so the nodes go first to the jobs that will finish soonest (shortest remaining
  processing time, the order that minimises mean completion time on one machine). An
  *unpredictable* job (no finite total) gets a level of a multi-level feedback queue: a
  Borda count ranks it on two signals — attained service (less is better) and the estimated
  speed-up its curve (the JPA's estimate, when learnt) promises from one node to its maximum —
  and level ``l`` weighs ``2**-l``.
- ``"mix"``: ``(1 - a) * 1 + a * jct`` with ``a = jct_weight``.

Weights are normalised to mean 1 so that rescale costs keep their meaning.

>>> from malleparsl.allocator import JobView
>>> from malleparsl.model import JobSpec, ScalingCurve
>>> c = ScalingCurve((1, 2), (1.0, 2.0))
>>> short = JobView(JobSpec("s", max_nodes=2, total_samples=10.0, curve=c), c)
>>> long = JobView(JobSpec("l", max_nodes=2, total_samples=1000.0, curve=c), c)
>>> w = priority_weights([short, long], "jct")
>>> bool(w[0] > w[1])
True
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from malleparsl.allocator.base import JobView

__all__ = ["OBJECTIVES", "priority_weights"]

OBJECTIVES = ("throughput", "jct", "mix")
"""Objectives the ``hold`` policy optimises (see the module docstring)."""


def _ranks(x: np.ndarray) -> np.ndarray:
    """0-based ranks, ties sharing their mean rank (a fair Borda count)."""
    order = np.argsort(x, kind="stable")
    ranks = np.empty(len(x))
    ranks[order] = np.arange(len(x))
    for v in np.unique(x):
        tie = x == v
        ranks[tie] = ranks[tie].mean()
    return ranks


def priority_weights(
    jobs: Sequence[JobView], objective: str, jct_weight: float = 0.5
) -> np.ndarray:
    """One weight per job, mean 1 (all ones for ``"throughput"``)."""
    n = len(jobs)
    if objective == "throughput" or n == 0:
        return np.ones(n)
    w = np.ones(n)
    pred = [i for i, j in enumerate(jobs) if math.isfinite(j.remaining)]
    predictable = set(pred)
    unpred = [i for i in range(n) if i not in predictable]
    if pred:
        best: dict[tuple, float] = {}  # best rate per (curve, max size): jobs share curves
        for i in pred:
            key = (jobs[i].curve, jobs[i].hi)
            if key not in best:
                best[key] = max(float(jobs[i].curve.rates_upto(jobs[i].hi).max()), 1e-12)
        t = np.array([jobs[i].remaining / best[(jobs[i].curve, jobs[i].hi)] for i in pred])
        inv = 1.0 / np.maximum(t, 1.0)
        w[pred] = inv / inv.mean()
    if unpred:
        att = np.array([jobs[i].attained_samples for i in unpred])
        gain = np.array(
            [
                float(jobs[i].curve.rate(jobs[i].hi)) / max(float(jobs[i].curve.rate(1)), 1e-12)
                for i in unpred
            ]
        )
        # Borda count: points for low attained service and for high promised speed-up
        pts = _ranks(-att) + _ranks(gain)
        levels = np.floor((pts.max() - pts) / max(1.0, len(unpred) / 2)).astype(float)
        w[unpred] = 2.0**-levels
    w = w / w.mean()
    if objective == "mix":
        w = (1 - jct_weight) + jct_weight * w
    return w
