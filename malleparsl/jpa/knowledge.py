"""What the JPA knows about one job: measured rates per size, rescale pauses, service received.

A :class:`JobRecord` is fed raw monitor readings and keeps only what can be trusted:

- readings of zero, negative or non-finite samples/s are dropped (a stalled or restarting job
  says nothing about its scalability) and counted;
- the first ``warmup_obs`` readings after the job changes size are dropped (data loaders,
  compilation and the new process group make the first seconds of a segment slow);
- per size, only the last ``window`` readings are kept, so a job whose speed drifts (a new
  phase, a shared file system) is tracked rather than averaged away.

A size is *stable* once its mean is known to ``stable_tol`` (standard error of the mean
relative to the mean), or after ``max_obs`` readings whatever their spread: that ends a probe.
"""

from __future__ import annotations

import logging
import math
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from malleparsl.jpa.estimate import CurveEstimate, ground_truth, merge, pooled_noise, scaled_prior
from malleparsl.jpa.estimate import estimate as fit_estimate
from malleparsl.jpa.models import Samples
from malleparsl.model import JobSpec, ScalingCurve

log = logging.getLogger(__name__)


@dataclass
class Probe:
    """A JPA-directed run of a job at ``size`` nodes, to measure its rate there.

    ``started_s`` is None until the job is seen holding ``size`` nodes.
    """

    size: int
    requested_s: float
    started_s: float | None = None
    check: bool = False  # a predictable job's check past its largest size (on idle nodes)
    base: int = 0  # nodes the job held when the probe was asked for: a check's cost is the rest


