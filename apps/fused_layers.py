"""Horizontally fused layers (HFTA): B copies of one ``nn.Sequential``, trained as one model.

:meth:`FusedSequential.from_models` stacks B models of one architecture (each trial built
with its own seed) into one module whose parameters carry a leading trial dimension. Each
plain layer maps to a fused one through :data:`FUSED_OPS` (one lookup per layer type, as in
HFTA's ``get_hfta_op_for``); an unsupported type raises a :class:`SpecError` naming it and the
supported ones.

Activations travel in one of two layouts:

* ``stack``: ``(B, N, *features)``. Linear layers are one ``torch.baddbmm``.
* ``group``: ``(N, B*C, H, W)``. Conv2d is one grouped convolution (``groups=B``); BatchNorm
  and pooling act per channel, so per-trial statistics come for free.

Every trial's slice depends only on its own parameters and inputs, so trial ``i`` of the fused
model computes what model ``i`` computes alone (up to floating-point summation order).
:meth:`FusedSequential.trial_state_dict` gives trial ``i`` back as a plain ``state_dict``, and
:meth:`FusedSequential.select` keeps a subset of the trials (a trial leaving its array).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from malleparsl.errors import SpecError


class SeededDropout(nn.Module):
    """Dropout whose masks come from ``(seed, call counter)``: reproducible, checkpointable.

    The fused model draws trial ``i``'s mask from the same generator state, so a trial with
    dropout trains identically fused or alone (``nn.Dropout`` draws from the global generator,
    which cannot be shared out per trial).
    """

    def __init__(self, p: float = 0.5, seed: int = 0) -> None:
        super().__init__()
        if not 0.0 <= p < 1.0:
            raise SpecError(f"dropout p must be in [0, 1), got {p!r}")
        self.p, self.seed = float(p), int(seed)
        self.register_buffer("calls", torch.zeros((), dtype=torch.long))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0.0:
            return x
        mask = dropout_mask(x.shape, self.p, self.seed, int(self.calls), x.dtype)
        self.calls += 1
        return x * mask


def dropout_mask(shape: Any, p: float, seed: int, call: int, dtype: torch.dtype) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed * 1_000_003 + call)
    return torch.empty(shape, dtype=dtype).bernoulli_(1.0 - p, generator=gen) / (1.0 - p)


def to_group(x: torch.Tensor, layout: str, B: int) -> torch.Tensor:
    """``(B, N, C, H, W)`` -> ``(N, B*C, H, W)``."""
    if layout == "group":
        return x
    if x.dim() != 5:
        raise SpecError(f"a convolution needs (N, C, H, W) inputs per trial, got {tuple(x.shape[1:])}")
    b, n, c, h, w = x.shape
    return x.transpose(0, 1).reshape(n, b * c, h, w)


def to_stack(x: torch.Tensor, layout: str, B: int) -> torch.Tensor:
    """``(N, B*C, H, W)`` -> ``(B, N, C, H, W)``."""
    if layout == "stack":
        return x
    n, bc = x.shape[:2]
    return x.reshape(n, B, bc // B, *x.shape[2:]).transpose(0, 1)


class FusedOp(nn.Module):
    """One fused layer: ``forward(x, layout) -> (x, layout)``; ``plain`` names its params."""

    plain_params: tuple[str, ...] = ()
    plain_buffers: tuple[str, ...] = ()
    shared_buffers: tuple[str, ...] = ()  # identical across trials (one copy, not stacked)

    def __init__(self, mods: Sequence[nn.Module]) -> None:
        super().__init__()
        self.B = len(mods)
        for name in self.plain_params:
            stacked = torch.stack([getattr(m, name).detach() for m in mods]).clone()
            self.register_parameter(name, nn.Parameter(stacked))
        for name in self.plain_buffers:
            self.register_buffer(name, torch.stack([getattr(m, name).detach() for m in mods]).clone())
        for name in self.shared_buffers:
            self.register_buffer(name, getattr(mods[0], name).detach().clone())

    def select(self, keep: torch.Tensor) -> None:
        for name in self.plain_params:
            setattr(self, name, nn.Parameter(getattr(self, name).data[keep].clone()))
        for name in self.plain_buffers:
            setattr(self, name, getattr(self, name)[keep].clone())
        self.B = len(keep)

    def trial_state(self, i: int, prefix: str) -> dict[str, torch.Tensor]:
        out = {f"{prefix}{n}": getattr(self, n).detach()[i].clone()
               for n in (*self.plain_params, *self.plain_buffers)}
        out.update({f"{prefix}{n}": getattr(self, n).detach().clone() for n in self.shared_buffers})
        return out


class FusedLinear(FusedOp):
    def __init__(self, mods: Sequence[nn.Module]) -> None:
        self.plain_params = ("weight", "bias") if mods[0].bias is not None else ("weight",)
        super().__init__(mods)

    def forward(self, x: torch.Tensor, layout: str) -> tuple[torch.Tensor, str]:
        x = to_stack(x, layout, self.B)
        lead = x.shape[1:-1]
        x3 = x.reshape(self.B, -1, x.shape[-1])
        if len(self.plain_params) == 1:
            y = torch.bmm(x3, self.weight.transpose(1, 2))
        else:
            y = torch.baddbmm(self.bias.unsqueeze(1), x3, self.weight.transpose(1, 2))
        return y.reshape(self.B, *lead, y.shape[-1]), "stack"


class FusedConv2d(FusedOp):
    def __init__(self, mods: Sequence[nn.Module]) -> None:
        m = mods[0]
        if m.padding_mode != "zeros" or isinstance(m.padding, str):
            raise SpecError("fused Conv2d needs padding_mode='zeros' and int padding")
        self.plain_params = ("weight", "bias") if m.bias is not None else ("weight",)
        super().__init__(mods)
        self.stride, self.padding, self.dilation, self.groups = m.stride, m.padding, m.dilation, m.groups
        self.channels_last = False  # set by FusedSequential.from_models(channels_last=True)

    def forward(self, x: torch.Tensor, layout: str) -> tuple[torch.Tensor, str]:
        x = to_group(x, layout, self.B)
        if self.channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        w = self.weight.reshape(-1, *self.weight.shape[2:])
        bias = self.bias.reshape(-1) if len(self.plain_params) == 2 else None
        y = F.conv2d(x, w, bias, self.stride, self.padding, self.dilation,
                     self.groups * self.B)
        return y, "group"


class FusedBatchNorm(FusedOp):
    """Per-trial batch statistics and running estimates (channels of all trials side by side)."""

    plain_params = ("weight", "bias")
    plain_buffers = ("running_mean", "running_var")
    shared_buffers = ("num_batches_tracked",)

    def __init__(self, mods: Sequence[nn.Module]) -> None:
        m = mods[0]
        if not (m.affine and m.track_running_stats) or m.momentum is None:
            raise SpecError("fused BatchNorm needs affine=True, track_running_stats=True and a "
                            "float momentum")
        super().__init__(mods)
        self.eps, self.momentum, self.conv = m.eps, m.momentum, isinstance(m, nn.BatchNorm2d)

    def forward(self, x: torch.Tensor, layout: str) -> tuple[torch.Tensor, str]:
        if self.training:
            self.num_batches_tracked += 1
        args = (self.running_mean.view(-1), self.running_var.view(-1), self.weight.reshape(-1),
                self.bias.reshape(-1), self.training, self.momentum, self.eps)
        if self.conv:
            return F.batch_norm(to_group(x, layout, self.B), *args), "group"
        x = to_stack(x, layout, self.B)  # (B, N, F) -> (N, B*F)
        b, n, f = x.shape
        y = F.batch_norm(x.transpose(0, 1).reshape(n, b * f), *args)
        return y.reshape(n, b, f).transpose(0, 1), "stack"


class FusedElementwise(FusedOp):
    """Activations: any layout, the plain module applied as is."""

    def __init__(self, mods: Sequence[nn.Module]) -> None:
        super().__init__(mods)
        self.fn = mods[0]

    def forward(self, x: torch.Tensor, layout: str) -> tuple[torch.Tensor, str]:
        return self.fn(x), layout


class FusedMaxPool(FusedElementwise):
    def forward(self, x: torch.Tensor, layout: str) -> tuple[torch.Tensor, str]:
        # pooling B*C channels in NCHW hits a slow CPU path (measured at 64 x 128 x 8 x 8,
        # forward+backward: 26 ms NCHW, 3.4 ms channels-last); the layout copies are exact,
        # and converting back keeps the convolutions' (and BatchNorm's) arithmetic unchanged
        x = to_group(x, layout, self.B).contiguous(memory_format=torch.channels_last)
        return self.fn(x).contiguous(), "group"


class FusedFlatten(FusedOp):
    def __init__(self, mods: Sequence[nn.Module]) -> None:
        super().__init__(mods)
        m = mods[0]
        if isinstance(m, nn.Flatten) and (m.start_dim != 1 or m.end_dim != -1):
            raise SpecError("fused Flatten supports start_dim=1, end_dim=-1 only")
        self.unflatten = tuple(m.unflattened_size) if isinstance(m, nn.Unflatten) else None
        if isinstance(m, nn.Unflatten) and m.dim != 1:
            raise SpecError("fused Unflatten supports dim=1 only")

    def forward(self, x: torch.Tensor, layout: str) -> tuple[torch.Tensor, str]:
        x = to_stack(x, layout, self.B)
        if self.unflatten is not None:
            return x.reshape(*x.shape[:2], *self.unflatten), "stack"
        return x.reshape(*x.shape[:2], -1), "stack"


class FusedDropout(FusedOp):
    """Trial ``i`` draws its mask as :class:`SeededDropout` with trial ``i``'s seed would."""

    shared_buffers = ("calls",)

    def __init__(self, mods: Sequence[nn.Module]) -> None:
        if not all(isinstance(m, SeededDropout) for m in mods):
            raise SpecError("fuse dropout as SeededDropout(p, seed): nn.Dropout draws from the "
                            "global generator, so no trial could be reproduced alone")
        super().__init__(mods)
        self.p, self.seeds = mods[0].p, [m.seed for m in mods]

    def select(self, keep: torch.Tensor) -> None:
        super().select(keep)
        self.seeds = [self.seeds[int(i)] for i in keep]

    def forward(self, x: torch.Tensor, layout: str) -> tuple[torch.Tensor, str]:
        if not self.training or self.p == 0.0:
            return x, layout
        x = to_stack(x, layout, self.B)
        call = int(self.calls)
        masks = torch.stack([dropout_mask(x.shape[1:], self.p, s, call, x.dtype) for s in self.seeds])
        self.calls += 1
        return x * masks, "stack"


