"""The ``hold`` policy's per-job reference: values and knapsack one job at a time (test only).

The shipped policy computes both on one table (:mod:`malleparsl.allocator.value_table`); the
tests hold that path to this plain one to the bit. ``oracle_table`` and ``oracle_counts`` take
the table path's arguments, so a test can swap them into :mod:`malleparsl.allocator.hold` and
run the whole policy (and a simulation) on the reference.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from malleparsl.allocator.base import JobView
from malleparsl.allocator.costs import PAUSE, RescaleCosts
from malleparsl.allocator.objective import allowed_sizes
from malleparsl.allocator.value_table import HOLD_CAP_S


def hold_values(
    view: JobView,
    sizes: np.ndarray,
    free_h: float,
    own_h: float,
    costs: RescaleCosts = PAUSE,
) -> np.ndarray:
    """Value of ``view`` at each count in ``sizes`` relative to keeping its current count
    (the formulas of :mod:`malleparsl.allocator.hold`'s docstring, one job at a time)."""
    sizes = np.asarray(sizes, dtype=np.int64)
    c = len(view.current)
    top = int(max(int(sizes.max(initial=0)), c))
    r = view.curve.rates_upto(top)
    rc, rk = r[c], r[sizes]
    left = view.remaining
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        job_h = np.where(rk > 0, left / np.maximum(rk, 1e-300), math.inf)
    s = view.spec
    h_grow = np.minimum(np.minimum(free_h, job_h), HOLD_CAP_S)
    h_own = np.minimum(np.minimum(own_h, job_h), HOLD_CAP_S)
    exposure = np.where(job_h > free_h, s.rescale_down_s * rk, 0.0)
    paid = rk if costs.at_new_size else rc
    pause = np.where((c == 0) & (job_h <= free_h), 0.0, s.rescale_up_s * paid)
    grow = np.where(rk != rc, (rk - rc) * h_grow, 0.0) - pause - exposure
    shrink = -np.where(rk != rc, (rc - rk) * h_own, 0.0) - s.rescale_down_s * paid
    val = np.where(sizes > c, grow, np.where(sizes < c, shrink, 0.0))
    return s.weight * val


def best_counts(
    n_nodes: int, jobs: Sequence[JobView], values: Sequence[tuple[np.ndarray, np.ndarray]]
) -> dict[str, int]:
    """Exact multiple-choice knapsack: one (size, value) option per job, sizes sum <= nodes;
    a tie goes to the smallest size (argmax takes the first maximum)."""
    best = np.zeros(n_nodes + 1)
    choices = []
    for sizes, vals in values:
        ok = sizes <= n_nodes
        sizes, vals = sizes[ok], vals[ok]
        smax = int(sizes.max(initial=0))
        padded = np.concatenate((np.full(smax, -np.inf), best))
        windows = np.lib.stride_tricks.sliding_window_view(padded, n_nodes + 1)[smax - sizes]
        cand = windows + vals[:, None]
        pick = np.argmax(cand, axis=0)
        best = cand[pick, np.arange(n_nodes + 1)]
        choices.append(sizes[pick])
    counts: dict[str, int] = {}
    m = int(np.argmax(best))
    for j, arg in zip(reversed(jobs), reversed(choices)):
        k = int(arg[m])
        counts[j.job_id] = k
        m -= k
    return counts


def oracle_table(
    jobs: Sequence[JobView],
    n_nodes: int,
    free_h: float,
    own_h: Sequence[float],
    prio: np.ndarray,
    costs: RescaleCosts = PAUSE,
) -> np.ndarray:
    """:func:`~malleparsl.allocator.value_table.hold_value_table`, row by row from
    :func:`hold_values` (``-inf`` at the sizes a job may not take)."""
    width = max((min(j.hi, n_nodes) for j in jobs), default=0) + 1
    table = np.full((len(jobs), width), -np.inf)
    for row, j, w, own in zip(table, jobs, prio, own_h):
        sizes = allowed_sizes(j, n_nodes)
        row[sizes] = w * hold_values(j, sizes, free_h, own, costs)
    return table


def oracle_counts(n_nodes: int, jobs: Sequence[JobView], table: np.ndarray) -> dict[str, int]:
    """:func:`~malleparsl.allocator.value_table.best_counts_table` by :func:`best_counts` over
    each job's allowed sizes."""
    values = []
    for row, j in zip(table, jobs):
        sizes = allowed_sizes(j, n_nodes)
        values.append((sizes, row[sizes]))
    return best_counts(n_nodes, jobs, values)
