"""Execution plans (Rubick): how a job trains at a given size, what memory each plan needs.

A malleable job keeps its global batch at every size; *how* it fits that batch into a node
is its execution plan, and the plan may change at every rescale:

* ``dp``: plain data parallelism, every rank holds parameters, gradients and optimizer state;
* ``ckpt``: activation checkpointing, only block inputs are kept in the forward pass and each
  block is recomputed in the backward pass (about one more forward);
* ``zero1``: ZeRO stage 1, the optimizer state is sharded across the ranks;
* ``zero1+ckpt``: both;
* ``fsdp`` (``fsdp+ckpt``): torch's FSDP2 ``fully_shard``, parameters, gradients and optimizer
  state sharded across the ranks, each unit's parameters all-gathered for its forward and
  backward. Offered only where the global batch splits evenly over the ranks (every rank must
  run as many forward/backward passes: its collectives are inside them).

Each may add gradient accumulation: ``name@mb=8`` runs micro-batches of at most 8 samples.
This module is torch-free (the allocator, the driver and the simulator use it); the apps layer
(:mod:`malleparsl.apps.plans`) carries plans out and measures a model's
:class:`MemoryProfile`.

Memory model per rank, in bytes (``P`` parameters of ``w`` bytes, ``s`` optimizer-state
tensors per parameter, ``n`` ranks, ``m`` samples per micro-batch, ``A``/``A_ckpt`` activation
bytes per sample kept for the backward pass without/with checkpointing)::

    persistent = w P (parameters) + w P (gradients) + s w P / (n if zero1 else 1) + buffers
                 + [zero1] z w P     (what ZeroRedundancyOptimizer keeps besides: z = 1.3 on gloo)
    forward/backward peak = persistent - (w P if one micro-batch)
                            + m * (A_ckpt if ckpt else A) + m * G_t   (activation gradients)
    gradient sync peak    = persistent + w P      (the flat all-reduce buffer)
    optimizer step peak   = persistent + t w P / (n if zero1 else 1)   (t: step temporaries)
    checkpoint peak       = persistent + [zero1] s w P (n - 1) / n   (the other ranks' shards,
                            gathered on rank 0 to write the plain file)
                                       + [fsdp] 1.5 w U   (every rank writes and reads its own
                            shards with torch.distributed.checkpoint; measured, not
                            root-caused. Restoring a *plain* file, written under another plan,
                            costs less: each rank reads its shards of it only)
                            (a replicated plan's file streams from the live state: + 0)

    under fsdp: parameters, gradients, optimizer state and temporaries / n, no flat buffer,
    and the forward/backward peak adds 4 w U (U: the largest unit's params): in a unit's
    backward, its all-gathered parameters, the next unit's (prefetched), its unsharded
    gradients and their copy in the reduce-scatter input buffer
    peak = max(the four)

>>> prof = MemoryProfile(params=10_000_000, act_per_sample=2e6, act_ckpt_per_sample=2e5)
>>> mem = plan_memory(prof, parse_plan("dp"), n=1, global_batch=64)
>>> round(mem.peak / 2**20)
237
>>> PlanOptions(prof, 64, 160 * 2**20).min_nodes(8)  # needs ZeRO-1 over 2 ranks
2

Which feasible plan is fastest is the performance model's call
(:meth:`malleparsl.jpa.plans.JobPlans.choose`).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, replace
from typing import Any

from malleparsl.errors import MalleparslError, SpecError, UnknownNameError, unknown_name

BASES = {"dp": (False, False, False), "ckpt": (True, False, False),
         "zero1": (False, True, False), "zero1+ckpt": (True, True, False),
         "fsdp": (False, False, True), "fsdp+ckpt": (True, False, True)}
"""Plan families: name -> (activation checkpointing, ZeRO-1 sharding, FSDP2 sharding)."""

FAMILIES = ("dp", "accum", "ckpt", "zero1", "zero1+ckpt", "fsdp", "fsdp+ckpt")
"""What a job may run unless it says otherwise (option ``plans``): ``dp`` is plain data
parallelism (one pass per step), ``accum`` adds micro-batches to it, the others may use
micro-batches too. The performance model picks among those that fit: FSDP2's per-pass
gathers make it the choice only where it fits and cheaper plans do not. It is also every
family a job may list in ``plans``."""

ZERO_GLOO_OVERHEAD = 1.3
"""Parameter copies torch's ZeroRedundancyOptimizer keeps resident beyond the model on CPU with
gloo (measured 1.07-1.67 at 2-3 ranks; not root-caused). Accelerator profiles use 0."""


FSDP_UNIT_COPIES = 4
"""Unsharded copies of one FSDP2 unit alive at its backward (see the module docstring)."""

FSDP_CKPT_UNITS = 1.5
"""What an FSDP2 rank holds beyond its live shards while writing or reading its sharded
checkpoint, in units of the largest unit's parameters (measured 5.7-5.8 MB = 1.4 w U for
BlockMLP 512x8 at 2 and 3 gloo ranks; not root-caused)."""


class MemoryBudgetError(MalleparslError, RuntimeError):
    """No plan fits the node's memory at this size (or the running plan exceeded it)."""


