"""Reference policies for comparisons: ``static`` (the floor) and ``upper-bound`` (the ceiling).

``static`` is what a non-malleable tenant of idle nodes gets: a job keeps the nodes it was first
given and loses only the preempted ones. ``upper-bound`` is the physical limit of a trace: at
every interval the largest throughput the idle nodes could give the submitted jobs if rescaling
were free and any number of jobs could run at once. The simulator sees its
``ignores_costs`` flag and, for it alone, charges no pauses and lifts the concurrency cap.
``upper-bound-capped`` keeps the cap: free rescaling for the jobs a real policy may run.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence
from functools import lru_cache

import numpy as np

from malleparsl.allocator.base import AllocationPolicy, ClusterSnapshot, JobView, register_policy
from malleparsl.model import Allocation, NodeId, ScalingCurve


def assign_counts(
    snapshot: ClusterSnapshot, jobs: Sequence[JobView], sizes: Mapping[str, int]
) -> Allocation:
    """Turn per-job node counts into node sets, keeping each job's current nodes where possible.

    A job that shrinks keeps a subset of what it holds; a job that grows keeps all of it and
    takes free nodes in snapshot order. Counts must fit in the snapshot's nodes.
    """
    out: dict[str, set[NodeId]] = {}
    released: list[NodeId] = []
    held: set[NodeId] = set()
    active = [j for j in jobs if j.current or sizes.get(j.job_id, 0)]
    for j in active:
        want = sizes.get(j.job_id, 0)
        cur = sorted(j.current)
        keep = cur[:want]
        released.extend(cur[want:])
        held.update(cur)
        out[j.job_id] = set(keep)
    free = [n for n in snapshot.nodes if n not in held] + released
    k = 0
    for j in active:
        need = sizes.get(j.job_id, 0) - len(out[j.job_id])
        if need > 0:
            out[j.job_id].update(free[k : k + need])
            k += need
    return Allocation({j: frozenset(n) for j, n in out.items() if n})


@register_policy("static")
class StaticPolicy(AllocationPolicy):
    """Rigid jobs on idle nodes: first sizes stick; a job only loses preempted nodes.

    A job without nodes (new, or preempted below its minimum) gets an equal share of the free
    nodes among the waiting jobs, clamped to its bounds; it never grows afterwards.
    """

    def allocate(self, snapshot: ClusterSnapshot, jobs: Sequence[JobView]) -> Allocation:
        sizes: dict[str, int] = {}
        used = 0
        waiting = []
        for j in jobs:
            keep = j.size_upto(len(j.current))  # a job with plan holes: a size it runs at
            if keep:
                sizes[j.job_id] = keep
                used += keep
            else:
                waiting.append(j)  # never started, or preempted below its minimum: restart
        free = len(snapshot.nodes) - used
        for i, j in enumerate(waiting):
            share = j.size_upto(free // (len(waiting) - i)) or j.size_from(j.lo)
            if 0 < share <= free:
                sizes[j.job_id] = share
                free -= share
        return assign_counts(snapshot, jobs, sizes)


@lru_cache(maxsize=4096)
def _hull_segments(curve: ScalingCurve, lo: int, hi: int, weight: float,
                   sizes: tuple[int, ...] | None = None) -> tuple[tuple[int, float], ...]:
    """Upper concave envelope of ``weight * rate`` over sizes ``{0} ∪ [lo, hi]`` (only the
    runnable ``sizes`` there, if given: plan holes).

    Returns segments ``(nodes, gain per node)`` with falling gains. For a concave curve this is
    the curve itself; otherwise it over-estimates between hull vertices, as a bound may.
    """
    if sizes is None:
        ns = np.r_[0, np.arange(lo, hi + 1)]
    else:
        ns = np.asarray([0, *(k for k in sizes if lo <= k <= hi)], dtype=np.int64)
    rs = weight * curve.rates_upto(hi)[ns]
    hull = [0]
    for i in range(1, len(ns)):
        while len(hull) >= 2:
            a, b = hull[-2], hull[-1]
            # drop b if it lies on or below the chord a -> i
            if (rs[b] - rs[a]) * (ns[i] - ns[a]) <= (rs[i] - rs[a]) * (ns[b] - ns[a]):
                hull.pop()
            else:
                break
        hull.append(i)
    segs = []
    for a, b in zip(hull, hull[1:]):
        dn = int(ns[b] - ns[a])
        slope = float((rs[b] - rs[a]) / dn)
        if slope <= 0:
            break
        segs.append((dn, slope))
    return tuple(segs)


@register_policy("upper-bound")
class UpperBoundPolicy(AllocationPolicy):
    """The ceiling: maximal instantaneous throughput, rescaling free, no cap on job count.

    Greedy on marginal gains over each job's concave envelope (exact for concave curves; a
    valid over-estimate otherwise). The first segment of a job must be taken to at least its
    minimum size.
    """

    ignores_costs = True

    def allocate(self, snapshot: ClusterSnapshot, jobs: Sequence[JobView]) -> Allocation:
        free = len(snapshot.nodes)
        # identical jobs (same curve and bounds) form a group; only the group's next unstarted
        # job sits in the heap, so the heap stays small with hundreds of waiting jobs
        groups: dict[tuple, list[int]] = {}
        for i, j in enumerate(jobs):
            key = (id(j.curve), j.lo, j.hi, float(j.spec.weight), j.sizes)
            groups.setdefault(key, []).append(i)
        heap: list[tuple[float, int, int, int, int]] = []  # (-gain, job, segment, nodes, group)
        seg_of: list[tuple[tuple[int, float], ...]] = []
        members: list[list[int]] = []
        for g, (key, idx) in enumerate(groups.items()):
            j = jobs[idx[0]]
            segs = _hull_segments(j.curve, key[1], key[2], key[3], key[4])
            seg_of.append(segs)
            members.append(idx[::-1])  # pop() gives the earliest-submitted job first
            if segs:
                heap.append((-segs[0][1], members[g].pop(), 0, segs[0][0], g))
        heapq.heapify(heap)
        sizes: dict[str, int] = {}
        while heap and free > 0:
            _, i, k, dn, g = heapq.heappop(heap)
            segs, j = seg_of[g], jobs[i]
            if k == 0 and members[g]:
                heapq.heappush(heap, (-segs[0][1], members[g].pop(), 0, segs[0][0], g))
            have = sizes.get(j.job_id, 0)
            take = j.size_upto(have + min(dn, free)) - have  # a partial segment: a runnable size
            if take <= 0:
                continue  # cannot start (or grow) this job on what is left
            sizes[j.job_id] = have + take
            free -= take
            if take == dn and k + 1 < len(segs):
                heapq.heappush(heap, (-segs[k + 1][1], i, k + 1, segs[k + 1][0], g))
        return assign_counts(snapshot, jobs, sizes)


@register_policy("upper-bound-capped")
class CappedUpperBoundPolicy(UpperBoundPolicy):
    """Free rescaling, but the same admission as real policies (cap, submission order).

    Its gap to ``upper-bound`` is what the concurrency cap and job order cost; a real policy's
    gap to it is what rescale costs (and the policy) cost.
    """

    keeps_cap = True
