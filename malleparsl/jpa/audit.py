"""Decision efficiency: how good each of the JPA-driven policy's decisions is, by the true curves.

End-of-replay totals are chaotic (one job held back early changes which jobs run hours later;
docs/jpa-log.md), so they cannot tell a better JPA from a luckier one. This measures every decision
on its own, in the state it was taken in: :class:`DecisionAudit` wraps the policy, passes its
answer through unchanged, and scores it with the allocator's own objective
(:func:`~malleparsl.allocator.objective.job_values`: ``Tfwd x rate - rescale cost``, BFTrainer's,
what ``milp`` maximises) evaluated with the TRUE curves and rescale pauses, against the optimum
of that objective for the same jobs, sizes held and nodes (what the oracle ``milp`` would choose
there; exact, by dynamic programming over node counts as
:func:`~malleparsl.allocator.objective.best_count_objective`).

Decision efficiency is ``sum_i dt_i V(chosen_i) / sum_i dt_i V(best_i)`` over decisions ``i``,
``dt_i`` the time until the next decision (the allocation holds that long). Its loss is split
by fixing, in the optimum, the jobs the JPA constrained to the sizes it gave them:

- ``probe``: jobs being probed (exactly ``min_nodes``): ``V(best) - V(best | probes fixed)``;
- ``unknown``: unpredictable jobs not being probed (planned with a negligible curve):
  ``V(best | probes fixed) - V(best | probes and unknown jobs fixed)``;
- ``estimate``: the rest, the learned curves' errors (and their optimism) on predictable jobs.

Each part is >= 0 and they sum to the loss. Also kept: the loss in decisions taken while any
probe ran (the split the other way: by decision, not by job).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from malleparsl.allocator.base import AllocationPolicy, ClusterSnapshot, JobView
from malleparsl.allocator.knapsack import programme
from malleparsl.allocator.objective import allowed_sizes, best_count_objective, job_values
from malleparsl.errors import SpecError
from malleparsl.model import Allocation, JobSpec

SUMMARY_KEYS = ("decision_eff", "de_loss_probe", "de_loss_unknown", "de_loss_estimate",
                "de_loss_probing", "de_loss_pause", "de_probing_time", "rate_eff")
"""The figures :meth:`DecisionAudit.summary` reports (besides ``decisions``)."""


@dataclass(frozen=True)
class Decision:
    """One audited decision: its time, the true objective of the choice, the optima, flags."""

    now_s: float
    chosen: float  # V(chosen)
    best: float  # V(best)
    best_probes_fixed: float  # V(best | probing jobs at their chosen sizes)
    best_known_free: float  # V(best | probing and unknown jobs at their chosen sizes)
    probing: bool  # some job was being probed
    rate_chosen: float = 0.0  # true aggregate rate of the choice (samples/s), pauses aside
    rate_best: float = 0.0  # ... of the optimum
    pause_chosen: float = 0.0  # rescale cost of the choice in the objective (samples)
    pause_best: float = 0.0  # ... of the optimum


def best_value(
    views: Sequence[JobView], n_nodes: int, tfwd_s: float, fixed: Mapping[str, int] | None = None
) -> float:
    """Optimum of the allocator's objective over node counts (``fixed``: jobs held at a size):
    the allocator's own exact knapsack (:func:`~malleparsl.allocator.knapsack.programme`)."""
    fixed = fixed or {}
    options = []
    for v in views:
        sizes = allowed_sizes(v, n_nodes)
        if v.job_id in fixed:
            sizes = np.asarray([fixed[v.job_id]], dtype=np.int64)
        options.append((sizes, job_values(v, sizes, tfwd_s)))
    return programme(options, n_nodes)[1]


