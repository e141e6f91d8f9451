"""Exact problem reduction for the count MILP: drop options that provably cannot be optimal.

The count model is a multiple-choice knapsack. Its LP relaxation is tight and solves in
milliseconds; from its pool duals ``lambda >= 0`` every option gets a Lagrangian reduced value
``rho_i = v_i - lambda . a_i`` (``a_i``: the option's net pool use per level), and

    U(lambda) = lambda . free + sum_j max_{i in j} rho_i

bounds the MILP optimum from above for *any* ``lambda >= 0`` (weak duality). Forcing option
``i`` of job ``j`` lowers that bound by ``max_{i' in j} rho_i' - rho_i``; if the forced bound is
below the value of a known feasible choice (the LP solution rounded down), no optimal solution
uses ``i`` and it is removed. Typically only a handful of options per job survive, so the MILP
left for HiGHS or CBC is tiny. Correctness never depends on the duals being exact — only how
much gets removed.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from malleparsl.allocator.countmodel import OptionTable
from malleparsl.allocator.highs import highspy

log = logging.getLogger(__name__)

__all__ = ["Reduction", "net_use", "reduce_options"]


def net_use(table: OptionTable) -> np.ndarray:
    """``a[i, L]``: nodes option ``i`` takes from the level-``L`` pool (negative: releases)."""
    lev = np.arange(table.levels.size)
    grows = (table.level[:, None] >= 0) & (table.level[:, None] <= lev[None, :])
    return table.demand[:, None] * grows - table.supply


@dataclass(frozen=True)
class Reduction:
    """Which options survive, with the bounds that justified it."""

    keep: np.ndarray  # bool per option
    upper: float  # Lagrangian upper bound on the optimum
    lower: float  # value of a feasible choice
    incumbent: np.ndarray  # option row per job of that feasible choice


def _lp_relaxation(
    table: OptionTable, use: np.ndarray, n_jobs: int
) -> tuple[np.ndarray, np.ndarray] | None:
    """Pool multipliers ``lambda >= 0`` and the primal ``x`` of HiGHS's LP relaxation."""
    n_opt, n_lev = use.shape
    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    h.setOptionValue("threads", 1)
    lp = highspy.HighsLp()
    lp.num_col_, lp.num_row_ = n_opt, n_jobs + n_lev
    lp.sense_ = highspy.ObjSense.kMaximize
    lp.col_cost_ = table.value.astype(float)
    lp.col_lower_ = np.zeros(n_opt)
    lp.col_upper_ = np.ones(n_opt)
    lp.row_lower_ = np.concatenate([np.ones(n_jobs), np.full(n_lev, -highspy.kHighsInf)])
    lp.row_upper_ = np.concatenate([np.ones(n_jobs), table.free.astype(float)])
    # column-wise matrix: option i has a 1 in its job row and use[i, L] in pool row L
    rows = np.concatenate(
        [table.job[:, None], n_jobs + np.broadcast_to(np.arange(n_lev), (n_opt, n_lev))], axis=1
    )
    vals = np.concatenate([np.ones((n_opt, 1)), use.astype(float)], axis=1)
    mask = vals != 0
    lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
    lp.a_matrix_.start_ = np.concatenate(([0], np.cumsum(mask.sum(axis=1)))).astype(np.int32)
    lp.a_matrix_.index_ = rows[mask].astype(np.int32)
    lp.a_matrix_.value_ = vals[mask]
    h.passModel(lp)
    h.run()
    if h.getModelStatus() != highspy.HighsModelStatus.kOptimal:
        return None
    sol = h.getSolution()
    duals = np.abs(np.asarray(sol.row_dual[n_jobs:], dtype=float))
    # sign conventions differ by sense; any lambda >= 0 gives a valid bound
    return duals, np.asarray(sol.col_value, dtype=float)


def _group_max(values: np.ndarray, job: np.ndarray, n_jobs: int) -> np.ndarray:
    out = np.full(n_jobs, -np.inf)
    np.maximum.at(out, job, values)
    return out


def _scalar_lambda(table: OptionTable, use: np.ndarray, n_jobs: int) -> np.ndarray:
    """Minimise the convex ``U(lambda)`` over one multiplier by bisection on its subgradient.

    Rows of the table are grouped by job (``build_options`` emits them so), which lets each
    evaluation use ``reduceat`` instead of sorting.
    """
    a, free = use[:, 0].astype(float), float(table.free[0])
    starts = np.flatnonzero(np.concatenate(([True], table.job[1:] != table.job[:-1])))
    lo, hi = 0.0, 1.0
    while _subgradient(table.value, a, starts, free, hi) < 0 and hi < 1e18:
        hi *= 4.0
    for _ in range(64):
        mid = 0.5 * (lo + hi)
        if _subgradient(table.value, a, starts, free, mid) < 0:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-12 * hi:
            break
    return np.asarray([hi])


def _subgradient(
    value: np.ndarray, a: np.ndarray, starts: np.ndarray, free: float, lam: float
) -> float:
    """``free - sum_j a`` of each job's best option at ``lam`` (ties: the smallest use)."""
    rho = value - lam * a
    best = np.maximum.reduceat(rho, starts)
    counts = np.diff(np.append(starts, rho.size))
    at_best = rho >= np.repeat(best, counts) - 1e-9 * np.abs(np.repeat(best, counts))
    return free - float(np.minimum.reduceat(np.where(at_best, a, np.inf), starts).sum())


def _fits(table: OptionTable, use: np.ndarray, rows: np.ndarray) -> bool:
    return bool(np.all(use[rows].sum(axis=0) <= table.free))


