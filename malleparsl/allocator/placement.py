"""From node counts to concrete nodes, preserving where jobs already run.

Count-based policies decide *how many* nodes each job gets; this module decides *which*. The
rules keep every rescale as cheap as the counts allow and never migrate a job:

- a job that keeps or grows its size keeps every node it holds;
- a job that shrinks keeps its longest-lived nodes and releases the others ("release before
  add": released nodes join the pool before anyone grows);
- growing jobs take the longest-lived pool nodes, the most horizon-demanding job first, so a
  job whose growth only pays on long-lived nodes gets them;
- a job made to grow to a size where its rate falls (its minimum is above what it holds) loses
  more the longer its new nodes stay, so it takes the shortest-lived pool nodes instead.

A node's remaining idle time ("horizon") comes from :func:`node_horizons`; nodes with no known
end share one default, and ties break by node name, so the mapping is deterministic.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence

from malleparsl.allocator.base import ClusterSnapshot, JobView
from malleparsl.errors import SpecError
from malleparsl.model import Allocation, NodeId

log = logging.getLogger(__name__)

__all__ = ["fallback_counts", "longest_first", "node_horizons", "place"]


def node_horizons(
    snapshot: ClusterSnapshot, *, default_s: float | None = None, cap_s: float | None = None
) -> dict[NodeId, float]:
    """Seconds each snapshot node is expected to stay idle from ``snapshot.now_s``.

    Parameters
    ----------
    default_s
        Horizon of a node absent from ``snapshot.node_end_s``; ``None`` means ``tfwd_s``, the
        published model's planning window.
    cap_s
        Upper bound on any horizon (``None``: no bound). A decision is revisited at the next
        event, and a job may finish before a very long idle period ends.
    """
    default = snapshot.tfwd_s if default_s is None else float(default_s)
    if not (default >= 0 and math.isfinite(default)):
        raise SpecError(f"default horizon must be a finite number >= 0 s, got {default_s!r}")
    if cap_s is not None and not cap_s > 0:
        raise SpecError(f"horizon cap must be > 0 s or None, got {cap_s!r}")
    out = {}
    for n in snapshot.nodes:
        end = snapshot.node_end_s.get(n)
        h = default if end is None else max(0.0, float(end) - snapshot.now_s)
        out[n] = h if cap_s is None else min(h, float(cap_s))
    return out


def longest_first(nodes: object, horizons: Mapping[NodeId, float]) -> list[NodeId]:
    """Nodes sorted longest-lived first (ties by name): the order growth draws from."""
    return sorted(nodes, key=lambda n: (-horizons.get(n, 0.0), n))  # type: ignore[call-overload]


def place(
    snapshot: ClusterSnapshot,
    jobs: Sequence[JobView],
    counts: Mapping[str, int],
    *,
    horizons: Mapping[NodeId, float] | None = None,
    grow_order: Sequence[str] | None = None,
    node_order: Sequence[NodeId] | None = None,
) -> Allocation:
    """Map ``counts`` (job id -> node count; missing means 0) to concrete nodes.

    ``grow_order`` lists growing jobs most-demanding first (default: the order of ``jobs``).
    ``node_order`` may pass the snapshot's nodes already sorted longest-lived first (saves the
    sort when placing many times). Raises :class:`SpecError` if the counts need more nodes
    than the snapshot has.
    """
    hz = horizons if horizons is not None else node_horizons(snapshot)
    total = sum(int(counts.get(j.job_id, 0)) for j in jobs)
    if total > len(snapshot.nodes):
        raise SpecError(
            f"counts ask for {total} nodes but the snapshot has {len(snapshot.nodes)}; "
            "a policy must keep the sum of counts within the usable nodes"
        )
    usable = set(snapshot.nodes)
    kept: dict[str, list[NodeId]] = {}
    growers: list[JobView] = []
    for j in jobs:
        k = int(counts.get(j.job_id, 0))
        cur = [n for n in j.current if n in usable]
        if k >= len(cur):
            kept[j.job_id] = cur
            if k > len(cur):
                growers.append(j)
        else:
            kept[j.job_id] = longest_first(cur, hz)[:k]
    taken = {n for nodes in kept.values() for n in nodes}
    if node_order is None:
        pool = longest_first(usable - taken, hz)
    else:
        pool = [n for n in node_order if n not in taken]
    if grow_order is not None:
        rank = {job: i for i, job in enumerate(grow_order)}
        growers.sort(key=lambda j: rank.get(j.job_id, len(rank)))
    front, back = 0, len(pool)
    for j in growers:
        have = len(kept[j.job_id])
        need = int(counts[j.job_id]) - have
        if j.curve.rate(have + need) < j.curve.rate(have):  # a forced, losing growth
            kept[j.job_id] = kept[j.job_id] + pool[back - need : back]
            back -= need
        else:
            kept[j.job_id] = kept[j.job_id] + pool[front : front + need]
            front += need
    return Allocation({job: frozenset(nodes) for job, nodes in kept.items() if nodes})


def fallback_counts(snapshot: ClusterSnapshot, jobs: Sequence[JobView]) -> dict[str, int]:
    """Counts that keep the current allocation where its sizes are still legal.

    Lost nodes are already gone from each job's ``current``; a job left above its maximum keeps
    ``hi`` nodes, one left below its minimum stops (0 nodes), one left at a count it cannot run
    at (a node lost from a job with plan holes, ``JobView.sizes``) keeps the largest it can run
    at below. Always feasible.
    """
    usable = set(snapshot.nodes)
    return {j.job_id: j.size_upto(len(j.current & usable)) for j in jobs}
