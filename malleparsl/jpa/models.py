"""Parametric throughput models: a pure ``fit(samples) -> params`` and a vectorised ``predict``.

Every model describes the *time per sample* at ``n`` nodes as a non-negative combination of a
few cost terms, so ``rate(n) = 1 / T(n)`` with

.. math::

    T(n) = a / n  +  b  +  d \\cdot [n \\ge 2]  +  c_1 \\log_2 n  +  c_2 (n - 1)
           +  e \\cdot [n \\ge 2] / n  +  g \\log_2 (n) / n

- ``a`` (``compute``): work split evenly across nodes (perfect scaling);
- ``b`` (``serial``): work every node repeats (Amdahl's serial fraction, a saturating curve);
- ``d`` (``span``): a one-time cost once the job spans more than one node (the network joins
  in): the drop in throughput some jobs show at 2 nodes;
- ``c1`` (``tree``): a tree/ring all-reduce whose latency grows with ``log2 n``;
- ``c2`` (``sync``): a synchronisation cost growing with the node count, which makes a curve
  fall past a peak at ``n* = sqrt(a / c2)``;
- ``e`` (``net``): a cost per *step* once the job spans more than one node (an all-reduce
  whose time does not grow with the node count, as a ring's), shared by the samples of every
  node: data parallelism keeps each node's batch, so a step trains ``n`` batches. Where ``d``
  drops a curve for good, ``e`` drops it at 2 nodes and lets it grow again, linearly: the
  dip of jobs that lose a third of their one-node rate at 2 nodes and pass it at 3 to 5.
- ``g`` (``net_tree``): with ``e``, the rest of a step's all-reduce when each node keeps its
  batch: a tree's latency growing with ``log2 n``, per step, so per sample ``log2(n) / n``
  (``c1`` is the same cost when the global batch is fixed). After a dip the curve then grows
  less than linearly but keeps growing, which ``e`` alone (growth proportional to ``n``) and
  the strong-scaling terms (growth that stops) cannot draw.

Amdahl's law with parallel fraction ``p`` is ``a = p / r1``, ``b = (1 - p) / r1``; a saturating
curve ``R n / (n + K)`` is ``a = K / R``, ``b = 1 / R`` (the same two terms). Pollux's model
(gamma = 1, every node keeping its batch ``m``: per iteration ``alpha_g + beta_g m`` of compute
and ``alpha_s + beta_s (n - 2)`` of sync from 2 nodes) is, per sample, ``a = alpha_g / m +
beta_g``, ``d = beta_s / m`` and ``e = (alpha_s - 2 beta_s) / m``; no structure combines ``d``
and ``e`` yet. Because the model is linear in its coefficients, fitting
is a non-negative least-squares problem on *relative* residuals: no starting point, no local
minima, microseconds per fit.

A *bounded* structure (``floor``) is ``T(n) = max(terms(n), f)``: a time per sample no node
count goes below (an input pipeline or a storage bound), so the curve rises to a knee and is
flat past it, which no smooth sum of terms draws. It is fitted by trying every split of the
measured sizes into a rising part (NNLS on the terms) and a flat part (their best constant);
:mod:`~malleparsl.jpa.estimate` admits it only where two sizes read the floor.

A *split* structure (``dip``) fits its terms to the sizes of two or more nodes alone and the
one-node time apart, as one more coefficient: a job whose rate drops when it first spans two
nodes runs in two regimes (one node; the network joined), and from two nodes on its curve may
saturate or peak as any other. ``compute + net`` is the split linear structure and
``compute + net + net_tree`` the split ``compute + net_tree``; the split saturating and peaking
structures are their alternatives, without which every dip was extrapolated linearly with
little spread (docs/jpa-log.md, session 21). They are admitted only after a drop, as ``net``.

The structures are nested subsets of the terms; the :mod:`~malleparsl.jpa.estimate` module
weighs them against each other for an uncertainty.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.optimize import nnls

from malleparsl.errors import SpecError

TERMS: tuple[str, ...] = ("compute", "serial", "span", "tree", "sync", "net", "net_tree")
"""The cost terms, in the column order of :func:`design_matrix`."""
_SPAN = TERMS.index("span")  # the design matrix's [n >= 2] column: 0 exactly at one node


def design_matrix(n: np.ndarray | Sequence[float]) -> np.ndarray:
    """Columns ``1/n, 1, [n>=2], log2 n, n-1, [n>=2]/n, log2(n)/n`` for node counts ``n >= 1``
    (shape ``(len(n), 7)``)."""
    x = np.asarray(n, dtype=float)
    if x.size and np.min(x) < 1:
        raise SpecError(f"node counts must be >= 1 to evaluate a throughput model, got {x.min()}")
    return np.stack(
        [1.0 / x, np.ones_like(x), (x >= 2).astype(float), np.log2(x), x - 1.0,
         (x >= 2).astype(float) / x, np.log2(x) / x], axis=-1
    )


@dataclass(frozen=True)
class ThroughputModel:
    """One model structure: which of the :data:`TERMS` it may use."""

    name: str
    terms: tuple[str, ...]
    floor: bool = False  # a time per sample the curve cannot go below (see fit)
    split: bool = False  # the terms from two nodes on, the one-node time apart (see fit)

    def __post_init__(self) -> None:
        bad = [t for t in self.terms if t not in TERMS]
        if bad or not self.terms:
            raise SpecError(
                f"model {self.name!r}: unknown term(s) {bad} or none given; use terms from {TERMS}"
            )
        if self.floor and self.split:
            raise SpecError(f"model {self.name!r}: a structure is bounded or split, not both")

    @property
    def n_params(self) -> int:
        return len(self.terms) + int(self.floor) + int(self.split)

    @property
    def for_dips(self) -> bool:
        """Whether the structure draws a drop at two nodes (admitted only after one; the
        ``net`` ones also after a weak first step, ``estimate.NET_EFF``)."""
        return self.split or "net" in self.terms

    @property
    def columns(self) -> list[int]:
        return [TERMS.index(t) for t in self.terms]


@dataclass(frozen=True)
class Samples:
    """Measured rates: per node count, the mean samples/s and how many measurements back it.

    ``weight`` is the number of measurements (or a smaller pseudo-count for a prior's points).
    """

    nodes: np.ndarray
    rates: np.ndarray
    weight: np.ndarray

    def __post_init__(self) -> None:
        n = np.asarray(self.nodes, dtype=float)
        r = np.asarray(self.rates, dtype=float)
        w = np.asarray(self.weight, dtype=float)
        if not (n.shape == r.shape == w.shape) or n.ndim != 1:
            raise SpecError(
                f"samples need 1-D nodes, rates and weight of one length, got shapes "
                f"{n.shape}, {r.shape}, {w.shape}"
            )
        if n.size and (np.min(n) < 1 or not np.all(np.isfinite(n))):
            raise SpecError(f"sample node counts must be finite and >= 1, got {n.tolist()}")
        if r.size and not (np.all(np.isfinite(r)) and np.min(r) > 0):
            raise SpecError(
                f"sample rates must be finite and > 0 samples/s, got {r.tolist()}; "
                "drop zero or failed measurements before fitting"
            )
        if w.size and not (np.all(np.isfinite(w)) and np.min(w) > 0):
            raise SpecError(f"sample weights must be finite and > 0, got {w.tolist()}")
        object.__setattr__(self, "nodes", n)
        object.__setattr__(self, "rates", r)
        object.__setattr__(self, "weight", w)

    @classmethod
    def of(
        cls,
        nodes: Sequence[float],
        rates: Sequence[float],
        weight: Sequence[float] | None = None,
    ) -> Samples:
        w = np.ones(len(nodes)) if weight is None else weight
        return cls(np.asarray(nodes), np.asarray(rates), np.asarray(w))

    def __len__(self) -> int:
        return int(self.nodes.size)


@dataclass(frozen=True)
class ModelParams:
    """A fitted model: the coefficients of all seven :data:`TERMS` (zeros for unused ones).

    ``theta`` is in seconds per sample; ``sse`` is the weighted sum of squared *relative*
    residuals of the fit, the quantity a noise level turns into a chi-square.
    """

    model: str
    theta: tuple[float, ...]
    sse: float
    n_params: int
    floor: float = 0.0  # seconds per sample the time cannot go below (0: none)
    one_node: float = 0.0  # seconds per sample at one node, fitted apart (0: the terms')


def fit(model: ThroughputModel, samples: Samples, *, design: np.ndarray | None = None) -> ModelParams:
    """Least-squares fit of ``model`` to ``samples`` with non-negative coefficients (pure).

    Minimises ``sum_i w_i (T_model(n_i) / T_i - 1)^2`` where ``T_i = 1 / rate_i``: relative
    errors, so a 3 % miss weighs the same on a slow and a fast job. ``design`` is
    ``design_matrix(samples.nodes)``, for a caller that fits many structures to one set.
    """
    if len(samples) == 0:
        raise SpecError(f"cannot fit model {model.name!r} to no samples; measure a rate first")
    design = design_matrix(samples.nodes) if design is None else design
    if model.floor:
        return _fit_floored(model, samples, design)
    if model.split:
        return _fit_split(model, samples, design)
    phi = design[:, model.columns]
    coef, sse = _nnls(phi, 1.0 / samples.rates, samples.weight)
    theta = np.zeros(len(TERMS))
    theta[model.columns] = coef
    return ModelParams(model.name, tuple(float(v) for v in theta), sse, model.n_params)


def _nnls(phi: np.ndarray, t_obs: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, float]:
    """The coefficients of the terms ``phi`` (design-matrix columns) for times per sample
    ``t_obs``, and their weighted relative SSE."""
    sw = np.sqrt(w)
    scale = _median(t_obs)  # condition the problem: coefficients near 1
    a_mat = (phi / t_obs[:, None]) * sw[:, None]
    coef, _ = nnls(a_mat * scale, sw, maxiter=50 * phi.shape[1])
    coef = coef * scale
    resid = (phi @ coef) / t_obs - 1.0
    return coef, float(np.sum(w * resid**2))


def _median(x: np.ndarray) -> float:
    """``np.median`` of a short 1-D array, bit for bit, without its generality (``np.median``
    took 14 % of a profiled replay)."""
    s = np.sort(x)
    m = s.size // 2
    return float(s[m]) if s.size % 2 else float((s[m - 1] + s[m]) / 2)


def _best_constant(t_obs: np.ndarray, w: np.ndarray) -> float:
    """The time per sample ``c`` minimising ``sum w (c / T - 1)^2`` over readings ``T``."""
    return float(np.sum(w / t_obs) / np.sum(w / t_obs**2))


def _fit_split(model: ThroughputModel, samples: Samples, design: np.ndarray) -> ModelParams:
    """The terms fitted to the readings at two or more nodes, the one-node time to those at one
    node (their best constant; 0, from the terms, when there are none)."""
    t_obs, w = 1.0 / samples.rates, samples.weight
    multi = samples.nodes >= 2
    theta = np.zeros(len(TERMS))
    sse, one = 0.0, 0.0
    if multi.any():
        coef, sse = _nnls(design[multi][:, model.columns], t_obs[multi], w[multi])
        theta[model.columns] = coef
    if not multi.all():
        one = _best_constant(t_obs[~multi], w[~multi])
        sse += float(np.sum(w[~multi] * (one / t_obs[~multi] - 1.0) ** 2))
    return ModelParams(model.name, tuple(float(v) for v in theta), sse, model.n_params,
                       one_node=one)


def _fit_floored(model: ThroughputModel, samples: Samples, design: np.ndarray) -> ModelParams:
    """``T(n) = max(terms(n), floor)``: every split of the sizes into a rising part (fitted by
    the terms) and a flat part (the floor, their weighted best constant) is tried, and the one
    with the least relative SSE of the whole kinked curve wins. No split (floor 0) is one of
    them, so the structure fits at least as well as its terms alone."""
    nodes, w = samples.nodes, samples.weight
    t_obs = 1.0 / samples.rates
    phi = design[:, model.columns]
    coef, sse = _nnls(phi, t_obs, w)  # no flat part
    best = (sse, coef, 0.0)
    for k in np.unique(nodes):  # the flat part is every size >= k (the smallest: all flat)
        flat = nodes >= k
        # the flat part's best constant time: min sum w (c / T - 1)^2
        c = _best_constant(t_obs[flat], w[flat])
        rise = ~flat
        coef = (_nnls(phi[rise], t_obs[rise], w[rise])[0] if rise.any()
                else np.zeros(len(model.columns)))
        sse = float(np.sum(w * (np.maximum(phi @ coef, c) / t_obs - 1.0) ** 2))
        if sse < best[0]:
            best = (sse, coef, c)
    sse, coef, c = best
    theta = np.zeros(len(TERMS))
    theta[model.columns] = coef
    return ModelParams(model.name, tuple(float(v) for v in theta), sse, model.n_params, float(c))


def predict(
    params: ModelParams | Sequence[ModelParams],
    n: np.ndarray | Sequence[float],
    *,
    design: np.ndarray | None = None,
) -> np.ndarray:
    """Samples/s at node counts ``n`` (vectorised over counts and over a list of fits).

    One fit gives shape ``(len(n),)``; a list of ``k`` fits gives ``(k, len(n))``. A fit whose
    time per sample is zero (nothing measured that constrains it) predicts ``inf``; callers cap.
    ``design`` is ``design_matrix(n)``, for a caller that predicts many fits at one grid.
    """
    single = isinstance(params, ModelParams)
    plist = [params] if single else list(params)  # type: ignore[list-item]
    theta = np.array([p.theta for p in plist], dtype=float)  # (k, len(TERMS))
    floor = np.array([p.floor for p in plist], dtype=float)
    design = design_matrix(n) if design is None else design
    t = np.maximum(theta @ design.T, floor[:, None])  # (k, len(n))
    if any(p.one_node > 0 for p in plist):  # split fits: their own time at one node
        one = np.array([p.one_node for p in plist], dtype=float)
        at_one = design[:, _SPAN] == 0  # the [n >= 2] column
        t = np.where(at_one[None, :] & (one[:, None] > 0), one[:, None], t)
    with np.errstate(divide="ignore"):
        out = np.where(t > 0, 1.0 / np.where(t > 0, t, 1.0), np.inf)
    return out[0] if single else out


LINEAR = ThroughputModel("linear", ("compute",))
AMDAHL = ThroughputModel("amdahl", ("compute", "serial"))
PEAK = ThroughputModel("compute+sync", ("compute", "sync"))
STEP = ThroughputModel("compute+span", ("compute", "span"))
RING = ThroughputModel("compute+tree", ("compute", "tree"))
SPAN = ThroughputModel("amdahl+span", ("compute", "serial", "span"))
TREE = ThroughputModel("amdahl+tree", ("compute", "serial", "tree"))
SYNC = ThroughputModel("amdahl+sync", ("compute", "serial", "sync"))
NET = ThroughputModel("compute+net", ("compute", "net"))
# a dip that grows again less than linearly (a weak scaler's tree all-reduce; docs/jpa-log.md, session 18)
NET_TREE = ThroughputModel("compute+net+net_tree", ("compute", "net", "net_tree"))
# the five strong-scaling terms: with ``net`` as a sixth, ImageNet at 0:512 lost 2.3-3.4 points
# (docs/jpa-log.md, session 15); ``net`` has its own structure, admitted after a drop (estimate)
FULL = ThroughputModel("full", ("compute", "serial", "span", "tree", "sync"))
# a knee: admitted where two sizes read one floor (estimate; docs/jpa-log.md, session 17)
BOUND = ThroughputModel("compute+bound", ("compute",), floor=True)
BOUND_AMDAHL = ThroughputModel("amdahl+bound", ("compute", "serial"), floor=True)

# past a drop, the curve from two nodes on saturates or peaks as any other (docs/jpa-log.md,
# session 21): the split linear and ``net_tree`` structures are ``NET`` and ``NET_TREE``
DIP_AMDAHL, DIP_PEAK, DIP_RING, DIP_TREE, DIP_SYNC = (
    ThroughputModel(f"{m.name}, dip", m.terms, split=True) for m in (AMDAHL, PEAK, RING, TREE, SYNC))

MODELS: tuple[ThroughputModel, ...] = (
    LINEAR, AMDAHL, PEAK, STEP, RING, NET, BOUND, SPAN, TREE, SYNC, NET_TREE, BOUND_AMDAHL, FULL,
    DIP_AMDAHL, DIP_PEAK, DIP_RING, DIP_TREE, DIP_SYNC)
"""The structures the estimator weighs, simplest first. Several share a parameter count on
purpose: two measured sizes fit all two-term models exactly, and their disagreement between and
beyond those sizes is the uncertainty that makes the advisor look there."""


def amdahl_params(*, rate1: float, parallel_fraction: float) -> ModelParams:
    """The exact :data:`AMDAHL` parameters of ``rate(n) = rate1 / ((1 - p) + p / n)``."""
    if not (rate1 > 0 and 0 <= parallel_fraction <= 1):
        raise SpecError(
            f"need rate1 > 0 and parallel_fraction in [0, 1], got {rate1!r}, {parallel_fraction!r}"
        )
    p = parallel_fraction
    return ModelParams("amdahl", (p / rate1, (1 - p) / rate1, 0.0, 0.0, 0.0, 0.0, 0.0), 0.0, 2)
