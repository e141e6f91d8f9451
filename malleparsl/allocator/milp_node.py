"""``milp-node``: BFTrainer's published node-level MILP, kept as the fidelity reference.

The model, as published (Liu et al., BFTrainer; also MalleTrain's allocator):

- binary ``x[j, n]``: node ``n`` runs job ``j``; each node serves at most one job;
- binary ``z[j]``: job ``j`` runs; ``min_j * z_j <= size_j <= max_j * z_j`` (size 0 or in bounds);
  a job with plan holes (``JobView.sizes``, not in the publication) also has one binary per
  runnable size, ``size_j = sum_k k b_jk`` and ``sum_k b_jk = z_j``;
- no migration: with ``kept_j`` the current nodes it keeps, ``size_j - kept_j <= N * up_j``,
  ``c_j - kept_j <= c_j * down_j``, ``up_j + down_j <= 1`` (a job only grows or only shrinks);
- throughput ``S_j`` = the measured curve, piecewise linear in ``size_j`` (SOS2; encoded here
  with one binary per segment, an exact SOS2 formulation every MILP solver accepts);
- maximise ``sum_j w_j * (Tfwd * S_j - (up_j * rescale_up_s + down_j * rescale_down_s) *
  rate_j(c_j))`` with ``Tfwd = snapshot.tfwd_s`` (10 s by default) and ``w_j = 1`` unless a
  job's spec says otherwise.

It has ``jobs x nodes`` binaries and many symmetric optima, which is why it is slow; ``milp``
reaches the same objective with counts. Unlike the original it never returns an empty map on
timeout: without a solution it keeps the current allocation minus lost nodes, topped up
greedily.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import pulp

from malleparsl.allocator.base import AllocationPolicy, ClusterSnapshot, JobView, register_policy
from malleparsl.allocator.objective import (
    allocation_objective,
    allowed_sizes,
    check_inputs,
    feasibility_problems,
)
from malleparsl.allocator.placement import node_horizons, place
from malleparsl.allocator.solvers import SolveResult, check_solver_options, solve
from malleparsl.allocator.ties import TieShuffle
from malleparsl.model import Allocation

log = logging.getLogger(__name__)

__all__ = ["MilpNodePolicy", "breakpoints"]


def breakpoints(view: JobView, n_nodes: int) -> tuple[list[int], list[float]]:
    """SOS2 breakpoints of a job's curve: (0, 0), the measured points below its cap, the cap."""
    cap = min(view.hi, n_nodes)
    xs = [0] + [p for p in view.curve.nodes if p < cap]
    if cap > 0:
        xs.append(cap)
    return xs, [view.curve.rate(x) for x in xs]


