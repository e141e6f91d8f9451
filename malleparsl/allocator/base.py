"""The allocation-policy interface: one small ABC, a registry of names, and frozen inputs.

A policy sees a frozen snapshot of the cluster and of the jobs (with the best curve currently
known for each, from the user or the Job Profiling Advisor) and returns a new
:class:`~malleparsl.model.Allocation`. It never touches the live engine, so the same policy
serves the executor's controller and the simulator.
"""

from __future__ import annotations

import bisect
import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import ClassVar, TypeVar

from malleparsl.errors import SpecError, unknown_name
from malleparsl.model import Allocation, JobSpec, NodeId, ScalingCurve


@dataclass(frozen=True)
class JobView:
    """One job as a policy sees it: its spec, the curve to plan with, the nodes it holds now.

    ``min_nodes``/``max_nodes`` default to the spec's; the controller may narrow them (a JPA
    probe, a job about to finish). ``curve`` is what the allocator should believe.

    ``sizes`` lists the only node counts the job can run at, when not every count in
    ``lo..hi`` can (``None``, the common case: all of them). An execution plan job has holes:
    FSDP2 needs a global batch that splits evenly, so it may run at 2 and 4 nodes, not 3. A
    policy gives a job 0 nodes or a count in ``lo..hi`` that is in ``sizes``
    (:meth:`allows`; :func:`~malleparsl.allocator.objective.allowed_sizes`).
    """

    spec: JobSpec
    curve: ScalingCurve
    current: frozenset[NodeId] = frozenset()
    min_nodes: int | None = None
    max_nodes: int | None = None
    remaining_samples: float | None = None  # None: the spec's total (no progress reported)
    attained_samples: float = 0.0  # trained so far (attained service, for MLFQ priorities)
    sizes: tuple[int, ...] | None = None  # runnable node counts; None: every one in lo..hi

    def __post_init__(self) -> None:
        object.__setattr__(self, "current", frozenset(self.current))
        lo, hi = self.lo, self.hi
        if lo > hi:
            raise SpecError(
                f"job {self.spec.job_id!r}: min_nodes ({lo}) > max_nodes ({hi}) in its view"
            )
        if self.sizes is not None:
            sizes = tuple(int(k) for k in self.sizes)
            if any(k < 1 for k in sizes) or any(b <= a for a, b in zip(sizes, sizes[1:])):
                raise SpecError(
                    f"job {self.spec.job_id!r}: sizes must be strictly increasing counts >= 1, "
                    f"got {self.sizes!r}"
                )
            object.__setattr__(self, "sizes", sizes)

    def allows(self, k: int) -> bool:
        """Whether a policy may give the job ``k`` nodes (0, or a runnable count in bounds)."""
        if k == 0:
            return True
        return self.lo <= k <= self.hi and (self.sizes is None or k in self.sizes)

    def size_upto(self, k: int) -> int:
        """The largest count ``<= k`` a policy may give the job (0 if none)."""
        # bounds read inline, not through lo/hi: heuristics call this per job and decision
        spec, lo, hi = self.spec, self.min_nodes, self.max_nodes
        lo = spec.min_nodes if lo is None else lo
        hi = spec.max_nodes if hi is None else hi
        if self.sizes is None:
            return (k if k < hi else hi) if k >= lo else 0
        i = bisect.bisect_right(self.sizes, min(k, hi))
        return self.sizes[i - 1] if i and self.sizes[i - 1] >= lo else 0

    def size_from(self, k: int) -> int:
        """The smallest count ``>= k`` (and ``>= lo``) a policy may give the job (0 if none)."""
        k = max(k, self.lo)
        if self.sizes is None:
            return k if k <= self.hi else 0
        i = bisect.bisect_left(self.sizes, k)
        return self.sizes[i] if i < len(self.sizes) and self.sizes[i] <= self.hi else 0

    @property
    def remaining(self) -> float:
        """Samples left: the reported progress, else the spec's total."""
        rem = self.remaining_samples
        return float(self.spec.total_samples if rem is None else rem)

    @property
    def job_id(self) -> str:
        return self.spec.job_id

    @property
    def lo(self) -> int:
        return self.spec.min_nodes if self.min_nodes is None else self.min_nodes

    @property
    def hi(self) -> int:
        return self.spec.max_nodes if self.max_nodes is None else self.max_nodes


