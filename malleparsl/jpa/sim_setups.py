"""Simulator setups of the JPA evaluation, registered with :mod:`malleparsl.sim.setups`.

- ``milp+jpa``: curves hidden from the controller; the Job Profiling Advisor learns them from
  the noisy rates the simulator measures, probes placed by :class:`~malleparsl.jpa.policy.ProbeFirst`
  around the MILP. Options go to the advisor (``share_priors=False``, ``kappa=...``), except
  ``inner`` and ``inner_options`` for the wrapped policy.
- ``milp+jpa-nopriors``: the same without priors from similar jobs (every job starts unknown),
  the setting for job sets where no two jobs share an app.
- ``milp-linear``: the MILP planning with linear scaling from a one-node measurement
  (``rate(n) = n * rate(1)``, the one-node rate measured once with the simulator's noise, for
  free): what an allocator without profiling would assume.
- ``milp-perturbed``: the MILP planning with every job's true curve times ``1 + error·N(0, 1)``
  at each node count, drawn once per job: a learner that knows every curve, at every size, to
  ``error`` (default 3 %; ``draw=K`` another draw). Not a profiler: it tells how finely the
  replay's figures resolve curve knowledge, the yardstick for the JPA's targets. One run moves
  with the draw (five draws at 1 % put one run between 90.4 and 106.8 %), so use several.

The oracle is plain ``milp`` (true curves) and ``equal-share`` needs no curves.
"""

from __future__ import annotations

import dataclasses
import zlib
from collections.abc import Sequence

import numpy as np

from malleparsl.allocator.base import AllocationPolicy, ClusterSnapshot, JobView, make_policy
from malleparsl.controller import CurveAdvisor, JobState, KnownCurves
from malleparsl.errors import SpecError
from malleparsl.jpa.advisor import JobProfilingAdvisor
from malleparsl.jpa.policy import ProbeFirst
from malleparsl.model import Allocation, JobSpec, ScalingCurve
from malleparsl.sim.setups import Setup, register_setup

SIM_DEFAULTS: dict[str, object] = {"warmup_obs": 0, "probe_timeout_s": 1800.0}
"""The simulator already drops a segment's warm-up before it measures, and measures at most
every 300 s; the advisor's own warm-up skip and probe timeout are set to match."""


class LinearFromOneNode(CurveAdvisor):
    """Plan with ``rate(n) = n * rate(1)``, ``rate(1)`` measured once with relative noise.

    Reads the one-node rate from the job's (true) curve: the measurement a user would make
    before submitting. ``noise`` is the relative standard deviation of that one measurement.
    """

    def __init__(self, *, noise: float = 0.03, seed: int = 0) -> None:
        if not noise >= 0:
            raise SpecError(f"noise must be >= 0, got {noise!r}")
        self.noise = noise
        self._rng = np.random.default_rng(seed)
        self._r1: dict[str, float] = {}

    def forget(self, job_id: str) -> None:
        self._r1.pop(job_id, None)

    def views(
        self, snapshot: ClusterSnapshot, jobs: Sequence[JobState], allocation: Allocation
    ) -> list[JobView]:
        out = []
        for js in jobs:
            spec = js.spec
            if spec.curve is None:
                raise SpecError(
                    f"job {spec.job_id!r} has no curve to take a one-node measurement from; "
                    "milp-linear needs the jobs' curves (a setup with hide_curves=False)"
                )
            if spec.job_id not in self._r1:
                r1 = spec.curve.rate(1) * (1 + self.noise * self._rng.standard_normal())
                self._r1[spec.job_id] = max(r1, 1e-9)
            hi = max(spec.max_nodes, 1)
            curve = ScalingCurve((1, hi) if hi > 1 else (1,),
                                 tuple(self._r1[spec.job_id] * k for k in ((1, hi) if hi > 1 else (1,))),
                                 name=spec.job_id)
            # the progress the controller reports, as KnownCurves and the JPA give it: policies
            # that value a grow over the job's remaining time need it
            out.append(JobView(spec, curve, allocation.nodes_of(spec.job_id), **js.progress()))
        return out


