"""The count model: every job picks one (node count, horizon level) option; pools stay feasible.

Nodes are interchangeable except for how long they stay idle, so instead of BFTrainer's binary
node-to-job variables the count MILP gives each job one binary per *option* and asks for exactly
one (a multiple-choice knapsack: tight LP relaxation, a few thousand binaries at 100 jobs x 4,734
nodes). An option is a node count ``k``; a growing option also names the horizon level ``b`` its
new nodes must reach.

Horizons (seconds a node stays idle, from :func:`~malleparsl.allocator.placement.node_horizons`)
are rounded *down* to at most ``max_levels`` thresholds ``H_1 > ... > H_B`` (exact when there
are that few distinct values). With ``c`` nodes held now and ``r`` the curve, an option is worth
(times the job's weight)::

    keep    k == c     Tfwd * r(c)
    grow    k > c      Tfwd * r(c) + (r(k) - r(c)) * H_b       - rescale_up_s   * r(c)
    shrink  k < c      Tfwd * r(c) - (r(c) - r(k)) * H_rel(k)  - rescale_down_s * r(c)

The rescale terms are those of the cost rule in use (:mod:`~malleparsl.allocator.costs`,
``costs=``): above, BFTrainer's (``OLD_RATE``: the pause at the old rate, so a start is free);
with ``PAUSE`` the pause is paid at ``r(k)``. ``weights`` (default: each spec's ``weight``)
scale a job's values, e.g. to value work rather than samples (``milp(value="work")``).

The gain of growing lasts until the first new node leaves (``H_b``, the lowest horizon among
them); a shrinking job releases its shortest-lived nodes and its loss lasts as long as the
longest of those would have stayed (``H_rel``). Both readings are the pessimistic ones, so the
model rescales only when it pays. When no node has a known end every horizon is ``Tfwd`` and the
values reduce exactly to BFTrainer's objective (see :mod:`~malleparsl.allocator.objective`).

With ``max_levels=1`` (``milp-horizon``'s default) there is one pool and ``H_b`` becomes, per
growing option, the running minimum of the horizons the job would get if it were first in line
(free nodes, then other jobs' nodes, longest first): the same one-constraint knapsack as
``milp``, hence as fast; :mod:`~malleparsl.allocator.milp` then undoes growth that the nodes
actually placed do not repay. With finite ``total_samples`` a gain lasts at most
``total_samples / r(k)`` seconds (the job cannot use a node longer than it trains). With
``exposure="first"`` a grow whose first new node leaves before the job is done also pays
``rescale_down_s x r(k)``, the shrink pause that departure will cause; ``"each"`` pays it
once per distinct departure time among the new nodes. With ``refill="stop"`` a stop (a running
job shrunk to 0 nodes) pays the restart it causes, a start back at ``c`` nodes under the cost
rule (``rescale_up_s x r(c)`` with ``PAUSE``; :func:`restart_pause`).

Feasibility, for every level ``L``: nodes demanded at horizon >= ``H_L`` by growing jobs <= free
nodes at that level + nodes released at that level. The sets are nested, so this is also
sufficient (Hall's condition), and :func:`~malleparsl.allocator.placement.place` realises it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from malleparsl.allocator.base import ClusterSnapshot, JobView
from malleparsl.allocator.costs import OLD_RATE, RescaleCosts
from malleparsl.allocator.objective import allowed_sizes
from malleparsl.model import NodeId

__all__ = [
    "OptionTable", "build_options", "horizon_levels", "horizon_objective", "restart_pause"
]


def horizon_levels(vals: np.ndarray, max_levels: int) -> np.ndarray:
    """Descending thresholds: the distinct horizons, or ``max_levels`` quantiles of them."""
    vals = np.asarray(vals, dtype=float)
    if vals.size == 0:
        return np.zeros(1)
    distinct = np.unique(vals)[::-1]
    if distinct.size <= max_levels:
        return distinct
    # equal-count classes: thresholds at the 0, 1/B, ..., (B-1)/B quantiles (the lowest one is
    # the minimum, so every node has a level)
    qs = np.quantile(vals, np.arange(max_levels) / max_levels, method="lower")
    return np.unique(qs)[::-1]


@dataclass(frozen=True)
class OptionTable:
    """All options of all jobs, as parallel arrays (one row per option)."""

    job: np.ndarray  # int: index into the jobs sequence
    size: np.ndarray  # int: node count k
    level: np.ndarray  # int: demanded horizon level of a growing option, -1 otherwise
    demand: np.ndarray  # int: nodes taken from the pool (k - c when growing, else 0)
    supply: np.ndarray  # int (options x levels): released nodes with horizon >= H_L
    value: np.ndarray  # float: objective value
    free: np.ndarray  # int (levels): unheld nodes with horizon >= H_L
    levels: np.ndarray  # float: thresholds H_1 > ... > H_B
    hold: np.ndarray  # float: seconds a growing option's gain is assumed to last (else 0)

    def __len__(self) -> int:
        return int(self.job.size)

    def subset(self, mask: np.ndarray) -> OptionTable:
        """The table restricted to the rows where ``mask`` is true."""
        return OptionTable(
            job=self.job[mask],
            size=self.size[mask],
            level=self.level[mask],
            demand=self.demand[mask],
            supply=self.supply[mask],
            value=self.value[mask],
            free=self.free,
            levels=self.levels,
            hold=self.hold[mask],
        )


def _prune_nongrow(sizes: np.ndarray, vals: np.ndarray) -> np.ndarray:
    """Keep non-growing options not beaten by a smaller one (smaller releases a superset)."""
    order = np.argsort(sizes, kind="stable")
    v = vals[order]
    before = np.maximum.accumulate(np.concatenate(([-np.inf], v[:-1])))  # best of the smaller sizes
    return order[v > before]


def build_options(
    snapshot: ClusterSnapshot,
    jobs: Sequence[JobView],
    horizons: Mapping[NodeId, float],
    *,
    horizon_aware: bool = False,
    max_levels: int = 8,
    costs: RescaleCosts = OLD_RATE,
    weights: Sequence[float] | None = None,
    exposure: str = "none",
    refill: str = "none",
) -> OptionTable:
    """Every undominated option of every job (a dominated one never beats its dominator).

    Without ``horizon_aware`` every node's horizon is ``tfwd_s``: one level, BFTrainer's values.
    """
    tfwd = snapshot.tfwd_s
    nodes = snapshot.nodes
    n_nodes = len(nodes)
    if horizon_aware:
        hvals = np.fromiter((horizons[n] for n in nodes), dtype=float, count=n_nodes)
    else:  # one level: every node lives tfwd_s, BFTrainer's planning window
        hvals = np.full(n_nodes, tfwd)
    levels = horizon_levels(hvals, max_levels)
    n_lev = levels.size
    lev_arr = np.searchsorted(-levels, -hvals, side="left").astype(np.int64)
    index = {n: i for i, n in enumerate(nodes)}
    held = np.zeros(n_nodes, dtype=bool)
    for j in jobs:
        held[[index[n] for n in j.current]] = True
    free = np.cumsum(np.bincount(lev_arr[~held], minlength=n_lev))
    total_per = np.cumsum(np.bincount(lev_arr, minlength=n_lev))
    one_level = horizon_aware and n_lev == 1 and max_levels == 1
    if one_level:  # growth draws on free nodes first, then on other jobs' nodes, longest first
        free_desc = np.sort(hvals[~held])[::-1]
        owner = np.full(n_nodes, -1)
        for ji, j in enumerate(jobs):
            owner[[index[n] for n in j.current]] = ji
        held_order = np.flatnonzero(held)[np.argsort(-hvals[held], kind="stable")]
    parts: list[tuple[np.ndarray, ...]] = []
    for ji, j in enumerate(jobs):
        sizes = allowed_sizes(j, n_nodes)
        c = len(j.current)
        rates = j.curve.rates_upto(int(max(sizes.max(), c)))
        w, rc = (j.spec.weight if weights is None else weights[ji]), rates[c]
        up_s, down_s = j.spec.rescale_up_s, j.spec.rescale_down_s
        base = tfwd * rc
        # shrinking (or keeping): release the c-k shortest-lived nodes
        if horizon_aware:
            cur = [index[n] for n in sorted(j.current, key=lambda n: (horizons[n], n))]
            cur_h, cur_lev = hvals[cur], lev_arr[cur]  # shortest-lived first
        else:
            cur_h, cur_lev = np.full(c, tfwd), np.zeros(c, dtype=np.int64)
        ng = sizes[sizes <= c]
        h_rel = cur_h[np.maximum(c - ng - 1, 0)] if c else np.zeros(ng.size)
        ng_vals = np.where(
            ng == c,
            w * base,
            w * (base - (rc - rates[ng]) * h_rel - costs.rescale(ng, c, rates, up_s, down_s)
                 - restart_pause(refill, ng, c, rates, up_s, costs)),
        )
        keep_idx = _prune_nongrow(ng, ng_vals)
        # released[m, L]: among the m shortest-lived current nodes, those at level <= L
        onehot = np.zeros((c + 1, n_lev), dtype=np.int64)
        onehot[np.arange(1, c + 1), cur_lev] = 1
        released = np.cumsum(np.cumsum(onehot, axis=0), axis=1)
        kk = ng[keep_idx]
        parts.append(
            (
                np.full(kk.size, ji),
                kk,
                np.full(kk.size, -1),
                np.zeros(kk.size, dtype=np.int64),
                released[c - kk],
                ng_vals[keep_idx],
                np.zeros(kk.size),
            )
        )
        best_ng = float(ng_vals[keep_idx].max()) if keep_idx.size else -np.inf
        # growing: grid of values V[b, k] over levels and sizes
        gs = sizes[sizes > c]
        if gs.size == 0:
            continue
        gain = rates[gs] - rc
        lasts = np.broadcast_to(levels[:, None], (n_lev, gs.size))
        pool = None  # the nodes a grow would take, in order (their own horizons)
        if one_level:
            others = hvals[held_order[owner[held_order] != ji]]
            pool = np.concatenate([free_desc, others])
            # the gain lasts until the first new node leaves: running minimum along the pool
            first_out = np.minimum.accumulate(pool)
            lasts = first_out[np.minimum(gs - c, pool.size) - 1][None, :]
        pay = costs.rescale(gs, c, rates, up_s, down_s)[None, :]
        total = j.spec.total_samples
        if horizon_aware and np.isfinite(total):
            # a gain cannot outlast the job: it trains at most total / r(k) seconds
            with np.errstate(divide="ignore"):
                job_h = (total / rates[gs])[None, :]
            if exposure != "none":  # the new nodes go before the job is done: shrink pauses
                times = _departures(exposure, gs - c, pool, job_h[0])
                pay = pay + np.where(job_h > lasts, times * down_s * rates[gs][None, :], 0.0)
            lasts = np.minimum(lasts, job_h)
        elif horizon_aware and exposure != "none":
            times = _departures(exposure, gs - c, pool, None)
            pay = pay + times * down_s * rates[gs][None, :]
        grid = w * (base + lasts * gain[None, :] - pay)
        avail = total_per - released[c]
        grid = np.where((gs[None, :] - c) <= avail[:, None], grid, -np.inf)
        # best value over options at least as cheap: same-or-lower level, same-or-smaller size
        pref = np.maximum.accumulate(grid, axis=1)
        q = np.maximum.accumulate(pref[::-1], axis=0)[::-1]
        smaller = np.full_like(grid, -np.inf)
        smaller[:, 1:] = q[:, :-1]
        cheaper = np.full_like(grid, -np.inf)
        cheaper[:-1, :] = q[1:, :]
        ok = np.isfinite(grid) & (grid > best_ng) & (grid > smaller) & (grid > cheaper)
        bb, ii = np.nonzero(ok)
        parts.append(
            (
                np.full(bb.size, ji),
                gs[ii],
                bb,
                gs[ii] - c,
                np.zeros((bb.size, n_lev), dtype=np.int64),
                grid[bb, ii],
                np.asarray(lasts)[bb, ii],
            )
        )
    cols = {
        name: (np.concatenate([p[k] for p in parts]) if parts else np.zeros(0))
        for k, name in enumerate(("job", "size", "level", "demand", "supply", "value", "hold"))
    }
    if not parts:
        cols["supply"] = np.zeros((0, n_lev))
    n_opt = int(cols["job"].size)
    return OptionTable(
        job=np.asarray(cols["job"], dtype=np.int64),
        size=np.asarray(cols["size"], dtype=np.int64),
        level=np.asarray(cols["level"], dtype=np.int64),
        demand=np.asarray(cols["demand"], dtype=np.int64),
        supply=(np.asarray(cols["supply"], dtype=np.int64).reshape(n_opt, n_lev)),
        value=np.asarray(cols["value"], dtype=float),
        free=free.astype(np.int64),
        levels=levels,
        hold=np.asarray(cols["hold"], dtype=float),
    )


def horizon_objective(
    snapshot: ClusterSnapshot,
    jobs: Sequence[JobView],
    assignment: Mapping[str, frozenset[NodeId]],
    horizons: Mapping[NodeId, float],
    costs: RescaleCosts = OLD_RATE,
    weights: Sequence[float] | None = None,
    exposure: str = "none",
    refill: str = "none",
) -> float:
    """The horizon-aware objective of concrete node sets (the values in the module docstring,
    with the actual nodes: growth lasts until the first added node leaves, a shrink's loss as
    long as the longest-lived released node would have stayed)."""
    total = 0.0
    for ji, j in enumerate(jobs):
        new, cur = assignment.get(j.job_id, frozenset()), j.current
        k, c, r = len(new), len(cur), j.curve.rate
        rates = j.curve.rates_upto(max(k, c))
        pay = float(costs.rescale(np.array([k]), c, rates, j.spec.rescale_up_s, j.spec.rescale_down_s)[0])
        v = snapshot.tfwd_s * r(c)
        if k > c:
            lasts, pay = grow_terms(j, k, r(k), [horizons[n] for n in new - cur], pay,
                                    exposure=exposure)
            v += (r(k) - r(c)) * lasts - pay
        elif k < c:
            v -= (r(c) - r(k)) * max(horizons[n] for n in cur - new)
            v -= pay + float(
                restart_pause(refill, np.array([k]), c, rates, j.spec.rescale_up_s, costs)[0]
            )
        total += (j.spec.weight if weights is None else weights[ji]) * v
    return total


def grow_terms(
    j: JobView, k: int, rk: float, added_h: Sequence[float], pay: float, *, exposure: str
) -> tuple[float, float]:
    """(How long a grow to ``k`` nodes pays, what it costs) for one concrete grow, as in
    :func:`build_options`: the gain lasts until the first new node leaves or the job is done;
    with ``exposure`` a grow whose nodes leave first also pays the shrink pause(s) then."""
    total = j.spec.total_samples
    job_h = total / rk if math.isfinite(total) and rk > 0 else math.inf
    nodes_h = min(added_h)
    if exposure != "none" and job_h > nodes_h:
        times = 1 if exposure == "first" else len({h for h in added_h if h < job_h})
        pay += times * j.spec.rescale_down_s * rk
    return min(nodes_h, job_h), pay


def restart_pause(
    refill: str,
    sizes: np.ndarray,
    c: int,
    rates: np.ndarray,
    up_s: float,
    costs: RescaleCosts = OLD_RATE,
) -> np.ndarray:
    """``refill="stop"``: what stopping a running job (``c`` nodes to 0) costs later.

    The job is not done: it restarts, and the stop causes that restart. Charged as the cost
    rule charges a start back at ``c`` nodes (about the size it restarts at): under ``PAUSE``
    ``rescale_up_s x r(c)``, which the stop itself (a pause at 0 nodes) did not pay; under
    ``OLD_RATE`` nothing (a start from 0 is free there). ``"none"``: nothing (the old model).
    """
    sizes = np.asarray(sizes)
    if refill == "none" or c == 0:
        return np.zeros(sizes.shape)
    again = float(costs.rescale(np.array([c]), 0, rates, up_s, 0.0)[0])
    return np.where(sizes == 0, again, 0.0)


def _departures(
    exposure: str, added: np.ndarray, pool: np.ndarray | None, job_h: np.ndarray | None
) -> np.ndarray | float:
    """Shrink pauses a grow of ``added`` nodes exposes its job to: one (``"first"``), or
    (``"each"``) one per distinct end time among the nodes it would take from ``pool`` (the
    one-pool model's nodes, longest-lived first) that comes before the job is done; with
    nested levels the nodes are not known, so one per node."""
    if exposure == "first":
        return 1.0
    if pool is None:
        return added.astype(float)
    limit = np.full(added.size, np.inf) if job_h is None else job_h
    m = np.minimum(added, pool.size)
    return np.array(
        [np.unique(pool[:mi][pool[:mi] < li]).size for mi, li in zip(m, limit)], dtype=float
    )
