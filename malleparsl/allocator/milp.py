"""``milp`` and ``milp-horizon``: choose node counts per job by MILP, then place them.

BFTrainer's node-level model (:mod:`~malleparsl.allocator.milp_node`) spends one binary per
(job, node) pair although idle nodes are interchangeable, so its search space is full of
symmetric copies of each answer. Here each job chooses one option (a node count, see
:mod:`~malleparsl.allocator.countmodel`): about ``jobs x max_nodes`` binaries whatever the
machine size, with the same optimum as the node model (tested), and
:func:`~malleparsl.allocator.placement.place` turns counts into nodes without moving any job.

``milp-horizon`` is the same with ``horizon=True``: growth is valued over the time the new
nodes will really stay (``snapshot.node_end_s``) rather than ``tfwd_s``, so a job does not grow
onto a node that leaves before the gain repays the rescale pause.

``milp-work`` is ``milp`` with ``value="work"``: each job's rate counts in node-seconds of its
work (:func:`work_weights`), the long-run value when a concurrency cap binds and admission is
first come first served (docs/sim.md: +7 to +9 % over ``milp`` on the whole Summit trace under
BFTrainer's accounting, 3-17 % behind it on 24 h windows).

>>> from malleparsl.allocator import ClusterSnapshot, JobView, make_policy
>>> from malleparsl.model import JobSpec, ScalingCurve
>>> job = JobSpec("j", max_nodes=4, curve=ScalingCurve((1, 4), (1.0, 4.0)))
>>> snap = ClusterSnapshot(now_s=0, nodes=("a", "b", "c"))
>>> make_policy("milp").allocate(snap, [JobView(job, job.curve)]).size("j")
3
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Sequence

import numpy as np
import pulp

from malleparsl.allocator.base import (
    AllocationPolicy,
    ClusterSnapshot,
    JobView,
    register_policy,
    register_policy_factory,
)
from malleparsl.allocator.costs import OLD_RATE, RescaleCosts, costs_named
from malleparsl.allocator.countmodel import (
    OptionTable,
    build_options,
    grow_terms,
    horizon_objective,
)
from malleparsl.allocator.knapsack import solve_one_pool
from malleparsl.allocator.objective import check_inputs
from malleparsl.allocator.placement import fallback_counts, longest_first, node_horizons, place
from malleparsl.allocator.reduction import Reduction, net_use, reduce_options
from malleparsl.allocator.solvers import SolveResult, check_solver_options, solve
from malleparsl.allocator.ties import TieShuffle
from malleparsl.errors import SpecError
from malleparsl.model import Allocation

log = logging.getLogger(__name__)

__all__ = ["MilpPolicy"]

VALUES = ("samples", "work")
"""What a job's rate is worth: its samples, or the node-seconds of work they stand for."""

TIE = 1e-3
"""``value="work"``: weight of samples against work, a tie-break (see :func:`work_weights`)."""

EXPOSURES = ("none", "first", "each")
"""``milp-horizon``'s ``exposure``: shrink pauses a grow's departing nodes will cause."""

MIN_SOLVER_S = 0.05
"""The solver's time when the budget is nearly spent by building and reducing the model."""

LEARN_HOLDS = (False, "mean", "median", "calibrate")
"""``milp-horizon``'s ``learn_hold``: what it learns from how long its grows were kept."""

MIN_CALIBRATED = 5
"""``learn_hold="calibrate"``: finished grows seen before the learnt ratio is used."""

ARRIVALS = (False, "next")
"""``milp-horizon``'s ``arrivals``: value growth only until nodes would come anyway."""

MIN_ARRIVALS = 5
"""``arrivals``: arrivals of idle nodes seen before the learnt wait is used."""

REFILLS = ("none", "stop")
"""``milp-horizon``'s ``refill``: whether stopping a running job pays the restart it causes."""

MIN_LEARNT_CAP_S = 1.0
"""``learn_hold``: floor of the learnt horizon cap (0 s samples are real, a 0 s cap is not)."""


