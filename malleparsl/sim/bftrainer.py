"""BFTrainer-compatible accounting: replay a trace the way the original BFTrainer replayer does.

The default engine (:mod:`malleparsl.sim.engine`) models what happens on a machine: a job
that finishes frees its nodes at once, a rescale pauses the job for its real duration. The
published replayer accounts differently, and a like-for-like comparison with its figures needs
its rules (``simulate --semantics bftrainer``):

- Events are the times at which any node of the slice changes state, from the window start
  (the first job's submission); nothing else is an event. A job that completes inside an
  interval keeps its nodes (idle) until the next event; a job submitted inside an interval
  waits for the next event.
- Over ``[t_{k-1}, t_k)`` every job is credited ``dt x rate`` of the allocation decided at
  ``t_{k-1}``, minus the rescale cost of that decision (a lump, charged one interval late),
  minus its preemption cost; progress is clipped at the job's total samples.
- Rescale cost of a decision, per job whose nodes change: ``rescale_up_s`` (grow) or
  ``rescale_down_s`` (shrink) x its rate at the OLD size, so a start from 0 nodes is free.
  (The original charges nothing for a move that both adds and drops nodes; here such a
  migration is charged as a grow or shrink by its net size change, as a shrink when equal.)
- Preemption cost: ``rescale_down_s`` x the job's rate before the event, once per job that
  lost at least one node to the trace.
- Both rules are :data:`~malleparsl.allocator.costs.OLD_RATE` (``COSTS``); the replay hands
  that object to the policy (``policy.costs``), so a policy's model charges what this
  accounting charges; an explicit ``policy_options={"costs": ...}`` naming another rule is a
  :class:`~malleparsl.errors.SpecError`, not silently overridden.
- Initial map: the idle nodes at the window start go to the jobs submitted by then (the
  original draws a random map; with one job — the published case — that is all of them, up to
  its maximum; with several, this replayer asks the policy), charged ``rate x rescale_up_s``.
- At most ``max_active`` jobs are in the system, admitted in submission order (BFTrainer's
  ``maxJ``).

Every decision is still the :class:`~malleparsl.controller.Controller`'s (its policy's). The
per-event step log has the original's columns (``STEP_COLUMNS``), so a run can be checked row
by row against the original's output (``tests/sim/test_bftrainer_semantics.py``).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence

import numpy as np
import pandas as pd

from malleparsl.allocator.costs import OLD_RATE, costs_named
from malleparsl.controller import Controller, KnownCurves
from malleparsl.errors import SpecError
from malleparsl.model import JobSpec
from malleparsl.sim.horizon import FragmentHorizon
from malleparsl.sim.plans import KnownPlans
from malleparsl.sim.result import EVENT_COLUMNS, JOB_COLUMNS, SIZE_COLUMNS, SimResult
from malleparsl.sim.setups import make_setup
from malleparsl.traces import IdleTrace

log = logging.getLogger(__name__)

STEP_COLUMNS = [
    "evtTime",
    "Thr",
    "Rate",
    "ReScost",
    "evt",
    "Nleft",
    "Npre",
    "Njoin",
    "nJob",
    "nNd",
    "nJrun",
    "nNrun",
    "PreCost",
]
"""The original replayer's step-log columns (see ``../shared/data/bftrainer-reference``)."""

COSTS = OLD_RATE
"""The rescale and preemption costs this accounting charges; the policy is handed the same."""


def node_events(trace: IdleTrace) -> tuple[list[str], list[tuple[float, list[str], list[str]]]]:
    """The slice's state changes: nodes idle at the window start, then ``(t, left, joined)``.

    Times are those inside ``(start_s, end_s)`` at which some node's idle state really changes
    (a fragment ending where the next one of the same node starts is no change). Node lists
    follow the trace's node order.
    """
    f = trace.fragments
    order = {n: i for i, n in enumerate(trace.nodes)}
    t0 = trace.start_s
    initial = sorted(set(f.loc[(f["start_s"] <= t0) & (f["end_s"] > t0), "node"]), key=order.get)
    starts: dict[float, set[str]] = {}
    ends: dict[float, set[str]] = {}
    for node, s, e in zip(f["node"], f["start_s"].to_numpy(), f["end_s"].to_numpy()):
        if s > t0:
            starts.setdefault(float(s), set()).add(node)
        if e < trace.end_s:
            ends.setdefault(float(e), set()).add(node)
    out = []
    for t in sorted(set(starts) | set(ends)):
        if not t0 < t < trace.end_s:
            continue
        s, e = starts.get(t, set()), ends.get(t, set())
        left, joined = sorted(e - s, key=order.get), sorted(s - e, key=order.get)
        if left or joined:
            out.append((t, left, joined))
    return initial, out


