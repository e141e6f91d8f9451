"""Successive halving and ASHA: hyperparameter search that spends budget on the promising.

Every trial starts at rung 0 with the smallest budget; the best ``1/eta`` of each rung earn
``eta`` times more (they resume from their checkpoint). :class:`ASHA` promotes as soon as a
rung holds enough results (asynchronous: no trial waits for stragglers, so idle nodes never
wait for a barrier); with ``synchronous=True`` it promotes only once a rung is complete
(classic successive halving). With a finite number of trials the last, partly filled rungs
still promote their best, so a search always ends with at least one trial at full budget.

Pure decision logic, driven ask/tell-style (see :mod:`malleparsl.workflows.scheduler`):

>>> from malleparsl.workflows.space import SearchSpace, Choice
>>> s = ASHA(space=SearchSpace({"w": Choice([1, 2, 3, 4, 5, 6, 7, 8, 9])}), n_trials=9,
...          budget=Budget(min_budget=1, max_budget=9, eta=3), seed=0)
>>> while not s.done:
...     sug = s.ask()
...     _ = s.tell(sug, {"accuracy": sug.config["w"] / 10})
>>> s.best().config["w"], s.best().top_rung
(9, 2)
"""

from __future__ import annotations

import logging
import math
import random
from collections.abc import Mapping
from typing import Any

from malleparsl.errors import SpecError

from .scheduler import (
    Budget,
    Decision,
    Suggestion,
    TrialRecord,
    TrialScheduler,
)
from .space import SearchSpace

log = logging.getLogger(__name__)


class _Rungs:
    """Results per rung and who was promoted out of each (ASHA's bookkeeping)."""

    def __init__(self, n_rungs: int) -> None:
        self.results: list[dict[str, float]] = [{} for _ in range(n_rungs)]
        self.promoted: list[set[str]] = [set() for _ in range(n_rungs)]

    def ranked(self, k: int, key) -> list[str]:
        return sorted(self.results[k], key=lambda t: (key(self.results[k][t]), t))


class ASHA(TrialScheduler):
    """Asynchronous successive halving (Li et al., 2020) over a :class:`SearchSpace`.

    Parameters
    ----------
    space
        Where new configurations come from.
    n_trials
        How many configurations to try at rung 0.
    budget
        Rung budgets (:class:`Budget`: unit epochs or samples, min, max, eta).
    metric, mode
        The result key to rank by and whether larger (``"max"``) or smaller is better.
    synchronous
        Promote only from complete rungs (classic successive halving).
    seed
        Seeds the configuration sampler.
    configs
        Optional explicit configurations to try first (e.g. a user's baseline).
    """

    def __init__(
        self,
        *,
        space: SearchSpace,
        n_trials: int,
        budget: Budget | None = None,
        metric: str = "accuracy",
        mode: str = "max",
        synchronous: bool = False,
        seed: int | None = 0,
        configs: list[Mapping[str, Any]] | None = None,
    ) -> None:
        super().__init__(metric=metric, mode=mode)
        if isinstance(n_trials, bool) or not isinstance(n_trials, int) or n_trials < 1:
            raise SpecError(f"n_trials must be an integer >= 1, got {n_trials!r}")
        if not isinstance(space, SearchSpace):
            raise SpecError(
                f"space must be a SearchSpace, got {type(space).__name__}; wrap the dict: "
                "SearchSpace({...})"
            )
        self.space, self.n_trials = space, n_trials
        self.budget = budget if budget is not None else Budget()
        self.synchronous = synchronous
        self.rng = random.Random(seed)
        self.rung_budgets = self.budget.rungs
        self._rungs = _Rungs(len(self.rung_budgets))
        self._queue = [dict(c) for c in (configs or [])]
        self._started = 0

    # ---- ask ----------------------------------------------------------------------------
    def ask(self) -> Suggestion | None:
        top = len(self.rung_budgets) - 1
        for k in range(top - 1, -1, -1):
            cand = self._promotable(k)
            if cand is not None:
                self._rungs.promoted[k].add(cand)
                rec = self.trials[cand]
                log.debug("promote %s from rung %d to %d", cand, k, k + 1)
                return self._hand_out(
                    Suggestion(cand, rec.config, k + 1, self.rung_budgets[k + 1], rec.parent)
                )
        if self._started < self.n_trials:
            self._started += 1
            cfg = self._queue.pop(0) if self._queue else self.space.sample(self.rng)
            tid = f"t{self._started - 1:03d}"
            return self._hand_out(Suggestion(tid, cfg, 0, self.rung_budgets[0]))
        return None

    @property
    def exhausted(self) -> bool:
        if self._started < self.n_trials:
            return False
        return all(self._promotable(k) is None for k in range(len(self.rung_budgets) - 1))

    def _closed(self, k: int) -> bool:
        """No trial can still enter rung ``k`` or report a result there."""
        if self._started < self.n_trials or any(r <= k for (_, r) in self.pending):
            return False
        return all(self._promotable(j) is None for j in range(k))  # recursion goes down only

    def _quota(self, k: int) -> int:
        """How many of rung ``k``'s best may be promoted: ``n/eta``, at least 1 once closed."""
        n = len(self._rungs.results[k])
        quota = int(math.floor(n / self.budget.eta + 1e-9))
        closed = self._closed(k)
        if self.synchronous and not closed:
            return 0
        return max(quota, 1) if closed and n else quota

    def _promotable(self, k: int) -> str | None:
        for tid in self._rungs.ranked(k, self.sort_key)[: self._quota(k)]:
            if tid not in self._rungs.promoted[k] and self.trials[tid].status != "failed":
                return tid
        return None

    # ---- tell ---------------------------------------------------------------------------
    def _decide(self, record: TrialRecord, rung: int, value: float) -> Decision:
        self._rungs.results[rung][record.trial_id] = value
        if rung >= len(self.rung_budgets) - 1:
            return Decision.STOP
        ranked = self._rungs.ranked(rung, self.sort_key)
        n = len(ranked)
        quota = max(int(math.floor(n / self.budget.eta + 1e-9)), 0)
        if self.synchronous:
            return Decision.PAUSE
        if record.trial_id in ranked[:quota]:
            return Decision.CONTINUE
        return Decision.PAUSE

    def final_status(self) -> dict[str, str]:
        """Each trial's status once the search is over: paused trials count as stopped."""
        return {
            t: ("stopped" if r.status == "paused" and self.done else r.status)
            for t, r in self.trials.items()
        }


def successive_halving(**kwargs: Any) -> ASHA:
    """Classic (synchronous) successive halving: :class:`ASHA` with ``synchronous=True``."""
    return ASHA(synchronous=True, **kwargs)