@dataclass(frozen=True)
class ExecPlan:
    """One execution plan: checkpointing, optimizer sharding and the micro-batch cap."""

    checkpoint: bool = False
    zero: bool = False
    micro_batch: int | None = None  # None: the whole local batch in one pass
    fsdp: bool = False  # FSDP2: parameters, gradients and optimizer state sharded

    def __post_init__(self) -> None:
        if self.zero and self.fsdp:
            raise SpecError("a plan shards with ZeRO-1 or with FSDP2, not both")

    @property
    def base(self) -> str:
        return {v: k for k, v in BASES.items()}[(self.checkpoint, self.zero, self.fsdp)]

    @property
    def sharded(self) -> bool:
        """Some state is split across the ranks (ZeRO-1 or FSDP2): needs 2 ranks or more."""
        return self.zero or self.fsdp

    @property
    def name(self) -> str:
        return self.base + (f"@mb={self.micro_batch}" if self.micro_batch else "")

    def __str__(self) -> str:
        return self.name


def parse_plan(name: str | ExecPlan | None) -> ExecPlan:
    """``"dp"``, ``"ckpt"``, ``"zero1"``, ``"zero1+ckpt"``, optionally ``"@mb=N"``."""
    if name is None:
        return ExecPlan()
    if isinstance(name, ExecPlan):
        return name
    if not isinstance(name, str):
        raise SpecError(f"plan must be a string like 'zero1@mb=8', got {name!r}")
    base, _, rest = name.strip().partition("@")
    if base not in BASES:
        raise unknown_name("plan", base, BASES)
    mb = None
    if rest:
        key, _, val = rest.partition("=")
        if key != "mb" or not val.isdigit() or int(val) < 1:
            raise SpecError(f"plan {name!r}: write '{base}@mb=N' with an integer N >= 1")
        mb = int(val)
    ckpt, zero, fsdp = BASES[base]
    return ExecPlan(checkpoint=ckpt, zero=zero, micro_batch=mb, fsdp=fsdp)


@dataclass(frozen=True)
class MemoryProfile:
    """A model's memory facts, measured once (:func:`malleparsl.apps.plans.profile_memory`).

    Sizes in bytes; ``params`` is a count. ``act_per_sample``: bytes the forward pass keeps
    for the backward pass, per sample; ``act_ckpt_per_sample``: the same with checkpointed
    blocks (block inputs, the un-checkpointed rest, and one block recomputed at a time).
    """

    params: int
    act_per_sample: float
    act_ckpt_per_sample: float
    bytes_per_param: int = 4
    opt_states: int = 2  # Adam: exp_avg and exp_avg_sq; SGD with momentum: 1
    opt_temps: int = 1  # temporaries of one optimizer step, in parameter copies
    buffers: float = 0.0
    grad_transient_per_sample: float = 0.0  # gradients of activations alive in the backward pass
    zero_overhead: float = 0.0  # parameter copies ZeRO-1 keeps beyond the model (gloo: 1.3)
    unit_params: float = 0.0  # params of the largest FSDP unit (a block or the rest); 0: all

    def __post_init__(self) -> None:
        for k, v in asdict(self).items():
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not v >= 0:
                raise SpecError(f"MemoryProfile.{k} must be a number >= 0, got {v!r}")

    def as_dict(self) -> dict[str, float]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> MemoryProfile:
        return cls(**{k: d[k] for k in cls.__dataclass_fields__ if k in d})


