"""Heuristic policies: ``equal-share`` (BFTrainer's baseline) and ``greedy`` (marginal gain).

Both decide node counts and leave the choice of nodes to
:func:`~malleparsl.allocator.placement.place` (keep current nodes, release before adding), so
they move no job and answer in microseconds to milliseconds. They are baselines for the MILPs
and the fallback the MILPs use when a solver finds nothing in time.

>>> from malleparsl.allocator import ClusterSnapshot, JobView, make_policy
>>> from malleparsl.model import JobSpec, ScalingCurve
>>> curve = ScalingCurve((1, 8), (1.0, 8.0))
>>> jobs = [JobView(JobSpec(f"j{i}", max_nodes=8, curve=curve), curve) for i in range(2)]
>>> snap = ClusterSnapshot(now_s=0, nodes=tuple(f"n{i}" for i in range(5)))
>>> make_policy("equal-share").allocate(snap, jobs).sizes()
{'j0': 3, 'j1': 2}
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import numpy as np

from malleparsl.allocator.base import AllocationPolicy, ClusterSnapshot, JobView, register_policy
from malleparsl.allocator.costs import OLD_RATE, RescaleCosts
from malleparsl.allocator.objective import allowed_sizes, check_inputs, job_values
from malleparsl.allocator.placement import fallback_counts, node_horizons, place
from malleparsl.allocator.ties import TieShuffle
from malleparsl.model import Allocation

log = logging.getLogger(__name__)

__all__ = [
    "EqualSharePolicy",
    "GreedyPolicy",
    "TieShuffle",
    "equal_share_counts",
    "greedy_counts",
]


def _fcfs(jobs: Sequence[JobView]) -> list[int]:
    """Job indices in first-come first-served order (submit time, then the order given)."""
    return sorted(range(len(jobs)), key=lambda i: (jobs[i].spec.submit_s, i))


def equal_share_counts(snapshot: ClusterSnapshot, jobs: Sequence[JobView]) -> dict[str, int]:
    """``N // J`` nodes per job clipped to its bounds; leftovers first come first served.

    A job whose minimum exceeds the share gets nothing from the share and competes for the
    leftovers. A job with plan holes (``JobView.sizes``) gets the largest size it runs at
    within its share, and within its share plus the leftovers. Rescale costs are ignored, as
    in the published heuristic.
    """
    n, jn = len(snapshot.nodes), len(jobs)
    if jn == 0:
        return {}
    share = n // jn
    target = [j.size_upto(share) for j in jobs]
    left = n - sum(target)
    for i in _fcfs(jobs):
        target[i] = jobs[i].size_upto(target[i] + left)  # never below target[i]: it runs
        left = n - sum(target)
    return {j.job_id: t for j, t in zip(jobs, target)}


def greedy_counts(
    snapshot: ClusterSnapshot,
    jobs: Sequence[JobView],
    *,
    weights: Sequence[float] | None = None,
    costs: RescaleCosts = OLD_RATE,
) -> dict[str, int]:
    """Start from the current sizes; shrink where that pays; then add nodes by best gain/node.

    Each step considers, for every job, growing to any larger allowed size (so a curve that
    only improves after a jump is not missed) and applies the step with the highest objective
    gain per added node, until no step gains or no node is free. Values are the published
    objective, rescale costs included (:func:`~malleparsl.allocator.objective.job_values`);
    ``weights`` (per job, replacing ``spec.weight``) and ``costs`` let a MILP's fallback keep
    its own objective (``milp-work``'s work value, a ``"pause"`` cost rule).
    """
    n = len(snapshot.nodes)
    if not jobs:
        return {}
    sizes = [allowed_sizes(j, n) for j in jobs]
    kmax = max(int(s.max()) for s in sizes)
    val = np.full((len(jobs), kmax + 1), -np.inf)  # val[j, k]: value of job j at k nodes
    for i, (j, s) in enumerate(zip(jobs, sizes)):
        if weights is None and costs is OLD_RATE:
            val[i, s] = job_values(j, s, snapshot.tfwd_s)
            continue
        c = len(j.current)
        rates = j.curve.rates_upto(int(max(int(s.max(initial=0)), c)))
        pay = costs.rescale(s, c, rates, j.spec.rescale_up_s, j.spec.rescale_down_s)
        w = j.spec.weight if weights is None else weights[i]
        val[i, s] = w * (snapshot.tfwd_s * rates[s] - pay)
    start = fallback_counts(snapshot, jobs)
    cur = np.asarray([start[j.job_id] for j in jobs], dtype=np.int64)
    for i in range(len(jobs)):  # release before add: shrink where a smaller size is worth more
        below = val[i, : cur[i] + 1]
        best = int(np.argmax(below))
        if below[best] > val[i, cur[i]]:
            cur[i] = best
    free = n - int(cur.sum())
    ks = np.arange(kmax + 1)
    rows = np.arange(len(jobs))
    while free > 0:
        delta = ks[None, :] - cur[:, None]
        ok = (delta > 0) & (delta <= free) & np.isfinite(val)
        gain = val - val[rows, cur][:, None]
        ratio = np.where(ok, gain / np.maximum(delta, 1), -np.inf)
        flat = int(np.argmax(ratio))
        i, k = divmod(flat, kmax + 1)
        if not ratio[i, k] > 0:
            break
        free -= int(k - cur[i])
        cur[i] = k
    return {j.job_id: int(c) for j, c in zip(jobs, cur)}


class _CountPolicy(AllocationPolicy):
    """Shared body: validate, compute counts, place them (longest-lived nodes first)."""

    _ties = TieShuffle(None)

    def _counts(self, snapshot: ClusterSnapshot, jobs: Sequence[JobView]) -> dict[str, int]:
        raise NotImplementedError

    def allocate(self, snapshot: ClusterSnapshot, jobs: Sequence[JobView]) -> Allocation:
        check_inputs(snapshot, jobs)
        if not jobs or not snapshot.nodes:
            return Allocation.empty()
        jobs = self._ties(jobs)
        counts = self._counts(snapshot, jobs)
        return place(snapshot, jobs, counts, horizons=node_horizons(snapshot))


@register_policy("equal-share")
class EqualSharePolicy(_CountPolicy):
    """BFTrainer's baseline: an equal share per job, clipped to bounds, leftovers FCFS."""

    def __init__(self) -> None:
        pass

    def _counts(self, snapshot: ClusterSnapshot, jobs: Sequence[JobView]) -> dict[str, int]:
        return equal_share_counts(snapshot, jobs)


@register_policy("greedy")
class GreedyPolicy(_CountPolicy):
    """Marginal gain per node, respecting bounds and rescale costs (never takes from a job).

    ``tie_seed``: see :class:`TieShuffle` (equal gains go to the first job in the order taken).
    """

    def __init__(self, *, tie_seed: int | None = None) -> None:
        self._ties = TieShuffle(tie_seed)

    def _counts(self, snapshot: ClusterSnapshot, jobs: Sequence[JobView]) -> dict[str, int]:
        return greedy_counts(snapshot, jobs)