@dataclass(eq=False)
class JobRecord:
    """Measurements and bookkeeping of one admitted job."""

    spec: JobSpec
    registered_s: float
    order: int
    window: int = 16
    warmup_obs: int = 1
    prior: CurveEstimate | None = None
    prior_weight: float = 0.5
    prior_is_user: bool = False
    robust: bool = True  # measured points win over fits that miss them (model-free fallback)
    obs: dict[int, deque[float]] = field(default_factory=dict)
    dropped_zero: int = 0
    last_obs_s: float = -math.inf
    last_n: int | None = None
    skip_left: int = 0
    version: int = 0
    readings: int = 0  # kept readings so far (version also counts prior changes)
    attained_ns: float = 0.0
    done_est: float = 0.0  # samples trained, integrated from the rates measured or predicted
    done_reported: float | None = None  # samples trained, as the controller last reported (None: no report)
    probe_ns: float = 0.0
    probe: Probe | None = None
    probe_failures: int = 0
    next_probe_s: float = 0.0
    checked: set[int] = field(default_factory=set)  # sizes a check was started at (once each)
    pauses: dict[str, list[float]] = field(default_factory=lambda: {"up": [], "down": []})
    ran_ns: dict[int, float] = field(default_factory=dict)  # size -> node-seconds held at it
    _cache: tuple[tuple[int, int, float], CurveEstimate] | None = None
    plan_cache: dict[int, tuple[int, ScalingCurve]] = field(default_factory=dict)
    spec_cache: tuple[tuple[int, int], JobSpec] | None = None

    @property
    def job_id(self) -> str:
        return self.spec.job_id

    # ---- measurements -------------------------------------------------------------------
    def add_rate(self, n: int, rate: float, now_s: float = 0.0) -> bool:
        """Record one monitor reading; returns whether it was kept."""
        if n < 1:
            return False
        if not (isinstance(rate, (int, float, np.floating)) and math.isfinite(rate) and rate > 0):
            self.dropped_zero += 1
            log.debug("job %r: ignoring rate %r at %d nodes", self.job_id, rate, n)
            return False
        if n != self.last_n:
            self.last_n, self.skip_left = n, self.warmup_obs
        if self.skip_left > 0:
            self.skip_left -= 1
            return False
        self.obs.setdefault(n, deque(maxlen=self.window)).append(float(rate))
        self.version += 1
        self.readings += 1
        self.last_obs_s = now_s
        return True

    def add_pause(self, kind: str, pause_s: float) -> bool:
        if kind not in self.pauses or not (math.isfinite(pause_s) and pause_s >= 0):
            return False
        self.pauses[kind].append(float(pause_s))
        return True

    def stable(
        self, n: int, *, tol: float, min_obs: int, max_obs: int, noise: float | None = None
    ) -> bool:
        """Whether the rate at ``n`` nodes is measured well enough to end a probe there.

        ``noise`` is the monitor's relative noise learned from all jobs (None if unknown): with
        it, one reading can suffice; this size's own spread counts when it is larger.
        """
        x = self.obs.get(n)
        if not x or len(x) < min_obs:
            return False
        if len(x) >= max_obs:
            return True
        a = np.asarray(x)
        mean = float(np.mean(a))
        own = float(np.std(a, ddof=1)) if a.size >= 2 else None
        if own is None and noise is None:
            return False
        sd = max(own or 0.0, (noise or 0.0) * mean)
        return sd / math.sqrt(a.size) <= tol * mean

    def stable_sizes(
        self, *, tol: float, min_obs: int, max_obs: int, noise: float | None = None
    ) -> list[int]:
        return [n for n in self.obs
                if self.stable(n, tol=tol, min_obs=min_obs, max_obs=max_obs, noise=noise)]

    def noise_sums(self) -> tuple[float, int]:
        """(sum of squared relative deviations, degrees of freedom) over repeated readings."""
        num, dof = 0.0, 0
        for x in self.obs.values():
            if len(x) >= 2:
                a = np.asarray(x)
                num += float(np.sum((a / a.mean() - 1.0) ** 2))
                dof += a.size - 1
        return num, dof

    @property
    def measured_sizes(self) -> list[int]:
        return sorted(n for n, x in self.obs.items() if x)

    def samples(self) -> Samples | None:
        """Per size, the mean of the kept readings weighted by their count."""
        sizes = self.measured_sizes
        if not sizes:
            return None
        return Samples.of(
            sizes,
            [float(np.mean(self.obs[n])) for n in sizes],
            [float(len(self.obs[n])) for n in sizes],
        )

    def noise(self) -> float | None:
        return pooled_noise([list(x) for x in self.obs.values()])

    # ---- curve --------------------------------------------------------------------------
    def explored(self) -> list[int]:
        """Sizes whose rate is backed by data: the job's own, or a prior's measured sizes."""
        sizes = set(self.measured_sizes)
        if self.prior is not None:
            sizes |= set(self.prior.measured)
        return sorted(sizes)

    def estimate(self, n_max: int, *, default_noise: float) -> CurveEstimate | None:
        """The current estimate (cached until a new reading arrives); None if nothing known."""
        noise = self.noise()
        noise = default_noise if noise is None else noise
        key = (self.version, n_max, round(noise, 4))
        if self._cache is not None and self._cache[0] == key:
            return self._cache[1]
        own = self.samples()
        pts = own
        if self.prior is not None:
            pr = scaled_prior(self.prior, own, weight=self.prior_weight, noise_rel=noise)
            pts = pr if own is None else merge(own, pr)
        if pts is None or len(pts) == 0:
            return None
        est = fit_estimate(pts, n_max=n_max, noise_rel=noise)
        if own is not None:  # the own sizes are what the job really measured
            est = CurveEstimate(est.mean, est.sigma, tuple(self.measured_sizes), est.fits,
                                est.weights, est.model_sigma)
        if self.robust:  # measured points win over a fit that misses them: the job's own
            # readings; with none yet, or against a user's curve, the prior's points too
            check = pts if own is None or self.prior_is_user else own
            est = ground_truth(est, pts, noise_rel=noise, check=check)
        self._cache = (key, est)
        return est

    def rescale_cost(self, kind: str) -> float | None:
        """The median measured pause of this kind, or None if never measured."""
        x = self.pauses.get(kind) or []
        return float(np.median(x)) if x else None
