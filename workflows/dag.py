"""Workflows as DAGs of stages, run on futures so independent stages overlap.

A :class:`Workflow` is a networkx DAG. Each node is a :class:`Stage`; an edge ``a -> b``
carries ``a``'s result to ``b``, optionally through a selector such as :func:`top_k` (the
best configurations of a search feed the next stage). A stage starts the moment all its
parents have finished, so branches that do not depend on each other run at the same time.
A :class:`TrialStage` emits trials — malleable training apps — through a
:class:`~malleparsl.workflows.runner.TrialRunner` and drives an ask/tell scheduler with their
futures as they complete: a finished or pruned trial's app returns, which frees its nodes
at once, and the next suggestion is submitted in its place.

>>> from malleparsl.workflows.runner import ThreadTrialRunner
>>> from malleparsl.workflows.scheduler import Budget
>>> wf = Workflow()
>>> _ = wf.add(TrialStage("grid", lambda inputs: FixedTrials(configs=[{"x": 1}, {"x": 3}])))
>>> _ = wf.add(TrialStage("best", lambda inputs: FixedTrials(configs=inputs["grid"])),
...            after=["grid"], select=top_k(1))
>>> res = wf.run(ThreadTrialRunner(lambda cfg, budget: {"accuracy": cfg["x"] / 4}))
>>> res.table.best().config["x"], sorted(res.stages)
(3, ['best', 'grid'])
"""

from __future__ import annotations

import concurrent.futures as cf
import logging
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import networkx as nx

from malleparsl.errors import SpecError

from .results import TrialRow, TrialsTable
from .runner import TrialRunner
from .scheduler import Decision, Suggestion, TrialScheduler

log = logging.getLogger(__name__)


class StageFailed(RuntimeError):
    """A stage did not run because a stage it depends on failed."""


@dataclass
class StageResult:
    """What a stage hands downstream: its trials (best first) and any extra value."""

    name: str
    rows: list[TrialRow] = field(default_factory=list)
    value: Any = None
    metric: str = "accuracy"
    mode: str = "max"

    def ranked(self) -> list[TrialRow]:
        """Completed trials at their highest rung, best first."""
        table = TrialsTable(self.rows, metric=self.metric, mode=self.mode)
        return table.final_rows()


class Stage(ABC):
    """One step of a workflow. ``start`` must return quickly with a future of its result."""

    def __init__(self, name: str) -> None:
        if not isinstance(name, str) or not name or "/" in name:
            raise SpecError(f"a stage needs a non-empty name without '/', got {name!r}")
        self.name = name

    @abstractmethod
    def start(self, inputs: Mapping[str, Any], runner: TrialRunner) -> cf.Future:
        """Begin the stage with its parents' (selected) results; return a future."""

    def _thread(self, body: Callable[[], Any]) -> cf.Future:
        fut: cf.Future = cf.Future()

        def run() -> None:
            try:
                fut.set_result(body())
            except BaseException as exc:  # noqa: BLE001 - delivered to the waiter
                fut.set_exception(exc)

        threading.Thread(target=run, name=f"stage-{self.name}", daemon=True).start()
        return fut


class FunctionStage(Stage):
    """A plain Python step (aggregate, filter, report) on its parents' results."""

    def __init__(self, name: str, fn: Callable[[Mapping[str, Any]], Any]) -> None:
        super().__init__(name)
        self.fn = fn

    def start(self, inputs: Mapping[str, Any], runner: TrialRunner) -> cf.Future:
        return self._thread(lambda: StageResult(self.name, value=self.fn(inputs)))


