"""``jpa``: place the JPA's probes first, then let any other policy allocate the rest.

The Job Profiling Advisor decides *which* unpredictable job to probe and at what size (least
attained service first, within its budget; see :mod:`malleparsl.jpa.advisor`). This wrapper
makes sure the probe really runs: it reserves the probe's nodes — the nodes the job already
holds, then nodes nobody holds, then nodes taken from the job whose rescale pause costs least
(the lowest planned rate; one node at a time, never below its minimum) — and hands the
remaining nodes and jobs to the inner policy (the MILP by default). A probe that cannot be
placed waits for the next event.

Registered as ``make_policy("jpa", advisor=..., inner="milp", **inner_options)``.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence

from malleparsl.allocator.base import (
    AllocationPolicy,
    ClusterSnapshot,
    JobView,
    make_policy,
    register_policy_factory,
)
from malleparsl.errors import SpecError
from malleparsl.model import Allocation, NodeId

log = logging.getLogger(__name__)


class ProbeFirst(AllocationPolicy):
    """Reserve nodes for the JPA's probes, then run ``inner`` on what is left.

    Parameters
    ----------
    advisor
        The :class:`~malleparsl.jpa.advisor.JobProfilingAdvisor` whose probes to place (anything
        with a ``probe_requests() -> {job_id: size}`` method).
    inner
        The policy for everything else, an instance or a registered name.
    inner_options
        Keyword options for ``make_policy(inner, ...)`` when ``inner`` is a name.
    """

    name = "jpa"

    def __init__(
        self,
        *,
        advisor: object,
        inner: AllocationPolicy | str = "milp",
        **inner_options: object,
    ) -> None:
        if not callable(getattr(advisor, "probe_requests", None)):
            raise SpecError(
                f"advisor {advisor!r} has no probe_requests(); pass advisor=JobProfilingAdvisor()"
            )
        self.advisor = advisor
        self.inner = make_policy(inner, **inner_options) if isinstance(inner, str) else inner

    def __repr__(self) -> str:
        return f"ProbeFirst(inner={self.inner!r})"

    def allocate(self, snapshot: ClusterSnapshot, jobs: Sequence[JobView]) -> Allocation:
        by_id = {v.job_id: v for v in jobs}
        requests = {
            j: k
            for j, k in self.advisor.probe_requests().items()  # type: ignore[attr-defined]
            if j in by_id and k > 0 and by_id[j].allows(k)
        }
        if not requests:
            return self.inner.allocate(snapshot, jobs)
        holding: dict[str, set[NodeId]] = {v.job_id: set(v.current) for v in jobs}
        free = set(snapshot.nodes) - set().union(*holding.values())
        placed: dict[str, frozenset[NodeId]] = {}
        for job, size in requests.items():
            got = _take(job, size, holding, free, by_id, probing=set(requests))
            if got is None:
                log.debug("probe of %r at %d nodes cannot be placed now", job, size)
                continue
            placed[job] = got
        reserved = set().union(*placed.values()) if placed else set()
        rest_views = [  # every field kept (progress, runnable sizes) but the reserved nodes
            dataclasses.replace(v, current=v.current - reserved)
            for v in jobs
            if v.job_id not in placed
        ]
        sub = ClusterSnapshot(
            now_s=snapshot.now_s,
            nodes=tuple(n for n in snapshot.nodes if n not in reserved),
            node_end_s={n: e for n, e in snapshot.node_end_s.items() if n not in reserved},
            tfwd_s=snapshot.tfwd_s,
        )
        inner = self.inner.allocate(sub, rest_views)
        return Allocation({**dict(inner.assignment), **placed})


def _take(
    job: str,
    size: int,
    holding: dict[str, set[NodeId]],
    free: set[NodeId],
    views: dict[str, JobView],
    *,
    probing: set[str],
) -> frozenset[NodeId] | None:
    """Pick ``size`` nodes for a probe of ``job``; updates ``holding``/``free`` on success."""
    own = sorted(holding.get(job, set()))
    chosen = own[:size]
    pool = sorted(free)
    chosen += pool[: size - len(chosen)]
    donors: dict[str, list[NodeId]] = {}
    if len(chosen) < size:
        # take from the job whose pause costs least (lowest planned rate now), never below its
        # view's minimum, never from another probe
        spare = {
            j: len(h) - max(views[j].lo, 1)
            for j, h in holding.items()
            if j != job and j not in probing and len(h) > max(views[j].lo, 1)
        }
        cost = {j: views[j].curve.rate(len(holding[j])) for j in spare}
        while len(chosen) < size and spare:
            j = min(spare, key=lambda d: (cost[d], d))
            node = sorted(holding[j] - set(donors.get(j, [])))[0]
            donors.setdefault(j, []).append(node)
            chosen.append(node)
            spare[j] -= 1
            if spare[j] <= 0:
                del spare[j]
    if len(chosen) < size:
        return None
    got = frozenset(chosen)
    for j, nodes in donors.items():
        holding[j] -= set(nodes)
    holding[job] = set(got)
    free -= got
    for n in own[size:]:  # a job holding more than its probe size gives the rest back
        free.add(n)
    return got


def _make(**options: object) -> ProbeFirst:
    if "advisor" not in options:
        raise SpecError(
            "policy 'jpa' needs the advisor whose probes it places: "
            "make_policy('jpa', advisor=JobProfilingAdvisor()); in the simulator use the "
            "setup 'milp+jpa'"
        )
    return ProbeFirst(**options)  # type: ignore[arg-type]


register_policy_factory("jpa", _make)
