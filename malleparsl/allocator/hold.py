"""``hold``: value each decision over the time the job will keep it, solved exactly and fast.

BFTrainer's objective values an allocation over ``Tfwd`` (10 s) against rescale pauses of
11-19 s, so a running job almost never grows and idle nodes stay idle. But a job that grows
keeps the nodes until they are taken back or it finishes: the gain lasts that long, while the
pause is paid once. This policy values every option of a job over that holding time::

    H(k)   = min(expected idle time left on the nodes, samples left / r(k))
    keep   k == c   0
    start  c == 0   r(k) * H(k) - rescale_up_s * r(k) - exposure(k)
    grow   k > c    (r(k) - r(c)) * H(k) - rescale_up_s * r(k) - exposure(k)
    shrink k < c    -(r(c) - r(k)) * H(k) - rescale_down_s * r(k)

with ``exposure(k) = rescale_down_s * r(k)`` when the nodes are expected to be taken back
before the job is done (a preemption the job would not suffer without them), else 0. That is
the asymmetry a myopic model misses: growth is paid for at once and again when the nodes go,
and pays back over their whole stay, not over ``Tfwd``. A start pays its pause like any grow
(the job trains nothing until it is up) — unless it would finish on the nodes it gets: that
pause is due once whenever the job starts, so it is not charged (else a job whose last samples
take less than its pause would never finish) — and needs its minimum size, so the same values decide
*admission*: the controller may offer more jobs than ``max_active`` and a queued job starts
only when its start is worth more than the growth of the running ones.

``H`` uses ``snapshot.node_end_s`` (announced ends, or the simulator's fragment-length
estimate); a node with no estimate is assumed to stay ``default_horizon_s`` (600 s, the
estimator's prior). The samples left come from ``JobView.remaining_samples`` (the controller
passes the progress it was told), else the job's total.

Counts are chosen by an exact dynamic programme over (jobs x nodes) — a multiple-choice
knapsack, as in :func:`~malleparsl.allocator.objective.best_count_objective` — in O(J x N x K)
vector operations: milliseconds at 10 jobs x 128 nodes, no solver, no time limit to hit. The
policy computes values and programme on one (jobs x sizes) table
(:mod:`~malleparsl.allocator.value_table`; the tests hold it to a per-job reference,
``tests/allocator/hold_oracle.py``, to the bit): uncapped on the whole Summit machine (up to
~800 jobs x ~2,000 nodes) at most 0.27 s of CPU per decision.
Objectives other than throughput (``"jct"``, a weighted ``"mix"``) scale each job's values by
a priority weight (:mod:`~malleparsl.allocator.priority`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from malleparsl.allocator.base import (
    AllocationPolicy,
    ClusterSnapshot,
    JobView,
    register_policy,
    register_policy_factory,
)
from malleparsl.allocator.costs import PAUSE, RescaleCosts, costs_named
from malleparsl.allocator.objective import check_inputs
from malleparsl.allocator.placement import longest_first, node_horizons, place
from malleparsl.allocator.value_table import best_counts_table, hold_value_table
from malleparsl.errors import SpecError
from malleparsl.model import Allocation

__all__ = ["HoldPolicy"]

WINDOW = 4


def _candidates(jobs: Sequence[JobView], n_nodes: int, prio: np.ndarray) -> list[int]:
    """Jobs the programme considers: all that hold nodes, and as many waiting ones, by
    priority then submission, as could start at their minimum size on every node (a start
    needs its minimum, so no further one could)."""
    holding = [i for i, j in enumerate(jobs) if j.current]
    waiting = sorted(
        (i for i, j in enumerate(jobs) if not j.current),
        key=lambda i: (-prio[i], jobs[i].spec.submit_s, i),
    )
    out, room = [], WINDOW * n_nodes
    for i in waiting:
        room -= jobs[i].lo
        if room < 0:
            break
        out.append(i)
    return sorted(holding + out)


@register_policy("hold")
class HoldPolicy(AllocationPolicy):
    """Node counts maximising value over each job's holding time (see the module docstring).

    Parameters
    ----------
    default_horizon_s
        Idle time assumed left on a node with no known or estimated end.
    objective
        ``"throughput"`` (samples), ``"jct"`` (completion time) or ``"mix"``; see
        :mod:`~malleparsl.allocator.priority`.
    jct_weight
        With ``"mix"``: the share of the completion-time priority (0..1).
    costs
        How rescales are paid (:mod:`~malleparsl.allocator.costs`): ``"pause"`` (default, what
        the default simulator charges) or ``"old-rate"``. The BFTrainer replay
        (:mod:`~malleparsl.sim.bftrainer`) sets ``policy.costs`` to the rule it charges.
    """

    def __init__(
        self,
        *,
        default_horizon_s: float = 600.0,
        objective: str = "throughput",
        jct_weight: float = 0.5,
        costs: str | RescaleCosts = PAUSE,
    ) -> None:
        from malleparsl.allocator.priority import OBJECTIVES

        if not (default_horizon_s > 0 and math.isfinite(default_horizon_s)):
            raise SpecError(
                f"default_horizon_s must be a finite number > 0, got {default_horizon_s!r}"
            )
        if objective not in OBJECTIVES:
            raise SpecError(f"objective must be one of {', '.join(OBJECTIVES)}, got {objective!r}")
        if not 0 <= jct_weight <= 1:
            raise SpecError(f"jct_weight must be in [0, 1], got {jct_weight!r}")
        self.default_horizon_s = float(default_horizon_s)
        self.objective = objective
        self.jct_weight = float(jct_weight)
        self.costs = costs_named(costs)

    def __repr__(self) -> str:
        return f"HoldPolicy(objective={self.objective!r})"

    def allocate(self, snapshot: ClusterSnapshot, jobs: Sequence[JobView]) -> Allocation:
        from malleparsl.allocator.priority import priority_weights

        check_inputs(snapshot, jobs)
        if not jobs or not snapshot.nodes:
            return Allocation.empty()
        hz = node_horizons(snapshot, default_s=self.default_horizon_s)
        n = len(snapshot.nodes)
        held = {x for j in jobs for x in j.current}
        free = [hz[x] for x in snapshot.nodes if x not in held]
        free_h = float(np.mean(free)) if free else float(np.mean(list(hz.values())))
        prio = priority_weights(jobs, self.objective, self.jct_weight)
        cand = _candidates(jobs, n, prio)
        jobs, prio = [jobs[i] for i in cand], prio[cand]
        own = [float(np.mean([hz[x] for x in j.current])) if j.current else free_h for j in jobs]
        table = hold_value_table(jobs, n, free_h, own, prio, self.costs)
        counts = best_counts_table(n, jobs, table)
        order = sorted(jobs, key=lambda j: -counts[j.job_id] + len(j.current))
        return place(
            snapshot,
            jobs,
            counts,
            horizons=hz,
            grow_order=[j.job_id for j in order],
            node_order=longest_first(snapshot.nodes, hz),
        )


def _hold_jct(**options: object) -> HoldPolicy:
    options.setdefault("objective", "jct")
    return HoldPolicy(**options)  # type: ignore[arg-type]


def _hold_mix(**options: object) -> HoldPolicy:
    options.setdefault("objective", "mix")
    return HoldPolicy(**options)  # type: ignore[arg-type]


register_policy_factory("hold-jct", _hold_jct)
register_policy_factory("hold-mix", _hold_mix)