class DecisionAudit(AllocationPolicy):
    """Wraps a policy; scores each of its answers by the true curves (module docstring).

    Parameters
    ----------
    truth
        Every job's true spec (with its curve and rescale pauses), by job id.
    policy
        The policy whose decisions to audit (``ProbeFirst`` around the MILP); its answer is
        returned unchanged, so the replay is the same with or without the audit. May be bound
        later with :meth:`bind` (the ``milp+jpa`` setup builds its policy itself).
    advisor
        The JPA feeding ``policy``: which jobs are probed and which are unpredictable (``None``:
        no split, every loss counts as ``estimate``).
    """

    name = "audit"

    def __init__(self, truth: Mapping[str, JobSpec], policy: AllocationPolicy | None = None,
                 advisor: object | None = None) -> None:
        missing = [j for j, s in truth.items() if s.curve is None]
        if missing:
            raise SpecError(f"DecisionAudit needs every job's true curve; none for {missing[:3]}")
        self.truth, self.policy, self.advisor = dict(truth), policy, advisor
        self.decisions: list[Decision] = []

    def bind(self, policy: AllocationPolicy, advisor: object | None = None) -> DecisionAudit:
        """Audit ``policy`` (fed by ``advisor``) from now on; returns self."""
        self.policy, self.advisor = policy, advisor
        return self

    def __getattr__(self, attr: str) -> object:  # the engine reads policy flags (ignores_costs...)
        if attr in ("policy", "truth", "advisor", "decisions"):
            raise AttributeError(attr)
        return getattr(self.policy, attr)

    def __repr__(self) -> str:
        return f"DecisionAudit({self.policy!r})"

    def allocate(self, snapshot: ClusterSnapshot, jobs: Sequence[JobView]) -> Allocation:
        if self.policy is None:
            raise SpecError("DecisionAudit has no policy to audit; bind(policy) first")
        alloc = self.policy.allocate(snapshot, jobs)
        self.decisions.append(self._score(snapshot, jobs, alloc))
        return alloc

    def _score(self, snap: ClusterSnapshot, jobs: Sequence[JobView], alloc: Allocation) -> Decision:
        probed = set(self.advisor.probe_requests()) if self.advisor is not None else set()  # type: ignore[attr-defined]
        # a cap the JPA put on a job (``released``) is a belief, not the job's constraint
        released = set(self.advisor.released()) if hasattr(self.advisor, "released") else set()  # type: ignore[union-attr]
        true = [self._true_view(v, v.job_id in probed or v.job_id in released) for v in jobs]
        n, tfwd = len(snap.nodes), snap.tfwd_s
        sizes = {v.job_id: alloc.size(v.job_id) for v in jobs}
        chosen = sum(float(job_values(v, np.asarray([sizes[v.job_id]]), tfwd)[0]) for v in true)
        probes, unknown = self._constrained(jobs, sizes)
        best, counts = best_count_objective(snap, true)
        rate_c = sum(v.spec.weight * v.curve.rate(sizes[v.job_id]) for v in true)
        rate_b = sum(v.spec.weight * v.curve.rate(counts[v.job_id]) for v in true)
        b_p = best_value(true, n, tfwd, {j: sizes[j] for j in probes}) if probes else best
        b_pu = (best_value(true, n, tfwd, {j: sizes[j] for j in probes | unknown})
                if unknown else b_p)
        return Decision(snap.now_s, chosen, best, b_p, b_pu, bool(probes), rate_c, rate_b,
                        tfwd * rate_c - chosen, tfwd * rate_b - best)

    def _true_view(self, v: JobView, probed: bool = False) -> JobView:
        """The view with the true spec and curve; its bounds, runnable sizes and progress kept.

        Those are constraints of the job, not beliefs: a size with no plan (``sizes``) or out
        of bounds cannot be the optimum either. Except a probe's bounds (``probed``: the JPA
        pins the job to the probe size): the optimum is taken without them, so what probing
        costs shows as ``de_loss_probe`` (module docstring) instead of vanishing; the same for
        the cap the JPA puts on a job past its knee (``release_flat``, ``released()``).
        """
        spec = self.truth.get(v.job_id)
        if spec is None:
            raise SpecError(f"DecisionAudit: no true spec for job {v.job_id!r}")
        lo, hi = (None, None) if probed else (v.min_nodes, v.max_nodes)
        return JobView(spec, spec.curve, v.current, lo, hi,  # type: ignore[arg-type]
                       remaining_samples=v.remaining_samples,
                       attained_samples=v.attained_samples, sizes=v.sizes)

    def _constrained(self, jobs: Sequence[JobView], sizes: Mapping[str, int]) -> tuple[set[str], set[str]]:
        """(jobs being probed at their probe size, unpredictable jobs not being probed)."""
        adv = self.advisor
        if adv is None:
            return set(), set()
        probes = {j for j, k in adv.probe_requests().items()  # type: ignore[attr-defined]
                  if j in sizes and sizes[j] == k}
        recs = adv.records  # type: ignore[attr-defined]
        unknown = {v.job_id for v in jobs if v.job_id not in probes and v.job_id in recs
                   and not adv.predictable(recs[v.job_id])}  # type: ignore[attr-defined]
        return probes, unknown

    def summary(self, end_s: float) -> dict[str, float]:
        """Time-weighted figures up to ``end_s`` (the replay's end); % of the optimum's value.

        ``decision_eff``: the efficiency; ``de_loss_probe`` / ``de_loss_unknown`` /
        ``de_loss_estimate``: its loss split by cause (points, they sum to ``100 - eff``);
        ``de_loss_probing``: the loss in decisions taken while a probe ran (points);
        ``de_loss_pause``: the part of the loss that is rescale cost (the choice's pauses beyond
        the optimum's; the rest is rate), points; ``de_probing_time``: the share of the time
        with a probe running; ``rate_eff``: the true aggregate rate of the choices, % of the
        optimum's (time-weighted, pauses aside: may pass 100); ``decisions``.
        """
        ds = self.decisions
        if not ds:
            return {k: math.nan for k in SUMMARY_KEYS} | {"decisions": 0}
        t = np.array([d.now_s for d in ds] + [max(end_s, ds[-1].now_s)])
        dt = np.diff(t)
        col = lambda f: np.array([getattr(d, f) for d in ds])  # noqa: E731
        best, chosen = col("best"), col("chosen")
        b_p, b_pu, probing = col("best_probes_fixed"), col("best_known_free"), col("probing")
        ref = float(dt @ best)
        pts = lambda x: 100.0 * float(dt @ x) / ref if ref > 0 else math.nan  # noqa: E731
        total = float(dt.sum())
        return {
            "decision_eff": pts(chosen),
            "de_loss_probe": pts(best - b_p),
            "de_loss_unknown": pts(b_p - b_pu),
            "de_loss_estimate": pts(b_pu - chosen),
            "de_loss_probing": pts(np.where(probing, best - chosen, 0.0)),
            "de_loss_pause": pts(col("pause_chosen") - col("pause_best")),
            "de_probing_time": float(dt @ probing) / total if total > 0 else math.nan,
            "rate_eff": (100.0 * float(dt @ col("rate_chosen")) / float(dt @ col("rate_best"))
                         if float(dt @ col("rate_best")) > 0 else math.nan),
            "decisions": len(ds),
        }
