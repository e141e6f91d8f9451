"""Domain model shared by every layer: nodes, job specs, scaling curves, allocations, plans.

Everything here is immutable and validated on construction, so a policy, the simulator and the
live executor can pass these values around without defensive copies. Bad values raise
:class:`~malleparsl.errors.SpecError` (a ``ValueError``) naming the job and the field.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from malleparsl.errors import SpecError

NodeId = str
"""A node's name (a hostname at a facility, ``node-03`` for an emulated one)."""


def _finite(value: float, what: str, *, allow_inf: bool = False) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise SpecError(f"{what} must be a number, got {value!r}")
    if math.isnan(value) or (math.isinf(value) and not allow_inf):
        raise SpecError(f"{what} must be finite, got {value!r}")


def node_count(value: object, what: str) -> int:
    """``value`` as a whole number of nodes; 1.5 or "2.9" is an error, never truncated.

    >>> node_count(2.0, "nodes"), node_count("3", "nodes")
    (2, 3)
    """
    try:
        x = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        x = math.nan
    if isinstance(value, bool) or not math.isfinite(x) or x != int(x):
        raise SpecError(f"{what} must be a whole number of nodes, got {value!r}")
    return int(x)


@dataclass(frozen=True)
class ScalingCurve:
    """Training throughput (samples/s) of one job at measured node counts.

    The curve passes through (0, 0) and is linear between measured points. Beyond the last
    measured count it stays flat at the last rate: extrapolating growth nobody measured would
    let an allocator hand a job nodes it cannot use, while "flat" makes extra nodes worthless,
    the safe error. The profiler (JPA) supplies optimistic points explicitly when it wants to
    explore.

    >>> c = ScalingCurve(nodes=(1, 2, 4), rates=(100.0, 180.0, 300.0))
    >>> c.rate(3), c.rate(8), c.rate(0)
    (240.0, 300.0, 0.0)
    """

    nodes: tuple[int, ...]
    rates: tuple[float, ...]
    name: str = ""

    def __post_init__(self) -> None:
        who = f"scaling curve {self.name!r}" if self.name else "scaling curve"
        nodes = tuple(self.nodes)
        rates = tuple(float(r) if not isinstance(r, bool) else r for r in self.rates)
        if len(nodes) != len(rates):
            raise SpecError(f"{who}: nodes has {len(nodes)} entries but rates has {len(rates)}")
        if not nodes:
            raise SpecError(f"{who}: needs at least one measured point (nodes=(1,), rates=(r,))")
        for n in nodes:
            if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0:
                raise SpecError(f"{who}: node counts must be integers >= 0, got {n!r}")
        for r in rates:
            _finite(r, f"{who}: rate")
            if r < 0:
                raise SpecError(f"{who}: rates must be >= 0 samples/s, got {r!r}")
        if any(b <= a for a, b in zip(nodes, nodes[1:])):
            raise SpecError(f"{who}: node counts must be strictly increasing, got {nodes}")
        if nodes[0] == 0:
            if rates[0] != 0:
                raise SpecError(f"{who}: the rate at 0 nodes must be 0, got {rates[0]}")
            nodes, rates = nodes[1:], rates[1:]
            if not nodes:
                raise SpecError(f"{who}: needs a measured point at 1 node or more")
        object.__setattr__(self, "nodes", tuple(int(n) for n in nodes))
        object.__setattr__(self, "rates", rates)

    @property
    def max_measured(self) -> int:
        """The largest node count with a measured (or given) rate."""
        return self.nodes[-1]

    def rate(self, n: float) -> float:
        """Samples/s at ``n`` nodes (0 at 0 nodes, linear between points, flat past the last)."""
        if n <= 0:
            return 0.0
        return float(np.interp(n, (0, *self.nodes), (0.0, *self.rates)))

    def rates_upto(self, n_max: int) -> np.ndarray:
        """Vector ``r`` with ``r[k]`` = rate at ``k`` nodes for ``k`` in ``0..n_max``."""
        return np.interp(np.arange(n_max + 1), (0, *self.nodes), (0.0, *self.rates))

    @classmethod
    def from_points(cls, points: Mapping[int, float], name: str = "") -> ScalingCurve:
        """Build from a ``{nodes: samples_per_s}`` mapping."""
        items = sorted(points.items())
        return cls(tuple(k for k, _ in items), tuple(v for _, v in items), name=name)

    @classmethod
    def amdahl(
        cls, *, rate1: float, parallel_fraction: float, max_nodes: int, name: str = ""
    ) -> ScalingCurve:
        """Amdahl's law: ``rate(n) = rate1 / ((1 - p) + p / n)`` tabulated at 1..max_nodes."""
        if not 0 <= parallel_fraction <= 1:
            raise SpecError(f"parallel_fraction must be in [0, 1], got {parallel_fraction!r}")
        ns = tuple(range(1, max_nodes + 1))
        rates = tuple(rate1 / ((1 - parallel_fraction) + parallel_fraction / n) for n in ns)
        return cls(ns, rates, name=name)