@dataclass(frozen=True)
class ClusterSnapshot:
    """The nodes malleparsl may use now.

    ``nodes`` lists every usable node, including those jobs hold now. ``node_end_s`` gives, where
    known or estimated, the time a node stops being idle (a scheduler's planned start of the next
    job, or a statistical estimate); a horizon-aware policy weighs rescale costs against it.
    ``tfwd_s`` is the expected time to the next event (BFTrainer's ``Tfwd``). ``queued`` counts
    the jobs submitted but kept waiting by the controller's cap on active jobs: when it is > 0
    the cap binds, which a policy cannot tell from the admitted jobs alone.
    """

    now_s: float
    nodes: tuple[NodeId, ...]
    node_end_s: Mapping[NodeId, float] = field(default_factory=dict)
    tfwd_s: float = 10.0
    queued: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "nodes", tuple(self.nodes))
        if len(set(self.nodes)) != len(self.nodes):
            raise SpecError("snapshot lists a node more than once")
        if not (self.tfwd_s > 0 and math.isfinite(self.tfwd_s)):
            raise SpecError(f"tfwd_s must be a finite number > 0, got {self.tfwd_s!r}")
        if isinstance(self.queued, bool) or not isinstance(self.queued, int) or self.queued < 0:
            raise SpecError(f"queued must be an integer >= 0, got {self.queued!r}")

    def current_allocation(self, jobs: Sequence[JobView]) -> Allocation:
        """The allocation the jobs hold now; checks it against this snapshot.

        Raises :class:`SpecError` for a node held that is not in the snapshot, or held twice.
        """
        known = set(self.nodes)
        for j in jobs:
            bad = sorted(j.current - known)
            if bad:
                raise SpecError(
                    f"job {j.job_id!r} holds unknown node(s) {bad[:5]}; remove lost nodes "
                    "from the current allocation before allocating"
                )
        return Allocation({j.job_id: j.current for j in jobs})


class AllocationPolicy(ABC):
    """Decides how many and which nodes each job gets.

    Implementations are registered with :func:`register_policy` and built by name with
    :func:`make_policy`. ``allocate`` must return a valid allocation for any valid input —
    zero nodes, zero jobs, more jobs than nodes, minimums that cannot be met — and never an
    empty map just because a solver was slow.
    """

    name: ClassVar[str] = ""

    @abstractmethod
    def allocate(self, snapshot: ClusterSnapshot, jobs: Sequence[JobView]) -> Allocation:
        """Return the new allocation (job id -> nodes), a subset of ``snapshot.nodes``."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


_POLICIES: dict[str, Callable[..., AllocationPolicy]] = {}
P = TypeVar("P", bound=type[AllocationPolicy])


def register_policy(name: str) -> Callable[[P], P]:
    """Class decorator: make a policy buildable as ``make_policy(name, **options)``."""

    def deco(cls: P) -> P:
        cls.name = name
        _POLICIES[name] = cls
        return cls

    return deco


def register_policy_factory(name: str, factory: Callable[..., AllocationPolicy]) -> None:
    """Register a variant built by a function (e.g. ``milp`` with a different objective)."""
    _POLICIES[name] = factory


def policy_names() -> list[str]:
    _load_builtin_policies()
    return sorted(_POLICIES)


def make_policy(name: str, **options: object) -> AllocationPolicy:
    """Build a registered policy by name; unknown names get an error listing the valid ones."""
    _load_builtin_policies()
    try:
        factory = _POLICIES[name]
    except KeyError:
        raise unknown_name("policy", name, _POLICIES) from None
    return factory(**options)


def _load_builtin_policies() -> None:
    """Import the modules that register the built-in policies (lazily: they pull in solvers)."""
    import importlib

    for mod in _BUILTIN_MODULES:
        try:
            importlib.import_module(mod)
        except ModuleNotFoundError as exc:  # a module not written yet must not break the rest
            if exc.name != mod:
                raise


_BUILTIN_MODULES: list[str] = [
    "malleparsl.allocator.heuristics",
    "malleparsl.allocator.bftrainer_heuristic",
    "malleparsl.allocator.hold",
    "malleparsl.allocator.milp",
    "malleparsl.allocator.milp_node",
    "malleparsl.sim.policies",
    "malleparsl.jpa.policy",
]
