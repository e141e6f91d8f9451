"""Neural architecture search by regularised evolution over small MLPs and CNNs.

Regularised (aging) evolution (Real et al., 2019): keep a population of the most recently
evaluated architectures; to make a child, sample a few members, mutate the best of the sample,
train the child, add it and drop the *oldest* member. Aging, rather than dropping the worst,
keeps lucky evaluations from ruling forever and suits asynchronous workers: a child can be
asked for whenever nodes free up, with no generation barrier.

Architectures are plain dicts so they pickle, print and land in the trials table:
``{"kind": "mlp", "layers": [64, 32], "activation": "relu"}`` or
``{"kind": "cnn", "channels": [16, 32], "kernel": 3, "fc": 64, "activation": "relu"}``.
:func:`build_model` turns one into a torch module for 8x8 single-channel images (digits).

>>> ev = RegularizedEvolution(space=ArchSpace(), n_trials=12, population_size=4,
...                           sample_size=2, seed=1)
>>> while not ev.done:
...     s = ev.ask()
...     _ = ev.tell(s, {"accuracy": -abs(sum(s.config.get("layers", [0])) - 96)})
>>> len(ev.trials), ev.best().results[0] <= 0
(12, True)
"""

from __future__ import annotations

import copy
import logging
import random
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from malleparsl.errors import SpecError

from .scheduler import Decision, Suggestion, TrialRecord, TrialScheduler

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ArchSpace:
    """The architectures evolution may visit (sizes kept small: a 2-core machine trains them)."""

    kinds: tuple[str, ...] = ("mlp", "cnn")
    widths: tuple[int, ...] = (16, 32, 64, 128, 256)
    max_layers: int = 3
    channels: tuple[int, ...] = (8, 16, 32)
    max_convs: int = 2  # 8x8 inputs: two 2x2 poolings bring them to 2x2
    kernels: tuple[int, ...] = (3, 5)
    activations: tuple[str, ...] = ("relu", "tanh", "gelu")

    def __post_init__(self) -> None:
        bad = set(self.kinds) - {"mlp", "cnn"}
        if bad or not self.kinds:
            raise SpecError(f"ArchSpace kinds must be drawn from ('mlp', 'cnn'), got {self.kinds!r}")
        if self.max_layers < 1 or self.max_convs < 1:
            raise SpecError(
                f"max_layers ({self.max_layers}) and max_convs ({self.max_convs}) must be >= 1"
            )

    def sample(self, rng: random.Random) -> dict[str, Any]:
        kind = rng.choice(self.kinds)
        act = rng.choice(self.activations)
        if kind == "mlp":
            n = rng.randint(1, self.max_layers)
            return {"kind": "mlp", "layers": [rng.choice(self.widths) for _ in range(n)],
                    "activation": act}
        n = rng.randint(1, self.max_convs)
        return {"kind": "cnn", "channels": [rng.choice(self.channels) for _ in range(n)],
                "kernel": rng.choice(self.kernels), "fc": rng.choice(self.widths),
                "activation": act}

    def mutate(self, arch: Mapping[str, Any], rng: random.Random) -> dict[str, Any]:
        """One random edit: resize, add or drop a layer, or swap kernel/activation/fc width."""
        child = copy.deepcopy(dict(arch))
        key, choices, cap = (
            ("layers", self.widths, self.max_layers) if child["kind"] == "mlp"
            else ("channels", self.channels, self.max_convs)
        )
        ops = ["resize", "activation"]
        if len(child[key]) < cap:
            ops.append("add")
        if len(child[key]) > 1:
            ops.append("drop")
        if child["kind"] == "cnn":
            ops += ["kernel", "fc"]
        op = rng.choice(ops)
        if op == "resize":
            i = rng.randrange(len(child[key]))
            child[key][i] = rng.choice([c for c in choices if c != child[key][i]] or choices)
        elif op == "add":
            child[key].insert(rng.randrange(len(child[key]) + 1), rng.choice(choices))
        elif op == "drop":
            child[key].pop(rng.randrange(len(child[key])))
        elif op == "activation":
            child["activation"] = rng.choice(
                [a for a in self.activations if a != child["activation"]] or self.activations
            )
        elif op == "kernel":
            child["kernel"] = rng.choice([k for k in self.kernels if k != child["kernel"]] or self.kernels)
        else:
            child["fc"] = rng.choice([w for w in self.widths if w != child["fc"]] or self.widths)
        return child


