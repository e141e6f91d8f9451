"""Exact one-pool count model by dynamic programming: no solver, no time limit to hit.

With one horizon level (``milp``, and ``milp-horizon`` with ``max_levels=1``) the count model
has a single capacity row, ``sum_j use_j <= free`` with ``use`` = nodes an option takes from the
pool (negative when it releases nodes). That is a multiple-choice knapsack over at most
``N`` units, solved exactly by dynamic programming in ``O(options x N)`` vector operations
after the reduction has removed the options that cannot be optimal (typically a few dozen
to a few hundred rows, so a millisecond or two at 512 nodes).

Branch and bound on the same model is fast on most instances but not all: on the Theta log at
512 nodes HiGHS needed up to 23 s to prove optimality among 250-420 options of ten jobs, many
with the same curve and so many equally good combinations (see docs/allocator.md). The
programme's time depends only on the table's size.

>>> import numpy as np
>>> from malleparsl.allocator.countmodel import OptionTable
>>> t = OptionTable(job=np.array([0, 0, 1, 1]), size=np.array([0, 2, 0, 2]),
...                 level=np.array([-1, 0, -1, 0]), demand=np.array([0, 2, 0, 2]),
...                 supply=np.zeros((4, 1), dtype=int), value=np.array([0.0, 5.0, 0.0, 3.0]),
...                 free=np.array([3]), levels=np.array([10.0]), hold=np.zeros(4))
>>> solve_one_pool(t, 2)
[1, 2]
"""

from __future__ import annotations

import numpy as np

from malleparsl.allocator.countmodel import OptionTable
from malleparsl.allocator.reduction import net_use

__all__ = ["CHUNK_CELLS", "MAX_CELLS", "solve_one_pool"]

MAX_CELLS = 20_000_000
"""Largest ``options x (capacity + 1)`` the programme takes on (~0.1 s of numpy; larger
tables go to the time-limited solver)."""
CHUNK_CELLS = 1_000_000
"""Cells evaluated at once (8 MB of floats per array)."""


def solve_one_pool(
    table: OptionTable, n_jobs: int, *, max_cells: int = MAX_CELLS
) -> list[int] | None:
    """Row of the optimal option per job, or ``None`` when the programme does not apply.

    ``None``: several pools (nested horizon levels), a job without options, no feasible
    choice, or a table larger than ``max_cells``. Ties go to the first row of a job.
    """
    if table.levels.size != 1 or len(table) == 0:
        return None
    job = table.job
    rows_of = [np.flatnonzero(job == j) for j in range(n_jobs)]
    if any(r.size == 0 for r in rows_of):
        return None
    use = net_use(table)[:, 0].astype(np.int64)
    # shift each job's uses to start at 0; the capacity grows by the same amounts
    shift = np.asarray([-int(use[r].min()) for r in rows_of], dtype=np.int64)
    weight = use + shift[job]
    cap = int(table.free[0]) + int(shift.sum())
    if cap < 0:
        return None
    cap = min(cap, int(sum(int(weight[r].max()) for r in rows_of)))
    if len(table) * (cap + 1) > max_cells:
        return None
    m = np.arange(cap + 1)
    best = np.zeros(cap + 1)  # best[m]: best value of the jobs so far with total weight <= m
    picks: list[np.ndarray] = []
    step = max(1, CHUNK_CELLS // (cap + 1))  # rows per block: bounded memory for big jobs
    for rows in rows_of:
        new, pick = np.full(cap + 1, -np.inf), np.zeros(cap + 1, dtype=np.int64)
        for lo in range(0, rows.size, step):
            block = rows[lo : lo + step]
            idx = m[None, :] - weight[block][:, None]
            cand = np.where(
                idx >= 0, best[np.maximum(idx, 0)] + table.value[block][:, None], -np.inf
            )
            arg = np.argmax(cand, axis=0)
            top = cand[arg, m]
            better = top > new  # ties keep the earlier block's (lower) row
            new[better], pick[better] = top[better], block[arg[better]]
        best = new
        picks.append(pick)
    if not np.isfinite(best[cap]):
        return None
    chosen: list[int] = []
    left = cap
    for rows_pick in reversed(picks):
        i = int(rows_pick[left])
        chosen.append(i)
        left -= int(weight[i])
    return chosen[::-1]
