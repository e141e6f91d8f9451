"""One optimizer over stacked trial parameters, each trial with its own hyperparameters.

``FusedOptimizer`` applies Adam, AdamW or SGD (momentum, dampening, Nesterov) to parameters
of shape ``(B, ...)`` with per-trial learning rate, weight decay, momentum and betas, in a
handful of whole-tensor operations per parameter instead of one ``torch.optim`` call per
trial. It follows the arithmetic of ``torch.optim``'s single-tensor path step by step (the one
used on CPU), so trial ``i`` gets the update ``torch.optim`` would give it alone; the tests
compare both. ``trial_state`` / ``load_trial_state`` convert one trial's slice to and from
``torch.optim``'s ``state_dict`` format, so a trial can leave an array and continue alone, or
join another array.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from malleparsl.errors import SpecError

KINDS = ("adam", "adamw", "sgd")


@dataclass(frozen=True)
class TrialHparams:
    """One trial's optimizer settings (``optimizer`` must match across an array)."""

    optimizer: str = "adam"
    lr: float = 1e-3
    weight_decay: float = 0.0
    momentum: float = 0.0  # SGD
    dampening: float = 0.0  # SGD
    nesterov: bool = False  # SGD
    beta1: float = 0.9  # Adam/AdamW
    beta2: float = 0.999
    eps: float = 1e-8

    def __post_init__(self) -> None:
        if self.optimizer not in KINDS:
            raise SpecError(f"optimizer {self.optimizer!r} is not one of {KINDS}")
        if not self.lr > 0:
            raise SpecError(f"lr must be > 0, got {self.lr!r}")
        if self.nesterov and (self.momentum <= 0 or self.dampening != 0):
            raise SpecError("nesterov needs momentum > 0 and dampening 0 (as torch.optim.SGD)")

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> TrialHparams:
        """Take the known keys of a trial configuration (others are ignored)."""
        names = cls.__dataclass_fields__
        return cls(**{k: config[k] for k in names if k in config})

    def torch_optimizer(self, params: Any) -> torch.optim.Optimizer:
        """The plain ``torch.optim`` optimizer this trial would use alone."""
        if self.optimizer == "sgd":
            return torch.optim.SGD(params, lr=self.lr, momentum=self.momentum,
                                   dampening=self.dampening, nesterov=self.nesterov,
                                   weight_decay=self.weight_decay)
        cls = torch.optim.Adam if self.optimizer == "adam" else torch.optim.AdamW
        return cls(params, lr=self.lr, betas=(self.beta1, self.beta2), eps=self.eps,
                   weight_decay=self.weight_decay)