def build_model(arch: Mapping[str, Any], *, side: int = 8, n_classes: int = 10):
    """A torch module for ``side x side`` single-channel images (flattened or not) from ``arch``."""
    import torch.nn as nn  # lazy: importing torch costs seconds

    acts = {"relu": nn.ReLU, "tanh": nn.Tanh, "gelu": nn.GELU}
    if arch.get("activation") not in acts:
        raise SpecError(f"activation {arch.get('activation')!r} is not one of {sorted(acts)}")
    act = acts[arch["activation"]]
    if arch.get("kind") == "mlp":
        mods: list[nn.Module] = [nn.Flatten()]
        width = side * side
        for w in arch["layers"]:
            mods += [nn.Linear(width, int(w)), act()]
            width = int(w)
        return nn.Sequential(*mods, nn.Linear(width, n_classes))
    if arch.get("kind") == "cnn":
        k = int(arch["kernel"])
        mods = [nn.Unflatten(1, (1, side, side))]
        ch, s = 1, side
        for c in arch["channels"]:
            mods += [nn.Conv2d(ch, int(c), k, padding=k // 2), act()]
            if s >= 4:
                mods.append(nn.MaxPool2d(2))
                s //= 2
            ch = int(c)
        return nn.Sequential(*mods, nn.Flatten(), nn.Linear(ch * s * s, int(arch["fc"])), act(),
                             nn.Linear(int(arch["fc"]), n_classes))
    raise SpecError(f"architecture kind {arch.get('kind')!r} is not 'mlp' or 'cnn'")


class RegularizedEvolution(TrialScheduler):
    """Aging evolution, ask/tell: one architecture per suggestion, trained at ``budget``.

    Parameters
    ----------
    space
        The :class:`ArchSpace` to search.
    n_trials
        Architectures to train in all (the first ``population_size`` are random).
    population_size, sample_size
        Population kept (oldest dropped first) and tournament size.
    budget
        Units (epochs or samples, the caller's choice) each architecture trains for.
    base
        Hyperparameters merged into every configuration (learning rate, batch size...).
    """

    def __init__(
        self,
        *,
        space: ArchSpace | None = None,
        n_trials: int = 20,
        population_size: int = 8,
        sample_size: int = 3,
        budget: float = 1.0,
        base: Mapping[str, Any] | None = None,
        metric: str = "accuracy",
        mode: str = "max",
        seed: int | None = 0,
    ) -> None:
        super().__init__(metric=metric, mode=mode)
        for name, v in (("n_trials", n_trials), ("population_size", population_size),
                        ("sample_size", sample_size)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise SpecError(f"{name} must be an integer >= 1, got {v!r}")
        if sample_size > population_size:
            raise SpecError(
                f"sample_size ({sample_size}) > population_size ({population_size}); the "
                "tournament samples from the population, so lower sample_size"
            )
        self.space = space if space is not None else ArchSpace()
        self.n_trials, self.population_size, self.sample_size = n_trials, population_size, sample_size
        self.budget, self.base = float(budget), dict(base or {})
        self.rng = random.Random(seed)
        self.population: deque[str] = deque()
        self._started = 0

    def ask(self) -> Suggestion | None:
        if self._started >= self.n_trials:
            return None
        parent = None
        if self._started < self.population_size:
            arch = self.space.sample(self.rng)
        elif not self.population:
            return None  # the random seed population has not reported yet
        else:
            pool = list(self.population)
            sample = self.rng.sample(pool, min(self.sample_size, len(pool)))
            parent = min(sample, key=lambda t: (self.sort_key(self.trials[t].results[0]), t))
            arch = self.space.mutate(self._arch_of(self.trials[parent].config), self.rng)
        tid = f"a{self._started:03d}"
        self._started += 1
        return self._hand_out(Suggestion(tid, {**self.base, "arch": arch}, 0, self.budget, parent))

    @property
    def exhausted(self) -> bool:
        return self._started >= self.n_trials

    def _decide(self, record: TrialRecord, rung: int, value: float) -> Decision:
        self.population.append(record.trial_id)
        while len(self.population) > self.population_size:
            old = self.population.popleft()
            log.debug("population drops its oldest member %s", old)
        return Decision.STOP

    @staticmethod
    def _arch_of(config: Mapping[str, Any]) -> dict[str, Any]:
        return dict(config["arch"])