@register_policy("milp")
class MilpPolicy(AllocationPolicy):
    """Integer node counts per job by MILP; counts mapped to nodes preserving placement.

    Parameters
    ----------
    solver
        ``"highs"`` (default, in-process) or ``"cbc"``.
    time_limit_s
        Budget of one decision (seconds): the solver gets what is left of it after the model
        is built and reduced (at least 0.05 s, at most ``time_limit_s``). On timeout the best
        solution found is used, or the reduction's feasible choice (the solver's warm start) if
        that is better; with neither, the current allocation minus lost nodes (topped up
        greedily with free nodes, valued with ``value`` and ``costs`` over ``tfwd_s``) — never
        an empty map. Only the nested-level model (``max_levels > 1``) and tables too
        large for the dynamic programme reach the solver.
    mip_gap
        Relative optimality gap at which the solver may stop.
    horizon
        Value growth over each node's expected remaining idle time (``snapshot.node_end_s``)
        instead of ``tfwd_s``; see :mod:`~malleparsl.allocator.countmodel`.
    default_horizon_s
        With ``horizon``: remaining time assumed for a node with no known end (``None``:
        ``snapshot.tfwd_s``, which makes such nodes behave exactly as in ``milp``).
    horizon_cap_s
        With ``horizon``: cap on any node's remaining time (``None``: no cap).
    max_levels
        With ``horizon``: 1 (default) plans with one node pool, a growing job's gain lasting as
        long as the nodes it would get if it grew first (fast: the same knapsack as ``milp``);
        more levels round horizons down to that many nested pools, exact for that rounding but
        a much harder MILP (seconds at 20 jobs x 128 nodes).
    reduce
        Remove options the LP relaxation proves cannot be optimal before the MILP
        (:mod:`~malleparsl.allocator.reduction`; exact, and much faster at scale).
    dp
        Solve one-pool models (``milp``; ``milp-horizon`` with ``max_levels=1``) exactly by
        dynamic programming (:mod:`~malleparsl.allocator.knapsack`) instead of the MILP solver:
        same optimum, time bounded by the table's size. ``False`` always runs the solver.
    threads
        Solver threads (``None``: the solver's default). One by default: these models are
        small, and on a shared node extra solver threads mostly wait for a core.
    costs
        How rescales are paid (:mod:`~malleparsl.allocator.costs`): ``"old-rate"``
        (BFTrainer's objective, the default) or ``"pause"``. Only the BFTrainer replay sets
        ``policy.costs`` to the rule it charges (``OLD_RATE``). The default engine charges the
        pause at the new size but leaves this at ``OLD_RATE`` on purpose: with ``"pause"`` the
        10 s objective never repays a start's pause and trained 0 samples on ImageNet 24 h
        0:64, 0:128, 0:512 and ``poisson`` 0:128 seeds 0-1.
    value
        ``"samples"`` (default): a job's rate counts as is (BFTrainer's throughput).
        ``"work"``: a job's rate counts in node-seconds of its work, ``r(n) / e`` with ``e``
        its best rate per node (:func:`work_weights`): the long-run value when a concurrency
        cap binds and admission is first come first served, so that every admitted job must
        be trained before the queue moves on.
    tie_seed
        ``None`` (default): jobs are taken in the order given, so among answers of equal value
        the programme keeps the one that favours the first jobs (deterministic). An integer:
        each decision takes the jobs in a fresh random order (a generator seeded once with
        this value), so a different answer of the same value may be taken. For measuring how
        much a replay moves with tie-breaking alone (docs/allocator.md), not for production.
    learn_hold
        With ``horizon``: ``"mean"`` (or ``True``) / ``"median"`` caps every horizon at that
        statistic of how long nodes added by this policy's grows were actually kept by their
        job so far in the run (until given back, taken back or the job left). The node's idle
        time overstates how long a grow pays: the allocation is revisited at the next events
        (measured on ImageNet 24 h: ~650 s assumed against ~190 s median, ~360 s mean kept).
        ``"calibrate"`` scales every horizon instead (keeping their order) by the median, over
        this run's finished grows (at least ``MIN_CALIBRATED``), of how long the grow lasted
        until its first added node left the job (taken back, moved by the policy, or the job
        done) over a predicted hold: the lowest horizon of its nodes, or the job's whole
        duration at the grown size if shorter (its total samples, not those left: a grow
        ended by the job finishing counts as short; measured better than the time left,
        docs/allocator.md, item 2: ~650 s
        predicted against ~130-220 s median realised, the machine's reclaims, the policy's
        own moves and job ends together).
    arrivals
        With ``horizon``: ``"next"`` caps every horizon at the mean time between arrivals of
        idle nodes (decisions at which nodes appear that were not idle at the previous one),
        learnt in the run: where nodes arrive often, a job not grown now gets nodes at the
        next arrival anyway, in one pause instead of two, so growing it now is worth only the
        gain until then (and a job shrunk now is refilled then). ``False`` (default): no cap.
        Measured in docs/allocator.md (item 2, session 7).
    refill
        With ``horizon``: ``"stop"`` charges stopping a running job (shrinking it to 0 nodes)
        the restart it causes, a start back at ``c`` nodes under ``costs`` (``"pause"``:
        ``rescale_up_s x r(c)``; ``"old-rate"``: free): the job is not done and must start
        again, which under ``costs="pause"`` the stop itself (a pause at 0 nodes) did not pay.
        Measured in docs/allocator.md (item 2, session 8): without it the candidate stopped
        running jobs 143 times in 24 h at 512 nodes (102 on 1 node; to feed another job's grow
        at 45 decisions, a start at 35), each restarted a median 192 s later; with it 99.
        ``"none"`` (default): not charged.
    exposure
        With ``horizon``: ``"first"`` (or ``True``): a grow whose new nodes are expected to
        leave before the job is done also pays the shrink pause then
        (``rescale_down_s x r(k)``), as in ``hold``; ``"each"``: one such pause per distinct
        departure time among the new nodes; ``"none"`` (default) pays nothing.
    """

    def __init__(
        self,
        *,
        solver: str = "highs",
        time_limit_s: float = 0.4,
        mip_gap: float = 1e-6,
        horizon: bool = False,
        default_horizon_s: float | None = None,
        horizon_cap_s: float | None = None,
        max_levels: int = 1,
        reduce: bool = True,
        threads: int | None = 1,
        dp: bool = True,
        costs: str | RescaleCosts = OLD_RATE,
        value: str = "samples",
        tie_seed: int | None = None,
        learn_hold: bool | str = False,
        exposure: str | bool = "none",
        arrivals: str | bool = False,
        refill: str = "none",
        slot: int | str | None = None,
    ) -> None:
        check_solver_options(solver, time_limit_s, mip_gap)
        if value not in VALUES:
            raise SpecError(f"value must be one of {', '.join(VALUES)}, got {value!r}")
        if isinstance(max_levels, bool) or not isinstance(max_levels, int) or max_levels < 1:
            raise SpecError(f"max_levels must be an integer >= 1, got {max_levels!r}")
        self.solver = solver
        self.time_limit_s = time_limit_s
        self.mip_gap = mip_gap
        self.horizon = horizon
        self.default_horizon_s = default_horizon_s
        self.horizon_cap_s = horizon_cap_s
        self.max_levels = max_levels
        self.reduce = reduce
        self.threads = threads
        self.dp = dp
        self.costs = costs_named(costs)
        self.value = value
        self._ties = TieShuffle(tie_seed)  # refuses a non-integer seed
        self.tie_seed = tie_seed
        if learn_hold is True:
            learn_hold = "mean"
        if learn_hold not in LEARN_HOLDS:
            raise SpecError(
                f"learn_hold must be False, 'mean', 'median' or 'calibrate', got {learn_hold!r}"
            )
        self.learn_hold = learn_hold
        if arrivals is True:
            arrivals = "next"
        if arrivals not in ARRIVALS:
            raise SpecError(f"arrivals must be False or 'next', got {arrivals!r}")
        self.arrivals = arrivals
        # arrivals: the idle nodes at the previous decision, the first decision's time and
        # how many decisions since saw nodes arrive
        self._idle: frozenset | None = None
        self._t_first: float | None = None
        self._n_arrivals = 0
        self._kept: list[float] = []  # how long each grown node was kept, in this run
        # learn_hold="calibrate": open grows (when, predicted hold, job, nodes added) and, per
        # finished grow, its realised hold over the predicted one
        self._open: list[tuple[float, float, str, frozenset]] = []
        self._ratios: list[float] = []
        self._added: dict[tuple[str, object], float] = {}  # (job, node) -> when a grow added it
        if isinstance(exposure, bool):
            exposure = "first" if exposure else "none"
        if exposure not in EXPOSURES:
            raise SpecError(f"exposure must be one of {', '.join(EXPOSURES)}, got {exposure!r}")
        self.exposure = exposure
        if refill not in REFILLS:
            raise SpecError(f"refill must be one of {', '.join(REFILLS)}, got {refill!r}")
        self.refill = refill
        if slot is not None and slot != "auto" and (
            isinstance(slot, bool) or not isinstance(slot, int) or slot < 1
        ):
            raise SpecError(
                f"slot must be the cap on active jobs (an integer >= 1), 'auto' or None, got {slot!r}"
            )
        if slot is not None and value != "samples":
            raise SpecError(f"slot values samples and slot time: use it with value='samples', got {value!r}")
        self.slot = slot
        if horizon_cap_s is not None and not (
            isinstance(horizon_cap_s, (int, float)) and horizon_cap_s > 0
        ):
            raise SpecError(f"horizon_cap_s must be a number > 0 (or None), got {horizon_cap_s!r}")
        horizon_only = {
            "learn_hold": learn_hold or None,
            "arrivals": arrivals or None,
            "exposure": None if exposure == "none" else exposure,
            "refill": None if refill == "none" else refill,
            "default_horizon_s": default_horizon_s,
            "horizon_cap_s": horizon_cap_s,
            "max_levels": None if max_levels == 1 else max_levels,
        }
        given = {k: v for k, v in horizon_only.items() if v is not None}
        if not horizon and given:
            raise SpecError(
                f"{', '.join(given)} value grows over the nodes' horizons: use them with "
                f"horizon=True (policy milp-horizon), got {given}"
            )
        self.last_result: SolveResult | None = None
        self.last_fallback = False
        self.last_stats: dict[str, object] = {}

    def __repr__(self) -> str:
        extra = ", horizon=True" if self.horizon else ""
        return f"{type(self).__name__}(solver={self.solver!r}, time_limit_s={self.time_limit_s}{extra})"

    def _cap_binds(self, snapshot: ClusterSnapshot, jobs: Sequence[JobView]) -> bool:
        """Whether ``slot`` applies: ``"auto"`` while the controller keeps jobs queued behind
        its cap (``snapshot.queued``), an integer cap while that many jobs are active."""
        if self.slot == "auto":
            return snapshot.queued > 0
        return self.slot is not None and len(jobs) >= self.slot

    def allocate(self, snapshot: ClusterSnapshot, jobs: Sequence[JobView]) -> Allocation:
        t0 = time.perf_counter()
        check_inputs(snapshot, jobs)
        self.last_result, self.last_fallback = None, False
        if self.horizon and self.learn_hold:
            self._observe_kept(snapshot.now_s, jobs)
        horizons = raw = node_horizons(
            snapshot,
            default_s=self.default_horizon_s if self.horizon else None,
            cap_s=self._cap_s() if self.horizon else None,
        )
        ratio = self._ratio()
        if ratio is not None:
            horizons = {n: h * ratio for n, h in raw.items()}
        wait = self._arrival_wait(snapshot) if self.horizon and self.arrivals else None
        if wait is not None:
            horizons = {n: min(h, wait) for n, h in horizons.items()}
        if not jobs or not snapshot.nodes:
            return Allocation.empty()
        jobs = self._ties(jobs)
        weights = work_weights(jobs, len(snapshot.nodes)) if self.value == "work" else None
        if self._cap_binds(snapshot, jobs):
            weights = slot_weights(jobs)
        table = full = build_options(
            snapshot,
            jobs,
            horizons,
            horizon_aware=self.horizon,
            max_levels=self.max_levels,
            costs=self.costs,
            weights=weights,
            exposure=self.exposure,
            refill=self.refill,
        )
        red = reduce_options(table, len(jobs), gap=self.mip_gap) if self.reduce else None
        mine: list[int] | None = None  # the reduction's feasible choice, as rows of the kept table
        if red is not None:
            table = table.subset(red.keep)
            remap = np.cumsum(red.keep) - 1
            mine = [int(remap[i]) for i in red.incumbent]
        self.last_stats = {"options": len(full), "kept": len(table)}
        if red is not None and _proved(red, len(table), len(jobs), self.mip_gap):
            chosen = mine
            self.last_result = SolveResult("optimal", 0.0, red.lower, "proved by the LP bound")
        else:
            chosen = self._exact_dp(table, len(jobs)) if self.dp else None
            if chosen is None:
                left = self.time_limit_s - (time.perf_counter() - t0)
                limit = min(self.time_limit_s, max(MIN_SOLVER_S, left))
                chosen = self._solve(table, len(jobs), mine, limit)
        if self.last_result is not None:
            self.last_stats |= {
                "status": self.last_result.status,
                "solver_ms": round(1e3 * self.last_result.seconds, 2),
            }
        # the reduction's feasible choice, if the solver did worse
        if mine is not None and (
            chosen is None or table.value[chosen].sum() < table.value[mine].sum() - 1e-9
        ):
            self.last_fallback = chosen is None
            chosen = mine
        if chosen is None:
            self.last_fallback = True
            self.last_stats["fallback"] = "greedy"
            return _fallback(snapshot, jobs, horizons, weights, self.costs)
        counts = {jobs[int(table.job[i])].job_id: int(table.size[i]) for i in chosen}
        # growers needing the longest-lived nodes pick first
        grow_rows = sorted(
            (i for i in chosen if table.level[i] >= 0),
            key=lambda i: (table.level[i], -table.hold[i]),
        )
        order = [jobs[int(table.job[i])].job_id for i in grow_rows]
        node_order = longest_first(snapshot.nodes, horizons)
        alloc = place(
            snapshot, jobs, counts, horizons=horizons, grow_order=order, node_order=node_order
        )
        if self.horizon and self.max_levels == 1:
            alloc = _revert_short_growers(
                snapshot, jobs, full, counts, order, alloc, horizons, node_order, weights,
                self.costs, exposure=self.exposure,
            )
            keep = place(
                snapshot,
                jobs,
                fallback_counts(snapshot, jobs),
                horizons=horizons,
                node_order=node_order,
            )
            score = lambda a: horizon_objective(  # noqa: E731
                snapshot, jobs, a.assignment, horizons, self.costs, weights,
                exposure=self.exposure, refill=self.refill,
            )
            mine = score(alloc)
            if score(keep) > mine + 1e-9 * abs(mine):
                alloc = keep
        if self.horizon and self.learn_hold:
            for j in jobs:
                if j.current and len(alloc.nodes_of(j.job_id)) > len(j.current):
                    added = alloc.nodes_of(j.job_id) - j.current
                    if self.learn_hold != "calibrate":
                        for n in added:
                            self._added[(j.job_id, n)] = snapshot.now_s
                    else:
                        rk = j.curve.rate(len(alloc.nodes_of(j.job_id)))
                        # total, not remaining, samples: tuned so (docs/allocator.md)
                        job_h = j.spec.total_samples / rk if rk > 0 else math.inf
                        pred = min(min(raw[n] for n in added), job_h)
                        self._open.append((snapshot.now_s, pred, j.job_id, frozenset(added)))
        return alloc

    def _cap_s(self) -> float | None:
        """The horizon cap: the fixed one, or (``learn_hold``) the mean or median time grown
        nodes were kept so far in this run when that is shorter (none before the first is
        given back). Floored at ``MIN_LEARNT_CAP_S``: nodes taken back at the instant they were
        added give 0 s samples, and a cap must be positive."""
        cap = self.horizon_cap_s
        if self.learn_hold in ("mean", "median") and self._kept:
            kept = (
                sum(self._kept) / len(self._kept)  # the same additions, in order, as before
                if self.learn_hold == "mean"
                else float(np.median(self._kept))
            )
            kept = max(kept, MIN_LEARNT_CAP_S)
            cap = kept if cap is None else min(cap, kept)
        return cap

    def _observe_kept(self, now_s: float, jobs: Sequence[JobView]) -> None:
        """A node a grow added and that its job no longer holds (given back, taken back, or
        the job gone): one sample of how long grown nodes are kept."""
        held = {(j.job_id, n) for j in jobs for n in j.current}
        for key in [k for k in self._added if k not in held]:
            self._kept.append(now_s - self._added.pop(key))
        if self.learn_hold == "calibrate":
            cur = {j.job_id: j.current for j in jobs}
            still = []
            for t, pred, job, added in self._open:
                if job in cur and added <= cur[job]:
                    still.append((t, pred, job, added))
                else:  # its first node left the job (taken back, moved) or the job left
                    self._ratios.append((now_s - t) / max(pred, MIN_LEARNT_CAP_S))
            self._open = still

    def _arrival_wait(self, snapshot: ClusterSnapshot) -> float | None:
        """``arrivals``: record whether idle nodes arrived since the previous decision; the
        expected wait until a job would get nodes anyway (``None`` before ``MIN_ARRIVALS``)."""
        now = snapshot.now_s
        idle = frozenset(snapshot.nodes)
        if self._idle is None:
            self._t_first = now
        elif idle - self._idle:
            self._n_arrivals += 1
        self._idle = idle
        if self._n_arrivals < MIN_ARRIVALS or self._t_first is None:
            return None
        return max((now - self._t_first) / self._n_arrivals, MIN_LEARNT_CAP_S)

    def _ratio(self) -> float | None:
        """``learn_hold="calibrate"``: the median, over this run's finished grows, of realised
        over predicted hold (``None`` before ``MIN_CALIBRATED`` of them)."""
        if self.learn_hold != "calibrate" or len(self._ratios) < MIN_CALIBRATED:
            return None
        return max(float(np.median(self._ratios)), 1e-3)  # a horizon of 0 s grows nothing

    def _exact_dp(self, table: OptionTable, n_jobs: int) -> list[int] | None:
        """One pool: the exact optimum by dynamic programming (``None``: use the solver)."""
        t0 = time.perf_counter()
        chosen = solve_one_pool(table, n_jobs)
        if chosen is not None:
            value = float(table.value[chosen].sum())
            self.last_result = SolveResult(
                "optimal", time.perf_counter() - t0, value, "exact dynamic programme (one pool)"
            )
        return chosen

    def _solve(
        self,
        table: OptionTable,
        n_jobs: int,
        start: list[int] | None = None,
        time_limit_s: float | None = None,
    ) -> list[int] | None:
        """Row index of the chosen option per job, or ``None`` without a usable solution.

        ``start`` (one row per job, feasible) is handed to the solver as a first solution;
        ``time_limit_s`` (default: the policy's) is what is left of the decision's budget.
        """
        prob = pulp.LpProblem("malleparsl_counts", pulp.LpMaximize)
        y = [prob.add_variable(f"y{i}", 0, 1, cat=pulp.LpBinary) for i in range(len(table))]
        # scale the objective to O(1000): HiGHS warns about (and handles worse) costs of 1e6+
        scale = max(1e-12, float(np.abs(table.value).max(initial=0.0)) / 1e3)
        prob += pulp.LpAffineExpression(
            [(y[i], float(v) / scale) for i, v in enumerate(table.value)]
        )
        rows_of: list[list[int]] = [[] for _ in range(n_jobs)]
        for i, ji in enumerate(table.job):
            rows_of[int(ji)].append(i)
        for ji, rows in enumerate(rows_of):
            prob += pulp.LpAffineExpression([(y[i], 1.0) for i in rows]) == 1, f"one_{ji}"
        use = net_use(table)
        for lev in range(table.levels.size):
            nz = np.flatnonzero(use[:, lev])
            if nz.size:
                terms = [(y[i], float(use[i, lev])) for i in nz]
                prob += pulp.LpAffineExpression(terms) <= float(table.free[lev]), f"pool_{lev}"
        res = solve(
            prob,
            solver=self.solver,
            time_limit_s=self.time_limit_s if time_limit_s is None else time_limit_s,
            mip_gap=self.mip_gap,
            threads=self.threads,
            start=None if start is None else {f"y{i}": 1.0 for i in start},
        )
        self.last_result = res
        if not res.has_solution:
            log.warning("milp: %s; falling back to the current allocation", res.detail)
            return None
        vals = np.asarray([v.varValue if v.varValue is not None else 0.0 for v in y])
        chosen = [rows[int(np.argmax(vals[rows]))] for rows in rows_of]
        if not _feasible(table, chosen, vals, rows_of):
            log.warning("milp: solver answer is not feasible (%s); falling back", res.detail)
            return None
        return chosen