class PerturbedCurves(KnownCurves):
    """Every job's true curve times ``1 + error·N(0, 1)`` at each size 1..max_nodes, drawn once
    per job from ``(seed, draw, job id)`` (so a job's draw does not depend on the others' order).

    One draw is one learner: a single replay's figure moves with it by several points where the
    replay is chaotic, so the yardstick is several draws (``draw=0, 1, ...``) per case."""

    def __init__(self, *, error: float = 0.03, seed: int = 0, draw: int = 0) -> None:
        if not (isinstance(error, (int, float)) and np.isfinite(error) and error >= 0):
            raise SpecError(f"milp-perturbed: error must be a finite relative error >= 0 "
                            f"(0.01 for 1 %), got {error!r}")
        if isinstance(draw, bool) or not isinstance(draw, int) or draw < 0:
            raise SpecError(f"milp-perturbed: draw must be a whole number >= 0, got {draw!r}")
        self.error, self.seed, self.draw = float(error), int(seed), draw
        self._curves: dict[str, ScalingCurve] = {}

    def forget(self, job_id: str) -> None:
        self._curves.pop(job_id, None)

    def curve(self, spec: JobSpec) -> ScalingCurve:
        """The planning curve of ``spec`` (its true curve, perturbed; built on first use)."""
        if spec.job_id not in self._curves:
            if spec.curve is None:
                raise SpecError(
                    f"job {spec.job_id!r} has no curve to perturb; milp-perturbed needs the "
                    "jobs' true curves (a setup with hide_curves=False)"
                )
            rng = np.random.default_rng([self.seed, self.draw, zlib.crc32(spec.job_id.encode())])
            sizes = tuple(range(1, max(spec.max_nodes, 1) + 1))
            noise = 1 + self.error * rng.standard_normal(len(sizes))
            rates = np.maximum(np.array(spec.curve.rates_upto(sizes[-1])[1:]) * noise, 1e-9)
            self._curves[spec.job_id] = ScalingCurve(sizes, tuple(map(float, rates)),
                                                     name=spec.job_id)
        return self._curves[spec.job_id]

    def views(
        self, snapshot: ClusterSnapshot, jobs: Sequence[JobState], allocation: Allocation
    ) -> list[JobView]:
        """The oracle's views (:class:`KnownCurves`), each with its job's perturbed curve."""
        return [dataclasses.replace(v, curve=self.curve(v.spec))
                for v in super().views(snapshot, jobs, allocation)]


def _jpa_setup(*, share_priors: bool = True, **options: object) -> Setup:
    """``advisor=`` passes a ready advisor (to read its figures after the run); ``audit=`` a
    :class:`~malleparsl.jpa.audit.DecisionAudit` to score every decision by the true curves
    (the answers are unchanged); ``hide_curves=False`` hands the advisor each job's true curve
    as a user's curve (the simulator then measures nothing): the mechanics test."""
    inner = options.pop("inner", "milp")
    inner_options = dict(options.pop("inner_options", None) or {})  # type: ignore[call-overload]
    advisor = options.pop("advisor", None)
    audit = options.pop("audit", None)
    hide = bool(options.pop("hide_curves", True))
    if advisor is None:
        kw = {**SIM_DEFAULTS, **options}
        advisor = JobProfilingAdvisor(share_priors=share_priors, **kw)  # type: ignore[arg-type]
    elif options:
        raise SpecError(f"give advisor options or advisor=, not both (got {sorted(options)})")
    policy: AllocationPolicy = ProbeFirst(advisor=advisor, inner=inner, **inner_options)  # type: ignore[arg-type]
    if audit is not None:
        if inner != "milp" or inner_options:
            # the audit scores with plain milp's objective (Tfwd x rate - OLD_RATE pauses);
            # against another objective its efficiency and loss split would mean nothing
            raise SpecError(
                f"audit= scores decisions with plain milp's objective: use it with inner='milp' "
                f"and no inner_options (got inner={inner!r}, inner_options={inner_options})"
            )
        policy = audit.bind(policy, advisor)  # type: ignore[attr-defined]
    return policy, advisor, hide  # type: ignore[return-value]


def _jpa_nopriors(**options: object) -> Setup:
    return _jpa_setup(share_priors=False, **options)


def _linear_setup(*, noise: float = 0.03, seed: int = 0, **milp_options: object) -> Setup:
    return make_policy("milp", **milp_options), LinearFromOneNode(noise=noise, seed=seed), False


def _perturbed_setup(
    *, error: float = 0.03, seed: int = 0, draw: int = 0, **milp_options: object
) -> Setup:
    return make_policy("milp", **milp_options), PerturbedCurves(error=error, seed=seed, draw=draw), False


register_setup("milp+jpa", _jpa_setup)
register_setup("milp+jpa-nopriors", _jpa_nopriors)
register_setup("milp-linear", _linear_setup)
register_setup("milp-perturbed", _perturbed_setup)