@dataclass(frozen=True)
class PlanMemory:
    """Predicted bytes per rank of one plan at one size."""

    params: float
    grads: float
    optimizer: float
    activations: float
    buffers: float
    sync_buffer: float
    opt_temps: float
    comm_buffers: float
    micro_batch: int
    peak: float
    checkpoint: float = 0.0  # what rank 0 gathers beyond its persistent state to write one


def local_batch(global_batch: int, n: int) -> int:
    """The largest local batch of ``n`` ranks (rank 0's: the first ranks take the remainder)."""
    return math.ceil(global_batch / n)


def plan_memory(prof: MemoryProfile, plan: ExecPlan, *, n: int, global_batch: int) -> PlanMemory:
    """The memory model of the module docstring for one plan at ``n`` ranks."""
    if n < 1 or global_batch < 1:
        raise SpecError(f"need n >= 1 and global_batch >= 1, got {n!r}, {global_batch!r}")
    wp = float(prof.bytes_per_param * prof.params)
    shard = n if plan.sharded else 1
    local = local_batch(global_batch, n)
    mb = min(local, plan.micro_batch or local)
    kept = prof.act_ckpt_per_sample if plan.checkpoint else prof.act_per_sample
    act = mb * (kept + prof.grad_transient_per_sample)
    opt = prof.opt_states * wp / shard
    temps = prof.opt_temps * wp / shard
    if plan.fsdp and n > 1:
        unit = prof.bytes_per_param * (prof.unit_params or prof.params)
        params = grads = wp / n
        # backward of one unit: its gathered parameters, the next unit's (prefetched), its
        # unsharded gradients and their copy in the reduce-scatter input buffer
        comm = FSDP_UNIT_COPIES * unit
        sync = 0.0  # gradients are reduce-scattered inside backward
        persistent = params + grads + opt + prof.buffers
        fwd_bwd = persistent - (grads if mb >= local else 0.0) + comm + act
    else:
        params = grads = sync = wp
        comm = prof.zero_overhead * wp if plan.zero and n > 1 else 0.0  # ZERO_GLOO_OVERHEAD
        persistent = 2 * wp + opt + prof.buffers + comm
        fwd_bwd = persistent - (wp if mb >= local else 0.0) + act
    # ZeRO-1's plain file gathers the other shards on rank 0; FSDP2 ranks write and read
    # their own shards; a replicated plan's file streams from the live state
    if plan.fsdp and n > 1:
        ckpt = FSDP_CKPT_UNITS * comm / FSDP_UNIT_COPIES
    elif plan.zero and n > 1:
        ckpt = prof.opt_states * wp * (n - 1) / n
    else:
        ckpt = 0.0
    peak = max(fwd_bwd, persistent + sync, persistent + temps, persistent + ckpt)
    return PlanMemory(params, grads, opt, act, prof.buffers, sync, temps, comm, mb, peak,
                      checkpoint=ckpt)


def candidate_plans(global_batch: int, n: int, *, bases: Iterable[str] = FAMILIES) -> list[ExecPlan]:
    """Every plan worth trying at ``n`` ranks from the allowed families: micro-batches of the
    local batch halved down to 1 (a micro-batch no larger than needed). Sharded plans need 2
    ranks; FSDP2 also a global batch that splits evenly (equal local batches, so every rank
    runs as many passes: each pass holds collectives, and an extra one on one rank would hang
    the others). None at more ranks than the global batch has samples: some rank would get no
    sample and its node would train nothing (see :attr:`PlanOptions.max_batch_nodes`)."""
    if n > global_batch:
        return []
    local = local_batch(global_batch, n)
    mbs: list[int | None] = [None]
    m = local
    while m > 1:
        m = math.ceil(m / 2)
        mbs.append(m)
    out = []
    for b in bases:
        if b not in FAMILIES:
            raise unknown_name("plan family", b, FAMILIES)
        ckpt, zero, fsdp = BASES["dp" if b == "accum" else b]
        if (zero or fsdp) and n == 1:
            continue  # nothing to shard over
        if fsdp and not splits_for(ExecPlan(fsdp=True), global_batch, n):
            continue  # uneven local batches: unequal passes would deadlock FSDP2's collectives
        sizes = [None] if b == "dp" else mbs[1:] if b == "accum" else mbs
        out += [ExecPlan(checkpoint=ckpt, zero=zero, micro_batch=x, fsdp=fsdp) for x in sizes]
    return out