def _revert_short_growers(
    snapshot: ClusterSnapshot,
    jobs: Sequence[JobView],
    table: OptionTable,
    counts: dict[str, int],
    order: list[str],
    alloc: Allocation,
    horizons: dict,
    node_order: list,
    weights: Sequence[float] | None = None,
    costs: RescaleCosts = OLD_RATE,
    *,
    exposure: str = "none",
) -> Allocation:
    """One-pool horizon model: undo growth that the nodes actually placed do not repay.

    The one-pool model values each job's growth as if it were first in line for long-lived
    nodes. When several jobs grow, a later one may get shorter-lived nodes; if its growth is
    then worth less than its best non-growing option, it takes that option instead. Removing
    a grower only moves the others onto longer-lived nodes, so this ends within ``len(jobs)``
    rounds with every remaining growth worth at least what the job could get without growing.
    """
    by_id = {j.job_id: (ji, j) for ji, j in enumerate(jobs)}
    nongrow = np.flatnonzero(table.level < 0)
    best_rows = nongrow[np.lexsort((-table.value[nongrow], table.job[nongrow]))]
    first = np.concatenate(([True], table.job[best_rows][1:] != table.job[best_rows][:-1]))
    alt_of = dict(zip(table.job[best_rows[first]].tolist(), best_rows[first].tolist()))
    for _ in range(len(jobs)):
        worst = None
        for job in order:
            ji, j = by_id[job]
            added = alloc.nodes_of(job) - j.current
            c, k = len(j.current), counts[job]
            alt = alt_of[ji]
            r = j.curve.rate
            rates = j.curve.rates_upto(max(k, c))
            pay = float(costs.rescale(np.array([k]), c, rates, j.spec.rescale_up_s, 0.0)[0])
            lasts, pay = grow_terms(
                j, k, r(k), [horizons[n] for n in added], pay,
                exposure=exposure,
            )
            val = (j.spec.weight if weights is None else weights[ji]) * (
                snapshot.tfwd_s * r(c) + (r(k) - r(c)) * lasts - pay
            )
            loss = float(table.value[alt]) - val
            if loss > 1e-9 * max(1.0, abs(val)) and (worst is None or loss > worst[0]):
                worst = (loss, job, int(table.size[alt]))
        if worst is None:
            return alloc
        _, job, size = worst
        counts[job] = size
        order = [o for o in order if o != job]
        alloc = place(
            snapshot, jobs, counts, horizons=horizons, grow_order=order, node_order=node_order
        )
    return alloc