def _incumbent(
    table: OptionTable,
    use: np.ndarray,
    rho: np.ndarray,
    n_jobs: int,
    x: np.ndarray | None = None,
) -> np.ndarray:
    """A good feasible choice: the LP's (or the best reduced) options, repaired, improved."""
    best = _group_max(rho, table.job, n_jobs)[table.job]
    near = rho >= best - 1e-9 * np.abs(best)  # ties as in _subgradient: the smallest use wins
    if x is not None:  # the LP's choice: its largest weight per job
        near = x >= _group_max(x, table.job, n_jobs)[table.job] - 1e-9
    order = np.lexsort((-table.value, use.sum(axis=1), ~near, table.job))
    first = np.ones(order.size, dtype=bool)
    first[1:] = table.job[order][1:] != table.job[order][:-1]
    pick = order[first]  # one row per job, in job order
    # each job's best non-growing option: always feasible together (they only release nodes)
    nongrow = np.flatnonzero(table.level < 0)
    by = nongrow[np.lexsort((-table.value[nongrow], table.job[nongrow]))]
    head = np.concatenate(([True], table.job[by][1:] != table.job[by][:-1]))
    safe = np.full(n_jobs, -1)
    safe[table.job[by[head]]] = by[head]
    sval = table.value[safe]
    if x is not None and not _fits(table, use, pick):
        # the LP splits a few jobs between options: round them to their best non-growing option,
        # or to their smallest (which releases a superset of nodes); the moves below regrow them
        split = np.flatnonzero(_group_max(x, table.job, n_jobs) < 1 - 1e-6)
        pick[split] = safe[split]
        if not _fits(table, use, pick):
            nongrow = np.flatnonzero(table.level < 0)
            by = nongrow[np.lexsort((table.size[nongrow], table.job[nongrow]))]
            head = np.concatenate(([True], table.job[by][1:] != table.job[by][:-1]))
            smallest = np.full(n_jobs, -1)
            smallest[table.job[by[head]]] = by[head]
            pick[split] = smallest[split]
    if not _fits(table, use, pick):
        for j in np.argsort(table.value[pick] - sval):  # drop the cheapest growth first
            pick[j] = safe[j]
            if _fits(table, use, pick):
                break
    cand = _candidates(table, best - rho, per_job=4)
    for _ in range(4 * n_jobs + 10):
        if not (_single_move(table, use, pick) or _pair_move(table, use, pick, cand)):
            break
    return pick


def _candidates(table: OptionTable, regret: np.ndarray, per_job: int) -> np.ndarray:
    """The ``per_job`` options of each job with the smallest Lagrangian regret."""
    order = np.lexsort((regret, table.job))
    rank = np.arange(order.size) - np.searchsorted(table.job[order], table.job[order])
    return order[rank < per_job]


def _single_move(table: OptionTable, use: np.ndarray, pick: np.ndarray) -> bool:
    """Switch one job to the option gaining most that still fits the leftover pools."""
    slack = table.free - use[pick].sum(axis=0)
    delta = use - use[pick[table.job]]
    gain = table.value - table.value[pick[table.job]]
    ok = np.all(delta <= slack[None, :], axis=1) & (gain > 1e-9 * np.abs(table.value) + 1e-9)
    if not ok.any():
        return False
    i = int(np.flatnonzero(ok)[np.argmax(gain[ok])])
    pick[table.job[i]] = i
    return True


def _pair_move(table: OptionTable, use: np.ndarray, pick: np.ndarray, cand: np.ndarray) -> bool:
    """Switch two jobs at once (one frees nodes the other takes) if that gains and fits."""
    slack = table.free - use[pick].sum(axis=0)
    jobs = table.job[cand]
    delta = use[cand] - use[pick[jobs]]  # (C, L)
    gain = table.value[cand] - table.value[pick[jobs]]
    total = gain[:, None] + gain[None, :]
    fits = np.all(delta[:, None, :] + delta[None, :, :] <= slack[None, None, :], axis=2)
    ok = fits & (jobs[:, None] != jobs[None, :]) & (total > 1e-9 * np.abs(table.value).max())
    if not ok.any():
        return False
    a, b = np.unravel_index(int(np.argmax(np.where(ok, total, -np.inf))), ok.shape)
    pick[jobs[a]], pick[jobs[b]] = cand[a], cand[b]
    return True


def reduce_options(table: OptionTable, n_jobs: int, *, gap: float = 0.0) -> Reduction | None:
    """Options that may be optimal, or ``None`` if the LP could not be used.

    With ``gap > 0``, options that could improve on the feasible choice by no more than
    ``gap * |U|`` are dropped too: what remains still contains a solution within ``gap`` of
    the optimum (relative to the bound ``U``).
    """
    if len(table) == 0:
        return None
    use = net_use(table)
    x = None
    if table.levels.size == 1:
        lam = _scalar_lambda(table, use, n_jobs)
    else:
        got = _lp_relaxation(table, use, n_jobs)
        if got is None:
            return None
        lam, x = got
    rho = table.value - use @ lam
    best_rho = _group_max(rho, table.job, n_jobs)
    upper = float(lam @ table.free + best_rho.sum())
    pick = _incumbent(table, use, rho, n_jobs, x)
    lower = float(table.value[pick].sum())
    tol = 1e-9 * max(1.0, abs(upper)) + 1e-6
    keep = upper - (best_rho[table.job] - rho) >= lower + gap * abs(upper) - tol
    keep[pick] = True
    log.debug(
        "reduction: %d of %d options kept (U=%.6g, L=%.6g)", keep.sum(), keep.size, upper, lower
    )
    return Reduction(keep=keep, upper=upper, lower=lower, incumbent=pick)
