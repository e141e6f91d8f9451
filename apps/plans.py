"""Carry out an execution plan in a training function: checkpointed blocks, a sharded optimizer.

The plan is chosen outside (the driver picks the best plan that fits the node's memory at
every size, see :mod:`malleparsl.plans`) and arrives as ``ctx.plan``; the training function
hands its model and optimizer class to :func:`prepare` and writes the same loop as before::

    model = Net()
    model, opt = prepare(ctx, model, torch.optim.Adam, blocks=model.layers, lr=1e-3)
    for step in ctx.steps(total_steps, global_batch=64, dataset_size=len(x)):
        opt.zero_grad()
        for idx in step.micro_batches():       # the plan's micro-batch applies here
            step.backward(loss_fn(model(x[idx]), y[idx]))
        loss = step.sync(model)
        opt.step()

Every plan computes the same global mean gradient and the same update, so the loss
trajectory does not depend on the plan. Checkpoints are plan-independent: the model's
``state_dict`` is unchanged by checkpointing, and :class:`PlanOptimizer` always saves the plain
optimizer's format (ZeRO's shards are consolidated on rank 0 first), which any plan loads at any
size (ZeRO keeps its own partition of it). Under FSDP2 (``fsdp``) the model is registered as a
:class:`ShardedModel` and both it and the optimizer are ``sharded_checkpoint``: every rank
writes its own shards with ``torch.distributed.checkpoint`` (no rank gathers the whole state,
see :meth:`~malleparsl.apps.checkpoint.CheckpointStore.save_sharded`) and loads its shard of a
sharded checkpoint at any size; any other plan reads such a checkpoint whole into the plain
format, and FSDP2 still loads a plain file, each rank reading its shard of it only (ZeRO-1
its own parameters' state; see ``reads_mapped_state`` and ``TrainContext.restore``).
"""

from __future__ import annotations

import functools
import logging
from typing import Any

import torch
from torch import nn

from malleparsl.errors import SpecError
from malleparsl.plans import (
    ZERO_GLOO_OVERHEAD,
    ExecPlan,
    MemoryBudgetError,
    MemoryProfile,
    node_budget,
    plan_memory,
)

log = logging.getLogger(__name__)


def _gathered(value: Any, keep: bool) -> Any:
    """A DTensor's full tensor, as a CPU copy where ``keep`` (rank 0) and ``None`` elsewhere.

    A collective: every rank calls it for the same tensors in the same order. Each gathered
    tensor is dropped at once where it is not kept, so a caller that gathers one tensor at a
    time holds at most one full tensor on the other ranks."""
    from torch.distributed.tensor import DTensor

    full = value.full_tensor() if isinstance(value, DTensor) else value
    if not keep:
        return None
    if isinstance(full, torch.Tensor):  # a copy: plain values alias the live state
        return full.detach().to("cpu", copy=True)
    return full


def _shard_like(value: Any, ref: Any) -> Any:
    """This rank's shard of the full tensor ``value``, placed as ``ref`` (no communication:
    every rank has the whole checkpoint); a copy of ``value`` when ``ref`` is not a DTensor or
    the shapes differ (a scalar ``step``). Memory of its own: nothing kept aliases ``value``.
    A tensor of a mapped checkpoint (FSDP2's ``Shard(0)``) has only its shard read from the
    file (:func:`~malleparsl.apps.checkpoint.read_rows`)."""
    from torch.distributed.tensor import DTensor, Shard, distribute_tensor

    from malleparsl.apps.checkpoint import read_rows

    if (isinstance(ref, DTensor) and isinstance(value, torch.Tensor)
            and not isinstance(value, DTensor) and tuple(value.shape) == tuple(ref.shape)):
        try:  # private in torch 2.13; without it the shard is cut from the whole tensor
            from torch.distributed.tensor._utils import compute_local_shape_and_global_offset
        except ImportError:  # pragma: no cover - another torch
            compute_local_shape_and_global_offset = None
        if (compute_local_shape_and_global_offset is not None and value.dtype == ref.dtype
                and tuple(ref.placements) == (Shard(0),) and value.dim()):
            shape, offset = compute_local_shape_and_global_offset(
                ref.shape, ref.device_mesh, ref.placements)
            rows = read_rows(value, offset[0], offset[0] + shape[0])
            if rows is not None:
                return DTensor.from_local(rows.to(ref.device), ref.device_mesh, ref.placements,
                                          run_check=False, shape=ref.shape, stride=ref.stride())
        part = distribute_tensor(value.to(ref.dtype), ref.device_mesh, ref.placements,
                                 src_data_rank=None)
        local = part.to_local()
        if local.untyped_storage().data_ptr() != value.untyped_storage().data_ptr():
            return part  # distribute_tensor copied it
        return DTensor.from_local(local.clone(), part.device_mesh, part.placements,
                                  run_check=False, shape=part.shape, stride=part.stride())
    return value.clone() if isinstance(value, torch.Tensor) else value


