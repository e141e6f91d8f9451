"""From measured points to a scaling curve with an uncertainty: a small ensemble of models.

No single structure fits every job (a curve may saturate, drop at two nodes, or fall past a
peak), and with two or three measured sizes several structures fit equally well yet disagree
about the sizes nobody ran. So every structure of :mod:`~malleparsl.jpa.models` that the data
can pin down (no more coefficients than distinct sizes; a bounded one only where two sizes read
its floor) is fitted, weighted by its Akaike
weight (fit quality at the measured noise, minus two per coefficient), and

- the *mean* curve is the weighted mean of their predictions;
- the *uncertainty* is their weighted spread (model uncertainty, large far from the data)
  combined with the measurement error of the nearest measured size, inflated by how many
  doublings away it is (extrapolation).

All of it is vectorised over node counts ``1..n_max``; an estimate is an immutable value.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from malleparsl.errors import SpecError
from malleparsl.jpa.models import (
    MODELS,
    ModelParams,
    Samples,
    ThroughputModel,
    design_matrix,
    fit,
    predict,
)

MIN_NOISE = 0.01
"""Floor on the relative noise of one measurement: no monitor is better than 1 %."""


@dataclass(frozen=True)
class CurveEstimate:
    """What is known of one job's curve: mean and 1-sigma samples/s at ``0..n_max`` nodes.

    ``mean[k]``/``sigma[k]`` are at ``k`` nodes (index 0 is 0 nodes, rate 0). ``measured`` are
    the sizes backed by the job's own measurements.
    """

    mean: np.ndarray
    sigma: np.ndarray
    measured: tuple[int, ...]
    fits: tuple[ModelParams, ...] = ()
    weights: tuple[float, ...] = ()
    model_sigma: np.ndarray | None = None  # the structures' spread alone (no measurement error)
    model_free: bool = False  # no structure fits: measured points interpolated (see ground_truth)

    @property
    def n_max(self) -> int:
        return int(self.mean.size - 1)

    def rate(self, n: int) -> float:
        """Mean samples/s at ``n`` nodes (flat past ``n_max``)."""
        return float(self.mean[min(max(int(n), 0), self.n_max)])

    def rel_sigma(self, n: int) -> float:
        k = min(max(int(n), 1), self.n_max)
        return float(self.sigma[k] / self.mean[k]) if self.mean[k] > 0 else math.inf


def pooled_noise(groups: Sequence[Sequence[float]]) -> float | None:
    """Pooled relative standard deviation of repeated measurements (None if none repeat)."""
    num, dof = 0.0, 0
    for g in groups:
        x = np.asarray(g, dtype=float)
        if x.size >= 2 and np.mean(x) > 0:
            num += float(np.sum((x / np.mean(x) - 1.0) ** 2))
            dof += x.size - 1
    return math.sqrt(num / dof) if dof else None


NET_EFF = 0.75
"""Parallel efficiency of the first multi-node step below which the ``net`` structures are
admitted without a drop. A cost per step once the network joins (a ring all-reduce's, which
does not grow with the nodes) and a serial fraction read the same at two sizes, but the first
then grows linearly and the second saturates: a job that read 1.08x at 2 nodes was planned
flat and held at one node, while its true curve grew at 59 % from 2 nodes on (zoo ``step``
0:128 seed 1: 90 % of the oracle in samples; docs/jpa-log.md, session 25). ImageNet's smooth
curves read 92-100 % at 2 nodes."""


def _first_step(sizes: np.ndarray, rates: np.ndarray) -> tuple[bool, bool]:
    """``(drop, weak)``: whether the smallest multi-node size measured is slower than one node,
    and whether it reads below :data:`NET_EFF` of linear scaling from one node (every drop is
    weak: ``NET_EFF`` x 2 > 1). A drop admits the split structures and the ``net`` terms (a dip
    they let grow again); a weak step the ``net`` terms only. Where the step is near linear,
    ``compute`` alone describes what ``compute + net`` would fit there, and the ensemble would
    count linear growth twice against the saturating structures: admitted always, it cost
    ImageNet at 0:512 1.6 points, one run below 98 % (docs/jpa-log.md, session 15); a split
    structure would repeat its unsplit one. ``sizes``/``rates``: :func:`_point_means` (each
    point counts by its readings, or pseudo-count)."""
    if sizes.size < 2 or sizes[0] != 1:
        return False, False
    return bool(rates[1] < rates[0]), bool(rates[1] < NET_EFF * sizes[1] * rates[0])


FLOOR_EXTRA = 2
"""Distinct sizes a bounded structure needs beyond its coefficients: a bound fits any rates at
as many sizes as it has coefficients, flat past the largest, so it would hold every job there;
with sizes to spare, readings that still rise reject it (one to spare cost ImageNet's smooth
curves: a run at 0:128 fell to 97.6 % of the oracle; docs/jpa-log.md, session 16)."""

FLAT_Z = 2.0
"""A bound is kept only where the readings show one: two or more sizes it holds flat, each
within ``FLAT_Z`` standard errors of the floor. A falling part (past a peak) or a weak scaler's
scatter is not a bound; nor is one size below the rising terms, which any concave curve gives
a linear rise (docs/jpa-log.md, session 17)."""


def _two_sizes_could_agree(rates: np.ndarray, tol: np.ndarray) -> bool:
    """Whether any two sizes' mean rates admit one floor within their relative tolerances: if
    not, no bound can be seen, and the bounded structures are not fitted (they cost most of an
    estimate)."""
    lo, hi = (1.0 - tol) / rates, (1.0 + tol) / rates  # floors (s/sample) each size allows
    order = np.argsort(lo)
    return bool(np.any(np.maximum.accumulate(hi[order])[:-1] >= lo[order][1:]))


def _bound_is_seen(p: ModelParams, sizes: np.ndarray, rates: np.ndarray, tol: np.ndarray) -> bool:
    """Whether a bounded fit's flat part is two or more sizes that agree with its floor."""
    if p.floor <= 0:
        return False  # no bound: the structure without it is already in the ensemble
    flat = np.asarray(p.theta) @ design_matrix(sizes).T <= p.floor
    return int(flat.sum()) >= 2 and bool(np.all(np.abs(rates[flat] * p.floor - 1.0) <= tol[flat]))