FUSED_OPS: dict[type, Callable[[Sequence[nn.Module]], FusedOp]] = {
    nn.Linear: FusedLinear,
    nn.Conv2d: FusedConv2d,
    nn.BatchNorm1d: FusedBatchNorm,
    nn.BatchNorm2d: FusedBatchNorm,
    nn.ReLU: FusedElementwise,
    nn.GELU: FusedElementwise,
    nn.Tanh: FusedElementwise,
    nn.Identity: FusedElementwise,
    nn.MaxPool2d: FusedMaxPool,
    nn.Flatten: FusedFlatten,
    nn.Unflatten: FusedFlatten,
    SeededDropout: FusedDropout,
    nn.Dropout: FusedDropout,  # raises with the fix
}


def fused_op_for(mods: Sequence[nn.Module]) -> FusedOp:
    """The fused layer for B plain layers of one type (HFTA's ``get_hfta_op_for``)."""
    kind = type(mods[0])
    if any(type(m) is not kind for m in mods):
        raise SpecError(f"trials differ in layer type: {sorted({type(m).__name__ for m in mods})}")
    make = FUSED_OPS.get(kind)
    if make is None:
        raise SpecError(f"layer {kind.__name__} cannot be fused; supported: "
                        f"{sorted(k.__name__ for k in FUSED_OPS)}")
    return make(mods)