def _consolidate_zero(zero: Any) -> None:
    """``zero.consolidate_state_dict(to=0)`` without its copies: every rank's shard of the
    optimizer state reaches rank 0 one tensor at a time, straight into the tensor kept.

    torch's version pickles each rank's whole shard, so rank 0 holds a shard three times
    while receiving it (the bytes, their copy, the unpickled tensors). Here only the small
    structure is pickled. A collective: every rank calls it. Fills what torch's fills (the
    per-rank list ``_all_state_dicts``, on rank 0 only), so ``zero.state_dict()`` works as
    after torch's; :meth:`PlanOptimizer.release` empties it.
    """
    import torch.distributed as dist

    zero._sync_param_groups(zero.param_groups, zero.optim.param_groups)  # as torch's does
    me = dist.get_rank(zero.process_group)
    own = zero.optim.state_dict()
    shards = []
    for r in range(dist.get_world_size(zero.process_group)):
        src = dist.distributed_c10d.get_global_rank(zero.process_group, r)
        dst = dist.distributed_c10d.get_global_rank(zero.process_group, 0)
        if r == me == 0:
            shards.append(own)  # references to the live state, as torch keeps on CPU
        elif r == me:
            tensors: list[torch.Tensor] = []
            dist.send_object_list([_skeleton(own, tensors)], dst=dst, group=zero.process_group,
                                 device=zero._default_device)
            for t in tensors:  # on the group's device (NCCL sends no CPU tensor: Adam's step)
                dist.send(t.detach().to(zero._default_device).contiguous(), dst=dst,
                          group=zero.process_group)
        elif me == 0:
            box: list[Any] = [None]
            dist.recv_object_list(box, src=src, group=zero.process_group,
                                 device=zero._default_device)  # as torch's: NCCL's device
            shards.append(_filled(box[0], src, zero))
    zero._all_state_dicts = shards if me == 0 else []


class _TensorSlot:
    """Where a tensor goes in a state dict sent as its structure (shape and dtype only)."""

    def __init__(self, t: torch.Tensor) -> None:
        self.shape, self.dtype = tuple(t.shape), t.dtype


def _skeleton(value: Any, tensors: list[torch.Tensor]) -> Any:
    if isinstance(value, torch.Tensor):
        tensors.append(value)
        return _TensorSlot(value)
    if isinstance(value, dict):
        return {k: _skeleton(v, tensors) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_skeleton(v, tensors) for v in value)
    return value


def _filled(value: Any, src: int, zero: Any) -> Any:
    """``value`` with every slot received from ``src``, in :func:`_skeleton`'s order."""
    import torch.distributed as dist

    if isinstance(value, _TensorSlot):
        t = torch.empty(value.shape, dtype=value.dtype, device=zero._default_device)
        dist.recv(t, src=src, group=zero.process_group)
        return t.cpu()  # kept on the CPU, as torch's consolidation does
    if isinstance(value, dict):
        return {k: _filled(v, src, zero) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_filled(v, src, zero) for v in value)
    return value


def _rank() -> int:
    import torch.distributed as dist

    return dist.get_rank() if dist.is_initialized() else 0