def estimate(
    samples: Samples,
    *,
    n_max: int,
    noise_rel: float | None = None,
    models: Sequence[ThroughputModel] = MODELS,
) -> CurveEstimate:
    """Fit the admissible models to ``samples`` and combine them (see the module docstring).

    ``samples.weight`` counts measurements per point; ``noise_rel`` is the relative standard
    deviation of one measurement (default 5 %, floored at 1 %).
    """
    if n_max < 1:
        raise SpecError(f"n_max must be >= 1, got {n_max!r}")
    if len(samples) == 0:
        raise SpecError("cannot estimate a curve from no samples; measure one rate first")
    sigma_obs = max(noise_rel if noise_rel is not None else 0.05, MIN_NOISE)
    n_grid = np.arange(1, n_max + 1, dtype=float)
    # once per estimate: the drop test, the bounds' check and the measurement error below
    sizes, rates, counts = _point_means(samples)
    drop, weak = _first_step(sizes, rates)  # split and ``net`` structures; ``net`` only
    # the bounded structures only where two sizes could show a floor (each within ``tol``)
    bounds = None
    if any(m.floor and sizes.size >= m.n_params + FLOOR_EXTRA for m in models):
        tol = FLAT_Z * sigma_obs / np.sqrt(np.maximum(counts, 1.0))
        bounds = (sizes, rates, tol) if _two_sizes_could_agree(rates, tol) else None
    cands = [m for m in models if m.n_params <= max(1, sizes.size)
             and (not m.for_dips or drop or (weak and not m.split))
             and (not m.floor or (bounds is not None and sizes.size >= m.n_params + FLOOR_EXTRA))]
    fits, scores, preds = [], [], []
    design, grid = design_matrix(samples.nodes), design_matrix(n_grid)  # once for every fit
    for m in cands:
        p = fit(m, samples, design=design)
        if m.floor and not _bound_is_seen(p, *bounds):
            continue
        pr = predict(p, n_grid, design=grid)
        if not np.all(np.isfinite(pr)):
            continue
        fits.append(p)
        scores.append(p.sse / sigma_obs**2 + 2.0 * p.n_params)
        preds.append(pr)
    if not fits:  # cannot happen with LINEAR in the list and positive rates; be safe anyway
        raise SpecError(f"no throughput model could be fitted to {samples}")
    s = np.asarray(scores)
    w = np.exp(-0.5 * (s - s.min()))
    w /= w.sum()
    p_mat = np.vstack(preds)  # (k, n_max)
    mean = w @ p_mat
    model_var = w @ (p_mat - mean) ** 2

    # measurement error of the nearest measured size, inflated per doubling of distance
    se_rel = sigma_obs / np.sqrt(counts)
    dist = np.abs(np.log2(n_grid[:, None]) - np.log2(sizes[None, :]))  # (n_max, k)
    near = np.argmin(dist, axis=1)
    meas_sd = mean * se_rel[near] * (1.0 + dist[np.arange(n_max), near])
    sigma = np.sqrt(model_var + meas_sd**2)
    return CurveEstimate(
        mean=np.concatenate([[0.0], mean]),
        sigma=np.concatenate([[0.0], sigma]),
        measured=tuple(int(d) for d in sizes),
        fits=tuple(fits),
        weights=tuple(float(v) for v in w),
        model_sigma=np.concatenate([[0.0], np.sqrt(model_var)]),
    )