def splits_for(plan: ExecPlan, global_batch: int, ranks: int) -> bool:
    """Whether ``plan`` can split ``global_batch`` over ``ranks`` ranks: FSDP2 needs equal
    local batches (so every rank runs as many passes; it runs unsharded on one rank), every
    other plan takes any split."""
    return not plan.fsdp or ranks == 1 or global_batch % ranks == 0


class UnevenSplitError(SpecError):
    """A fixed FSDP2 plan was launched at a size whose ranks do not split the loop's global
    batch (:func:`splits_for`), and the options did not name ``global_batch``: the controller
    could not have known. Carries the batch, so the executor re-runs the job at a size that
    splits it instead of failing the user's future for the controller's choice, and the step
    the loop needs it from (0 when ``ctx.steps`` had not restored the checkpoint yet)."""

    def __init__(self, message: str, global_batch: int, step: int = 0) -> None:
        super().__init__(message)
        self.global_batch = global_batch
        self.step = step

    def __reduce__(self) -> tuple[type, tuple[str, int, int]]:  # ranks ship it to the driver
        return type(self), (str(self), self.global_batch, self.step)


def with_micro_batch(plan: ExecPlan, micro_batch: int | None) -> ExecPlan:
    return replace(plan, micro_batch=micro_batch)


# ---- the job's options: what the driver and the controller read --------------------------
def batch_max_nodes(global_batch: int, ranks_per_node: int = 1) -> int:
    """The most nodes whose ranks all get a sample of the global batch.

    The data split (:class:`malleparsl.apps.sharding.ShardPlan`) gives ranks past the batch's
    samples a local batch of 0: they would hold a node (an accelerator each) and train nothing.
    Applies to every job that names its ``global_batch``, with automatic plans or not."""
    return global_batch // ranks_per_node


def batch_text(nodes: int, global_batch: int, ranks_per_node: int = 1) -> str:
    """Why ``nodes`` is too large for the global batch, for error messages."""
    return (f"{nodes} node(s) x ranks_per_node={ranks_per_node} = {nodes * ranks_per_node} "
            f"ranks exceed global_batch={global_batch} (every rank needs a sample: at most "
            f"{batch_max_nodes(global_batch, ranks_per_node)} node(s))")


def batch_below_node(global_batch: int, ranks_per_node: int = 1) -> str | None:
    """When one node's ranks outnumber the global batch's samples (None otherwise): the fix.
    Naming the batch in the options cannot help then (every job needs a node: the cap refuses
    it at submit), and a smaller ``min_nodes`` does not exist."""
    if batch_max_nodes(global_batch, ranks_per_node):
        return None
    return (f"global_batch={global_batch} has fewer samples than one node's "
            f"{ranks_per_node} ranks, so some rank trains nothing at any size: raise "
            f"global_batch to at least {ranks_per_node} or run fewer ranks per node")


def cap_to_batch(min_nodes: int, max_nodes: int, *, global_batch: int,
                 ranks_per_node: int = 1) -> int:
    """``max_nodes`` lowered to :func:`batch_max_nodes`; a ``min_nodes`` already above it is a
    :class:`SpecError` naming global_batch, ranks_per_node and the size (a larger
    ``max_nodes`` is not: it is a cap)."""
    top = batch_max_nodes(global_batch, ranks_per_node)
    if min_nodes > top:
        fix = batch_below_node(global_batch, ranks_per_node) or (
            "lower min_nodes or raise global_batch")
        raise SpecError(f"min_nodes={min_nodes} is too large: "
                        f"{batch_text(min_nodes, global_batch, ranks_per_node)}; {fix}")
    return min(max_nodes, top)


