"""Exact one-pool count model by dynamic programming: no solver, no time limit to hit.

With one horizon level (``milp``, and ``milp-horizon`` with ``max_levels=1``) the count model
has a single capacity row, ``sum_j use_j <= free`` with ``use`` = nodes an option takes from the
pool (negative when it releases nodes). That is a multiple-choice knapsack over at most
``N`` units, solved exactly by dynamic programming in ``O(options x N)`` vector operations
after the reduction has removed the options that cannot be optimal (typically a few dozen
to a few hundred rows, so a millisecond or two at 512 nodes).

:func:`programme` is also ``hold``'s knapsack (:mod:`~malleparsl.allocator.value_table`):
there every job has every size ``0..S`` (a dense table, read as views, no gather), counts are
absolute (no releases, budget = all nodes) and the choice is recovered from the smallest budget
reaching the best value; here options are sparse rows whose weight is the shifted net use.

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

from collections.abc import Sequence

import numpy as np

from malleparsl.allocator.countmodel import OptionTable
from malleparsl.allocator.reduction import net_use

__all__ = ["CHUNK_CELLS", "MAX_CELLS", "programme", "solve_one_pool"]

MAX_CELLS = 20_000_000
"""Largest ``options x (capacity + 1)`` the programme takes on (~0.1 s of numpy; larger
tables go to the time-limited solver)."""
CHUNK_CELLS = 1_000_000
"""Cells evaluated at once (8 MB of floats per array)."""


def programme(
    options: Sequence[tuple[np.ndarray | None, np.ndarray]],
    cap: int,
    *,
    from_cap: bool = True,
    skip: np.ndarray | None = None,
) -> tuple[list[int], float]:
    """Exact multiple-choice knapsack: one option per job, weights sum <= ``cap``.

    ``options[j] = (weights, values)``: job ``j``'s options (weights ``>= 0``; ``None``: the
    weights are ``0, 1, ..., len(values) - 1``, every job then the same length, as ``hold``'s
    table). Returns the index of each job's option and the best value (``-inf``: no feasible
    choice). A tie goes to a job's first option. The choice is recovered from budget ``cap``
    (``from_cap``) or from the smallest budget that reaches the best value; a ``skip``-ped
    job takes its first option and leaves the programme as it is (for options that can at best
    tie with it: ``hold``'s waiting jobs whose starts are worth nothing).

    The best-value vector after each job is kept (``J x (cap + 1)`` floats) and each job's
    choice recovered with one argmax at the single budget that matters; a job's candidates are
    contiguous windows of that vector (a view when the weights are ``0..S``, a row gather
    otherwise), at most ``CHUNK_CELLS`` at once.
    """
    nj = len(options)
    if nj == 0:
        return [], 0.0
    s = max(len(v) - 1 if w is None else int(w.max(initial=0)) for w, v in options)
    pad = np.full(s + cap + 1, -np.inf)  # pad[s + m] = best[m]; -inf below a budget of 0
    pad[s:] = 0.0
    best = pad[s:]
    # win[t, m] = pad[t + m] = best[m - (s - t)]: a view re-read after every job
    win = np.lib.stride_tricks.as_strided(
        pad, (s + 1, cap + 1), (pad.strides[0],) * 2, writeable=False
    )
    hist = np.empty((nj, cap + 1))  # best before each job
    step = max(1, CHUNK_CELLS // (cap + 1))  # option rows per block: bounded memory
    # rows of the largest option list (repeated weights may make it longer than s + 1)
    buf = np.empty((min(max(len(v) for _, v in options), step), cap + 1))
    new, top = np.empty(cap + 1), np.empty(cap + 1)
    for i, (w, v) in enumerate(options):
        hist[i] = best
        if skip is not None and skip[i]:
            continue
        for lo in range(0, len(v), step):
            hi = min(len(v), lo + step)
            out = buf[: hi - lo]
            if w is None:  # options largest first (t = s - k): contiguous rows of the view
                np.add(win[s - hi + 1 : s - lo + 1], v[lo:hi][::-1, None], out=out)
            else:
                np.add(win[s - w[lo:hi]], v[lo:hi, None], out=out)
            # the max of a set of floats does not depend on the order it is taken in
            if hi == len(v) and lo == 0:  # one block: straight into the vector
                out.max(axis=0, out=best)
            elif lo == 0:
                out.max(axis=0, out=new)
            else:
                np.maximum(new, out.max(axis=0, out=top), out=new)
        if len(v) > step:
            best[:] = new
    m = cap if from_cap else int(np.argmax(best))
    value = float(best[m])
    chosen = [0] * nj
    for i in range(nj - 1, -1, -1):
        w, v = options[i]
        if skip is not None and skip[i]:
            continue
        if w is None:  # the options at budget m, smallest weight first
            kk = min(len(v) - 1, m)
            k = int(np.argmax(hist[i, m - kk : m + 1][::-1] + v[: kk + 1]))
            m -= k
        else:  # argmax takes the first maximum: a tie goes to the first option
            cand = np.where(w <= m, hist[i].take(m - w, mode="clip") + v, -np.inf)
            k = int(np.argmax(cand))
            m -= int(w[k])
        chosen[i] = k
    return chosen, value


def solve_one_pool(
    table: OptionTable, n_jobs: int, *, max_cells: int = MAX_CELLS
) -> list[int] | None:
    """Row of the optimal option per job, or ``None`` when the programme does not apply.

    ``None``: several pools (nested horizon levels), a job without options, no feasible
    choice, or a table larger than ``max_cells``. Ties go to the first row of a job.
    """
    if table.levels.size != 1 or len(table) == 0:
        return None
    counts = np.bincount(table.job, minlength=n_jobs)
    if counts.size != n_jobs or not counts.all():
        return None
    order = np.argsort(table.job, kind="stable")  # each job's rows together, in row order
    starts = np.concatenate(([0], np.cumsum(counts)[:-1]))
    use = net_use(table)[order, 0].astype(np.int64)
    # shift each job's uses to start at 0; the capacity grows by the same amounts
    shift = -np.minimum.reduceat(use, starts)
    weight = use + np.repeat(shift, counts)
    cap = int(table.free[0]) + int(shift.sum())
    if cap < 0:
        return None
    cap = min(cap, int(np.maximum.reduceat(weight, starts).sum()))
    if len(table) * (cap + 1) > max_cells:
        return None
    value = table.value[order]
    ends = starts + counts
    chosen, best = programme([(weight[a:b], value[a:b]) for a, b in zip(starts, ends)], cap)
    if not np.isfinite(best):
        return None
    return [int(order[a + k]) for a, k in zip(starts, chosen)]
