"""MILP solvers behind one call: HiGHS (default) or CBC, a time limit, an honest status.

Both come with PuLP: HiGHS through ``highspy`` (``pulp.HiGHS``, in-process, no files) and CBC
as the binary bundled in PuLP's wheel (``pulp.PULP_CBC_CMD``). :func:`solve` never raises
because a solver was slow: it reports whether it holds an optimal solution, a feasible one
found before the time limit, or none, and the policy decides what to fall back to.
"""

from __future__ import annotations

import logging
import math
import time
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import pulp

from malleparsl.allocator.highs import highspy
from malleparsl.errors import SpecError, unknown_name

log = logging.getLogger(__name__)

__all__ = ["SOLVERS", "SolveResult", "check_solver_options", "make_solver", "solve"]


class _StartedHiGHS(pulp.HiGHS):
    """``pulp.HiGHS`` that can hand HiGHS a feasible start (``start``: variable name -> value).

    With a good start HiGHS prunes by bound from its first node; the count MILP always has one
    (the reduction's feasible choice), so it mostly has to prove optimality.
    """

    start: Mapping[str, float] | None = None

    def callSolver(self, lp: pulp.LpProblem) -> None:  # noqa: N802 - PuLP's name
        if self.start:
            vals = [0.0] * lp.solverModel.getNumCol()
            for v in lp.variables():
                vals[v.index] = float(self.start.get(v.name, 0.0))
            sol = highspy.HighsSolution()
            sol.col_value = vals
            lp.solverModel.setSolution(sol)
        super().callSolver(lp)


def _highs(time_limit_s: float, mip_gap: float, threads: int | None) -> pulp.LpSolver:
    return _StartedHiGHS(msg=False, timeLimit=time_limit_s, gapRel=mip_gap, threads=threads)


def _cbc(time_limit_s: float, mip_gap: float, threads: int | None) -> pulp.LpSolver:
    # CBC counts whole seconds; below 1 s it would not stop earlier anyway. PuLP 3.3 deprecates
    # PULP_CBC_CMD in favour of a separately installed CBC; the bundled binary is what we want.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return pulp.PULP_CBC_CMD(
            msg=False, timeLimit=max(1, math.ceil(time_limit_s)), gapRel=mip_gap, threads=threads
        )


SOLVERS: dict[str, Callable[[float, float, int | None], pulp.LpSolver]] = {
    "highs": _highs,
    "cbc": _cbc,
}
"""Solver name -> factory ``(time_limit_s, mip_gap, threads) -> pulp solver``."""


def check_solver_options(solver: str, time_limit_s: float, mip_gap: float) -> None:
    """Raise a clear error for an unknown solver, a bad time limit or a bad gap."""
    if solver not in SOLVERS:
        raise unknown_name("solver", solver, SOLVERS)
    if isinstance(time_limit_s, bool) or not (
        isinstance(time_limit_s, (int, float)) and time_limit_s > 0 and math.isfinite(time_limit_s)
    ):
        raise SpecError(
            f"time_limit_s must be a finite number of seconds > 0, got {time_limit_s!r}"
        )
    if not (isinstance(mip_gap, (int, float)) and 0 <= mip_gap < 1):
        raise SpecError(f"mip_gap must be a relative gap in [0, 1), got {mip_gap!r}")


def make_solver(
    solver: str = "highs",
    *,
    time_limit_s: float = 5.0,
    mip_gap: float = 1e-6,
    threads: int | None = None,
) -> pulp.LpSolver:
    """A configured PuLP solver: ``"highs"`` or ``"cbc"``."""
    check_solver_options(solver, time_limit_s, mip_gap)
    return SOLVERS[solver](float(time_limit_s), float(mip_gap), threads)


@dataclass(frozen=True)
class SolveResult:
    """What a solve produced.

    ``status`` is ``"optimal"``, ``"feasible"`` (stopped by the time limit with a solution) or
    ``"none"`` (no usable solution: time limit before the first one, or solver failure).
    """

    status: str
    seconds: float
    objective: float | None
    detail: str = ""

    @property
    def has_solution(self) -> bool:
        return self.status in ("optimal", "feasible")


def solve(
    prob: pulp.LpProblem,
    *,
    solver: str = "highs",
    time_limit_s: float = 5.0,
    mip_gap: float = 1e-6,
    threads: int | None = None,
    start: Mapping[str, float] | None = None,
) -> SolveResult:
    """Solve ``prob`` in place (variables get ``varValue``) and report what was found.

    ``start`` (variable name -> value) is a feasible solution HiGHS starts from; CBC ignores it.
    """
    engine = make_solver(solver, time_limit_s=time_limit_s, mip_gap=mip_gap, threads=threads)
    if isinstance(engine, _StartedHiGHS):
        engine.start = start
    t0 = time.perf_counter()
    try:
        prob.solve(engine)
    except pulp.PulpSolverError as exc:  # a crashed or missing solver binary
        log.warning("%s failed: %s", solver, exc)
        return SolveResult("none", time.perf_counter() - t0, None, f"solver error: {exc}")
    seconds = time.perf_counter() - t0
    sol = prob.sol_status
    detail = f"{solver}: {pulp.LpStatus.get(prob.status, prob.status)}"
    if sol == pulp.LpSolutionOptimal:
        status = "optimal"
    elif sol == pulp.LpSolutionIntegerFeasible:
        status = "feasible"
    else:
        status = "none"
    if status != "optimal":
        log.info("%s after %.3f s (limit %.3f s): %s", detail, seconds, time_limit_s, status)
    obj = pulp.value(prob.objective) if status != "none" else None
    return SolveResult(status, seconds, None if obj is None else float(obj), detail)