def _flat_layers(model: nn.Module, prefix: str = "") -> list[tuple[str, nn.Module]]:
    if not isinstance(model, nn.Sequential):
        raise SpecError(f"fused trials need nn.Sequential models, got {type(model).__name__}")
    out = []
    for name, child in model.named_children():
        if isinstance(child, nn.Sequential):
            out += _flat_layers(child, f"{prefix}{name}.")
        else:
            out.append((f"{prefix}{name}.", child))
    return out


class FusedSequential(nn.Module):
    """B trials of one ``nn.Sequential`` architecture as one model (see the module docs)."""

    def __init__(self, ops: Sequence[FusedOp], prefixes: Sequence[str], B: int) -> None:
        super().__init__()
        self.ops = nn.ModuleList(ops)
        self.prefixes = list(prefixes)
        self.B = B

    @classmethod
    def from_models(cls, models: Sequence[nn.Module], *, channels_last: bool = False
                    ) -> FusedSequential:
        """Fuse ``models`` (one architecture). ``channels_last`` runs convolutions, BatchNorm
        and pooling in channels-last layout: about 2x faster for the digits CNN on CPU, but
        another summation order, so trials drift from their unfused runs (1.7e-5 in loss
        after 20 steps, measured) instead of matching within 1e-5."""
        if not models:
            raise SpecError("an array needs at least one trial model")
        layers = [_flat_layers(m) for m in models]
        names = [[n for n, _ in lay] for lay in layers]
        if any(n != names[0] for n in names) or any(
            {k: tuple(v.shape) for k, v in m.state_dict().items()}
            != {k: tuple(v.shape) for k, v in models[0].state_dict().items()} for m in models
        ):
            raise SpecError("trials in one array must share one architecture (layer names and shapes)")
        ops = [fused_op_for([lay[i][1] for lay in layers]) for i in range(len(names[0]))]
        for op in ops:
            if isinstance(op, FusedConv2d):
                op.channels_last = channels_last
        return cls(ops, names[0], len(models))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x``: ``(B, N, *input)`` (each trial its own samples); returns ``(B, N, *output)``."""
        layout = "stack"
        for op in self.ops:
            x, layout = op(x, layout)
        return to_stack(x, layout, self.B)

    def select(self, keep: Sequence[int] | torch.Tensor) -> None:
        """Keep only the trials at positions ``keep`` (in that order)."""
        keep = torch.as_tensor(list(keep) if not torch.is_tensor(keep) else keep, dtype=torch.long)
        for op in self.ops:
            op.select(keep)
        self.B = len(keep)

    def trial_state_dict(self, i: int) -> dict[str, torch.Tensor]:
        """Trial ``i`` as the ``state_dict`` of its plain model."""
        out: dict[str, torch.Tensor] = {}
        for op, prefix in zip(self.ops, self.prefixes):
            out.update(op.trial_state(i, prefix))
        return out
