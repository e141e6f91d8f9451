"""The Job Profiling Advisor: learns every job's scaling curve online and hands it to the policy.

The rule that splits jobs (AITurbo's predictable / unpredictable) and combines the two groups:

**A job is unpredictable until its rate is stable at one size** (or it arrives with a curve: a
user's, or a prior from a job with the same ``profile_key``; a job queued before its model was
measured adopts the model's prior once one exists, ``adopt_priors``). Unpredictable jobs are
probed, one at a time per node budget, in order of **least attained service** (node-seconds
received so far, then admission order): a probe gives the job exactly ``min_nodes`` nodes until
its rate there is stable (warm-up readings excluded) or it falls silent. Probes take at most
``max_probe_frac`` of the nodes and, while any predictable job exists, start only while probe
node-seconds stay within ``probe_share`` of all node-seconds used (plus one probe's worth of
credit). Everything else goes to the policy (the MILP): predictable jobs with their learned
curves, unpredictable jobs not being probed with a negligible curve (they get only nodes no
predictable job gains from, which also yields measurements; the curve is concave, so those nodes
spread over them instead of all going to one).

The curve a predictable job is planned with is **optimistic where unexplored, within the
linear bound**: ``min(mean + kappa * sigma, best measured per-node rate * n)``. Near measured
sizes sigma is the measurement error; between and beyond them it is the disagreement of the
model structures that fit the data, so sizes where the structures disagree look attractive until
someone runs there — and every run segment at any size is a measurement. Optimism never exceeds
linear scaling from the best per-node rate seen (no job is promised super-linear speed-up), and
``explore_factor`` (default 4; ``None`` turns it off) caps growth to that multiple of the largest
explored size, flat beyond. Other models' measured shapes (:mod:`malleparsl.jpa.explore`) widen
that limit to the size the population expects to pay best, and cap the optimism at sizes they
measured, so a new model jumps instead of walking the ladder. Rescale pauses measured live
replace the spec's values.

**Nodes past a job's knee go back when no node is idle** (``release_flat``, the default): the
optimism above sends jobs past their knees while nodes are idle, and the allocator's objective
keeps them there (a shrink pays a pause against ``Tfwd`` of another job's gain), so once every
node is held, a predictable job measured at its size is capped at the smallest size its
estimate expects within ``gain_tol`` of the rate it measured there.

**An estimate that expects no gain past the measured sizes is checked** (``check_beyond``, the
default since session 26): the allocator never goes where the plan offers nothing, so no
reading would contradict it. A job whose largest measured size (its own or its model's) is its
best and whose estimate expects no more at twice that size, with at least ``CHECK_MIN_S`` of
work left, is run there once — on idle nodes only, within the probing budget. The converse,
**past a measured fall** (``fall_cap``, opt-in since session 29): a job that read a peak and a
fall after it is planned no higher than its best rate read at sizes beyond the explored ones,
so sigma growing per doubling does not send it 3-4x past its peak.

**A model's prior is everything its jobs measured** (``pool_priors``, the default since
session 11): a finished job's estimate becomes its model's prior with the sizes of the prior it
started from as well as its own, so the sizes measured accumulate from job to job. **And a
running job's prior is what the model's other jobs measured so far** (``share_readings``, the
default since session 13): the other running jobs' readings, at one level, with the finished
jobs' prior, refitted whenever one of them reads a new rate, so jobs of one model running at
once pool what each explores instead of learning alone until one finishes.

A job that never reports, or reports only zeros, fails its probe once ``probe_timeout_s`` pass
without a usable reading and is retried after an exponential back-off; its probe node-seconds
count as service, so the other unknown jobs go first.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Mapping, Sequence

import numpy as np

from malleparsl.allocator.base import ClusterSnapshot, JobView
from malleparsl.controller import CurveAdvisor, JobState
from malleparsl.errors import SpecError
from malleparsl.jpa.estimate import CurveEstimate, ground_truth, merge, prior_level, scaled_prior
from malleparsl.jpa.estimate import estimate as fit_estimate
from malleparsl.jpa.explore import ShapePrior, choose_next_size
from malleparsl.jpa.knowledge import JobRecord, Probe
from malleparsl.jpa.models import Samples
from malleparsl.model import Allocation, JobSpec, ScalingCurve

log = logging.getLogger(__name__)

MIN_NOISE_DOF = 5
"""Repeated readings (degrees of freedom) needed before the pooled monitor noise is trusted."""

CHECK_MIN_S = 3600.0
"""Remaining work (seconds at the best measured rate) a job needs for a check past its largest
measured size (``check_beyond``): a check holds a size for two readings, about 11 minutes."""


def profile_key(spec: JobSpec) -> str | None:
    """Jobs with the same key share a prior: ``meta['profile_key']``, else the model name."""
    key = spec.meta.get("profile_key") if spec.meta else None
    return str(key) if key else (spec.model or None)


class JobProfilingAdvisor(CurveAdvisor):
    """Learns scaling curves from the monitor's samples/s; see the module docstring for the rule.

    >>> from malleparsl.controller import Controller
    >>> from malleparsl.jpa.policy import ProbeFirst
    >>> jpa = JobProfilingAdvisor()
    >>> ctl = Controller(policy=ProbeFirst(advisor=jpa, inner="equal-share"), advisor=jpa)
    """

    def __init__(
        self,
        *,
        kappa: float = 1.0,
        explore_factor: float | None = 4.0,
        default_noise: float = 0.05,
        probe_timeout_s: float = 900.0,
        probe_share: float = 0.02,
        max_probe_frac: float = 0.1,
        stable_tol: float = 0.03,
        min_obs: int = 1,
        max_obs: int = 2,
        warmup_obs: int = 1,
        window: int = 16,
        share_priors: bool = True,
        prior_weight: float = 0.5,
        optimism: str = "total",
        robust: bool = True,
        explore_min_s: float = 300.0,
        shape_prior: bool = False,
        gain_tol: float = 0.02,
        adopt_priors: bool = True,
        release_flat: bool = True,
        pool_priors: bool = True,
        share_readings: bool = True,
        check_beyond: bool = True,
        fall_cap: bool = False,
    ) -> None:
        for name, v, lo in [
            ("kappa", kappa, 0.0), ("default_noise", default_noise, 0.0),
            ("probe_share", probe_share, 0.0), ("max_probe_frac", max_probe_frac, 0.0),
            ("stable_tol", stable_tol, 0.0), ("prior_weight", prior_weight, 0.0),
        ]:
            if not (math.isfinite(v) and v >= lo):
                raise SpecError(f"JobProfilingAdvisor: {name} must be a finite number >= {lo}, got {v!r}")
        if explore_factor is not None and not explore_factor >= 1:
            raise SpecError(f"explore_factor must be >= 1 (1 = never beyond explored), got {explore_factor!r}")
        if not probe_timeout_s > 0:
            raise SpecError(f"probe_timeout_s must be > 0 seconds, got {probe_timeout_s!r}")
        if not 1 <= min_obs <= max_obs:
            raise SpecError(f"need 1 <= min_obs <= max_obs, got {min_obs!r}, {max_obs!r}")
        if warmup_obs < 0 or window < max_obs:
            raise SpecError(f"need warmup_obs >= 0 and window >= max_obs, got {warmup_obs!r}, {window!r}")
        self.kappa, self.explore_factor, self.default_noise = kappa, explore_factor, default_noise
        self.probe_timeout_s, self.probe_share, self.max_probe_frac = (
            probe_timeout_s, probe_share, max_probe_frac)
        self.stable_tol, self.min_obs, self.max_obs = stable_tol, min_obs, max_obs
        self.warmup_obs, self.window = warmup_obs, window
        self.share_priors, self.prior_weight = share_priors, prior_weight
        if optimism not in ("total", "model"):
            raise SpecError(f"optimism must be 'total' or 'model', got {optimism!r}")
        self.optimism = optimism
        if not (math.isfinite(explore_min_s) and explore_min_s >= 0):
            raise SpecError(f"explore_min_s must be a finite number of seconds >= 0, got {explore_min_s!r}")
        self.robust, self.explore_min_s = robust, explore_min_s
        if not (math.isfinite(gain_tol) and 0 <= gain_tol < 1):
            raise SpecError(f"gain_tol must be a number in [0, 1), got {gain_tol!r}")
        self.gain_tol = gain_tol
        # jobs queued before their model was measured take its prior once one exists (the
        # default since session 12: +1.2 / +1.4 points in progress at 0:512 on runs no rule was
        # tuned on, tuned families' seeds 4-11 / held-out families; neutral at 0:128 and -0.1
        # on the tuning seeds 0-3; docs/jpa-log.md "Session 12")
        self.adopt_priors = adopt_priors
        # with no idle node, a job measured at its size and expected as fast on fewer nodes is
        # held to those fewer (docs/jpa-log.md, session 9; the default since session 10: +1.4
        # points in samples and in progress at 0:512 on tuning seeds it was not designed on)
        self.release_flat = release_flat
        # a model's prior keeps the sizes every earlier job of it measured, not only the last
        # job's own (docs/jpa-log.md, session 11)
        self.pool_priors = pool_priors
        # every running job's prior is its model's readings so far, the other running jobs' and
        # the finished jobs', not a snapshot of one job's (the default since session 13; out of
        # sample, 0:512 seeds 4-11: +1.12 points in samples, +0.06 in progress; docs/jpa-log.md,
        # session 13)
        self.share_readings = share_readings
        # a long job whose estimate expects no gain past its largest measured size (its best)
        # is run at twice it once, on idle nodes: a pessimistic extrapolation is never checked
        # else (the default since session 26: out of sample +0.02 / +0.03 points, neutral; the
        # traced staircases +6.0 and +10.6 in samples; docs/jpa-log.md, session 26)
        self.check_beyond = check_beyond
        # past a measured fall (a peak read), no size beyond the explored ones is planned above
        # the best rate read; opt-in: neutral on the tuning seeds (-0.01 / -0.08 points), the
        # decision-time curve error on ``peak`` 0:512 46 % -> 29 % (docs/jpa-log.md, session 29)
        self.fall_cap = fall_cap
        self._pools: dict[str, tuple[tuple, CurveEstimate]] = {}  # job -> (stamp, its pool)
        self._released: dict[str, int] = {}
        # other models' measured shapes: where a sparsely measured job should go next
        self.shapes: ShapePrior | None = ShapePrior() if shape_prior else None
        self.records: dict[str, JobRecord] = {}
        self.priors: dict[str, CurveEstimate] = {}
        self.pause_pool: dict[str, list[float]] = {"up": [], "down": []}
        self.used_ns = 0.0  # node-seconds held by all jobs
        self.probe_ns = 0.0  # of which during probes
        self.finished: dict[str, dict] = {}  # job -> summary, for reports
        self.decisions: dict[tuple[str, int], list[float]] = {}  # (job, size) -> [w, w*pred]
        self._last_now: float | None = None
        self._noise: float | None = None
        self._noise_sums: tuple[float, int] = (0.0, 0)  # of finished jobs
        self._alloc_since = 0.0
        self._last_pred: dict[str, np.ndarray] = {}
        # an unpredictable job's near-zero placeholder, kept while (size, eps) stay the same:
        # a new object at every replan defeats the caches keyed on a curve's identity
        self._placeholders: dict[str, tuple[tuple[int, float], ScalingCurve]] = {}
        self._order = 0

    # ---- events -------------------------------------------------------------------------
    def register(self, spec: JobSpec, now_s: float) -> None:
        prior, user = None, False
        if spec.curve is not None:
            prior, user = _curve_as_estimate(spec.curve, spec.max_nodes), True
        elif self.share_priors and (key := profile_key(spec)):
            prior = self.priors.get(key) or self._live_prior(key)
        self._order += 1
        self.records[spec.job_id] = JobRecord(
            spec=spec, registered_s=now_s, order=self._order, window=self.window,
            warmup_obs=self.warmup_obs, prior=prior, prior_is_user=user,
            prior_weight=4.0 if user else self.prior_weight, robust=self.robust,
        )

    def forget(self, job_id: str) -> None:
        rec = self.records.pop(job_id, None)
        self._last_pred.pop(job_id, None)
        self._placeholders.pop(job_id, None)
        self._pools.pop(job_id, None)
        if rec is None:
            return
        a, b = rec.noise_sums()
        self._noise_sums = (self._noise_sums[0] + a, self._noise_sums[1] + b)
        self._offer_shape(rec)
        est = rec.estimate(max(rec.spec.max_nodes, 1), default_noise=self.default_noise)
        if est is not None and rec.measured_sizes:
            key = profile_key(rec.spec)
            old = self.priors.get(key) if key else None
            pri = self._as_prior(rec, est)
            if self.share_priors and key and (old is None or len(pri.measured) >= len(old.measured)):
                self.priors[key] = pri  # the better-explored of the two stays
        self.finished[job_id] = {
            "spec": rec.spec, "estimate": est, "ran_ns": dict(rec.ran_ns),
            "probe_ns": rec.probe_ns, "dropped": rec.dropped_zero,
            "probe_failures": rec.probe_failures,
        }

    def observe(self, job_id: str, n_nodes: int, samples_per_s: float, now_s: float) -> None:
        rec = self.records.get(job_id)
        if rec is None:
            log.debug("reading for job %r that is not admitted (or finished); ignored", job_id)
            return
        rec.add_rate(int(n_nodes), samples_per_s, now_s)

    def observe_rescale(self, job_id: str, kind: str, pause_s: float) -> None:
        rec = self.records.get(job_id)
        if rec is not None and rec.add_pause(kind, pause_s):
            self.pause_pool[kind].append(float(pause_s))

    # ---- classification -----------------------------------------------------------------
    def predictable(self, rec: JobRecord) -> bool:
        """The rule's split: a stable rate at some size, or a curve given / inherited."""
        return rec.prior is not None or bool(rec.stable_sizes(
            tol=self.stable_tol, min_obs=self.min_obs, max_obs=self.max_obs, noise=self._noise))

    def monitor_noise(self) -> float | None:
        """The monitor's relative noise, pooled over every job's repeated readings so far.

        None until there are ``MIN_NOISE_DOF`` degrees of freedom to go on.
        """
        num, dof = self._noise_sums
        for rec in self.records.values():
            a, b = rec.noise_sums()
            num, dof = num + a, dof + b
        return math.sqrt(num / dof) if dof >= MIN_NOISE_DOF else None

    def probe_requests(self) -> dict[str, int]:
        """Jobs to run at exactly this many nodes now, most urgent (least served) first."""
        recs = [r for r in self.records.values() if r.probe is not None]
        recs.sort(key=lambda r: (r.attained_ns, r.order))
        return {r.job_id: r.probe.size for r in recs}  # type: ignore[union-attr]

    # ---- the view the policy plans with -------------------------------------------------
    def views(
        self, snapshot: ClusterSnapshot, jobs: Sequence[JobState], allocation: Allocation
    ) -> list[JobView]:
        now = snapshot.now_s
        self._account(now, allocation)
        self._noise = self.monitor_noise()
        recs = []
        for js in jobs:
            if js.spec.job_id not in self.records:
                self.register(js.spec, now)
            recs.append(self.records[js.spec.job_id])
            self._offer_shape(recs[-1])
        if self.share_priors and (self.adopt_priors or self.share_readings):
            for rec in recs:
                if not (self.share_readings and self._share_readings(rec)) and self.adopt_priors:
                    self._adopt_prior(rec)
        # the sizes a job learnt it runs at (Controller.limit_sizes: a fixed FSDP2 plan whose
        # batch does not split at min_nodes): a probe there would never be placed nor time out
        runs = {js.spec.job_id: js.node_sizes for js in jobs
                if getattr(js, "node_sizes", None) is not None}
        self._update_probes(now, recs, allocation, len(snapshot.nodes), runs)
        n_nodes = len(snapshot.nodes)
        self._released = {}
        # no node idle: nodes a job holds past its knee are nodes another job could use
        full = self.release_flat and sum(map(len, allocation.assignment.values())) >= n_nodes
        known = {r.job_id for r in recs if self.predictable(r)}
        eps = 1e-6 * max([self._per_node(r) for r in recs if r.job_id in known] + [1.0])
        out = []
        for js, rec in zip(jobs, recs):
            # progress the controller reports (0 until one is: the executor may report none)
            rec.done_reported = js.done_samples if js.done_samples > 0 else None
            spec = self._spec_with_pauses(rec)
            current = allocation.nodes_of(rec.job_id)
            n_tab = max(spec.min_nodes, min(spec.max_nodes, max(n_nodes, 1)))
            curve = self.planning_curve(rec, n_tab) if rec.job_id in known else None
            if curve is None:
                curve = self._placeholder(rec.job_id, n_tab, eps)
            # the progress the controller reports, as KnownCurves gives it: policies that value
            # a grow over the job's remaining time (hold, priorities) need it
            done = js.progress()
            cap = (self._release_size(rec, len(current))
                   if full and rec.job_id in known and rec.probe is None else None)
            if rec.probe is not None:
                out.append(JobView(spec, curve, current, rec.probe.size, rec.probe.size, **done))
            elif cap is not None:
                self._released[rec.job_id] = cap
                out.append(JobView(spec, curve, current, None, cap, **done))
            else:
                out.append(JobView(spec, curve, current, **done))
        return out

    def released(self) -> dict[str, int]:
        """Jobs the last views held below their current size (``release_flat``): job -> cap."""
        return dict(self._released)

    def _release_size(self, rec: JobRecord, c: int) -> int | None:
        """The smallest size the estimate expects within ``gain_tol`` of the rate the job
        measured at its current size ``c``, if below ``c`` (else None).

        Nodes past a plateau or a peak add nothing, but the allocator's objective (a rescale
        costs a pause, a job starting from zero pays none) keeps them there: a job explored
        past its knee while nodes were idle keeps them once other jobs could use them."""
        if c <= max(rec.spec.min_nodes, 1) or not rec.obs.get(c):
            return None
        est = rec.estimate(max(rec.spec.max_nodes, c), default_noise=self.default_noise)
        if est is None:
            return None
        r_c = float(np.mean(rec.obs[c]))
        ok = np.flatnonzero(est.mean[1:c] >= (1 - self.gain_tol) * r_c)
        if not ok.size:
            return None
        return max(int(ok[0]) + 1, rec.spec.min_nodes)

    def _placeholder(self, job_id: str, n_tab: int, eps: float) -> ScalingCurve:
        """``eps * sqrt(n)``: an unpredictable job is worth (almost) nothing to grow, and the
        nodes no predictable job gains from spread over the unpredictable jobs.

        With ``eps`` per node every split of those nodes was worth the same, and the solver's
        tie-break gave them all to one job: its first reading came at whatever number of nodes
        was spare (64 on the ``composite`` family, at 0.41x its one-node rate), a size no plan
        would choose, while the other unknown jobs waited. Concave, the nodes go first one to
        each job, then evenly (docs/jpa-log.md, session 19)."""
        hit = self._placeholders.get(job_id)
        if hit is not None and hit[0] == (n_tab, eps):
            return hit[1]
        n = np.arange(1, n_tab + 1)
        curve = ScalingCurve(tuple(int(k) for k in n), tuple(float(v) for v in eps * np.sqrt(n)),
                             name=job_id)
        self._placeholders[job_id] = ((n_tab, eps), curve)
        return curve

    def planning_curve(self, rec: JobRecord, n_tab: int) -> ScalingCurve | None:
        """``min(mean + kappa sigma, linear bound)``; flat past ``explore_factor`` x explored."""
        short = self._nearly_done(rec)
        key = (rec.version, short, self.shapes.version if self.shapes is not None else 0)
        hit = rec.plan_cache.get(n_tab)
        if hit is not None and hit[0] == key:
            return hit[1]
        est = rec.estimate(max(rec.spec.max_nodes, n_tab), default_noise=self.default_noise)
        if est is None:
            return None
        self._last_pred[rec.job_id] = est.mean
        explored = rec.explored() or [1]
        limit = n_tab
        top = max(explored)
        factor = self.explore_factor
        # a model-free estimate is extrapolated as far as a fitted one: its flat mean and wide
        # sigma past the largest measured size already keep the optimism modest; holding it to
        # one doubling blocked growths the true curves pay for (docs/jpa-log.md, decision efficiency)
        if short:  # too little work left to pay for measuring a new size: stay where measured
            factor = 1.0
        if factor is not None:
            limit = int(min(n_tab, max(math.floor(factor * top), top + (0 if short else 1))))
        n = np.arange(1, n_tab + 1)
        per_node = self._per_node(rec, est)
        sig = est.sigma if self.optimism == "total" or est.model_sigma is None else est.model_sigma
        kappa = self.kappa
        bound = per_node * n
        if rec.prior is not None and rec.obs:
            # below the smallest size the job measured itself its own per-node rate is no upper
            # bound (fewer nodes are faster per node, and past a peak faster outright): there the
            # prior's per-node rates at its measured sizes, at this job's level, count too
            lo = min(rec.measured_sizes)
            pm = [m for m in rec.prior.measured if m < lo and m <= est.n_max]
            if pm:
                pn = max(float(est.mean[m]) / m for m in pm)
                bound = np.where(n < lo, np.maximum(bound, pn * n), bound)
        ucb = np.minimum(est.mean[1 : n_tab + 1] + kappa * sig[1 : n_tab + 1], bound)
        pop = None if short else self._shape_posterior(rec, n_tab)
        if pop is not None:
            # the population's expected curve: go to its best size at once, and do not plan
            # unexplored sizes above what it expects (plus kappa sd, with the monitor's noise)
            nxt = choose_next_size(pop.mean, lo=top + 1, hi=min(rec.spec.max_nodes, pop.support),
                                   available=n_tab, gain_tol=self.gain_tol)
            if nxt is not None:
                limit = max(limit, nxt)
            noise = self._noise if self._noise is not None else self.default_noise
            psd = np.hypot(pop.sd[1 : n_tab + 1], noise * pop.mean[1 : n_tab + 1])
            beyond = (n > top) & (n <= pop.support)  # unmeasured by the job, measured by others
            ucb[beyond] = np.minimum(ucb[beyond], (pop.mean[1 : n_tab + 1] + kappa * psd)[beyond])
        if self.fall_cap:
            ucb = _cap_past_fall(ucb, est, [m for m in explored if m <= min(n_tab, est.n_max)])
        plan = np.maximum(ucb, 0.0)
        if limit < n_tab:
            plan[limit:] = plan[limit - 1]
        curve = ScalingCurve(tuple(int(k) for k in n), tuple(float(v) for v in plan), name=rec.job_id)
        rec.plan_cache[n_tab] = (key, curve)
        return curve

    # ---- internals ----------------------------------------------------------------------
    def _offer_shape(self, rec: JobRecord) -> None:
        """A job's own measured means become its model's shape (if it spans >= 2 sizes)."""
        key = profile_key(rec.spec)
        if self.shapes is not None and key and len(rec.obs) >= 2:
            self.shapes.offer(key, {k: float(np.mean(x)) for k, x in rec.obs.items() if x})

    def _shape_posterior(self, rec: JobRecord, n_tab: int):  # noqa: ANN202
        """Other models' shapes conditioned on this job's own readings (None: no prior of the
        same model is better, none agree, or nothing measured yet)."""
        if self.shapes is None or rec.prior is not None or not rec.obs:
            return None
        own = {k: float(np.mean(x)) for k, x in rec.obs.items() if x}
        return self.shapes.posterior(own, n_tab, exclude=profile_key(rec.spec))

    def _live_prior(
        self, key: str, *, exclude: JobRecord | None = None, more_than: int = 0
    ) -> CurveEstimate | None:
        """A running job of the same model, the best explored one, as a prior (None if none,
        or if it would know no more than ``more_than`` sizes: its estimate is not computed).

        Best explored counts the sizes its prior carries on too (``_prior_sizes``), as the
        prior it gives will: by its own sizes alone, a job that measured 1, 2 and 3 nodes beat
        one that measured 8 and 16 after starting from those three."""
        cands = [(len(self._prior_sizes(r)), r) for r in self.records.values()
                 if r is not exclude and profile_key(r.spec) == key and r.obs]
        if not cands:
            return None
        n, best = max(cands, key=lambda c: c[0])  # the first of equals, as before
        if n <= more_than:
            return None
        est = best.estimate(max(best.spec.max_nodes, 1), default_noise=self.default_noise)
        return None if est is None else self._as_prior(best, est)

    def _inherited(self, rec: JobRecord) -> set[int]:
        """The sizes ``rec``'s prior measured that its own prior carries on (``_as_prior``)."""
        if not self.pool_priors or rec.prior is None or rec.prior_is_user:
            return set()
        return set(rec.prior.measured)

    def _prior_sizes(self, rec: JobRecord) -> set[int]:
        """At most the sizes ``rec``'s estimate as a prior marks measured, without fitting it."""
        return set(rec.measured_sizes) | self._inherited(rec)

    def _as_prior(self, rec: JobRecord, est: CurveEstimate) -> CurveEstimate:
        """A job's estimate as its model's prior.

        With ``pool_priors`` its measured sizes include those of the prior it started from: its
        estimate was fitted to those points too (scaled to this job's level), so the model's
        prior accumulates what all its jobs measured. Before, it held only the last job's own
        sizes: a job that measured 8 and 16 nodes after a prior of 1, 2 and 4 left a prior of
        two sizes, and a job that measured fewer sizes than the prior left none of its own."""
        extra = {m for m in self._inherited(rec) if m <= est.n_max}
        if not extra:
            return est
        return dataclasses.replace(est, measured=tuple(sorted(set(est.measured) | extra)))

    def _adopt_prior(self, rec: JobRecord) -> None:
        """A job registered before its model was measured takes the model's prior once one
        exists (a finished job's, else the best explored running one's), and a better explored
        one later: jobs of one model submitted together are probed once, not once each.

        Only while the prior knows more sizes than the job (its own and its prior's); a user's
        curve is never replaced. Measured on the zoo at 0:512: the first idle nodes met 10 queued
        jobs of 5 models, 4 of one model, each probed at one node in turn.
        """
        key = profile_key(rec.spec)
        if rec.prior_is_user or not key:
            return
        have = max(len(rec.prior.measured) if rec.prior is not None else 0,
                   len(rec.measured_sizes))
        cand = self.priors.get(key)
        best = max(have, len(cand.measured) if cand is not None else 0)
        live = self._live_prior(key, exclude=rec, more_than=best)
        if live is not None and len(live.measured) > best:
            cand = live
        if cand is None or len(cand.measured) <= have:
            return
        self._set_prior(rec, cand)

    @staticmethod
    def _set_prior(rec: JobRecord, prior: CurveEstimate) -> None:
        """``rec`` plans from ``prior`` now (adopted or shared); a pending first probe is off."""
        rec.prior = prior
        if rec.probe is not None and not rec.obs:
            rec.probe = None  # predictable now: its nodes go where the plan says
        rec.version += 1  # the estimate and the planning curve are recomputed
        rec.plan_cache.clear()

    def _share_readings(self, rec: JobRecord) -> bool:
        """``rec``'s prior becomes its model's pooled readings (``_pooled_prior``) whenever they
        change: what a job of the model measures now is known to the others at the next replan,
        not when it finishes, nor only when one job knows more sizes than another."""
        key = profile_key(rec.spec)
        if rec.prior_is_user or not key:
            return False
        pool = self._pooled_prior(key, rec)
        if pool is None:
            return False  # no other running job of the model measured anything
        if pool is rec.prior:
            return True
        # the pool's points are other jobs' readings, each size measured as a probe measures
        # it: weighed as a probe's readings (max_obs), not as a finished job's fitted curve
        rec.prior_weight = float(self.max_obs)
        self._set_prior(rec, pool)
        return True

    def _pooled_prior(self, key: str, rec: JobRecord) -> CurveEstimate | None:
        """Every reading of the model but ``rec``'s own, as one prior (None: no other running
        job of the model has readings; the finished jobs' prior stands).

        The running jobs' readings are scaled to the level of the one with most readings (jobs
        of one key may differ in batch size: ``prior_level``), measured at the sizes both read
        (a job that shares none is taken at that level), the finished jobs' prior too;
        cached until one of them changes, so an unchanged pool is the same object."""
        sibs = [r for r in self.records.values()
                if r is not rec and r.obs and profile_key(r.spec) == key]
        if not sibs:
            return None
        fin = self.priors.get(key)
        noise = self._noise if self._noise is not None else self.default_noise
        # their readings, not their priors (a prior from this pool must not make it new again),
        # nor the monitor's noise, which every reading of any job moves
        stamp = (tuple((r.order, r.readings) for r in sibs), id(fin))
        hit = self._pools.get(rec.job_id)
        if hit is not None and hit[0] == stamp:
            return hit[1]
        sibs.sort(key=lambda r: (-sum(map(len, r.obs.values())), r.order))
        ref, n_max = sibs[0], max(max(r.spec.max_nodes for r in sibs), 1)
        ref_pts = ref.samples()
        pts = ref_pts
        ref_est = ref.estimate(n_max, default_noise=self.default_noise)
        for r in sibs[1:]:
            own = r.samples()
            # its level where both read: between the reference's sizes its curve is a guess (a
            # reference read at 1 and 10 nodes, interpolated through a two-node dip, took a job
            # that read 4 nodes for one 2.7x slower); with no size in common, the reference's level
            both = np.isin(own.nodes, ref_pts.nodes)
            level = (prior_level(ref_est, Samples(own.nodes[both], own.rates[both], own.weight[both]),
                                 noise_rel=noise) if ref_est is not None and both.any() else 1.0)
            pts = merge(pts, dataclasses.replace(own, rates=own.rates / level))
        if fin is not None:
            pts = merge(pts, scaled_prior(fin, ref_pts, weight=self.prior_weight, noise_rel=noise))
        est = fit_estimate(pts, n_max=n_max, noise_rel=noise)
        if self.robust:  # measured points win over a fit that misses them, as in a job's own
            est = ground_truth(est, pts, noise_rel=noise, check=pts)
        # measured: the sizes some job read (the siblings' priors hold this job's own sizes)
        sizes = {int(m) for m in pts.nodes if m <= n_max}
        est = dataclasses.replace(est, measured=tuple(sorted(sizes)))
        self._pools[rec.job_id] = (stamp, est)
        return est

    def _nearly_done(self, rec: JobRecord) -> bool:
        """Whether the job's remaining work, at the best rate it measured, is shorter than
        ``explore_min_s``: measuring a new size (a pause, a warm-up, a reading) would not pay."""
        if not rec.obs:
            return False
        best = max(float(np.mean(x)) for x in rec.obs.values() if x)
        return _remaining_s(rec, best) < self.explore_min_s

    def _per_node(self, rec: JobRecord, est: CurveEstimate | None = None) -> float:
        """The best samples/s per node seen (own data, else the prior): the linear bound."""
        if rec.obs:
            return max(float(np.mean(x)) / n for n, x in rec.obs.items() if x)
        if rec.prior is not None:
            return max(rec.prior.rate(n) / n for n in rec.prior.measured)
        return 0.0 if est is None else float(np.max(est.mean[1:] / np.arange(1, est.n_max + 1)))

    def _spec_with_pauses(self, rec: JobRecord) -> JobSpec:
        """The spec with measured pauses: this job's median, else the spec's value, else (a
        spec saying 0, i.e. no hint) the median over all jobs measured so far."""
        key = (len(rec.pauses["up"]), len(rec.pauses["down"]),
               len(self.pause_pool["up"]), len(self.pause_pool["down"]))
        if rec.spec_cache is not None and rec.spec_cache[0] == key:
            return rec.spec_cache[1]
        given = {"up": rec.spec.rescale_up_s, "down": rec.spec.rescale_down_s}
        best = {}
        for kind in ("up", "down"):
            own = rec.rescale_cost(kind)
            pool = self.pause_pool[kind]
            best[kind] = own if own is not None else (
                given[kind] if given[kind] > 0 or not pool else float(np.median(pool[-256:])))
        spec = rec.spec if best == given else dataclasses.replace(
            rec.spec, rescale_up_s=best["up"], rescale_down_s=best["down"])
        rec.spec_cache = (key, spec)
        return spec

    def _account(self, now: float, allocation: Allocation) -> None:
        """Integrate node-seconds held since the last call (service, probes, decisions)."""
        dt = 0.0 if self._last_now is None else max(now - self._last_now, 0.0)
        self._alloc_since = now if self._last_now is None else self._last_now
        self._last_now = now
        if dt <= 0:
            return
        for job, nodes in allocation.assignment.items():
            rec = self.records.get(job)
            k = len(nodes)
            ns = k * dt
            self.used_ns += ns
            if rec is None:
                continue
            rec.attained_ns += ns
            x = rec.obs.get(k)
            if x:
                rec.done_est += dt * float(np.mean(x))
            elif (p := self._last_pred.get(job)) is not None and k < p.size:
                rec.done_est += dt * float(p[k])
            rec.ran_ns[k] = rec.ran_ns.get(k, 0.0) + ns
            if rec.probe is not None and k == rec.probe.size:
                cost = (k - rec.probe.base) * dt  # a check: only the nodes it added
                rec.probe_ns += cost
                self.probe_ns += cost
            pred = self._last_pred.get(job)
            if pred is not None and k < pred.size:
                acc = self.decisions.setdefault((job, k), [0.0, 0.0])
                acc[0] += ns
                acc[1] += ns * float(pred[k])

    def _update_probes(
        self, now: float, recs: list[JobRecord], allocation: Allocation, n_nodes: int,
        runs: Mapping[str, Sequence[int]] | None = None,
    ) -> None:
        """End finished or timed-out probes; start new ones in least-attained-service order,
        each at the smallest size its job runs at (``runs``: job -> the sizes it learnt; else
        its ``min_nodes``), and move one at a size its job learnt it cannot run at there."""
        runs = runs or {}

        def least(rec: JobRecord) -> int:
            ok = [k for k in runs.get(rec.job_id, ()) if k >= rec.spec.min_nodes]
            return min(ok) if ok else rec.spec.min_nodes

        for rec in recs:
            p = rec.probe
            if p is None:
                continue
            if rec.job_id in runs and p.size not in runs[rec.job_id]:
                p.size, p.started_s = least(rec), None
            if p.check and p.started_s is None and allocation.size(rec.job_id) != p.size:
                rec.probe = None  # the idle nodes it was for went elsewhere: not retried
                continue
            if allocation.size(rec.job_id) != p.size:
                p.started_s = None  # not placed (no nodes, or lost them): the clock waits
            elif p.started_s is None:
                p.started_s = self._alloc_since  # the replan that placed it
            if rec.stable(p.size, tol=self.stable_tol, min_obs=self.min_obs, max_obs=self.max_obs,
                          noise=self._noise):
                log.info("job %r: probe at %d nodes done", rec.job_id, p.size)
                rec.probe = None
            elif (p.started_s is not None
                  and now - max(p.started_s, rec.last_obs_s) > self.probe_timeout_s):
                rec.probe_failures += 1
                rec.next_probe_s = now + self.probe_timeout_s * 2 ** rec.probe_failures
                log.warning("job %r: no stable rate after a %.0f s probe at %d nodes; retry "
                            "after %.0f s", rec.job_id, self.probe_timeout_s, p.size,
                            rec.next_probe_s - now)
                rec.probe = None
        any_known = any(self.predictable(r) for r in recs)
        cap = max(1, math.floor(self.max_probe_frac * n_nodes))
        in_use = sum(r.probe.size for r in recs if r.probe is not None)
        waiting = [r for r in recs if r.probe is None and not self.predictable(r)
                   and now >= r.next_probe_s]
        waiting.sort(key=lambda r: (r.attained_ns, r.order))
        credit = self.probe_timeout_s  # one probe's worth at one node
        for rec in waiting:
            size = least(rec)
            if size > n_nodes or in_use + size > cap:
                continue
            if any_known and self.probe_ns > self.probe_share * self.used_ns + credit:
                break
            rec.probe = Probe(size=size, requested_s=now)
            in_use += size
        if self.check_beyond:
            self._start_checks(now, recs, allocation, n_nodes, runs)

    def _start_checks(
        self, now: float, recs: list[JobRecord], allocation: Allocation, n_nodes: int,
        runs: Mapping[str, Sequence[int]],
    ) -> None:
        """Run a long job once at twice its largest measured size when its estimate expects no
        gain there, on nodes nobody holds, within the probing budget.

        An estimate that expects a job to gain nothing past what it measured is never checked:
        the allocator does not go there, so no reading contradicts it. A staircase read at an
        odd size looks like a peak (zoo ``step``: 1.55x at 2 nodes, 1.59x at 3, truly 3.05x at
        4 and linear on, planned to decline and held at 2 nodes for 10,000 s; docs/jpa-log.md,
        session 26). Only jobs whose remaining work at their best rate lasts ``CHECK_MIN_S``
        are checked (a check holds the size for two readings), only at a size no job of the
        model measured, and only on idle nodes, which no job's plan wanted. A job that runs at
        some sizes only (``runs``) is checked at the largest of them up to twice its largest
        measured size."""
        credit = self.probe_timeout_s
        if self.probe_ns > self.probe_share * self.used_ns + credit:
            return
        pending = sum(max(r.probe.size - allocation.size(r.job_id), 0)
                      for r in recs if r.probe is not None)
        idle = n_nodes - sum(map(len, allocation.assignment.values())) - pending
        for rec in sorted(recs, key=lambda r: r.order):
            if idle <= 0:
                return
            cur = allocation.size(rec.job_id)
            if rec.probe is not None or cur == 0 or not rec.obs or not self.predictable(rec):
                continue
            means = {k: float(np.mean(x)) for k, x in rec.obs.items() if x}
            if rec.prior is not None:  # what the model's other jobs measured, at this job's level
                means = {m: rec.prior.rate(m) for m in rec.prior.measured} | means
            top, best = max(means), max(means.values())
            size = min(2 * top, rec.spec.max_nodes)
            if rec.job_id in runs:  # the largest size up to there the job can run at
                size = max((k for k in runs[rec.job_id] if k <= size), default=0)
            if (means[top] < (1 - self.gain_tol) * best or size <= max(top, cur)
                    or size in rec.checked or size - cur > idle):
                continue
            est = rec.estimate(max(rec.spec.max_nodes, size), default_noise=self.default_noise)
            if est is None or est.mean[size] > (1 + self.gain_tol) * best:
                continue
            if _remaining_s(rec, best) < CHECK_MIN_S:
                continue
            # its cost at most (the nodes it adds until a probe times out) within the budget
            if self.probe_ns + (size - cur) * credit > self.probe_share * self.used_ns + credit:
                continue
            rec.checked.add(size)
            rec.probe = Probe(size=size, requested_s=now, check=True, base=cur)
            idle -= size - cur
            log.info("job %r: checking %d nodes (estimate %.3g/s, best measured %.3g/s)",
                     rec.job_id, size, float(est.mean[size]), best)


