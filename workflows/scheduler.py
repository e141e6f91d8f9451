"""The ask/tell interface every search scheduler speaks, and the values it passes around.

A scheduler never runs anything. An outside loop — Parsl futures in
:mod:`malleparsl.workflows.dag`, a plain loop in a test — asks it for work
(:meth:`TrialScheduler.ask`), runs that work however it likes, and tells it the result
(:meth:`TrialScheduler.tell`), which answers with a :class:`Decision`. Keeping the decision
logic pure (results in, decisions out) is what lets the same ASHA or evolution code drive a
laptop test and a sweep on a supercomputer's idle nodes.

>>> from malleparsl.workflows.scheduler import Decision
>>> Decision.CONTINUE.value
'continue'
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from malleparsl.errors import SpecError


class Decision(str, Enum):
    """What happens to a trial after a result.

    ``CONTINUE``: it earned more budget (promoted to the next rung). ``PAUSE``: not now, but a
    later result may still promote it. ``STOP``: it is finished (top rung reached) or pruned.
    """

    CONTINUE = "continue"
    PAUSE = "pause"
    STOP = "stop"


@dataclass(frozen=True)
class Budget:
    """Training budget per rung, in ``epochs`` or ``samples``, growing by ``eta`` per rung.

    Rung ``k`` trains a trial up to ``min_budget * eta**k`` units in total (capped at
    ``max_budget``); a promoted trial resumes from its checkpoint, so the increment is what
    it costs.

    >>> Budget(unit="epochs", min_budget=1, max_budget=9, eta=3).rungs
    (1.0, 3.0, 9.0)
    """

    unit: str = "epochs"
    min_budget: float = 1.0
    max_budget: float = 9.0
    eta: float = 3.0

    def __post_init__(self) -> None:
        if self.unit not in ("epochs", "samples"):
            raise SpecError(
                f"budget unit {self.unit!r} is not supported; use unit='epochs' or "
                "unit='samples'"
            )
        for name in ("min_budget", "max_budget"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
                raise SpecError(f"budget {name} must be a finite number > 0, got {v!r}")
        if self.min_budget > self.max_budget:
            raise SpecError(
                f"budget min_budget ({self.min_budget}) > max_budget ({self.max_budget}); "
                "swap them or raise max_budget"
            )
        if isinstance(self.eta, bool) or not isinstance(self.eta, (int, float)) or not self.eta > 1:
            raise SpecError(f"budget eta must be a number > 1 (e.g. 3), got {self.eta!r}")

    @property
    def rungs(self) -> tuple[float, ...]:
        """Cumulative budget at each rung, the last one being ``max_budget``."""
        out, b = [], float(self.min_budget)
        while b < self.max_budget * (1 - 1e-9):
            out.append(b)
            b *= self.eta
        out.append(float(self.max_budget))
        return tuple(out)


@dataclass(frozen=True)
class Suggestion:
    """One unit of work a scheduler hands out: train ``trial_id`` up to ``budget`` units.

    ``rung`` 0 is a new trial; ``rung > 0`` continues the same trial (same configuration,
    same checkpoint directory) to a larger budget. ``parent`` names the trial a NAS child was
    mutated from.
    """

    trial_id: str
    config: Mapping[str, Any]
    rung: int = 0
    budget: float = 1.0
    parent: str | None = None


@dataclass
class TrialRecord:
    """A scheduler's frozen-enough view of one trial: its config and results per rung."""

    trial_id: str
    config: Mapping[str, Any]
    results: dict[int, float] = field(default_factory=dict)  # rung -> metric
    status: str = "running"  # running | paused | stopped | failed
    parent: str | None = None

    @property
    def top_rung(self) -> int:
        return max(self.results) if self.results else -1