def shard_model(model: nn.Module, blocks: Any, *, world_size: int, device: Any) -> nn.Module:
    """Apply FSDP2's ``fully_shard`` to every block, then to the rest (the root unit).

    Gradients are *summed* by its reduce-scatter (divide factor 1, plain SUM: gloo has no
    pre-multiplied sum), so :meth:`~malleparsl.apps.step.Step.sync` divides by the global
    batch once, as for every plan. Parameters must already be equal on every rank.
    """
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh(torch.device(device).type, (world_size,))
    units = [*(blocks or ()), model]
    for unit in units:
        fully_shard(unit, mesh=mesh)
    for unit in units:  # per unit: the root's setting does not reach the blocks' groups
        unit.set_gradient_divide_factor(1.0)
        unit.set_force_sum_reduction_for_comms(True)
    return model


class ShardedModel:
    """An FSDP2 model's checkpoint state.

    Checkpoints are sharded (``sharded_checkpoint``): :meth:`dcp_state` is the model's state
    dict of DTensor shards (no copy) and :meth:`load_dcp` fills it from a sharded checkpoint.
    :meth:`load_state_dict` takes a plain state dict on every rank and keeps each rank's shard
    (of a mapped plain file, only the shard is read). :meth:`consolidate` / :meth:`state_dict` give the plain format
    (gathered one tensor at a time, kept on rank 0 only, until :meth:`release`).
    """

    collective_state = True
    sharded_checkpoint = True
    reads_mapped_state = True  # a plain file: load_state_dict reads this rank's shard only
    checkpoint_kind = "module"

    def dcp_state(self) -> dict[str, Any]:
        from torch.distributed.checkpoint.state_dict import get_model_state_dict

        return get_model_state_dict(self.model)

    def load_dcp(self, entry: Any) -> None:
        from torch.distributed.checkpoint.state_dict import (
            get_model_state_dict,
            set_model_state_dict,
        )

        sd = get_model_state_dict(self.model)
        entry.load_into(sd)
        set_model_state_dict(self.model, sd)

    def __init__(self, model: nn.Module, class_name: str) -> None:
        self.model = model
        self.class_name = class_name  # fully_shard renames the class (FSDPNet): the plain one
        self._full: dict[str, Any] | None = None

    def consolidate(self) -> None:
        keep = _rank() == 0
        full = {}
        for k, v in self.model.state_dict().items():  # one collective per tensor, same order
            full[k] = _gathered(v, keep)
        self._full = full if keep else None

    def release(self) -> None:
        """Drop rank 0's full copy (the checkpoint holding it is written)."""
        self._full = None

    def state_dict(self) -> dict[str, Any]:
        if self._full is None:
            raise SpecError("ShardedModel.state_dict(): call consolidate() on every rank first")
        return self._full

    def load_state_dict(self, state: dict[str, Any]) -> None:
        own = self.model.state_dict()
        if set(own) != set(state):
            raise SpecError(f"state dict keys differ: missing {sorted(set(own) - set(state))}, "
                            f"unexpected {sorted(set(state) - set(own))}")
        from torch.distributed.tensor import DTensor

        with torch.no_grad():
            for k, v in own.items():
                part = _shard_like(state[k], v)
                local = v.to_local() if isinstance(v, DTensor) else v
                local.copy_(part.to_local() if isinstance(part, DTensor) else part)

    def checkpoint_layout(self) -> list[str]:
        """The plain model's layout (DTensors report their global shapes)."""
        from malleparsl.apps.checkpoint import _leaf_layout

        out = [f"class:{self.class_name}"]
        _leaf_layout("", self.model.state_dict(), out)
        return out


def set_checkpointing(blocks: Any, on: bool) -> None:
    """Recompute each block in the backward pass (``on``) or keep its activations.

    The block's ``forward`` is replaced on the instance only, so ``state_dict`` keys and the
    module tree stay as they are (a checkpoint written under any plan loads under any other).
    """
    from torch.utils.checkpoint import checkpoint

    for blk in blocks:
        if not isinstance(blk, nn.Module):
            raise SpecError(f"blocks must be nn.Modules, got {type(blk).__name__}")
        if "forward" in blk.__dict__:
            del blk.forward  # back to the class's forward
        if on:
            blk.forward = functools.partial(checkpoint, type(blk).forward.__get__(blk),
                                            use_reentrant=False)