def fixed_plan_sizes(plan: ExecPlan, min_nodes: int, max_nodes: int, *, global_batch: int,
                     ranks_per_node: int = 1) -> tuple[int, ...]:
    """The node counts in ``min_nodes..max_nodes`` at which the fixed ``plan`` splits the
    global batch (:func:`splits_for`): what the controller may give a job that runs it.

    The size is the controller's choice, not the user's: a job with ``plan="fsdp"`` and
    ``global_batch=64`` given 3 nodes would fail in ``ctx.steps``. No such count is a
    :class:`SpecError` at submit naming global_batch, ranks_per_node and the plan."""
    sizes = tuple(n for n in range(min_nodes, max_nodes + 1)
                  if splits_for(plan, global_batch, n * ranks_per_node))
    if not sizes:
        raise SpecError(
            f"plan {plan.name!r} needs global_batch={global_batch} to split evenly over the "
            f"ranks, and no size from min_nodes={min_nodes} to max_nodes={max_nodes} node(s) "
            f"of ranks_per_node={ranks_per_node} rank(s) does; choose a global_batch that "
            f"is a multiple of some node count x {ranks_per_node}, widen min_nodes..max_nodes "
            "or run another plan (e.g. plan='zero1', or automatic plans)")
    return sizes


def fixed_plan_option(options: Mapping[str, Any]) -> ExecPlan | None:
    """The job's fixed ``plan`` option parsed; None when it leaves plans alone (no ``plan``)
    or asks for automatic ones (``"auto"``).

    For the submit check: a plan :func:`parse_plan` refuses (``"fsdpp"``, ``"zero7"``,
    ``"fsdp@mb=0"``) is a :class:`SpecError` naming the option and the valid plans, raised
    when the job is submitted rather than by every rank once the job holds its nodes."""
    name = options.get("plan")
    if name is None or name == "auto":
        return None
    try:
        return parse_plan(name)
    except (SpecError, UnknownNameError) as exc:
        why = "" if isinstance(exc, UnknownNameError) else f" ({exc})"
        raise SpecError(
            f"malleable option plan={name!r} is not an execution plan{why}; valid plans: "
            f"'auto', {', '.join(repr(b) for b in BASES)}, each optionally with '@mb=N' "
            "(micro-batches of at most N samples, e.g. 'zero1@mb=8')") from None


def global_batch_option(options: Mapping[str, Any]) -> int | None:
    """The job's malleable option ``global_batch`` (samples per optimizer step, the value its
    training function passes to ``ctx.steps``), None when not given."""
    gb = options.get("global_batch")
    if gb is None:
        return None
    if isinstance(gb, bool) or not isinstance(gb, numbers.Integral) or gb < 1:
        raise SpecError(f"global_batch must be an integer >= 1 (samples per optimizer step, as "
                        f"passed to ctx.steps), got {gb!r}; e.g. global_batch=64")
    return int(gb)  # a numpy integer from a sweep's grid is one too