class TrialScheduler(ABC):
    """Ask/tell driver of a search.

    ``ask()`` returns the next :class:`Suggestion`, or ``None`` when nothing can start until a
    running trial reports (the caller waits for a result, then asks again). ``tell()`` records
    a result and returns the :class:`Decision` for that trial. ``fail()`` records a trial that
    raised. ``done`` is true once no suggestion will ever be made again and every handed-out
    suggestion has been told or failed.
    """

    def __init__(self, *, metric: str = "accuracy", mode: str = "max") -> None:
        if mode not in ("max", "min"):
            raise SpecError(f"mode must be 'max' or 'min', got {mode!r}")
        if not isinstance(metric, str) or not metric:
            raise SpecError(f"metric must be a result key such as 'accuracy', got {metric!r}")
        self.metric, self.mode = metric, mode
        self.trials: dict[str, TrialRecord] = {}
        self.pending: dict[tuple[str, int], Suggestion] = {}

    # ---- the interface ------------------------------------------------------------------
    @abstractmethod
    def ask(self) -> Suggestion | None:
        """The next unit of work, or ``None`` to wait for a result."""

    @abstractmethod
    def _decide(self, record: TrialRecord, rung: int, value: float) -> Decision:
        """The decision for ``record`` after its result ``value`` at ``rung``."""

    @property
    @abstractmethod
    def exhausted(self) -> bool:
        """True when ``ask`` will never return work again."""

    # ---- shared bookkeeping -------------------------------------------------------------
    @property
    def done(self) -> bool:
        return self.exhausted and not self.pending

    def tell(self, suggestion: Suggestion, result: Mapping[str, Any] | float) -> Decision:
        """Record ``result`` (a metrics dict holding ``self.metric``, or the metric itself)."""
        value = self.metric_of(result)
        key = (suggestion.trial_id, suggestion.rung)
        if key not in self.pending:
            raise SpecError(
                f"trial {suggestion.trial_id!r} rung {suggestion.rung} was not handed out by "
                "ask() or was already told; tell each suggestion exactly once"
            )
        del self.pending[key]
        rec = self.trials[suggestion.trial_id]
        rec.results[suggestion.rung] = value
        decision = self._decide(rec, suggestion.rung, value)
        rec.status = {Decision.CONTINUE: "running", Decision.PAUSE: "paused"}.get(
            decision, "stopped"
        )
        return decision

    def fail(self, suggestion: Suggestion) -> None:
        """The trial raised; it gets no more budget and its nodes are free."""
        self.pending.pop((suggestion.trial_id, suggestion.rung), None)
        if suggestion.trial_id in self.trials:
            self.trials[suggestion.trial_id].status = "failed"

    def metric_of(self, result: Mapping[str, Any] | float) -> float:
        if isinstance(result, Mapping):
            if self.metric not in result:
                raise SpecError(
                    f"result {dict(result)!r} has no metric {self.metric!r}; return it from the "
                    f"training function or build the scheduler with metric=<one of "
                    f"{sorted(result)}>"
                )
            result = result[self.metric]
        value = float(result)
        if math.isnan(value):
            # A diverged trial is the worst, not a crash of the search.
            value = -math.inf if self.mode == "max" else math.inf
        return value

    def better(self, a: float, b: float) -> bool:
        """True if ``a`` is strictly better than ``b`` under ``mode``."""
        return a > b if self.mode == "max" else a < b

    def sort_key(self, value: float) -> float:
        """Key that sorts best first."""
        return -value if self.mode == "max" else value

    def best(self) -> TrialRecord | None:
        """The trial with the best result at the highest rung it reached, ties by that rung."""
        told = [r for r in self.trials.values() if r.results]
        if not told:
            return None
        return min(told, key=lambda r: (-r.top_rung, self.sort_key(r.results[r.top_rung])))

    def _hand_out(self, s: Suggestion) -> Suggestion:
        self.pending[(s.trial_id, s.rung)] = s
        if s.trial_id not in self.trials:
            self.trials[s.trial_id] = TrialRecord(s.trial_id, dict(s.config), parent=s.parent)
        self.trials[s.trial_id].status = "running"
        return s
