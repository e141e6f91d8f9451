"""Where a sparsely measured job should go next: expected value under a population of shapes.

After its first probe a new model's curve is one point; the structures of
:mod:`~malleparsl.jpa.models` all fit one point, so how far to extrapolate was a fixed ladder
(``explore_factor`` x the largest explored size). Every model measured before says something
about the rest of the curve, though: the *shapes* (rate relative to a reference size) of other
models are a prior, weighed by how well each agrees with what this job measured.

:class:`ShapePrior` keeps one shape per model (``profile_key``): its measured means, the
best-explored set seen. For a job with measured points it gives a :class:`ShapePosterior`:

- each shape is scaled to the job's level (least squares in log rate over the job's sizes) and
  weighted by ``exp(-misfit / 2 tol^2)``; a shape must cover the job's largest measured size;
- the expected rate at ``n`` is the weighted mean of the scaled shapes that measured ``n``
  (renormalised), its spread the uncertainty; past the largest size any shape measured the
  posterior says nothing (held flat, and the advisor does not use it there).

:func:`choose_next_size` turns the posterior into the job's next size to try: the smallest
size, within the job's bounds and the nodes there are, whose expected rate is within
``gain_tol`` of the best expected rate (more nodes for a smaller expected gain are not worth a
rescale pause and a reading). The advisor lets the allocator go that far at once, instead of
walking there by ``explore_factor`` steps, and plans unexplored sizes with
``min(structures' optimism, posterior mean + kappa sd)``, so sizes the population says do not
pay are not offered as if they did. With no agreeing shape (the first models of a run, or a
job unlike all others) nothing changes: the ladder is the fallback.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from malleparsl.errors import SpecError

MIN_POINTS = 2
"""Measured sizes a model needs before its shape is a member of the prior (one point is no shape)."""


@dataclass(frozen=True)
class Shape:
    """Measured mean rates of one model at two or more sizes (increasing sizes)."""

    sizes: tuple[int, ...]
    rates: tuple[float, ...]

    def __post_init__(self) -> None:
        if len(self.sizes) != len(self.rates) or len(self.sizes) < MIN_POINTS:
            raise SpecError(f"a shape needs >= {MIN_POINTS} (size, rate) pairs, got "
                            f"{len(self.sizes)} sizes and {len(self.rates)} rates")
        if any(b <= a for a, b in zip(self.sizes, self.sizes[1:], strict=False)) or self.sizes[0] < 1:
            raise SpecError(f"shape sizes must be increasing and >= 1, got {self.sizes!r}")
        if not all(math.isfinite(r) and r > 0 for r in self.rates):
            raise SpecError(f"shape rates must be finite and > 0, got {self.rates!r}")

    def log_rate(self, n: np.ndarray) -> np.ndarray:
        """Log rate at ``n`` (linear in log n between measured sizes, flat outside)."""
        return np.interp(np.log(n), np.log(self.sizes), np.log(self.rates))

    def covers(self, n: int) -> bool:
        return self.sizes[0] <= n <= self.sizes[-1]


@dataclass(frozen=True)
class ShapePosterior:
    """Expected rate (and its spread) at ``0..n_max`` nodes for one job, from agreeing shapes."""

    mean: np.ndarray
    sd: np.ndarray
    members: int
    weight: float  # sum of the members' agreement weights (each at most 1)
    support: int  # the largest size any member measured: beyond it mean/sd are held flat


class ShapePrior:
    """One measured shape per model; conditions them on a job's own measurements."""

    def __init__(self, *, tol: float = 0.1, min_weight: float = 1.0) -> None:
        if not (math.isfinite(tol) and tol > 0):
            raise SpecError(f"ShapePrior: tol must be a finite number > 0, got {tol!r}")
        if not (math.isfinite(min_weight) and min_weight > 0):
            raise SpecError(f"ShapePrior: min_weight must be a finite number > 0, got {min_weight!r}")
        self.tol, self.min_weight = tol, min_weight
        self.shapes: dict[str, Shape] = {}
        self.version = 0  # bumped whenever a shape changes (planning curves cache on it)

    def offer(self, key: str, points: Mapping[int, float]) -> bool:
        """Keep ``points`` as ``key``'s shape if they span at least as many sizes as the one kept."""
        pts = {int(n): float(r) for n, r in points.items() if n >= 1 and math.isfinite(r) and r > 0}
        if len(pts) < MIN_POINTS:
            return False
        old = self.shapes.get(key)
        if old is not None and len(old.sizes) > len(pts):
            return False
        sizes = tuple(sorted(pts))
        new = Shape(sizes, tuple(pts[n] for n in sizes))
        if new == old:
            return False
        self.shapes[key] = new
        self.version += 1
        return True

    def posterior(
        self, own: Mapping[int, float], n_max: int, *, exclude: str | None = None
    ) -> ShapePosterior | None:
        """The shapes scaled to ``own`` (size -> measured mean), or None when too few agree."""
        pts = {int(n): float(r) for n, r in own.items() if n >= 1 and math.isfinite(r) and r > 0}
        if not pts or n_max < 1:
            return None
        sizes = np.array(sorted(pts), dtype=float)
        logs = np.log([pts[int(n)] for n in sizes])
        top = int(sizes[-1])
        n = np.arange(1, n_max + 1, dtype=float)
        curves, weights, ends = [], [], []
        for key, shape in self.shapes.items():
            if key == exclude or not shape.covers(top) or shape.sizes[-1] <= top:
                continue  # must say something about the job's level and beyond it
            resid = logs - shape.log_rate(sizes)
            level = float(np.mean(resid))
            misfit = float(np.sum((resid - level) ** 2))
            weights.append(math.exp(-misfit / (2 * self.tol**2)))
            c = np.exp(level + shape.log_rate(n))
            c[n > shape.sizes[-1]] = np.nan  # this shape says nothing there
            curves.append(c)
            ends.append(shape.sizes[-1])
        if not curves or sum(weights) < self.min_weight:
            return None
        support = min(max(ends), n_max)
        c = np.vstack(curves)[:, :support]
        w = np.where(np.isnan(c), 0.0, np.asarray(weights)[:, None])
        w = w / np.maximum(w.sum(axis=0), 1e-300)
        c = np.nan_to_num(c)
        mean = np.sum(w * c, axis=0)
        sd = np.sqrt(np.maximum(np.sum(w * (c - mean) ** 2, axis=0), 0.0))
        flat = np.full(n_max - support, mean[-1])
        mean = np.concatenate([[0.0], mean, flat])
        sd = np.concatenate([[0.0], sd, np.full(n_max - support, sd[-1])])
        return ShapePosterior(mean, sd, len(curves), float(sum(weights)), int(support))


def choose_next_size(
    expected: np.ndarray, *, lo: int, hi: int, available: int, gain_tol: float = 0.02
) -> int | None:
    """The smallest size in ``[lo, min(hi, available)]`` whose expected rate is within
    ``gain_tol`` of the best there (``expected[k]`` is the rate at ``k`` nodes); None if the
    range is empty."""
    if not (math.isfinite(gain_tol) and 0 <= gain_tol < 1):
        raise SpecError(f"gain_tol must be in [0, 1), got {gain_tol!r}")
    top = min(hi, available, expected.size - 1)
    lo = max(lo, 1)
    if top < lo:
        return None
    seg = np.asarray(expected[lo : top + 1], dtype=float)
    if not np.all(np.isfinite(seg)):
        raise SpecError("expected rates must be finite")
    best = float(np.max(seg))
    return lo + int(np.argmax(seg >= (1 - gain_tol) * best))
