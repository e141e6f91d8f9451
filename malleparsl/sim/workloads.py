"""Generated workloads: scaling curves of several shapes, Poisson job arrivals, synthetic traces.

The reference curves are real but smooth; a policy or profiler tuned to them alone may fail on
other shapes. These generators give tests and studies curves that follow Amdahl's law, that
saturate, or that drop when a job first spans two nodes, with jobs arriving as a Poisson
process, on synthetic idle-node traces (each node alternating idle and busy periods). Every
generator takes a seed and is deterministic for it.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from malleparsl.errors import SpecError
from malleparsl.model import JobSpec, ScalingCurve

CURVE_SHAPES = ("amdahl", "saturating", "two-node-drop")


def amdahl_curve(*, rate1: float, parallel_fraction: float, max_nodes: int, name: str = "") -> ScalingCurve:
    """``rate(n) = rate1 / ((1 - p) + p / n)``: a serial fraction caps the speed-up."""
    return ScalingCurve.amdahl(
        rate1=rate1, parallel_fraction=parallel_fraction, max_nodes=max_nodes, name=name
    )


def saturating_curve(*, rate_max: float, half_nodes: float, max_nodes: int, name: str = "") -> ScalingCurve:
    """``rate(n) = rate_max * n / (n + half_nodes)``: half the peak at ``half_nodes`` nodes."""
    if not (rate_max > 0 and half_nodes > 0):
        raise SpecError(f"rate_max and half_nodes must be > 0, got {rate_max!r}, {half_nodes!r}")
    ns = tuple(range(1, max_nodes + 1))
    return ScalingCurve(ns, tuple(rate_max * n / (n + half_nodes) for n in ns), name=name)


def two_node_drop_curve(*, rate1: float, drop: float, max_nodes: int, name: str = "") -> ScalingCurve:
    """Linear scaling except that crossing from one node to two loses ``drop`` (0..1) of it."""
    if not 0 <= drop < 1:
        raise SpecError(f"drop must be in [0, 1), got {drop!r}")
    ns = tuple(range(1, max_nodes + 1))
    return ScalingCurve(ns, tuple(rate1 * (n if n == 1 else n * (1 - drop)) for n in ns), name=name)


def random_curve(rng: np.random.Generator, shape: str, max_nodes: int, name: str = "") -> ScalingCurve:
    """One curve of the given shape with random parameters in realistic ranges."""
    rate1 = float(rng.uniform(500, 8000))
    if shape == "amdahl":
        return amdahl_curve(
            rate1=rate1, parallel_fraction=float(rng.uniform(0.9, 0.999)), max_nodes=max_nodes,
            name=name,
        )
    if shape == "saturating":
        return saturating_curve(
            rate_max=rate1 * max_nodes / 2, half_nodes=float(rng.uniform(4, 64)),
            max_nodes=max_nodes, name=name,
        )
    if shape == "two-node-drop":
        return two_node_drop_curve(
            rate1=rate1, drop=float(rng.uniform(0.2, 0.5)), max_nodes=max_nodes, name=name
        )
    raise SpecError(f"unknown curve shape {shape!r}; valid shapes are {', '.join(CURVE_SHAPES)}")


def poisson_jobs(
    *,
    n_jobs: int,
    mean_interarrival_s: float,
    seed: int = 0,
    start_s: float = 0.0,
    shapes: Sequence[str] = CURVE_SHAPES,
    min_nodes: int = 1,
    max_nodes: int = 32,
    hours_at_one_node: tuple[float, float] = (2.0, 20.0),
    rescale_up_s: tuple[float, float] = (10.0, 30.0),
    rescale_down_s: tuple[float, float] = (5.0, 15.0),
) -> list[JobSpec]:
    """``n_jobs`` jobs with Poisson arrivals, curves cycling through ``shapes``.

    Each job's size in samples is what it would train in a uniform draw from
    ``hours_at_one_node`` hours on one node, so big and small models get comparable work.
    """
    if n_jobs < 0 or not mean_interarrival_s > 0:
        raise SpecError(
            f"need n_jobs >= 0 and mean_interarrival_s > 0, got {n_jobs!r}, "
            f"{mean_interarrival_s!r}"
        )
    rng = np.random.default_rng(seed)
    arrivals = start_s + np.cumsum(rng.exponential(mean_interarrival_s, n_jobs))
    jobs = []
    for i, t in enumerate(arrivals):
        shape = shapes[i % len(shapes)]
        curve = random_curve(rng, shape, max_nodes, name=f"{shape}-{i}")
        hours = float(rng.uniform(*hours_at_one_node))
        jobs.append(
            JobSpec(
                job_id=f"G{i:05d}-{shape}",
                min_nodes=min_nodes,
                max_nodes=max_nodes,
                rescale_up_s=float(rng.uniform(*rescale_up_s)),
                rescale_down_s=float(rng.uniform(*rescale_down_s)),
                total_samples=curve.rate(1) * hours * 3600,
                submit_s=float(t),
                curve=curve,
                model=shape,
            )
        )
    return jobs


def synthetic_fragments(
    *,
    n_nodes: int,
    duration_s: float,
    mean_idle_s: float = 1200.0,
    mean_busy_s: float = 12000.0,
    min_idle_s: float = 50.0,
    seed: int = 0,
) -> list[tuple[str, float, float]]:
    """Idle fragments of ``n_nodes`` nodes, each alternating exponential busy/idle periods.

    Idle lengths are log-normal with the given mean (real gaps are heavy-tailed: many short,
    a few long), at least ``min_idle_s``; the idle fraction is about
    ``mean_idle_s / (mean_idle_s + mean_busy_s)``.
    """
    if n_nodes < 1 or not duration_s > 0:
        raise SpecError(f"need n_nodes >= 1 and duration_s > 0, got {n_nodes!r}, {duration_s!r}")
    rng = np.random.default_rng(seed)
    sigma = 1.2
    mu = np.log(mean_idle_s) - sigma**2 / 2
    width = len(str(n_nodes - 1))
    out: list[tuple[str, float, float]] = []
    for k in range(n_nodes):
        node = f"s{k:0{width}d}"
        t = float(rng.uniform(0, mean_busy_s))
        while t < duration_s:
            length = max(min_idle_s, float(rng.lognormal(mu, sigma)))
            end = min(duration_s, t + length)
            out.append((node, t, end))
            t = end + float(rng.exponential(mean_busy_s))
    return out