def work_weights(jobs: Sequence[JobView], n_nodes: int) -> list[float]:
    """Per job, ``weight x (1 / e + TIE / e_max)``: its rate in node-seconds of its work, then
    (a tie-break) in samples.

    ``e`` is the job's best rate per node over the sizes it may take, ``e_max`` the largest
    among the jobs. Valued this way a job's rate is the node-seconds of work it gets through
    per second. Under a binding cap with first-come-first-served admission every admitted job
    is trained in the end, so over a run many job lifetimes long the samples trained follow
    from how few node-seconds that work takes — a fast model trained now is not a gain, only
    its slow successor's work put off — and the nodes are best spent where each does the most
    of its job's work (the efficient sizes), not where it adds the most samples this second.
    Work leaves many ties (every job's first node does one node-second per second); samples
    break them, so among equally efficient uses the faster model trains first.
    """
    eff = []
    for j in jobs:
        hi = max(j.lo, min(j.hi, n_nodes))
        r = j.curve.rates_upto(hi)
        n = np.arange(max(1, j.lo), hi + 1)
        eff.append(float(np.max(r[n] / n)) if n.size else 0.0)
    e_max = max(eff, default=0.0)
    return [
        j.spec.weight * (1.0 / e + TIE / e_max) if e > 0 else j.spec.weight
        for j, e in zip(jobs, eff)
    ]