class FusedOptimizer:
    """Adam / AdamW / SGD over ``(B, ...)`` parameters; ``hparams[i]`` belongs to trial ``i``."""

    def __init__(self, params: Sequence[torch.nn.Parameter], hparams: Sequence[TrialHparams]) -> None:
        kinds = {h.optimizer for h in hparams}
        if len(kinds) != 1:
            raise SpecError(f"one array trains one optimizer kind, got {sorted(kinds)}; pack "
                            "trials by optimizer")
        if len({(h.nesterov, h.dampening) for h in hparams}) != 1:
            raise SpecError("trials in one array must share nesterov and dampening")
        self.kind = kinds.pop()
        self.params = list(params)
        self.hparams = list(hparams)
        self.state: list[dict[str, torch.Tensor]] = [{} for _ in self.params]
        self.steps = torch.zeros(len(hparams), dtype=torch.float64)  # per trial, like torch's
        self._cols: dict[tuple, torch.Tensor] = {}

    # -- per-trial values: a Python scalar when all trials agree (torch's own arithmetic,
    # and fewer passes), else a (B, 1, ...) column that broadcasts against the parameter ----
    def _col(self, values: Sequence[float], like: torch.Tensor, dtype: Any = None) -> Any:
        first = values[0]
        if all(v == first for v in values):
            return first
        key = (tuple(values), like.dim(), dtype or like.dtype)
        col = self._cols.get(key)
        if col is None:
            col = torch.tensor(list(values), dtype=dtype or like.dtype)
            col = col.view(-1, *([1] * (like.dim() - 1)))
            if len(self._cols) > 256:
                self._cols.clear()
            self._cols[key] = col
        return col

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self) -> None:
        h = self.hparams
        self.steps += 1
        steps = self.steps.tolist()
        if self.kind != "sgd":  # bias corrections per trial, in double precision as torch
            bc1 = [1 - x.beta1**s for x, s in zip(h, steps)]
            self._step_size = [x.lr / b for x, b in zip(h, bc1)]
            self._bc2_sqrt = [(1 - x.beta2**s) ** 0.5 for x, s in zip(h, steps)]
        for p, st in zip(self.params, self.state):
            if p.grad is None:
                continue
            if self.kind == "sgd":
                self._sgd(p, p.grad, st, h)
            else:
                self._adam(p, p.grad, st, h)

    def _decay(self, grad: torch.Tensor, p: torch.Tensor, wd: Any) -> torch.Tensor:
        if isinstance(wd, torch.Tensor):
            return torch.addcmul(grad, wd, p)
        return grad.add(p, alpha=wd) if wd else grad

    def _sgd(self, p: torch.Tensor, grad: torch.Tensor, st: dict, h: list[TrialHparams]) -> None:
        grad = self._decay(grad, p, self._col([x.weight_decay for x in h], p))
        mom = [x.momentum for x in h]
        if any(mom):
            m = self._col(mom, p)
            damp = h[0].dampening
            buf = st.get("momentum_buffer")
            if buf is None:
                buf = st["momentum_buffer"] = grad.detach().clone()
            else:
                buf.mul_(m).add_(grad, alpha=1 - damp)
            nxt = grad.add(buf * m) if h[0].nesterov else buf
            if all(mom):
                grad = nxt
            else:  # trials with momentum 0 keep no buffer in torch: their step is the gradient
                grad = torch.where(self._col([x != 0 for x in mom], p, torch.bool), nxt, grad)
        lr = self._col([x.lr for x in h], p)
        if isinstance(lr, torch.Tensor):
            p.sub_(lr * grad)
        else:
            p.add_(grad, alpha=-lr)

    def _adam(self, p: torch.Tensor, grad: torch.Tensor, st: dict, h: list[TrialHparams]) -> None:
        if any(x.weight_decay for x in h):
            if self.kind == "adamw":
                p.mul_(self._col([1 - x.lr * x.weight_decay for x in h], p))
            else:
                grad = self._decay(grad, p, self._col([x.weight_decay for x in h], p))
        if not st:
            st["exp_avg"] = torch.zeros_like(p)
            st["exp_avg_sq"] = torch.zeros_like(p)
        exp_avg, exp_avg_sq = st["exp_avg"], st["exp_avg_sq"]
        exp_avg.lerp_(grad, self._col([1 - x.beta1 for x in h], p))
        b2 = self._col([x.beta2 for x in h], p)
        if isinstance(b2, torch.Tensor):
            exp_avg_sq.mul_(b2).addcmul_(grad, grad * (1 - b2))
        else:
            exp_avg_sq.mul_(b2).addcmul_(grad, grad, value=1 - b2)
        denom = (exp_avg_sq.sqrt() / self._col(self._bc2_sqrt, p)).add_(
            self._col([x.eps for x in h], p))
        step_size = self._col(self._step_size, p)
        if isinstance(step_size, torch.Tensor):
            p.addcdiv_(exp_avg * step_size, denom, value=-1)
        else:
            p.addcdiv_(exp_avg, denom, value=-step_size)

    # -- trials leaving and joining ------------------------------------------------------
    def select(self, keep: Sequence[int], params: Sequence[torch.nn.Parameter]) -> None:
        """Keep the trials at ``keep``; ``params`` are the model's new (selected) parameters."""
        idx = torch.as_tensor(list(keep), dtype=torch.long)
        self.params = list(params)
        self.state = [{k: v[idx].clone() for k, v in st.items()} for st in self.state]
        self.hparams = [self.hparams[int(i)] for i in idx]
        self.steps = self.steps[idx].clone()

    def trial_state(self, i: int, plain_params: Sequence[torch.nn.Parameter]) -> dict[str, Any]:
        """Trial ``i``'s state as ``torch.optim``'s ``state_dict`` for ``plain_params``."""
        opt = self.hparams[i].torch_optimizer(list(plain_params))
        sd = opt.state_dict()
        for j, st in enumerate(self.state):
            if self.kind == "sgd":
                if "momentum_buffer" in st and self.hparams[i].momentum != 0:
                    sd["state"][j] = {"momentum_buffer": st["momentum_buffer"][i].clone()}
            elif st:
                sd["state"][j] = {"step": torch.tensor(float(self.steps[i])),
                                  "exp_avg": st["exp_avg"][i].clone(),
                                  "exp_avg_sq": st["exp_avg_sq"][i].clone()}
        return sd

    def load_trial_state(self, i: int, sd: Mapping[str, Any]) -> None:
        """Load a ``torch.optim`` ``state_dict`` (of the same kind) into trial ``i``'s slice."""
        states = sd.get("state", {})
        for j, (p, st) in enumerate(zip(self.params, self.state)):
            s = states.get(j) or states.get(str(j))
            if not s:
                continue
            for key in ("exp_avg", "exp_avg_sq", "momentum_buffer"):
                if key in s:
                    if key not in st:
                        st[key] = torch.zeros_like(p)
                    st[key][i] = s[key]
            if "step" in s:
                self.steps[i] = float(s["step"])

    def state_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "steps": self.steps.clone(),
                "state": [dict(st) for st in self.state]}

    def load_state_dict(self, sd: Mapping[str, Any]) -> None:
        if sd["kind"] != self.kind or len(sd["state"]) != len(self.params):
            raise SpecError(f"optimizer state of kind {sd['kind']!r} with {len(sd['state'])} "
                            f"tensors does not fit {self.kind!r} with {len(self.params)}")
        self.steps = sd["steps"].clone()
        self.state = [{k: v.clone() for k, v in st.items()} for st in sd["state"]]