def simulate_bftrainer(
    trace: IdleTrace,
    jobs: Sequence[JobSpec],
    *,
    policy: str = "milp",
    max_active: int | None = 10,
    tfwd_s: float = 10.0,
    policy_options: dict | None = None,
    history: IdleTrace | None = None,
    horizon: bool = True,
    progress: Callable[[float], None] | None = None,
) -> SimResult:
    """Replay ``trace`` with ``jobs`` under BFTrainer's accounting.

    The result's ``steps`` attribute is the original's step log (a DataFrame, ``STEP_COLUMNS``).
    """
    t_wall = time.perf_counter()
    rep = _BFReplay(trace, jobs, policy, max_active, tfwd_s, policy_options or {}, history, horizon)
    rep.run(progress)
    return rep.result(time.perf_counter() - t_wall)


class _BFReplay:
    """One run under BFTrainer's rules (the module docstring lists them)."""

    def __init__(
        self,
        trace: IdleTrace,
        jobs: Sequence[JobSpec],
        policy: str,
        max_active: int | None,
        tfwd_s: float,
        policy_options: dict,
        history: IdleTrace | None,
        horizon: bool,
    ) -> None:
        asked = policy_options.get("costs")
        if asked is not None and costs_named(asked) is not COSTS:
            raise SpecError(
                f"policy_options costs={asked!r} conflicts with --semantics bftrainer, which "
                f"charges {COSTS.name!r} and plans with it; drop the option or use the default "
                "semantics"
            )
        pol, advisor, hide = make_setup(policy, **policy_options)
        if hide:
            raise SpecError(
                f"setup {policy!r} learns curves from measurements; --semantics bftrainer "
                "replays known curves only (use the default semantics)"
            )
        self.trace, self.policy = trace, policy
        # the policy values decisions with the costs this accounting charges (COSTS)
        if hasattr(pol, "costs"):
            pol.costs = COSTS  # type: ignore[attr-defined]
        self.free = bool(getattr(pol, "ignores_costs", False))
        uncapped = self.free and not getattr(pol, "keeps_cap", False)
        self.horizon = FragmentHorizon() if horizon else None
        if self.horizon is not None and history is not None:
            h = history.fragments
            past = h[h["end_s"] <= trace.start_s]
            self.horizon.record_many((past["end_s"] - past["start_s"]).to_numpy())
        self.ctl = Controller(
            policy=pol,
            advisor=advisor or KnownCurves(),
            max_active=None if uncapped else max_active,
            tfwd_s=tfwd_s,
            keep_history=True,
            horizon=self.horizon,
            plans=KnownPlans(),  # plan-aware jobs (sim.plans): runnable sizes, as live
        )
        self.todo = sorted((j for j in jobs if j.submit_s < trace.end_s), key=lambda j: j.submit_s)
        if not all(j.curve is not None for j in self.todo):
            raise SpecError("every simulated job needs its true curve (JobSpec(curve=...))")
        self.spec = {j.job_id: j for j in self.todo}
        self.done: dict[str, float] = {}  # samples trained, per admitted job
        self.rate: dict[str, float] = {}  # rate of the current decision, per job in system
        self.cost: dict[str, float] = {}  # rescale cost of the current decision (next row)
        self.first_start: dict[str, float] = {}
        self.finish: dict[str, float] = {}
        self.rescales: dict[str, int] = {}
        self.ji = 0
        self.steps: list[list] = []
        self.size_rows: list[tuple] = []
        self.solve: list[float] = []
        self.tot = dict(used=0.0, rescales=0, pause=0.0, ppause=0.0, pcost=0.0, preempt=0)
        self.last_nrun = 0  # the original logs a stale running-job count when the queue empties
        self.tail = 0.0  # samples credited after the last event, to the window's end

    # ---- helpers ---------------------------------------------------------------------------
    def _rate(self, jid: str, n: int) -> float:
        s = self.spec[jid]
        return s.curve.rate(n) if n >= s.min_nodes else 0.0  # type: ignore[union-attr]

    def _sizes(self) -> dict[str, int]:
        return {j: len(self.ctl.allocation.nodes_of(j)) for j in self.rate}

    def _admit(self, now: float) -> None:
        """Jobs submitted by ``now`` enter the controller (it admits up to the cap)."""
        while self.ji < len(self.todo) and self.todo[self.ji].submit_s <= now:
            self.ctl.submit(self.todo[self.ji], now_s=now)
            self.ji += 1
        self.ctl._admit(now)
        for js in self.ctl.active_jobs:
            jid = js.spec.job_id
            if jid not in self.rate:
                self.rate[jid], self.cost[jid], self.done[jid] = 0.0, 0.0, 0.0
                self.rescales[jid] = 0

    def _decide(self, now: float) -> None:
        """One replan; the new rates, and the rescale costs charged in the next interval."""
        before = self._sizes()
        held = {j: self.ctl.allocation.nodes_of(j) for j in before}
        for jid in before:
            self.ctl.report_progress(jid, samples_done=max(0.0, self.done[jid]))
        self.ctl.replan(now_s=now)
        self.solve.append(self.ctl.history[-1].solve_s)
        self.ctl.history.clear()
        for jid, old in before.items():
            new_nodes = self.ctl.allocation.nodes_of(jid)
            new = len(new_nodes)
            s = self.spec[jid]
            cost = 0.0
            if new_nodes != held[jid]:
                up, down = (0.0, 0.0) if self.free else (s.rescale_up_s, s.rescale_down_s)
                pause = up if new > old else down
                to = new if new != old else old - 1  # a migration is charged as a shrink
                rates = s.curve.rates_upto(max(new, old))  # type: ignore[union-attr]
                cost = float(COSTS.rescale(np.array([to]), old, rates, up, down)[0])
                self.tot["rescales"] += 1
                self.tot["pause"] += pause if old > 0 else 0.0
                self.rescales[jid] += 1
                self.size_rows.append((now, jid, new))
                if new > 0:
                    self.first_start.setdefault(jid, now)
            self.cost[jid] = cost
            self.rate[jid] = self._rate(jid, new)

    # ---- the loop --------------------------------------------------------------------------
    def run(self, progress: Callable[[float], None] | None) -> None:
        tr, ctl = self.trace, self.ctl
        initial, events = node_events(tr)
        t0 = tr.start_s
        ctl.add_nodes(initial, now_s=t0)
        self._admit(t0)
        if self.rate and initial:
            self._decide(t0)
            for jid in self.rate:  # the start-up cost of the initial map
                n = len(ctl.allocation.nodes_of(jid))
                self.cost[jid] = 0.0 if self.free else self.rate[jid] * self.spec[jid].rescale_up_s
                if n:
                    self.first_start.setdefault(jid, t0)
        self.last_nrun = sum(1 for j in self.rate if ctl.allocation.nodes_of(j))
        prev = t0
        for k, (t, left, joined) in enumerate(events, start=1):
            if self._step(k, prev, t, left, joined):
                break
            prev = t
            if progress is not None and k % 200 == 0:
                progress((t - t0) / tr.duration_s)
        else:  # the window's tail after the last event (no row: the original has none)
            self.tail, complete = self._credit(prev, tr.end_s, {}, self._held())
            for jid in complete:
                self.finish[jid] = tr.end_s
        if progress is not None:
            progress(1.0)

    def _held(self) -> int:
        return sum(len(self.ctl.allocation.nodes_of(j)) for j in self.rate)

    def _credit(
        self, prev: float, now: float, pre: dict[str, float], held: int
    ) -> tuple[float, list[str]]:
        """Credit ``[prev, now)`` (``held`` nodes in use over it); returns the samples credited
        and the jobs now complete."""
        dt = now - prev
        self.tot["used"] += dt * held
        thr, complete = 0.0, []
        for jid in list(self.rate):
            p = dt * self.rate[jid] - self.cost[jid] - pre.get(jid, 0.0)
            total = self.spec[jid].total_samples
            self.done[jid] += p
            if total <= self.done[jid]:
                p -= self.done[jid] - total
                self.done[jid] = total
                complete.append(jid)
            thr += p
            self.cost[jid] = 0.0
        return thr, complete

    def _step(self, k: int, prev: float, now: float, left: list[str], joined: list[str]) -> bool:
        ctl = self.ctl
        pre: dict[str, float] = {}
        held = self._held()  # before the event takes nodes back: they were used until now
        lost = ctl.remove_nodes(left, now_s=now) if left else {}
        for jid in lost:
            if jid in self.rate:
                pre[jid] = COSTS.preemption(self.rate[jid], self.spec[jid].rescale_down_s)
                self.tot["preempt"] += 1
                self.tot["pcost"] += pre[jid]
                self.tot["ppause"] += self.spec[jid].rescale_down_s
        old_rate_sum = sum(self.rate.values())
        thr, complete = self._credit(prev, now, pre, held)
        for jid in complete:
            ctl.finish(jid, now_s=now)
            self.finish[jid] = now
            for d in (self.rate, self.cost):
                d.pop(jid)
            self.size_rows.append((now, jid, 0))
        if joined:
            ctl.add_nodes(joined, now_s=now)
        self._admit(now)
        n_nodes, n_jobs = len(ctl.nodes), len(self.rate)
        row = [
            now,
            thr,
            0.0,
            0.0,
            k,
            len(left),
            len(pre),
            len(joined),
            n_jobs,
            n_nodes,
            0,
            0,
            sum(pre.values()),
        ]
        if n_jobs == 0 and self.ji >= len(self.todo) and not ctl.active_jobs:
            row[2], row[8] = old_rate_sum, 0
            self.steps.append(row)
            return True
        if n_nodes == 0 or n_jobs == 0:
            if n_jobs == 0:
                row[10] = self.last_nrun
            else:
                self.last_nrun = 0
                for jid in self.rate:
                    self.rate[jid] = 0.0
            self.steps.append(row)
            return False
        self._decide(now)
        sizes = self._sizes()
        self.last_nrun = sum(1 for n in sizes.values() if n > 0)
        row[2] = sum(self.rate.values())
        row[3] = sum(self.cost.values())
        row[10], row[11] = self.last_nrun, sum(sizes.values())
        self.steps.append(row)
        return False

    # ---- the answer ------------------------------------------------------------------------
    @property
    def step_log(self) -> pd.DataFrame:
        return pd.DataFrame(self.steps, columns=STEP_COLUMNS)

    def result(self, wall_s: float) -> SimResult:
        tr, steps = self.trace, self.step_log
        ev = []
        times = steps["evtTime"].to_numpy()
        nxt = np.r_[times[1:], tr.end_s] if len(times) else np.array([])
        thr_next = np.r_[steps["Thr"].to_numpy()[1:], 0.0] if len(times) else np.array([])
        for i, r in enumerate(steps.itertuples(index=False)):
            dt = nxt[i] - times[i]
            ev.append(
                [
                    times[i],
                    r.nNd,
                    r.nNrun,
                    r.nJob,
                    0,
                    thr_next[i] / dt if dt > 0 else 0.0,
                    self.solve[i] * 1e3 if i < len(self.solve) else 0.0,
                    0,
                ]
            )
        job_rows = [
            (
                j.job_id,
                j.model,
                j.submit_s,
                self.first_start.get(j.job_id),
                self.finish.get(j.job_id),
                self.done.get(j.job_id, 0.0),
                self.rescales.get(j.job_id, 0),
                0.0,
                j.total_samples,
            )
            for j in self.todo
        ]
        res = SimResult(
            policy=self.policy,
            trace=tr.name,
            start_s=tr.start_s,
            end_s=tr.end_s,
            samples=float(steps["Thr"].sum() if len(steps) else 0.0) + self.tail,
            idle_node_s=tr.idle_node_seconds(),
            used_node_s=self.tot["used"],
            rescales=int(self.tot["rescales"]),
            pause_s=self.tot["pause"],
            preempt_pause_s=self.tot["ppause"],
            preempt_cost_samples=self.tot["pcost"],
            preemptions=int(self.tot["preempt"]),
            jobs_done=len(self.finish),
            jobs_submitted=len(self.todo),
            solve_s=np.asarray(self.solve),
            wall_s=wall_s,
            events=pd.DataFrame(ev, columns=EVENT_COLUMNS),
            sizes=pd.DataFrame(self.size_rows, columns=SIZE_COLUMNS),
            jobs=pd.DataFrame(job_rows, columns=JOB_COLUMNS),
            replans=len(self.solve),
            extra={"semantics": "bftrainer"},
        )
        res.steps = steps  # type: ignore[attr-defined]
        return res


def steps_match(ours: pd.DataFrame, ref: pd.DataFrame, rtol: float = 1e-6) -> list[str]:
    """Differences between two step logs, one line per mismatching cell (empty: identical)."""
    out = []
    if len(ours) != len(ref):
        out.append(f"{len(ours)} rows, reference has {len(ref)}")
    for i in range(min(len(ours), len(ref))):
        for c in STEP_COLUMNS:
            a, b = ours[c].iloc[i], ref[c].iloc[i]
            if c == "evtTime":
                if a != b:
                    out.append(f"row {i + 1} {c}: {a} != {b}")
            elif not math.isclose(float(a), float(b), rel_tol=rtol, abs_tol=1e-6):
                out.append(f"row {i + 1} {c}: {a} != {b}")
    return out