@register_policy("milp-node")
class MilpNodePolicy(AllocationPolicy):
    """The published node-level model (binary node-to-job variables).

    Parameters
    ----------
    solver
        ``"highs"`` (default) or ``"cbc"`` (the solver the published results used).
    time_limit_s
        Solver time limit; on timeout the best solution found, else the fallback above.
    mip_gap
        Relative optimality gap at which the solver may stop.
    threads
        Solver threads (``None``: the solver's default). One by default: these models are
        small, and on a shared node extra solver threads mostly wait for a core.
    tie_seed
        ``None`` (default): the jobs in the order given. An integer: in a fresh seeded random
        order at every decision (model and fallback), so the solver may return another
        optimum of equal value (:class:`~malleparsl.allocator.ties.TieShuffle`).
    """

    def __init__(
        self,
        *,
        solver: str = "highs",
        time_limit_s: float = 60.0,
        mip_gap: float = 1e-6,
        threads: int | None = 1,
        tie_seed: int | None = None,
    ) -> None:
        check_solver_options(solver, time_limit_s, mip_gap)
        self._ties = TieShuffle(tie_seed)
        self.solver = solver
        self.time_limit_s = time_limit_s
        self.mip_gap = mip_gap
        self.threads = threads
        self.last_result: SolveResult | None = None
        self.last_fallback = False

    def __repr__(self) -> str:
        return f"{type(self).__name__}(solver={self.solver!r}, time_limit_s={self.time_limit_s})"

    def allocate(self, snapshot: ClusterSnapshot, jobs: Sequence[JobView]) -> Allocation:
        check_inputs(snapshot, jobs)
        self.last_result, self.last_fallback = None, False
        if not jobs or not snapshot.nodes:
            return Allocation.empty()
        jobs = self._ties(jobs)
        prob, x = self._model(snapshot, jobs)
        res = solve(
            prob,
            solver=self.solver,
            time_limit_s=self.time_limit_s,
            mip_gap=self.mip_gap,
            threads=self.threads,
        )
        self.last_result = res
        from malleparsl.allocator.heuristics import greedy_counts

        fallback = place(
            snapshot, jobs, greedy_counts(snapshot, jobs), horizons=node_horizons(snapshot)
        )
        if res.has_solution:
            alloc = Allocation(
                {
                    j.job_id: {n for n, var in x[j.job_id].items() if (var.varValue or 0) > 0.5}
                    for j in jobs
                }
            )
            problems = feasibility_problems(snapshot, jobs, alloc)
            if not problems:
                # a solution cut short by the time limit may be worse than keeping the current one
                if res.status == "optimal" or allocation_objective(
                    snapshot, jobs, alloc
                ) >= allocation_objective(snapshot, jobs, fallback):
                    return alloc
                log.info("milp-node: time-limited solution is worse than the fallback")
                return fallback
            log.warning("milp-node: solver answer infeasible (%s); falling back", problems[:3])
        else:
            log.warning("milp-node: %s; falling back to the current allocation", res.detail)
        self.last_fallback = True
        return fallback

    def _model(
        self, snapshot: ClusterSnapshot, jobs: Sequence[JobView]
    ) -> tuple[pulp.LpProblem, dict[str, dict[str, pulp.LpVariable]]]:
        nodes = snapshot.nodes
        n_all = len(nodes)
        prob = pulp.LpProblem("bftrainer_node_model", pulp.LpMaximize)
        x: dict[str, dict[str, pulp.LpVariable]] = {}
        objective = []
        for ji, j in enumerate(jobs):
            xj = {
                n: prob.add_variable(f"x_{ji}_{ni}", 0, 1, cat=pulp.LpBinary)
                for ni, n in enumerate(nodes)
            }
            x[j.job_id] = xj
            size = pulp.lpSum(xj.values())
            z = prob.add_variable(f"z_{ji}", 0, 1, cat=pulp.LpBinary)
            cap = min(j.hi, n_all)
            prob += size <= cap * z, f"max_{ji}"
            prob += size >= j.lo * z, f"min_{ji}"
            if j.sizes is not None:  # plan holes: one binary per runnable size
                ks = [int(k) for k in allowed_sizes(j, n_all)[1:]]
                b = [prob.add_variable(f"k_{ji}_{k}", 0, 1, cat=pulp.LpBinary) for k in ks]
                prob += pulp.lpSum(b) == z, f"one_size_{ji}"
                prob += size == pulp.lpSum(k * v for k, v in zip(ks, b)), f"runnable_{ji}"
            # throughput: SOS2 over the breakpoints, one binary per segment
            xs, rs = breakpoints(j, n_all)
            lam = [prob.add_variable(f"l_{ji}_{i}", 0) for i in range(len(xs))]
            prob += pulp.lpSum(lam) == 1, f"lam_{ji}"
            prob += size == pulp.lpSum(b * v for b, v in zip(xs, lam)), f"size_{ji}"
            if len(xs) > 2:
                seg = [
                    prob.add_variable(f"s_{ji}_{t}", 0, 1, cat=pulp.LpBinary)
                    for t in range(len(xs) - 1)
                ]
                prob += pulp.lpSum(seg) == 1, f"seg_{ji}"
                for i, v in enumerate(lam):
                    adj = [seg[t] for t in (i - 1, i) if 0 <= t < len(seg)]
                    prob += v <= pulp.lpSum(adj), f"sos2_{ji}_{i}"
            rate = pulp.lpSum(r * v for r, v in zip(rs, lam))
            # no migration and rescale cost
            cur = [n for n in nodes if n in j.current]
            c = len(cur)
            kept = pulp.lpSum(xj[n] for n in cur)
            up = prob.add_variable(f"up_{ji}", 0, 1, cat=pulp.LpBinary)
            down = prob.add_variable(f"down_{ji}", 0, 1, cat=pulp.LpBinary)
            prob += size - kept <= n_all * up, f"grow_{ji}"
            prob += c - kept <= c * down, f"shrink_{ji}"
            prob += up + down <= 1, f"one_way_{ji}"
            r_now = j.curve.rate(c)
            cost = (j.spec.rescale_up_s * r_now) * up + (j.spec.rescale_down_s * r_now) * down
            objective.append(j.spec.weight * (snapshot.tfwd_s * rate - cost))
        for ni, n in enumerate(nodes):
            prob += pulp.lpSum(x[j.job_id][n] for j in jobs) <= 1, f"node_{ni}"
        prob += pulp.lpSum(objective)
        return prob, x
