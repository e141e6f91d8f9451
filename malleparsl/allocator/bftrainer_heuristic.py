"""``bftrainer-heuristic``: the published replayer's heuristic, reproduced rule for rule.

It differs from :class:`~malleparsl.allocator.heuristics.EqualSharePolicy` in one comparison:
a job gets the equal share ``q = N // J`` only when ``q`` is *greater* than its minimum (ours:
at least its minimum), so with minimum 1 a share of 1 gives nothing and the leftovers go first
come first served. Nodes are chosen in the snapshot's order (the order nodes became idle, as
the original's node map), keeping a job's nodes when it keeps or grows its size; it exists for
like-for-like comparisons under ``simulate --semantics bftrainer``.

>>> from malleparsl.allocator import ClusterSnapshot, JobView, make_policy
>>> from malleparsl.model import JobSpec, ScalingCurve
>>> curve = ScalingCurve((1, 8), (1.0, 8.0))
>>> jobs = [JobView(JobSpec(f"j{i}", max_nodes=8, curve=curve), curve) for i in range(3)]
>>> snap = ClusterSnapshot(now_s=0, nodes=tuple(f"n{i}" for i in range(5)))
>>> make_policy("bftrainer-heuristic").allocate(snap, jobs).sizes()
{'j0': 5}
"""

from __future__ import annotations

from collections.abc import Sequence

from malleparsl.allocator.base import AllocationPolicy, ClusterSnapshot, JobView, register_policy
from malleparsl.allocator.objective import check_inputs
from malleparsl.model import Allocation

__all__ = ["BFTrainerHeuristicPolicy", "bftrainer_counts"]


def bftrainer_counts(n: int, jobs: Sequence[JobView]) -> dict[str, int]:
    """Share ``n // J`` to each job whose minimum is below it, then leftovers in job order."""
    if not jobs:
        return {}
    share = n // len(jobs)
    target = [j.size_upto(share) if share > j.lo else 0 for j in jobs]
    left = n - sum(target)
    order = sorted(range(len(jobs)), key=lambda i: (jobs[i].spec.submit_s, i))
    for i in order:  # as the published rule; a job with plan holes keeps to its sizes
        target[i] = jobs[i].size_upto(target[i] + left)
        left = n - sum(target)
    return {j.job_id: t for j, t in zip(jobs, target)}


@register_policy("bftrainer-heuristic")
class BFTrainerHeuristicPolicy(AllocationPolicy):
    """BFTrainer's heuristic (equal share only above the minimum), nodes in snapshot order."""

    def __init__(self) -> None:
        pass

    def allocate(self, snapshot: ClusterSnapshot, jobs: Sequence[JobView]) -> Allocation:
        check_inputs(snapshot, jobs)
        if not jobs or not snapshot.nodes:
            return Allocation.empty()
        counts = bftrainer_counts(len(snapshot.nodes), jobs)
        rank = {n: i for i, n in enumerate(snapshot.nodes)}
        kept: dict[str, list] = {}
        for j in jobs:
            cur = sorted(j.current, key=rank.__getitem__)
            keep = counts[j.job_id]
            kept[j.job_id] = cur[max(0, len(cur) - keep) :] if keep else []
        taken = {n for nodes in kept.values() for n in nodes}
        pool = [n for n in snapshot.nodes if n not in taken]
        pos = 0
        for j in jobs:
            need = counts[j.job_id] - len(kept[j.job_id])
            if need > 0:
                kept[j.job_id] += pool[pos : pos + need]
                pos += need
        return Allocation({job: frozenset(ns) for job, ns in kept.items() if ns})