PRIOR_LEVEL_SD = 0.25
"""A priori spread of log(level) between two jobs of one ``profile_key`` (same app, maybe another
batch size or data set): how far a prior's level is pulled by readings at sizes it never
measured, where its own curve is an interpolation or an extrapolation."""


def prior_level(
    prior: CurveEstimate, own: Samples, *, noise_rel: float, level_sd: float | None = None,
) -> float:
    """This job's level relative to ``prior``: the ratio of its rates to the prior's.

    Each own size counts by its precision: its readings' error (``noise_rel`` per reading) and
    the prior's own uncertainty there (small where the prior measured, large where its curve
    is an interpolation or an extrapolation). When the job shares no size with the prior's
    measured ones, the log ratio is also shrunk towards 1 by a level spread of ``level_sd``
    (default :data:`PRIOR_LEVEL_SD`), so readings only at sizes the prior never measured barely
    move it: measured on the zoo, a median ratio taken at such a size (a job started from a
    prior that measured up to 16 nodes, reading at 44) put the prior's points up to 2.6x above
    the job's truth. Sizes past the prior's largest *measured* size say nothing of the level
    and are left out: there the prior's curve is a guess (held flat past its ``n_max``, or a
    fit's extrapolation, which can be confident and wrong: a prior measured near-linear up to
    17 nodes claimed 4.5 % at 64, where the job's curve had been flat since 22, and the job's
    reading there levelled every prior point 28 % down although it matched the prior at 17).
    Always finite and > 0; 1 with nothing to go on.
    """
    sd = PRIOR_LEVEL_SD if level_sd is None else level_sd
    if not (math.isfinite(sd) and sd > 0):
        raise SpecError(f"level_sd must be a finite number > 0, got {level_sd!r}")
    sig = max(noise_rel, MIN_NOISE)
    # past the prior's largest measured size its curve is a guess: no information on the level
    top = min(prior.n_max, max(prior.measured, default=prior.n_max))
    pts = [(int(n), float(r), float(c)) for n, r, c in zip(own.nodes, own.rates, own.weight)
           if 1 <= int(n) <= top and r > 0 and prior.rate(int(n)) > 0]
    shared = any(n in prior.measured for n, _, _ in pts)
    num, den = 0.0, 0.0 if shared else 1.0 / sd**2
    for n, r, c in pts:
        ref = prior.rate(n)
        rs = prior.rel_sigma(n)
        w = 1.0 / (sig**2 / max(c, 1.0) + (rs if math.isfinite(rs) else 1e6) ** 2)
        num += w * math.log(r / ref)
        den += w
    return math.exp(num / den) if den > 0 else 1.0


def scaled_prior(
    prior: CurveEstimate, own: Samples | None, *, weight: float, noise_rel: float = 0.05,
) -> Samples:
    """A similar job's curve as pseudo-measurements, rescaled to this job's level.

    The prior's measured sizes become points of weight ``weight`` each; sizes this job has
    measured itself are left out, and the rest are scaled by :func:`prior_level` (same app,
    maybe another batch size or dataset).
    """
    sizes = [n for n in prior.measured if n <= prior.n_max]
    ratio = 1.0
    if own is not None and len(own):
        ratio = prior_level(prior, own, noise_rel=noise_rel)
        mine = set(int(n) for n in own.nodes)
        sizes = [n for n in sizes if n not in mine]
    rates = [prior.rate(n) * ratio for n in sizes]
    keep = [(n, r) for n, r in zip(sizes, rates) if r > 0]
    if not keep:
        return Samples.of([], [], [])
    return Samples.of([n for n, _ in keep], [r for _, r in keep], [weight] * len(keep))


def merge(a: Samples, b: Samples) -> Samples:
    """Concatenate two sample sets."""
    return Samples(
        np.concatenate([a.nodes, b.nodes]),
        np.concatenate([a.rates, b.rates]),
        np.concatenate([a.weight, b.weight]),
    )


MISFIT_SIGMAS = 3.0
"""A fitted mean this many standard errors off a measured point means no structure fits."""
MISFIT_FLOOR = 0.04
"""...and at least this far off (relative): a 2 % miss on a well-measured point is not a misfit."""
GAP_SIGMA = 0.15
"""Model-free uncertainty midway between two measured sizes, relative to the rate there."""
BEYOND_SIGMA = 0.5
"""Model-free uncertainty per doubling past the largest measured size, relative to its rate."""