def slot_weights(jobs: Sequence[JobView]) -> list[float]:
    """Per job, ``weight x (1 + S / r(lo))`` with ``S`` the mean of the jobs' ``r(lo)``.

    Under a binding cap a job holds a slot until it is done; a sample trained now brings that
    forward by ``1 / r(lo)`` seconds at its smallest size (where a job the cap leaves waiting
    would run), and a freed slot trains about ``S`` samples per second for the job it admits.
    A job with no positive rate keeps its weight.
    """
    lows = [float(j.curve.rate(max(1, j.lo))) for j in jobs]
    pos = [r for r in lows if r > 0]
    s = sum(pos) / len(pos) if pos else 0.0
    return [
        j.spec.weight * (1.0 + s / r) if r > 0 else j.spec.weight for j, r in zip(jobs, lows)
    ]


def _proved(red: Reduction, n_left: int, n_jobs: int, mip_gap: float) -> bool:
    """The reduction's feasible choice is optimal (within ``mip_gap``): no solver needed."""
    return n_left == n_jobs or red.upper - red.lower <= mip_gap * max(1.0, abs(red.upper))


def _feasible(
    table: OptionTable, chosen: list[int], vals: np.ndarray, rows_of: list[list[int]]
) -> bool:
    """Check the decoded choice ourselves: one option per job, every pool within bounds."""
    for rows, i in zip(rows_of, chosen):
        if vals[i] < 0.5 or np.sum(vals[rows] > 0.5) != 1:
            return False
    idx = np.asarray(chosen, dtype=np.int64)
    return bool(np.all(net_use(table)[idx].sum(axis=0) <= table.free))


def _fallback(
    snapshot: ClusterSnapshot,
    jobs: Sequence[JobView],
    horizons: dict,
    weights: Sequence[float] | None,
    costs: RescaleCosts,
) -> Allocation:
    """Current allocation minus lost nodes, topped up greedily: never empty for a slow solver.

    The greedy values options with the policy's ``weights`` (``value="work"``) and ``costs``
    over ``tfwd_s``; it ignores horizons (``milp-horizon`` falls back to the myopic values).
    """
    from malleparsl.allocator.heuristics import greedy_counts

    counts = greedy_counts(snapshot, jobs, weights=weights, costs=costs)
    return place(snapshot, jobs, counts, horizons=horizons)


def _milp_horizon(**options: object) -> MilpPolicy:
    # an approximate model anyway: stopping within 0.01 % of its optimum saves most solves
    options.setdefault("horizon", True)
    options.setdefault("mip_gap", 1e-4)
    return MilpPolicy(**options)  # type: ignore[arg-type]


register_policy_factory("milp-horizon", _milp_horizon)


def _milp_work(**options: object) -> MilpPolicy:
    options.setdefault("value", "work")
    return MilpPolicy(**options)  # type: ignore[arg-type]


register_policy_factory("milp-work", _milp_work)