class TrialStage(Stage):
    """Trials proposed by a scheduler, run through the runner, ``max_concurrent`` at a time.

    ``make_scheduler(inputs)`` builds the scheduler from the parents' results, so a stage can
    refine what an earlier one found.
    """

    def __init__(
        self,
        name: str,
        make_scheduler: Callable[[Mapping[str, Any]], TrialScheduler],
        *,
        max_concurrent: int = 4,
        poll_s: float = 0.2,
    ) -> None:
        super().__init__(name)
        if isinstance(max_concurrent, bool) or not isinstance(max_concurrent, int) or max_concurrent < 1:
            raise SpecError(f"max_concurrent must be an integer >= 1, got {max_concurrent!r}")
        self.make_scheduler, self.max_concurrent, self.poll_s = make_scheduler, max_concurrent, poll_s
        self.scheduler: TrialScheduler | None = None

    def start(self, inputs: Mapping[str, Any], runner: TrialRunner) -> cf.Future:
        sched = self.make_scheduler(inputs)
        if not isinstance(sched, TrialScheduler):
            raise SpecError(
                f"stage {self.name!r}: make_scheduler returned {type(sched).__name__}, not a "
                "TrialScheduler (ASHA, RegularizedEvolution, FixedTrials...)"
            )
        self.scheduler = sched
        return self._thread(lambda: self._drive(sched, runner))

    def _drive(self, sched: TrialScheduler, runner: TrialRunner) -> StageResult:
        running: dict[cf.Future, tuple[Suggestion, TrialRow]] = {}
        rows: list[TrialRow] = []
        while not sched.done:
            while len(running) < self.max_concurrent:
                sug = sched.ask()
                if sug is None:
                    break
                row = TrialRow(stage=self.name, trial_id=sug.trial_id, rung=sug.rung,
                               budget=sug.budget, config=dict(sug.config), parent=sug.parent,
                               started_s=time.time())
                rows.append(row)
                try:
                    row.job_id, row.ckpt_dir, fut = runner.submit(self.name, sug)
                except Exception as exc:  # noqa: BLE001 - recorded like a failed trial
                    log.error("stage %s: trial %s could not be submitted: %r", self.name,
                              sug.trial_id, exc)
                    row.status, row.error = "failed", f"{type(exc).__name__}: {exc}"
                    row.finished_s = time.time()
                    sched.fail(sug)
                    continue
                running[fut] = (sug, row)
            if not running:
                if sched.done:
                    break
                raise RuntimeError(
                    f"stage {self.name!r}: scheduler {type(sched).__name__} is not done but "
                    "offers no work and nothing is running"
                )
            done, _ = cf.wait(list(running), timeout=self.poll_s, return_when=cf.FIRST_COMPLETED)
            for fut in done:
                sug, row = running.pop(fut)
                row.finished_s = time.time()
                try:
                    result = fut.result()
                except Exception as exc:  # noqa: BLE001 - a failed trial must not end the search
                    log.warning("stage %s: trial %s rung %d failed: %r", self.name,
                                sug.trial_id, sug.rung, exc)
                    row.status, row.error = "failed", f"{type(exc).__name__}: {exc}"
                    sched.fail(sug)
                    runner.trial_done(self.name, sug, row)
                    continue
                row.metrics = dict(result) if isinstance(result, Mapping) else {sched.metric: result}
                decision = sched.tell(sug, result)
                row.status = {Decision.CONTINUE: "promoted", Decision.PAUSE: "paused"}.get(
                    decision, "stopped")
                runner.trial_done(self.name, sug, row)
        for r in rows:  # paused trials that were never promoted ended with the search
            if r.status == "paused":
                promoted = any(o.trial_id == r.trial_id and o.rung > r.rung for o in rows)
                r.status = "promoted" if promoted else "stopped"
        return StageResult(self.name, rows, metric=sched.metric, mode=sched.mode)


class FixedTrials(TrialScheduler):
    """A given list of configurations (or upstream trial rows), each trained once at ``budget``."""

    def __init__(self, *, configs: Iterable[Any], budget: float = 1.0, metric: str = "accuracy",
                 mode: str = "max", prefix: str = "c") -> None:
        super().__init__(metric=metric, mode=mode)
        self._todo: list[tuple[str, dict[str, Any]]] = []
        seen: set[str] = set()
        for i, c in enumerate(configs):
            # an upstream trial keeps its name, for traceability
            tid = f"{c.stage}.{c.trial_id}" if isinstance(c, TrialRow) else f"{prefix}{i:03d}"
            while tid in seen:
                tid += "'"
            seen.add(tid)
            self._todo.append((tid, dict(getattr(c, "config", c))))
        self.budget = float(budget)

    def ask(self) -> Suggestion | None:
        if not self._todo:
            return None
        tid, cfg = self._todo.pop(0)
        return self._hand_out(Suggestion(tid, cfg, 0, self.budget))

    @property
    def exhausted(self) -> bool:
        return not self._todo

    def _decide(self, record, rung, value) -> Decision:
        return Decision.STOP