class PlanOptimizer:
    """An optimizer run plainly or sharded (ZeRO-1, or over FSDP2's sharded parameters), with
    one portable checkpoint format.

    ``state_dict()`` is the plain optimizer's; when sharded it needs :meth:`consolidate` on
    every rank first (``TrainContext.save`` does that for objects with ``collective_state``).
    """

    checkpoint_kind = "optimizer"

    def __init__(self, params: Any, optimizer_class: type, *, zero: bool, fsdp: bool = False,
                 model: nn.Module | None = None, **kwargs: Any) -> None:
        import torch.distributed as dist

        params = list(params)
        multi = dist.is_initialized() and dist.get_world_size() > 1
        self.zero = bool(zero) and multi
        self.fsdp = bool(fsdp) and multi  # params are DTensor shards; so is the state
        self.collective_state = self.zero or self.fsdp
        self.model = model  # the FSDP2 model, for its sharded checkpoints
        self.sharded_checkpoint = self.fsdp and model is not None
        self._full: dict[str, Any] | None = None
        if self.zero:
            from torch.distributed.optim import ZeroRedundancyOptimizer

            self.opt = ZeroRedundancyOptimizer(params, optimizer_class=optimizer_class, **kwargs)
        else:
            self.opt = optimizer_class(params, **kwargs)

    @property
    def sharded(self) -> bool:
        return self.zero or self.fsdp

    @property
    def reads_mapped_state(self) -> bool:
        """Sharded: :meth:`load_state_dict` takes a mapped plain state and reads this rank's
        part of it only (see ``TrainContext.restore``)."""
        return self.sharded

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return self.opt.param_groups

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.opt.zero_grad(set_to_none=set_to_none)

    def step(self, closure: Any = None) -> Any:
        return self.opt.step(closure) if closure is not None else self.opt.step()

    def register_step_post_hook(self, hook: Any) -> Any:
        return self.opt.register_step_post_hook(hook)

    def dcp_state(self) -> dict[str, Any]:
        """The state keyed by parameter names, of DTensor shards (FSDP2 only)."""
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

        return get_optimizer_state_dict(self.model, self.opt)

    def load_dcp(self, entry: Any) -> None:
        from torch.distributed.checkpoint.state_dict import (
            get_optimizer_state_dict,
            set_optimizer_state_dict,
        )

        sd = get_optimizer_state_dict(self.model, self.opt)
        entry.load_into(sd)
        set_optimizer_state_dict(self.model, self.opt, sd)

    def consolidate(self) -> None:
        """Collective: gather the sharded state on rank 0 (no-op when not sharded)."""
        if self.zero:
            _consolidate_zero(self.opt)
        elif self.fsdp:  # one tensor at a time, kept on rank 0 only (see ShardedModel)
            keep = _rank() == 0
            sd = self.opt.state_dict()
            full: dict[Any, dict[str, Any]] = {}
            for i, st in sd["state"].items():
                full[i] = {}
                for k, v in st.items():
                    full[i][k] = _gathered(v, keep)
            self._full = {"state": full, "param_groups": sd["param_groups"]} if keep else None

    def release(self) -> None:
        """Drop rank 0's full copy of the sharded state (the checkpoint holding it is written).

        Under ZeRO-1 that is the list of every rank's shard which ``consolidate_state_dict``
        leaves on rank 0 (torch keeps it until the next consolidation: the other ranks' shards,
        ``(n - 1) / n`` of the optimizer state, beyond what the memory model counts).
        """
        self._full = None
        if self.zero:
            self.opt._all_state_dicts = []  # what torch's consolidate_state_dict fills

    def state_dict(self) -> dict[str, Any]:
        if not self.fsdp:
            return self.opt.state_dict()
        if self._full is None:
            raise SpecError("PlanOptimizer.state_dict(): call consolidate() on every rank first")
        return self._full

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Load the plain format; sharded, read (and keep) this rank's part of it only."""
        if self.fsdp:  # keep this rank's shard of every full state tensor
            params = [p for g in self.opt.param_groups for p in g["params"]]
            state = {**state, "state": {
                i: {k: _shard_like(v, params[int(i)]) for k, v in st.items()}
                for i, st in state["state"].items()}}
        elif self.zero:  # this rank's parameters' state, in memory of its own; no other's
            from malleparsl.apps.checkpoint import owned

            mine = {i for i, p in enumerate(self.opt._index_to_param)
                    if self.opt._param_to_rank[p] == self.opt.rank}
            state = {**state, "state": {i: owned(st) for i, st in state["state"].items()
                                        if int(i) in mine}}
        self.opt.load_state_dict(state)