@dataclass(frozen=True)
class JobSpec:
    """What a user (or a job set) says about one malleable training job.

    ``curve`` is optional: without one, the Job Profiling Advisor learns it online. Rescale
    pauses are the seconds the whole job stops when it grows or shrinks (checkpoint, restart,
    re-form the process group).
    """

    job_id: str
    min_nodes: int = 1
    max_nodes: int = 1
    rescale_up_s: float = 0.0
    rescale_down_s: float = 0.0
    total_samples: float = math.inf
    weight: float = 1.0
    submit_s: float = 0.0
    curve: ScalingCurve | None = None
    model: str = ""
    meta: Mapping[str, Any] = field(default_factory=dict, compare=False, hash=False)

    def __post_init__(self) -> None:
        who = f"job {self.job_id!r}"
        if not isinstance(self.job_id, str) or not self.job_id:
            raise SpecError(f"job_id must be a non-empty string, got {self.job_id!r}")
        for name in ("min_nodes", "max_nodes"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
                raise SpecError(f"{who}: {name} must be an integer >= 1, got {v!r}")
        if self.min_nodes > self.max_nodes:
            raise SpecError(
                f"{who}: min_nodes ({self.min_nodes}) > max_nodes ({self.max_nodes}); "
                "set min_nodes <= max_nodes"
            )
        for name in ("rescale_up_s", "rescale_down_s", "weight", "submit_s"):
            v = getattr(self, name)
            _finite(v, f"{who}: {name}")
            if v < 0:
                raise SpecError(f"{who}: {name} must be >= 0, got {v!r}")
        _finite(self.total_samples, f"{who}: total_samples", allow_inf=True)
        if self.total_samples <= 0:
            raise SpecError(f"{who}: total_samples must be > 0, got {self.total_samples!r}")
        if self.curve is not None and not isinstance(self.curve, ScalingCurve):
            raise SpecError(f"{who}: curve must be a ScalingCurve, got {type(self.curve).__name__}")


@dataclass(frozen=True)
class RescalePlan:
    """The difference between two allocations: what the executor or simulator must do.

    ``start``/``stop`` are jobs going from 0 nodes / to 0 nodes; ``grow``/``shrink`` map a job
    that keeps running to the nodes it gains / loses.
    """

    start: Mapping[str, frozenset[NodeId]]
    stop: Mapping[str, frozenset[NodeId]]
    grow: Mapping[str, frozenset[NodeId]]
    shrink: Mapping[str, frozenset[NodeId]]

    @property
    def changed_jobs(self) -> frozenset[str]:
        """Every job whose node set changes."""
        return frozenset(self.start) | frozenset(self.stop) | frozenset(self.grow) | frozenset(
            self.shrink
        )

    @property
    def empty(self) -> bool:
        return not self.changed_jobs


@dataclass(frozen=True)
class Allocation:
    """Which nodes each job holds. Jobs absent from the mapping hold no nodes.

    >>> a = Allocation({"j1": {"n1", "n2"}})
    >>> b = Allocation({"j1": {"n1"}, "j2": {"n2", "n3"}})
    >>> plan = a.plan_to(b)
    >>> sorted(plan.shrink["j1"]), sorted(plan.start["j2"])
    (['n2'], ['n2', 'n3'])
    """

    assignment: Mapping[str, frozenset[NodeId]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        clean: dict[str, frozenset[NodeId]] = {}
        owner: dict[NodeId, str] = {}
        for job, nodes in dict(self.assignment).items():
            fs = frozenset(nodes)
            for n in fs:
                if n in owner:
                    raise SpecError(
                        f"node {n!r} is assigned twice, to jobs {owner[n]!r} and {job!r}; "
                        "a node serves at most one job"
                    )
                owner[n] = job
            if fs:
                clean[job] = fs
        object.__setattr__(self, "assignment", clean)

    @classmethod
    def empty(cls) -> Allocation:
        return cls({})

    def nodes_of(self, job_id: str) -> frozenset[NodeId]:
        return self.assignment.get(job_id, frozenset())

    def size(self, job_id: str) -> int:
        return len(self.nodes_of(job_id))

    def sizes(self) -> dict[str, int]:
        return {j: len(n) for j, n in self.assignment.items()}

    @property
    def used_nodes(self) -> frozenset[NodeId]:
        return frozenset().union(*self.assignment.values()) if self.assignment else frozenset()

    def without_nodes(self, lost: Iterable[NodeId]) -> Allocation:
        """This allocation after ``lost`` nodes vanished (preempted or released)."""
        gone = frozenset(lost)
        return Allocation({j: n - gone for j, n in self.assignment.items()})

    def without_jobs(self, jobs: Iterable[str]) -> Allocation:
        drop = set(jobs)
        return Allocation({j: n for j, n in self.assignment.items() if j not in drop})

    def plan_to(self, new: Allocation) -> RescalePlan:
        """The rescale plan that turns this allocation into ``new``."""
        start, stop, grow, shrink = {}, {}, {}, {}
        for job in set(self.assignment) | set(new.assignment):
            old_n, new_n = self.nodes_of(job), new.nodes_of(job)
            if old_n == new_n:
                continue
            if not old_n:
                start[job] = new_n
            elif not new_n:
                stop[job] = old_n
            else:
                if new_n - old_n:
                    grow[job] = new_n - old_n
                if old_n - new_n:
                    shrink[job] = old_n - new_n
        return RescalePlan(start=start, stop=stop, grow=grow, shrink=shrink)
