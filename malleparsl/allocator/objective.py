"""The published allocation objective, scored one way for every policy, plus input checks.

Every policy (the node-level MILP, the count MILP, the heuristics) and every test scores an
answer with :func:`allocation_objective`, so "same optimum" means the same number computed by
the same code. The objective is BFTrainer's::

    sum_j  w_j * (Tfwd * S_j(n_j) - cost_j)
    cost_j = rescale_up_s   * S_j(c_j)   if n_j > c_j   (the job pauses while it grows)
           = rescale_down_s * S_j(c_j)   if n_j < c_j   (... while it shrinks or stops)
           = 0                           if n_j == c_j

with ``c_j`` the nodes job ``j`` holds now, ``S_j`` its piecewise-linear curve and ``Tfwd`` the
snapshot's expected time to the next event. ``w_j`` (the spec's ``weight``, default 1) makes
the published model a special case.

:func:`best_count_objective` computes the exact optimum by dynamic programming over node counts
(a multiple-choice knapsack); the benchmark uses it as the best known solution and the tests use
it as an oracle independent of any MILP solver.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence

import numpy as np

from malleparsl.allocator.base import ClusterSnapshot, JobView
from malleparsl.errors import SpecError
from malleparsl.model import Allocation

log = logging.getLogger(__name__)

__all__ = [
    "allocation_objective",
    "allowed_sizes",
    "best_count_objective",
    "check_inputs",
    "feasibility_problems",
    "job_values",
]


def check_inputs(snapshot: ClusterSnapshot, jobs: Sequence[JobView]) -> Allocation:
    """Validate a policy's inputs and return the current allocation.

    Raises :class:`~malleparsl.errors.SpecError` (a ``ValueError``) for a job listed twice, a
    node held by a job but absent from the snapshot, a node held by two jobs, or a NaN/negative
    ``node_end_s``. Specs and curves validate themselves on construction.
    """
    if not isinstance(snapshot, ClusterSnapshot):
        raise SpecError(f"snapshot must be a ClusterSnapshot, got {type(snapshot).__name__}")
    seen: set[str] = set()
    for j in jobs:
        if not isinstance(j, JobView):
            raise SpecError(f"jobs must be JobView objects, got {type(j).__name__}")
        if j.job_id in seen:
            raise SpecError(f"job {j.job_id!r} is listed twice; pass each job once")
        seen.add(j.job_id)
    if not math.isfinite(snapshot.now_s):
        raise SpecError(f"snapshot now_s must be finite, got {snapshot.now_s!r}")
    for node, end in snapshot.node_end_s.items():
        if isinstance(end, bool) or not isinstance(end, (int, float, np.integer, np.floating)):
            raise SpecError(f"node_end_s[{node!r}] must be a number, got {end!r}")
        if math.isnan(end):
            raise SpecError(
                f"node_end_s[{node!r}] is NaN; give the expected idle end in seconds or leave "
                "the node out of node_end_s"
            )
    return snapshot.current_allocation(jobs)


def allowed_sizes(view: JobView, n_nodes: int) -> np.ndarray:
    """Node counts job ``view`` may hold: 0, or ``lo..hi`` capped at the ``n_nodes`` usable,
    only the runnable ones where the view lists them (``JobView.sizes``: plan holes)."""
    hi = min(view.hi, n_nodes)
    if view.sizes is not None:
        return np.asarray([0, *(k for k in view.sizes if view.lo <= k <= hi)], dtype=np.int64)
    sizes = [0] + list(range(view.lo, hi + 1))
    return np.asarray(sizes, dtype=np.int64)


def job_values(view: JobView, sizes: np.ndarray, tfwd_s: float) -> np.ndarray:
    """Objective contribution of ``view`` at each count in ``sizes`` (vectorised)."""
    sizes = np.asarray(sizes, dtype=np.int64)
    c = len(view.current)
    top = int(max(int(sizes.max(initial=0)), c))
    rates = view.curve.rates_upto(top)
    r_now = rates[c]
    spec = view.spec
    cost = np.where(
        sizes > c,
        spec.rescale_up_s * r_now,
        np.where(sizes < c, spec.rescale_down_s * r_now, 0.0),
    )
    return spec.weight * (tfwd_s * rates[sizes] - cost)


def allocation_objective(
    snapshot: ClusterSnapshot, jobs: Sequence[JobView], allocation: Allocation
) -> float:
    """The published objective of ``allocation`` (see the module docstring)."""
    total = 0.0
    for j in jobs:
        n = allocation.size(j.job_id)
        total += float(job_values(j, np.asarray([n]), snapshot.tfwd_s)[0])
    return total


def feasibility_problems(
    snapshot: ClusterSnapshot, jobs: Sequence[JobView], allocation: Allocation
) -> list[str]:
    """Why ``allocation`` breaks the published model's rules (empty list: it is feasible).

    Rules: only snapshot nodes; only known jobs; size 0 or within the view's bounds and
    runnable (``JobView.sizes``); no migration (a job that gains nodes keeps all it had; one
    that loses nodes gains none).
    """
    problems = []
    usable = set(snapshot.nodes)
    views = {j.job_id: j for j in jobs}
    for job, nodes in allocation.assignment.items():
        if job not in views:
            problems.append(f"job {job!r} is not among the jobs")
            continue
        v = views[job]
        if nodes - usable:
            problems.append(
                f"job {job!r} got nodes outside the snapshot {sorted(nodes - usable)[:3]}"
            )
        if not v.lo <= len(nodes) <= v.hi:
            problems.append(f"job {job!r} got {len(nodes)} nodes, outside [{v.lo}, {v.hi}]")
        elif not v.allows(len(nodes)):
            problems.append(f"job {job!r} got {len(nodes)} nodes, not a runnable size {v.sizes}")
        if (nodes - v.current) and (v.current - nodes):
            problems.append(f"job {job!r} both gains and loses nodes (migration)")
    return problems


def best_count_objective(
    snapshot: ClusterSnapshot, jobs: Sequence[JobView]
) -> tuple[float, dict[str, int]]:
    """Exact optimum of the published objective and the node count per job achieving it.

    Nodes are interchangeable and any count vector with ``sum <= N`` can be placed without
    migration, so the optimum over node assignments equals the optimum over counts: a
    multiple-choice knapsack, solved here by dynamic programming in ``O(J * N * K)``.
    """
    n = len(snapshot.nodes)
    best = np.zeros(n + 1)  # best[m]: best value using at most m nodes for the jobs so far
    choices = []
    for j in jobs:
        sizes = allowed_sizes(j, n)
        vals = job_values(j, sizes, snapshot.tfwd_s)
        new = np.full(n + 1, -np.inf)
        arg = np.zeros(n + 1, dtype=np.int64)
        for k, v in zip(sizes, vals):
            cand = np.full(n + 1, -np.inf)
            cand[k:] = best[: n + 1 - k] + v
            better = cand > new
            new[better] = cand[better]
            arg[better] = k
        best = new
        choices.append(arg)
    counts: dict[str, int] = {}
    m = n
    for j, arg in zip(reversed(jobs), reversed(choices)):
        k = int(arg[m])
        counts[j.job_id] = k
        m -= k
    return float(best[n]) if jobs else 0.0, counts