def prepare(
    ctx: Any,
    model: nn.Module,
    optimizer_class: type,
    *,
    blocks: Any = None,
    profile: MemoryProfile | None = None,
    global_batch: int | None = None,
    **optimizer_kwargs: Any,
) -> tuple[nn.Module, PlanOptimizer]:
    """Apply ``ctx.plan`` to ``model``, build its optimizer, register both for checkpoints.

    ``blocks``: the modules to checkpoint under a ``ckpt`` plan (e.g. a transformer's layers);
    required for those plans. With a budget (option ``rank_memory_bytes``, one accelerator's
    memory, or ``node_memory_bytes``, the node's: :func:`~malleparsl.plans.node_budget`), and
    ``profile`` and ``global_batch``, the plan's predicted peak is checked against the budget
    before training (the node's ranks together: ``ctx.local_world_size`` peaks); always with
    a budget, the measured growth of this process's memory after each of the first steps
    against its share of the node's budget (:class:`MemoryGuard`).
    """
    plan: ExecPlan = ctx.plan
    if plan.checkpoint and blocks is None:
        raise SpecError(
            f"plan {plan.name!r} checkpoints activations: pass blocks=... (the model's "
            "repeated layers) to prepare()"
        )
    per_node = max(1, int(getattr(ctx, "local_world_size", 1) or 1))  # ranks sharing the node
    budget = node_budget(ctx.options, ranks_per_node=per_node)
    guard = MemoryGuard(budget, ranks=per_node) if budget else None
    if budget and profile is not None and global_batch:
        need = per_node * plan_memory(profile, plan, n=ctx.world_size,
                                      global_batch=global_batch).peak
        if need > float(budget):
            raise MemoryBudgetError(
                f"plan {plan.name} needs {need / 2**20:.1f} MiB per node at "
                f"{max(1, ctx.world_size // per_node)} node(s) of {per_node} rank(s), over the "
                f"node budget of {float(budget) / 2**20:.1f} MiB"
            )
    model = model.to(ctx.device)
    if blocks is not None:
        set_checkpointing(blocks, plan.checkpoint)
    fsdp = plan.fsdp and ctx.world_size > 1
    state: Any = model
    if fsdp:
        for t in [*model.parameters(), *model.buffers()]:  # equal replicas before sharding
            ctx.broadcast(t.data)
        state = ShardedModel(model, type(model).__qualname__)
        shard_model(model, blocks, world_size=ctx.world_size, device=ctx.device)
    opt = PlanOptimizer(model.parameters(), optimizer_class, zero=plan.zero, fsdp=fsdp,
                        model=model if fsdp else None, **optimizer_kwargs)
    ctx.register(model=state, optimizer=opt)
    if guard is not None:
        opt.register_step_post_hook(guard.after_step)
    return model, opt