def gap_sd(n: np.ndarray, sizes: np.ndarray, rates: np.ndarray, mean: np.ndarray) -> np.ndarray:
    """What may hide between two measured sizes (a dip or a peak): 0 at them and outside them,
    peaking midway at :data:`GAP_SIGMA` of ``mean`` plus half the step between the neighbours'
    ``rates``. Only the model-free estimate uses it: added to a fitted estimate's planning
    sigma it cost 0.25-0.5 points on the zoo (docs/jpa-log.md, session 28)."""
    if sizes.size < 2:
        return np.zeros_like(mean, dtype=float)
    idx = np.clip(np.searchsorted(sizes, n), 1, sizes.size - 1)
    a, b = sizes[idx - 1], sizes[idx]
    t = np.clip((n - a) / np.maximum(b - a, 1e-9), 0.0, 1.0)
    bump = 4 * t * (1 - t) * (GAP_SIGMA * mean + 0.5 * np.abs(rates[idx] - rates[idx - 1]))
    return np.where((n > sizes[0]) & (n < sizes[-1]), bump, 0.0)


def misfit_sizes(est: CurveEstimate, own: Samples, *, noise_rel: float) -> list[int]:
    """Measured sizes where the fitted mean disagrees with the measurement beyond its error."""
    sig = max(noise_rel, MIN_NOISE)
    bad = []
    for n, r, w in zip(own.nodes, own.rates, own.weight):
        k = int(n)
        if k > est.n_max:
            continue
        tol = max(MISFIT_SIGMAS * sig / math.sqrt(max(float(w), 1.0)), MISFIT_FLOOR)
        if abs(est.mean[k] / r - 1.0) > tol:
            bad.append(k)
    return bad


def _point_means(pts: Samples) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Distinct sizes, their weighted mean rates and total weights (readings or pseudo-counts)."""
    sizes = np.unique(pts.nodes)
    rates = np.array([np.average(pts.rates[pts.nodes == d], weights=pts.weight[pts.nodes == d])
                      for d in sizes])
    counts = np.array([pts.weight[pts.nodes == d].sum() for d in sizes])
    return sizes, rates, counts


def ground_truth(
    est: CurveEstimate, pts: Samples, *, noise_rel: float, check: Samples | None = None,
) -> CurveEstimate:
    """Measured points win over the fitted structures when they disagree.

    When the weighted fit misses one of the points (``pts``: the job's own readings and any
    prior's scaled points, each with its weight) by more than its error, no structure describes
    this job: the estimate becomes model-free — the measured means joined linearly, with an explicit
    uncertainty that is the measurement error at measured sizes, grows to :data:`GAP_SIGMA` of
    the rate midway between them (plus half the step between neighbours: a dip or a peak may
    hide there), and grows by :data:`BEYOND_SIGMA` of the last rate per doubling past the
    largest measured size (the mean stays flat there: growth nobody measured is not assumed).
    Otherwise the fit stands: it pools every reading, so a reading within its noise does not
    bend the curve (a correction at points missed by 3 standard errors but less than 4 % was
    tried and cost 1.7 points on an ImageNet run). The points checked are ``check``, by default
    every point in ``pts``, so a user's curve or a prior measured at many sizes is not smoothed
    away by a structure that cannot describe it (measured on the zoo: such fits missed true
    curves by up to 51 %). A job with readings of its own checks only those against a model's
    prior (:meth:`~malleparsl.jpa.knowledge.JobRecord.estimate`): a prior of another batch size
    may disagree with them without any structure failing the job.
    """
    check = pts if check is None else check
    if not len(pts) or not len(check):
        return est
    if not misfit_sizes(est, check, noise_rel=noise_rel):
        return est
    sig = max(noise_rel, MIN_NOISE)
    sizes, rates, counts = _point_means(pts)
    se = rates * sig / np.sqrt(np.maximum(counts, 0.25))
    n_max = est.n_max
    n = np.arange(1, n_max + 1, dtype=float)
    mean = np.interp(n, np.concatenate([[0.0], sizes]), np.concatenate([[0.0], rates]))
    sd = np.interp(n, sizes, se)
    gap = gap_sd(n, sizes, rates, mean)  # between measured sizes: a dip or a peak may hide there
    sd = np.where(gap > 0, np.sqrt(sd**2 + gap**2), sd)
    below = n < sizes[0]
    sd = np.where(below, np.maximum(sd, GAP_SIGMA * mean), sd)
    beyond = n > sizes[-1]
    grow = BEYOND_SIGMA * rates[-1] * np.log2(np.maximum(n / sizes[-1], 1.0))
    sd = np.where(beyond, np.sqrt(sd**2 + grow**2), sd)
    return CurveEstimate(
        mean=np.concatenate([[0.0], mean]),
        sigma=np.concatenate([[0.0], sd]),
        measured=est.measured, fits=est.fits, weights=est.weights,
        model_sigma=np.concatenate([[0.0], np.sqrt(np.maximum(sd**2 - np.interp(n, sizes, se)**2, 0))]),
        model_free=True,
    )