def top_k(k: int) -> Callable[[StageResult], list[TrialRow]]:
    """Edge selector: the ``k`` best trials of the parent stage (at their highest rung)."""
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise SpecError(f"top_k needs an integer k >= 1, got {k!r}")
    return lambda result: result.ranked()[:k]


@dataclass
class WorkflowResult:
    """Every stage's result, all trials in one table, and the stages that failed (if any)."""

    stages: dict[str, StageResult]
    table: TrialsTable
    wall_s: float
    failed: dict[str, BaseException] = field(default_factory=dict)


class WorkflowError(RuntimeError):
    """Some stages failed; ``result`` still holds every trial that ran."""

    def __init__(self, message: str, result: WorkflowResult) -> None:
        super().__init__(message)
        self.result = result


class Workflow:
    """A DAG of stages; :meth:`run` executes it through one :class:`TrialRunner`."""

    def __init__(self, *, metric: str = "accuracy", mode: str = "max") -> None:
        self.graph = nx.DiGraph()
        self.metric, self.mode = metric, mode

    def add(self, stage: Stage, *, after: Iterable[str] = (),
            select: Callable[[StageResult], Any] | None = None) -> Stage:
        """Add ``stage`` depending on the stages named in ``after`` (edges carry ``select``)."""
        if stage.name in self.graph:
            raise SpecError(f"stage name {stage.name!r} is used twice; stage names must be unique")
        parents = list(after)
        for p in parents:
            if p not in self.graph:
                raise SpecError(
                    f"stage {stage.name!r} depends on unknown stage {p!r}; add {p!r} first "
                    f"(known: {sorted(self.graph)})"
                )
        self.graph.add_node(stage.name, stage=stage)
        for p in parents:
            self.graph.add_edge(p, stage.name, select=select)
        return stage

    def run(self, runner: TrialRunner, *, timeout_s: float | None = None,
            raise_on_failure: bool = True) -> WorkflowResult:
        """Run every stage as soon as its parents are done; failures skip their dependents.

        A failed stage raises :class:`WorkflowError` at the end (carrying the partial result)
        unless ``raise_on_failure`` is false.
        """
        if not nx.is_directed_acyclic_graph(self.graph):
            raise SpecError(f"workflow has a cycle: {nx.find_cycle(self.graph)}")
        t0 = time.time()
        results: dict[str, StageResult] = {}
        failed: dict[str, BaseException] = {}
        running: dict[cf.Future, str] = {}
        waiting = set(self.graph)
        while waiting or running:
            for name in sorted(waiting):
                parents = list(self.graph.predecessors(name))
                if any(p in failed for p in parents):
                    failed[name] = StageFailed(f"stage {name!r} skipped: a parent failed")
                    waiting.discard(name)
                elif all(p in results for p in parents):
                    inputs = {}
                    for p in parents:
                        sel = self.graph.edges[p, name]["select"]
                        inputs[p] = sel(results[p]) if sel else results[p]
                    stage = self.graph.nodes[name]["stage"]
                    log.info("workflow: starting stage %s", name)
                    running[stage.start(inputs, runner)] = name
                    waiting.discard(name)
            if not running:
                continue
            left = None if timeout_s is None else max(0.0, timeout_s - (time.time() - t0))
            done, _ = cf.wait(list(running), timeout=left, return_when=cf.FIRST_COMPLETED)
            if not done:
                raise TimeoutError(f"workflow did not finish within {timeout_s} s")
            for fut in done:
                name = running.pop(fut)
                try:
                    results[name] = fut.result()
                except Exception as exc:  # noqa: BLE001 - recorded, dependents skipped
                    log.error("workflow: stage %s failed: %r", name, exc)
                    failed[name] = exc
        rows = [r for s in results.values() for r in s.rows]
        out = WorkflowResult(results, TrialsTable(rows, metric=self.metric, mode=self.mode),
                             time.time() - t0, failed)
        if failed and raise_on_failure:
            first = next(iter(failed.values()))
            raise WorkflowError(f"workflow stages failed: {sorted(failed)}: {first!r}", out) from first
        return out
