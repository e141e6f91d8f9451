"""A zoo of scaling curves for testing and benchmarking the JPA: shapes it was not built for.

Each *family* is a seeded generator of job sets whose curves share a shape (a drop when a job
first spans two nodes, a peak then a decline, a plateau, steps, irregular noise around a trend,
rates spread over four orders of magnitude, short and long jobs) plus curves *measured* on real
hardware (:data:`PUBLISHED`). Jobs of a family cycle through a few distinct models (their
``model`` names repeat), as a real workload resubmits the same apps, so priors across jobs
matter; the generators draw every parameter from wide ranges, not fitted to anything.

Families in :data:`HELD_OUT` are kept out of every tuning loop of the JPA: benchmarks report them
apart (``malleparsl bench jpa --jobs zoo``), so a figure on them says how the JPA holds on curves
nobody tuned it for.

>>> jobs = zoo_jobs("dip", seed=0, n_jobs=4, start_s=0.0)
>>> c = jobs[0].curve
>>> c.rate(2) < c.rate(1) < c.rate(4)
True
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from malleparsl.errors import SpecError
from malleparsl.model import JobSpec, ScalingCurve

MAX_NODES = 64


def _amdahl(n: np.ndarray, p: float) -> np.ndarray:
    return 1.0 / ((1 - p) + p / n)


def _dip(rng: np.random.Generator, n: np.ndarray) -> np.ndarray:
    """Loses 20-45 % at 2 nodes, passes the one-node rate again at 3-5 nodes, then grows."""
    loss = rng.uniform(0.2, 0.45)
    recover = int(rng.integers(3, 6))  # first size above the one-node rate
    # linear in n from rate(2) = 1 - loss through rate(recover) = 1.05, saturating later
    slope = (1.05 - (1 - loss)) / (recover - 2)
    r = (1 - loss) + slope * (n - 2)
    sat = rng.uniform(24, 256)
    r = r / (1 + np.maximum(n - recover, 0) / sat)
    return np.where(n < 2, 1.0, r)


def _peak(rng: np.random.Generator, n: np.ndarray) -> np.ndarray:
    """Rises to a peak at 4-16 nodes (often 8 or 12), then declines by 1-5 % of it per node."""
    peak = int(rng.choice([4, 6, 8, 8, 12, 12, 16]))
    eff = rng.uniform(0.5, 0.9)  # parallel efficiency reached at the peak
    up = 1 + (eff * peak - 1) * (n - 1) / (peak - 1)
    down = eff * peak * (1 - rng.uniform(0.01, 0.05) * (n - peak))
    return np.maximum(np.where(n <= peak, up, down), 0.05 * eff * peak)


def _plateau(rng: np.random.Generator, n: np.ndarray) -> np.ndarray:
    """Near-linear up to 3-24 nodes, then flat (an input pipeline or a storage bound)."""
    cap = rng.uniform(3, 24)
    eff = rng.uniform(0.8, 0.98)
    return np.where(n <= 1, 1.0, np.minimum(1 + eff * (n - 1), 1 + eff * (cap - 1)))


def _step(rng: np.random.Generator, n: np.ndarray) -> np.ndarray:
    """Only some sizes help: the rate of the largest 'good' size at or below n (powers of 2 or
    multiples of a group), with a loss each time the job crosses a group boundary."""
    group = int(rng.choice([2, 4, 6, 8]))
    eff = rng.uniform(0.55, 0.9)
    groups = np.floor(n / group)
    within = np.where(groups >= 1, groups * group * eff, 1 + (n - 1) * rng.uniform(0.6, 1.0))
    return np.maximum(within, 1.0)


def _noisy(rng: np.random.Generator, n: np.ndarray) -> np.ndarray:
    """An Amdahl trend (p in 0.8-0.99) times irregular per-size factors of 8-20 % spread."""
    trend = _amdahl(n, rng.uniform(0.8, 0.99))
    spread = rng.uniform(0.08, 0.2)
    f = np.exp(spread * rng.standard_normal(n.size))
    f[0] = 1.0
    return trend * f


def _nearlinear(rng: np.random.Generator, n: np.ndarray) -> np.ndarray:
    """Amdahl with p in 0.995-0.9999: the curves on which linear scaling is nearly right."""
    return _amdahl(n, rng.uniform(0.995, 0.9999))


def _composite(rng: np.random.Generator, n: np.ndarray) -> np.ndarray:
    """The issue's real curves in one: a peak (60 %, as ``peak``) or an Amdahl trend (p in
    0.85-0.99); in half the models a cost per step once the network joins that drops the rate
    at 2 nodes by 10-45 % (``n / (n / base + c)``: each node keeps its batch); then irregular
    per-size factors of 3-10 % spread."""
    base = _peak(rng, n) if rng.random() < 0.6 else _amdahl(n, rng.uniform(0.85, 0.99))
    if rng.random() < 0.5:
        loss = rng.uniform(0.10, 0.45)
        c = 2.0 / (1 - loss) - 2.0 / base[1]  # > 0: base[1] >= 1 > 1 - loss
        base = np.where(n >= 2, n / (n / base + c), base)
    f = np.exp(rng.uniform(0.03, 0.10) * rng.standard_normal(n.size))
    f[0] = 1.0
    return base * f


def _mixed_shape(rng: np.random.Generator, n: np.ndarray) -> np.ndarray:
    fam = rng.choice(["dip", "peak", "plateau", "amdahl"])
    if fam == "amdahl":
        return _amdahl(n, rng.uniform(0.6, 0.99))
    return _SHAPERS[str(fam)](rng, n)


_SHAPERS: dict[str, Callable[[np.random.Generator, np.ndarray], np.ndarray]] = {
    "dip": _dip, "peak": _peak, "plateau": _plateau, "step": _step, "noisy": _noisy,
    "nearlinear": _nearlinear,
}


@dataclass(frozen=True)
class Family:
    """How one zoo family draws its jobs: a shape, one-node rates and hours of work at 1 node."""

    name: str
    shape: Callable[[np.random.Generator, np.ndarray], np.ndarray]
    rate1: tuple[float, float] = (300.0, 8000.0)  # samples/s at one node, log-uniform
    hours1: tuple[float, float] = (2.0, 20.0)  # work in hours at one node, log-uniform
    models: int = 6  # distinct models the jobs cycle through (shared priors)
    doc: str = ""


FAMILIES: dict[str, Family] = {
    f.name: f
    for f in [
        Family("dip", _dip, doc="drop at 2 nodes, above the 1-node rate only at 3-5"),
        Family("peak", _peak, doc="peak at 4-16 nodes (mostly 8, 12), then decline"),
        Family("plateau", _plateau, doc="near-linear, then flat past 3-24 nodes"),
        Family("step", _step, doc="only multiples of a group (2-8 nodes) help"),
        Family("noisy", _noisy, doc="irregular +-8-20 % per size around an Amdahl trend"),
        Family("rates", _mixed_shape, rate1=(0.5, 5000.0),
               doc="mixed shapes, one-node rates from 0.5 to 5000 samples/s"),
        Family("short", _mixed_shape, hours1=(1.0, 4.0), doc="mixed shapes, 1-4 h at one node"),
        Family("long", _mixed_shape, hours1=(30.0, 200.0), doc="mixed shapes, 30-200 h at one node"),
        Family("nearlinear", _nearlinear, doc="Amdahl p 0.995-0.9999 (linear is nearly right)"),
        Family("published", _mixed_shape, doc="measured curves (DLPerf, see PUBLISHED)"),
        Family("composite", _composite, rate1=(0.5, 5000.0), hours1=(1.5, 6.0),
               doc="the issue's real curves in one: a dip at 2 nodes, a peak then a decline, "
                   "3-10 % irregular, rates over four orders of magnitude, 1.5-6 h at one node"),
    ]
}

_STREAMS: tuple[str, ...] = (
    "dip", "long", "nearlinear", "noisy", "peak", "plateau", "published", "rates", "short", "step",
    "composite",
)
"""Each family's random stream number: a family added later takes the next one, so the curves of
the families before it stay those every figure in docs/jpa-log.md was measured on."""

HELD_OUT: frozenset[str] = frozenset({"step", "noisy", "published", "composite"})
"""Families never used while tuning the JPA; benchmarks report them apart."""

NEAR_LINEAR: frozenset[str] = frozenset({"nearlinear"})
"""Families whose curves are near-linear: no margin over ``milp-linear`` is expected there."""

PUBLISHED: dict[str, tuple[tuple[int, ...], tuple[float, ...]]] = {
    # DLPerf Benchmark Test Report V1.0 (OneFlow Inc., Aug 2020), github.com/Oneflow-Inc/DLPerf,
    # reports/dlperf_benchmark_test_report_v1.md and PaddlePaddle/bert/README.md: 4 nodes of
    # 8x V100-SXM2-16GB, 100 Gb/s InfiniBand, FP32. A "node" here is one GPU; points at 1 GPU,
    # 1x8, 2x8 and 4x8 GPUs (the bert-paddle rows also 2 and 4 GPUs). Samples/s.
    "rn50-oneflow": ((1, 8, 16, 32), (384.85, 2969.45, 5906.55, 11711.18)),
    "rn50-tf1": ((1, 8, 16, 32), (362.44, 2721.98, 5099.42, 9514.64)),
    "rn50-mxnet": ((1, 8, 16, 32), (389.71, 2947.72, 5684.68, 10419.21)),
    "rn50-pytorch": ((1, 8, 16, 32), (354.40, 2719.07, 5307.21, 10632.33)),
    "rn50-paddle": ((1, 8, 16, 32), (352.72, 2625.38, 4895.27, 9348.17)),
    "rn50-tf2": ((1, 8, 16, 32), (321.80, 2458.74, 4849.68, 9418.44)),
    "bert-b32-tf1": ((1, 8, 16, 32), (106.80, 806.56, 1090.20, 1923.68)),
    "bert-b32-mxnet": ((1, 8, 16, 32), (127.05, 928.03, 1136.44, 1895.50)),
    "bert-b32-paddle": ((1, 2, 4, 8, 16, 32), (132.64, 228.12, 406.02, 615.12, 1116.02, 2073.6)),
    "bert-b64-paddle": ((1, 2, 4, 8, 16, 32), (137.27, 252.71, 441.74, 761.22, 1426.52, 2736.78)),
    "bert-b96-oneflow": ((1, 8, 16, 32), (149.84, 1158.51, 2257.71, 4455.97)),
    "bert-b64-paddle-fp16": ((1, 4, 8, 16, 32), (289.23, 784.52, 1298.96, 1999.38, 3406.36)),
}
"""Measured throughput (samples/s) at measured sizes; curves stop at the largest one."""


def family_names() -> list[str]:
    return list(FAMILIES)


def _curve(name: str, rates: np.ndarray) -> ScalingCurve:
    return ScalingCurve(tuple(range(1, rates.size + 1)), tuple(float(v) for v in rates), name=name)


def family_curves(family: str, seed: int = 0, max_nodes: int = MAX_NODES) -> list[ScalingCurve]:
    """The distinct model curves of ``family`` for ``seed`` (jobs cycle through them)."""
    fam = _family(family)
    if family == "published":
        return [ScalingCurve(n, r, name=k) for k, (n, r) in PUBLISHED.items()]
    rng = np.random.default_rng([seed, _STREAMS.index(family)])
    n = np.arange(1, max_nodes + 1, dtype=float)
    out = []
    for i in range(fam.models):
        lo, hi = np.log(fam.rate1[0]), np.log(fam.rate1[1])
        r1 = float(np.exp(rng.uniform(lo, hi)))
        shape = np.asarray(fam.shape(rng, n), dtype=float)
        out.append(_curve(f"{family}-{seed}-{i}", r1 * shape / shape[0]))
    return out


def zoo_jobs(
    family: str,
    *,
    seed: int = 0,
    n_jobs: int = 300,
    start_s: float = 0.0,
    mean_interarrival_s: float = 600.0,
    max_nodes: int = MAX_NODES,
) -> list[JobSpec]:
    """Poisson arrivals of ``n_jobs`` jobs of ``family``, cycling through its models."""
    fam = _family(family)
    curves = family_curves(family, seed, max_nodes)
    rng = np.random.default_rng([seed, 7919, _STREAMS.index(family)])
    t = start_s + np.cumsum(rng.exponential(mean_interarrival_s, n_jobs))
    jobs = []
    for i in range(n_jobs):
        c = curves[int(rng.integers(len(curves)))]
        hours = float(np.exp(rng.uniform(np.log(fam.hours1[0]), np.log(fam.hours1[1]))))
        jobs.append(JobSpec(
            job_id=f"Z{i:04d}-{c.name}", min_nodes=1, max_nodes=min(max_nodes, c.max_measured),
            rescale_up_s=float(rng.uniform(10, 30)), rescale_down_s=float(rng.uniform(5, 15)),
            total_samples=c.rate(1) * 3600 * hours, submit_s=float(t[i]), curve=c,
            model=c.name, meta={"family": family},
        ))
    return jobs


def _family(name: str) -> Family:
    if name not in FAMILIES:
        raise SpecError(f"unknown zoo family {name!r}; valid families are {', '.join(FAMILIES)}")
    return FAMILIES[name]
