"""The ``hold`` policy's values and knapsack on one dense (jobs x sizes) table.

Uncapped on the whole Summit machine a decision sees up to ~800 jobs and ~2,000 nodes, and a
per-job computation (now only the tests' reference, ``tests/allocator/hold_oracle.py``) spent
most of its time in numpy call overhead: a curve interpolated per job, a strided view and an
argmax over options per job. Here

- every job's values are computed at once on a ``(J, S + 1)`` table (``S`` the largest size
  any job may take; sizes a job may not take hold ``-inf``), with each curve interpolated once;
- the programme (:func:`~malleparsl.allocator.knapsack.programme`, the one ``milp``'s exact
  path also runs) keeps the best-value vector after every job (``J x (N + 1)`` floats) instead
  of an argmax per job and cell, and recovers each job's choice on the way back with one
  argmax over its options at the single node budget that matters;
- a waiting job none of whose starts is worth anything leaves the vector as it is (skipped).

The answers are *bit-identical* to that per-job reference, not just as good: every value is the
same IEEE operation on the same operands, the programme adds the same numbers in the same job
order, and a tie between options still goes to the smallest size (``argmax`` takes the first
maximum; a skipped job's options can at best tie with keeping 0 nodes, since the best-value
vector never decreases with the budget). ``tests/allocator/test_hold_table.py`` holds the two
to equality.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from malleparsl.allocator.base import JobView
from malleparsl.allocator.costs import PAUSE, RescaleCosts
from malleparsl.allocator.knapsack import programme
from malleparsl.model import ScalingCurve

__all__ = ["HOLD_CAP_S", "best_counts_table", "hold_value_table"]

HOLD_CAP_S = 1e9
"""Longest holding time a value counts (~32 years: "for ever" on any trace). An infinite
horizon (``node_end_s=inf``) with an infinite total would make a grow worth ``+inf`` and a
shrink ``-inf``, and the programme's ``-inf + inf`` is NaN; capped, every value is finite and
options still rank by rate difference."""


def _rate_tables(jobs: Sequence[JobView], top: int) -> np.ndarray:
    """``R[j, k]`` = rate of job ``j``'s curve at ``k`` nodes, ``k`` in ``0..top``."""
    rows: dict[ScalingCurve, int] = {}
    idx = np.empty(len(jobs), dtype=np.int64)
    for i, j in enumerate(jobs):
        idx[i] = rows.setdefault(j.curve, len(rows))
    # np.interp evaluates each point alone, so one long table equals every per-job one
    table = np.stack([c.rates_upto(top) for c in rows]) if rows else np.zeros((0, top + 1))
    return table[idx]


def hold_value_table(
    jobs: Sequence[JobView],
    n_nodes: int,
    free_h: float,
    own_h: Sequence[float],
    prio: np.ndarray,
    costs: RescaleCosts = PAUSE,
) -> np.ndarray:
    """``prio[j]`` times job ``j``'s hold value at ``k`` nodes (the formulas of
    :mod:`~malleparsl.allocator.hold`) for ``k`` in ``0..S``; ``-inf`` off limits.

    ``S`` = the largest size any job may take (``min(hi, n_nodes)``; a job with plan holes,
    ``JobView.sizes``, takes only its runnable ones); ``free_h``: expected idle time left on
    the nodes a job would grow onto; ``own_h[j]``: on the nodes job ``j`` holds (what a shrink
    gives up).
    """
    nj = len(jobs)
    lo = np.fromiter((j.lo for j in jobs), np.int64, nj)
    hi = np.minimum(np.fromiter((j.hi for j in jobs), np.int64, nj), n_nodes)
    cur = np.fromiter((len(j.current) for j in jobs), np.int64, nj)
    smax = int(max(int(hi.max(initial=0)), 0))
    top = int(max(smax, int(cur.max(initial=0))))
    rates = _rate_tables(jobs, top)
    k = np.arange(smax + 1)
    rk = rates[:, : smax + 1]
    c = cur[:, None]
    rc = np.take_along_axis(rates, c, axis=1)
    left = np.fromiter((j.remaining for j in jobs), float, nj)[:, None]
    up = np.fromiter((j.spec.rescale_up_s for j in jobs), float, nj)[:, None]
    down = np.fromiter((j.spec.rescale_down_s for j in jobs), float, nj)[:, None]
    weight = np.fromiter((j.spec.weight for j in jobs), float, nj)[:, None]
    own = np.asarray(own_h, dtype=float)[:, None]
    # the same operations, operand for operand, as the tests' per-job reference (bit-identical)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        job_h = np.where(rk > 0, left / np.maximum(rk, 1e-300), math.inf)
    h_grow = np.minimum(np.minimum(free_h, job_h), HOLD_CAP_S)
    h_own = np.minimum(np.minimum(own, job_h), HOLD_CAP_S)
    exposure = np.where(job_h > free_h, down * rk, 0.0)
    # the rate the pause is paid at (costs.RescaleCosts): PAUSE, the new size (a start pays
    # too); OLD_RATE, BFTrainer's accounting, the size before (a start is free)
    paid = rk if costs.at_new_size else np.broadcast_to(rc, rk.shape)
    # a stopped job that would finish on these nodes pays its start pause now or later, but
    # pays it once whatever happens: charging it here would leave a job whose last samples
    # take less than the pause stopped for ever (its result never delivered)
    pause = np.where((c == 0) & (job_h <= free_h), 0.0, up * paid)
    # a flat stretch (equal rates) gains or loses nothing however long it is held
    grow = np.where(rk != rc, (rk - rc) * h_grow, 0.0) - pause - exposure
    shrink = -np.where(rk != rc, (rc - rk) * h_own, 0.0) - down * paid
    val = np.where(k > c, grow, np.where(k < c, shrink, 0.0))
    out = np.asarray(prio, dtype=float)[:, None] * (weight * val)
    allowed = (k == 0) | ((k >= lo[:, None]) & (k <= hi[:, None]))
    for i, j in enumerate(jobs):  # plan holes (JobView.sizes): only jobs that have them
        if j.sizes is not None:
            allowed[i, 1:] &= np.isin(k[1:], j.sizes)
    out[~allowed] = -np.inf
    return out


def best_counts_table(n_nodes: int, jobs: Sequence[JobView], table: np.ndarray) -> dict[str, int]:
    """Exact multiple-choice knapsack over ``table[j, k]`` (value of ``k`` nodes for job ``j``).

    Every job may keep its count (value 0), so the programme is feasible whenever the current
    allocation is; a tie between options goes to the smallest size.
    """
    if not len(jobs):
        return {}
    # a job that holds nothing and gains nothing by starting cannot change the best values
    idle = np.fromiter((not j.current for j in jobs), bool, len(jobs))
    idle &= ~(table[:, 1:] > 0).any(axis=1)
    chosen, _ = programme([(None, row) for row in table], n_nodes, from_cap=False, skip=idle)
    return {j.job_id: k for j, k in zip(jobs, chosen)}
