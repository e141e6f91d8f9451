"""Instance builders and curve shapes shared by the allocator tests (not tuned to ImageNet)."""

from __future__ import annotations

import itertools
import math

from hypothesis import strategies as st

from malleparsl.allocator import ClusterSnapshot, JobView
from malleparsl.allocator.objective import allocation_objective, feasibility_problems
from malleparsl.model import Allocation, JobSpec, ScalingCurve

SHAPES = ("linear", "saturating", "drop-at-two", "peaked", "jumpy")


def shaped_curve(shape: str, rate1: float, k: int) -> ScalingCurve:
    """A curve over 1..k nodes of a named shape."""
    ns = list(range(1, k + 1))
    if shape == "linear":
        rs = [rate1 * n for n in ns]
    elif shape == "saturating":
        rs = [rate1 * 3 * (1 - math.exp(-n / 2)) for n in ns]
    elif shape == "drop-at-two":  # spanning two nodes costs communication first
        rs = [rate1 * (n if n != 2 else 0.6) for n in ns]
    elif shape == "peaked":  # falls past a peak at 3 nodes
        rs = [rate1 * min(n, max(0.5, 6 - n)) for n in ns]
    elif shape == "jumpy":  # flat, then a jump (a superlinear step)
        rs = [rate1 * (1 if n < 3 else 4 + n) for n in ns]
    else:
        raise ValueError(shape)
    return ScalingCurve(tuple(ns), tuple(float(r) for r in rs), name=shape)


@st.composite
def instances(draw, max_jobs: int = 3, max_nodes: int = 6, with_ends: bool = False):
    """A random small (snapshot, jobs) with a random legal current allocation."""
    n = draw(st.integers(0, max_nodes))
    nodes = tuple(f"n{i}" for i in range(n))
    jn = draw(st.integers(0, max_jobs))
    owner = [draw(st.integers(-1, jn - 1)) if jn else -1 for _ in nodes]
    views = []
    for j in range(jn):
        lo = draw(st.integers(1, 3))
        hi = draw(st.integers(lo, 5))
        curve = shaped_curve(
            draw(st.sampled_from(SHAPES)),
            draw(st.floats(1.0, 100.0)),
            draw(st.integers(1, 6)),
        )
        spec = JobSpec(
            f"j{j}",
            min_nodes=lo,
            max_nodes=hi,
            rescale_up_s=draw(st.floats(0.0, 40.0)),
            rescale_down_s=draw(st.floats(0.0, 40.0)),
            weight=draw(st.sampled_from([1.0, 1.0, 0.5, 2.0])),
            submit_s=float(j),
            curve=curve,
        )
        cur = frozenset(nd for nd, o in zip(nodes, owner) if o == j)
        views.append(JobView(spec, curve, cur))
    ends = {}
    if with_ends:
        for nd in nodes:
            choice = draw(st.sampled_from(["none", "short", "mid", "long"]))
            if choice != "none":
                ends[nd] = {"short": 5.0, "mid": 30.0, "long": 400.0}[choice]
    tfwd = draw(st.sampled_from([10.0, 10.0, 3.0, 60.0]))
    return ClusterSnapshot(now_s=0.0, nodes=nodes, node_end_s=ends, tfwd_s=tfwd), views


def brute_force(snapshot, jobs, score=None):
    """Best objective over every node-to-job map the published model allows."""
    score = score or allocation_objective
    best, best_alloc = -math.inf, None
    choices = [None, *range(len(jobs))]
    for owners in itertools.product(choices, repeat=len(snapshot.nodes)):
        assign = {j.job_id: set() for j in jobs}
        for nd, o in zip(snapshot.nodes, owners):
            if o is not None:
                assign[jobs[o].job_id].add(nd)
        alloc = Allocation(assign)
        if feasibility_problems(snapshot, jobs, alloc):
            continue
        val = score(snapshot, jobs, alloc)
        if val > best:
            best, best_alloc = val, alloc
    return best, best_alloc


def horizon_score(snapshot, jobs, alloc, horizons):
    """The horizon-aware value of a node-level allocation, written out independently.

    Growth is worth ``(r(k) - r(c)) * min horizon of the added nodes``; a shrink loses
    ``(r(c) - r(k)) * max horizon of the released nodes``; rescale costs as published. Returns
    -inf when a shrinking job does not keep its longest-lived nodes (the model's rule).
    """
    total = 0.0
    for j in jobs:
        new, cur = alloc.nodes_of(j.job_id), j.current
        k, c = len(new), len(cur)
        r = j.curve.rate
        base = snapshot.tfwd_s * r(c)
        if k > c:
            h = min(horizons[nd] for nd in new - cur)
            v = base + (r(k) - r(c)) * h - j.spec.rescale_up_s * r(c)
        elif k < c:
            rel = cur - new
            longest_released = max(horizons[nd] for nd in rel)
            if any(horizons[nd] < longest_released for nd in new):
                return -math.inf
            v = base - (r(c) - r(k)) * longest_released - j.spec.rescale_down_s * r(c)
        else:
            v = base
        total += j.spec.weight * v
    return total