def _cap_past_fall(ucb: np.ndarray, est: CurveEstimate, explored: Sequence[int]) -> np.ndarray:
    """Past a measured fall, plan no size beyond the explored ones above the best rate read.

    A job read slower at its largest explored size (its own or its prior's) than at its best
    one, by more than two standard errors, has passed a peak: sigma growing per doubling past
    the largest size still planned sizes 3-4x larger at up to 1.7x the best rate read (``peak``
    0:512 seed 0: a 12-node peak sent to 42 and 44 nodes, where it ran at 5 % of that plan).
    The estimate's mean may still rise there (a fitted structure that expects it); its sigma
    bonus may not lift a size past the best rate read. A fall from one node is not a peak but
    the network joining (zoo ``dip``: the rate passes one node's again at 3-5 nodes); capping
    that too cost ``dip`` 0:128 1.9 points in samples on the tuning seeds (session 29)."""
    if len(explored) < 2:
        return ucb
    means = np.array([est.mean[m] for m in explored])
    best = int(np.argmax(means))
    top = len(explored) - 1
    if best == top or explored[best] < 2:  # a fall from one node is the network joining: a dip
        return ucb
    se = math.hypot(float(est.sigma[explored[best]]), float(est.sigma[explored[top]]))
    if means[best] - means[top] <= 2 * se:
        return ucb
    out = ucb.copy()
    n_top = explored[top]
    past = slice(n_top, out.size)  # ucb[i] is the plan at i + 1 nodes
    out[past] = np.minimum(out[past], np.maximum(est.mean[n_top + 1 : out.size + 1], means[best]))
    return out


def _remaining_s(rec: JobRecord, rate: float) -> float:
    """Seconds the job's remaining work lasts at ``rate`` (inf: unbounded, or no rate).

    The work done is the controller's reported progress where it has one (exact), else the
    JPA's own integral of the rates (``done_est``: off by the error of the rates assumed at
    unmeasured sizes)."""
    total = rec.spec.total_samples
    if not math.isfinite(total) or not rate > 0:
        return math.inf
    done = rec.done_est if rec.done_reported is None else rec.done_reported
    return (total - done) / rate


def _curve_as_estimate(curve: ScalingCurve, n_max: int) -> CurveEstimate:
    """A user's curve as a prior: its points are 'measured', interpolated in between."""
    n = max(n_max, curve.max_measured)
    mean = curve.rates_upto(n)
    return CurveEstimate(mean=mean, sigma=0.02 * mean, measured=tuple(curve.nodes))