@dataclass(frozen=True)
class PlanOptions:
    """A job's automatic plans: its profile, global batch, the node budget, allowed families.

    Sizes here are *nodes*: ``ranks_per_node`` ranks share one node's ``budget`` (bytes; None:
    no limit), so ``n`` nodes run ``n * ranks_per_node`` ranks and a plan fits when that many
    ranks' peaks fit the node: ``ranks_per_node * peak(n * ranks_per_node) <= budget``, i.e.
    each rank's peak fits :attr:`rank_budget` (every rank's peak is the same).
    """

    profile: MemoryProfile
    global_batch: int
    budget: float | None = None
    bases: tuple[str, ...] = FAMILIES
    ranks_per_node: int = 1

    def __post_init__(self) -> None:
        r = self.ranks_per_node
        if isinstance(r, bool) or not isinstance(r, int) or r < 1:
            raise SpecError(f"ranks_per_node must be an integer >= 1, got {r!r}")
        for b in self.bases:
            if b not in FAMILIES:
                raise unknown_name("plan family", b, FAMILIES)

    @property
    def rank_budget(self) -> float | None:
        """Bytes one rank may use: its accelerator's memory (``rank_memory_bytes``)."""
        return None if self.budget is None else self.budget / self.ranks_per_node

    def budget_text(self) -> str:
        """The budget in words for error messages: per node, and per rank when they differ."""
        node = f"{(self.budget or 0.0) / 2**20:.1f} MiB per node"
        if self.ranks_per_node == 1 or self.budget is None:
            return node
        return f"{node} ({self.rank_budget / 2**20:.1f} MiB a rank)"

    def ranks(self, nodes: int) -> int:
        return nodes * self.ranks_per_node

    @property
    def max_batch_nodes(self) -> int:
        """The most nodes whose ranks all get a sample of the global batch: no plan runs above
        (:func:`batch_max_nodes`)."""
        return batch_max_nodes(self.global_batch, self.ranks_per_node)

    def batch_text(self, nodes: int) -> str:
        """Why ``nodes`` is too large for the global batch, for error messages."""
        return batch_text(nodes, self.global_batch, self.ranks_per_node)

    def node_peak(self, plan: ExecPlan, nodes: int) -> float:
        """Bytes one node needs: its ranks' predicted peaks together."""
        mem = plan_memory(self.profile, plan, n=self.ranks(nodes), global_batch=self.global_batch)
        return self.ranks_per_node * mem.peak

    def feasible(self, nodes: int) -> list[ExecPlan]:
        """The allowed plans that fit the node budget at ``nodes`` nodes."""
        cands = candidate_plans(self.global_batch, self.ranks(nodes), bases=self.bases)
        if self.budget is None:
            return cands
        return [p for p in cands if self.node_peak(p, nodes) <= self.budget]

    def min_nodes(self, n_max: int) -> int | None:
        """The smallest node count at which some allowed plan fits; None if none up to n_max."""
        return next((n for n in range(1, n_max + 1) if self.feasible(n)), None)

    def leanest_need(self, nodes: int) -> tuple[ExecPlan, float]:
        """The allowed plan needing the least memory per node at ``nodes``, and that need.

        Raises :class:`MemoryBudgetError` when the allowed families have no plan at all at
        this size (ZeRO-1 on one rank; ``accum`` once the local batch is 1 sample)."""
        if nodes > self.max_batch_nodes:
            raise MemoryBudgetError(f"no plan runs: {self.batch_text(nodes)}")
        cands = candidate_plans(self.global_batch, self.ranks(nodes), bases=self.bases)
        if not cands:
            raise MemoryBudgetError(
                f"no plan among {list(self.bases)} can run at {nodes} node(s) of "
                f"{self.ranks_per_node} rank(s) with global_batch={self.global_batch} (zero1 "
                "needs 2 ranks or more, fsdp 2 or more that split the global batch evenly, "
                "accum a local batch of 2 samples or more); allow more "
                "plans (plans=[...]) or change min_nodes/max_nodes"
            )
        best = min(cands, key=lambda p: self.node_peak(p, nodes))
        return best, self.node_peak(best, nodes)


def _budget_value(options: Mapping[str, Any], key: str) -> float | None:
    v = options.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, numbers.Real) or not 0 < v < math.inf:
        raise SpecError(f"{key} must be a number of bytes > 0, got {v!r}; e.g. {key}=40 * 2**30")
    return float(v)


