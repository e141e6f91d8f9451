"""Search spaces: named parameters with a distribution each, sampled reproducibly.

A space is a plain mapping from name to a parameter; sampling uses a caller-supplied
``random.Random`` so a seeded search replays exactly. The four kinds cover the usual HPO
dimensions (learning rate on a log scale, width and depth as integers, batch size as a choice).

>>> import random
>>> space = SearchSpace({"lr": LogUniform(1e-3, 1e-1), "width": Choice([32, 64]),
...                      "depth": IntRange(1, 3)})
>>> cfg = space.sample(random.Random(0))
>>> sorted(cfg), 1e-3 <= cfg["lr"] <= 1e-1, cfg["width"] in (32, 64)
(['depth', 'lr', 'width'], True, True)
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from malleparsl.errors import SpecError


class Param:
    """One dimension of a search space."""

    def sample(self, rng: random.Random) -> Any:  # pragma: no cover - abstract
        raise NotImplementedError

    def contains(self, value: Any) -> bool:  # pragma: no cover - abstract
        raise NotImplementedError


def _num(v: Any, what: str) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise SpecError(f"{what} must be a finite number, got {v!r}")
    return float(v)


@dataclass(frozen=True)
class Uniform(Param):
    """A float uniform in ``[low, high]``."""

    low: float
    high: float

    def __post_init__(self) -> None:
        if _num(self.low, "Uniform low") > _num(self.high, "Uniform high"):
            raise SpecError(f"Uniform({self.low}, {self.high}): low must be <= high; swap them")

    def sample(self, rng: random.Random) -> float:
        return rng.uniform(self.low, self.high)

    def contains(self, value: Any) -> bool:
        return self.low <= value <= self.high


@dataclass(frozen=True)
class LogUniform(Param):
    """A float whose logarithm is uniform in ``[log low, log high]`` (learning rates)."""

    low: float
    high: float

    def __post_init__(self) -> None:
        lo, hi = _num(self.low, "LogUniform low"), _num(self.high, "LogUniform high")
        if lo <= 0 or lo > hi:
            raise SpecError(
                f"LogUniform({self.low}, {self.high}): needs 0 < low <= high, e.g. "
                "LogUniform(1e-4, 1e-1)"
            )

    def sample(self, rng: random.Random) -> float:
        return math.exp(rng.uniform(math.log(self.low), math.log(self.high)))

    def contains(self, value: Any) -> bool:
        return self.low * (1 - 1e-12) <= value <= self.high * (1 + 1e-12)


@dataclass(frozen=True)
class IntRange(Param):
    """An integer uniform in ``[low, high]`` (both included)."""

    low: int
    high: int

    def __post_init__(self) -> None:
        for v in (self.low, self.high):
            if isinstance(v, bool) or not isinstance(v, int):
                raise SpecError(f"IntRange bounds must be integers, got {v!r}")
        if self.low > self.high:
            raise SpecError(f"IntRange({self.low}, {self.high}): low must be <= high; swap them")

    def sample(self, rng: random.Random) -> int:
        return rng.randint(self.low, self.high)

    def contains(self, value: Any) -> bool:
        return isinstance(value, int) and self.low <= value <= self.high


@dataclass(frozen=True)
class Choice(Param):
    """One of a fixed list of values (batch sizes, activations)."""

    options: Sequence[Any]

    def __post_init__(self) -> None:
        if isinstance(self.options, (str, bytes)) or not len(self.options):
            raise SpecError(
                f"Choice needs a non-empty list of options, got {self.options!r}; "
                "write Choice([32, 64, 128])"
            )
        object.__setattr__(self, "options", tuple(self.options))

    def sample(self, rng: random.Random) -> Any:
        return rng.choice(self.options)

    def contains(self, value: Any) -> bool:
        return value in self.options


class SearchSpace(Mapping[str, Param]):
    """Named parameters; constants (non-``Param`` values) are passed through unchanged."""

    def __init__(self, params: Mapping[str, Any]) -> None:
        if not isinstance(params, Mapping) or not params:
            raise SpecError(
                f"a search space needs a non-empty mapping name -> parameter, got {params!r}"
            )
        self._params = dict(params)

    def __getitem__(self, key: str) -> Any:
        return self._params[key]

    def __iter__(self):
        return iter(self._params)

    def __len__(self) -> int:
        return len(self._params)

    def sample(self, rng: random.Random) -> dict[str, Any]:
        """One configuration, drawing every parameter in name order (reproducible)."""
        return {
            k: (v.sample(rng) if isinstance(v, Param) else v)
            for k, v in sorted(self._params.items())
        }

    def contains(self, config: Mapping[str, Any]) -> bool:
        """True if ``config`` sets every parameter to an allowed value."""
        for k, v in self._params.items():
            if k not in config:
                return False
            if isinstance(v, Param) and not v.contains(config[k]):
                return False
            if not isinstance(v, Param) and config[k] != v:
                return False
        return True

    def __repr__(self) -> str:
        return f"SearchSpace({self._params!r})"