class MemoryGuard:
    """Enforces a node's memory budget on CPU: the process's resident memory may grow by at
    most the budget from when the job's model was built. Checked after the first steps (when
    parameters, gradients and optimizer state all exist); raises :class:`MemoryBudgetError`
    instead of letting the node run out of memory."""

    def __init__(self, budget: float, *, steps: int = 3, ranks: int = 1) -> None:
        from malleparsl.apps.memory import peak_rss_bytes, reset_peak_rss

        self.budget = float(budget)
        self.ranks = max(1, int(ranks))  # ranks sharing the node: each may grow by its share
        self.steps = steps
        reset_peak_rss()
        self.base = peak_rss_bytes()

    def after_step(self, *_: Any) -> None:
        from malleparsl.apps.memory import peak_rss_bytes

        if self.steps <= 0:
            return
        self.steps -= 1
        used = peak_rss_bytes() - self.base
        if used > self.budget / self.ranks:
            share = "" if self.ranks == 1 else f"its 1/{self.ranks} share of "
            raise MemoryBudgetError(
                f"this rank's memory grew by {used / 2**20:.1f} MiB, over {share}the node budget "
                f"of {self.budget / 2**20:.1f} MiB (node_memory_bytes, or ranks_per_node x "
                "rank_memory_bytes); run a leaner plan (ckpt, zero1, smaller micro-batches) or "
                "more nodes"
            )


def profile_memory(
    model: nn.Module,
    batch: Any,
    loss_fn: Any,
    *,
    blocks: Any = (),
    opt_states: int = 2,
    opt_temps: int = 1,
    zero_overhead: float = ZERO_GLOO_OVERHEAD,
) -> MemoryProfile:
    """Measure a model's :class:`MemoryProfile` from one forward pass on ``batch``.

    Saved-tensor hooks count the bytes autograd keeps for the backward pass (parameters
    excluded: they are counted once); forward pre-hooks attribute them to ``blocks`` and record
    each block's input, which is all a checkpointed block keeps. Per sample = total / batch size.
    """
    params = list(model.parameters())
    param_ptrs = {p.untyped_storage().data_ptr() for p in params}
    seen: set[tuple[int, int]] = set()
    inside: list[int] = [-1]
    per_block: dict[int, float] = {}
    block_inputs = 0.0
    outside = 0.0
    largest = [0.0]  # the largest saved tensor: its gradient and its input's coexist

    def pack(t: torch.Tensor) -> torch.Tensor:
        nonlocal outside
        nbytes = t.numel() * t.element_size()  # a view of a larger tensor keeps only itself
        key = (t.data_ptr(), nbytes)
        if t.untyped_storage().data_ptr() in param_ptrs or key in seen:
            return t
        seen.add(key)
        largest[0] = max(largest[0], nbytes)
        if inside[-1] >= 0:
            per_block[inside[-1]] = per_block.get(inside[-1], 0.0) + nbytes
        else:
            outside += nbytes
        return t

    handles = []
    blocks = list(blocks)
    in_blocks = [sum(p.numel() for p in blk.parameters()) for blk in blocks]  # FSDP units
    for i, blk in enumerate(blocks):
        def pre(_m: Any, args: Any, i: int = i) -> None:
            nonlocal block_inputs
            inside.append(i)
            block_inputs += sum(a.numel() * a.element_size() for a in args
                                if isinstance(a, torch.Tensor))

        def post(_m: Any, _a: Any, _o: Any) -> None:
            inside.pop()

        handles += [blk.register_forward_pre_hook(pre), blk.register_forward_hook(post)]
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            loss = loss_fn(model, batch)
    finally:
        for h in handles:
            h.remove()
    del loss
    n = len(batch[0]) if isinstance(batch, (tuple, list)) else len(batch)
    total = outside + sum(per_block.values())
    ckpt = outside + block_inputs + max(per_block.values(), default=0.0)
    return MemoryProfile(
        params=sum(p.numel() for p in params),
        act_per_sample=total / n,
        act_ckpt_per_sample=ckpt / n,
        bytes_per_param=params[0].element_size() if params else 4,
        opt_states=opt_states,
        opt_temps=opt_temps,
        buffers=float(sum(b.numel() * b.element_size() for b in model.buffers())),
        grad_transient_per_sample=2 * largest[0] / n,
        zero_overhead=zero_overhead,
        unit_params=max([*in_blocks, sum(p.numel() for p in params) - sum(in_blocks)]),
    )