def node_budget(options: Mapping[str, Any], *, ranks_per_node: int = 1) -> float | None:
    """A node's memory budget in bytes from a job's options (None: no limit).

    ``rank_memory_bytes`` is the memory of one rank's accelerator (at a facility
    ``accelerator_memory_bytes(site)``): a node runs ``ranks_per_node`` ranks, one per
    accelerator, so its budget is ``ranks_per_node`` times that. ``node_memory_bytes`` is the
    whole node's (an emulated node's). Both may be given only if they agree; each rank's peak
    must then fit ``node_budget / ranks_per_node``.
    """
    node = _budget_value(options, "node_memory_bytes")
    rank = _budget_value(options, "rank_memory_bytes")
    if rank is None:
        return node
    from_rank = ranks_per_node * rank
    if node is not None and abs(node - from_rank) > 1e-9 * max(node, from_rank):
        raise SpecError(
            f"node_memory_bytes={node:.0f} ({node / 2**20:.1f} MiB) and rank_memory_bytes="
            f"{rank:.0f} ({rank / 2**20:.1f} MiB) disagree: with ranks_per_node={ranks_per_node} "
            f"the node budget is ranks_per_node x rank_memory_bytes = {from_rank / 2**20:.1f} "
            "MiB; give only one (rank_memory_bytes: one accelerator's memory)"
        )
    return from_rank


def plan_options(options: Mapping[str, Any], *, ranks_per_node: int = 1) -> PlanOptions | None:
    """The job's :class:`PlanOptions` when it asks for automatic plans, else None.

    A job opts in with the malleable options ``memory_profile`` (a :class:`MemoryProfile` or
    its dict) and ``global_batch``; the budget is ``rank_memory_bytes`` (one accelerator's
    memory, per rank) or ``node_memory_bytes`` (the whole node's), see :func:`node_budget`
    (neither: no limit); ``plans`` lists the allowed families (default all; ``["dp"]`` is
    data-parallel only). A fixed ``plan`` option other than ``"auto"`` turns automatic choice
    off.
    """
    prof = options.get("memory_profile")
    if prof is None or options.get("plan") not in (None, "auto"):
        return None
    if not isinstance(prof, MemoryProfile):
        prof = MemoryProfile.from_dict(prof)
    gb = global_batch_option(options)
    if gb is None:
        raise SpecError("memory_profile needs global_batch (an integer >= 1), got None")
    bases = tuple(options.get("plans") or FAMILIES)
    budget = node_budget(options, ranks_per_node=ranks_per_node)
    return PlanOptions(prof, gb, budget, bases, ranks_per_node)


def min_nodes_for(options: Mapping[str, Any] | PlanOptions | None, min_nodes: int, max_nodes: int,
                  *, ranks_per_node: int = 1) -> int:
    """The job's minimum size raised to the smallest size some allowed plan fits (at or above
    ``min_nodes``: runnable sizes can have holes, e.g. FSDP2 where the batch does not split).

    No plan runs where the ranks outnumber the global batch's samples; a ``min_nodes`` already
    there is refused (SpecError naming global_batch, ranks_per_node and the size)."""
    got = options if isinstance(options, PlanOptions) or options is None else plan_options(
        options, ranks_per_node=ranks_per_node)
    if got is None:
        return min_nodes
    # no plan runs above the batch's cap; a min_nodes past it is refused
    hi = cap_to_batch(min_nodes, max_nodes, global_batch=got.global_batch,
                      ranks_per_node=got.ranks_per_node)
    n = got.min_nodes(hi)
    if n is None:
        _, least = got.leanest_need(hi)  # raises when no plan runs there at all
        at = f"max_nodes={max_nodes}" if hi == max_nodes else (
            f"{hi} node(s), the most global_batch={got.global_batch} gives every rank a sample")
        raise MemoryBudgetError(
            f"no plan among {list(got.bases)} fits {got.budget_text()} even at "
            f"{at} (the leanest needs {least / 2**20:.1f} MiB with "
            f"{got.ranks_per_node} rank(s) per node); "
            f"{'raise max_nodes' if hi == max_nodes else 'raise global_batch'}, allow more "
            "plans (plans=[...]) or run on nodes with more memory"
        )
    lo = max(min_nodes, n)
    first = next((k for k in range(lo, max_nodes + 1) if got.feasible(k)), None)
    if first is None:
        top = max(k for k in range(1, max_nodes + 1) if got.feasible(k))
        raise MemoryBudgetError(
            f"no plan among {list(got.bases)} runs at any size from {lo} to max_nodes="
            f"{max_nodes} node(s): they run at {n}..{top} (with global_batch="
            f"{got.global_batch}); lower min_nodes, raise global_batch or allow more plans"
        )
    return first
