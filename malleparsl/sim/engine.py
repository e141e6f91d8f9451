"""The trace-replay simulator: an event loop with a simulated clock around the one Controller.

The engine owns only what the live system gets from reality — which nodes are idle, how fast
each job really trains, how long a rescale really pauses it — and feeds it to
:class:`~malleparsl.controller.Controller` as events; every decision is the controller's (its
policy's). Semantics (see docs/sim.md):

- Events at equal times are coalesced: nodes taken back first, then jobs that reached their
  total samples finish, then new idle nodes and new jobs arrive; then one replan.
- Between events a job trains at ``rate(size)`` of its true curve except while paused.
- A job whose node set changes at an event pauses once: ``rescale_up_s`` when it starts or
  grows (the first allocation pays its grow cost), else ``rescale_down_s`` (a shrink, a
  preemption, or both). A pause during a pause restarts it.
- Jobs are admitted in submission order, at most ``max_active`` at once (the controller's cap).
- A learning setup's rate readings are due after ``warmup_s`` at a size, then every
  ``observe_every_s``; a due reading is an event with its own replan, as the live control loop
  replans on readings (``reading_events``), but not sooner than ``observe_replan_s`` after the
  last replan (the live loop's ``ControlOptions.observe_replan_s``).
- Replans are skipped when the only change is that *unused* idle nodes vanished (the previous
  answer is still feasible and an optimal policy would keep it) or that jobs arrived while the
  cap is full (they wait; the controller admits them at the next replan).
"""

from __future__ import annotations

import dataclasses
import heapq
import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from malleparsl.controller import Controller, KnownCurves
from malleparsl.errors import SpecError
from malleparsl.model import JobSpec
from malleparsl.sim.horizon import FragmentHorizon
from malleparsl.sim.plans import KnownPlans
from malleparsl.sim.result import EVENT_COLUMNS, JOB_COLUMNS, SIZE_COLUMNS, SimResult
from malleparsl.sim.setups import make_setup
from malleparsl.traces import IdleTrace

log = logging.getLogger(__name__)

SEMANTICS = ("default", "bftrainer")
"""Accountings ``simulate`` offers: ours (the default) and the original BFTrainer replayer's."""


@dataclass(frozen=True, kw_only=True)
class SimOptions:
    """Knobs of a simulation run (the defaults reproduce the published setting)."""

    max_active: int | None = 10  # concurrent-job cap (None: no cap)
    tfwd_s: float = 10.0  # BFTrainer's expected time to the next event
    horizon: bool = True  # estimate node idle ends for horizon-aware policies
    horizon_quantile: float | None = None  # None: mean remaining idle time; else a quantile
    reveal_ends: float = 0.0  # fraction of fragments whose end is announced at their start
    noise: float = 0.03  # relative noise of the rates measured for a hidden-curve advisor
    warmup_s: float = 60.0  # training time at a size before its rate is measured
    observe_every_s: float = 300.0  # at most one measurement per job per this many seconds
    reading_events: bool = True  # a due reading is an event with a replan, as in the live loop
    observe_replan_s: float = 5.0  # ... at least this long after the last replan (live: the same)
    seed: int = 0
    skip_idle_removals: bool = True
    semantics: str = "default"  # "bftrainer": the original replayer's accounting (sim/bftrainer.py)

    def __post_init__(self) -> None:
        if self.semantics not in SEMANTICS:
            raise SpecError(
                f"semantics must be one of {', '.join(SEMANTICS)}, got {self.semantics!r}"
            )
        if not 0 <= self.reveal_ends <= 1:
            raise SpecError(f"reveal_ends must be in [0, 1], got {self.reveal_ends!r}")
        if min(self.noise, self.warmup_s, self.observe_every_s, self.observe_replan_s) < 0:
            raise SpecError("noise, warmup_s, observe_every_s and observe_replan_s must be >= 0")
        if self.reading_events and self.observe_every_s == 0 and self.observe_replan_s == 0:
            raise SpecError("reading_events needs observe_every_s > 0 or observe_replan_s > 0: "
                            "with both 0 a reading would be due again at once, for ever")


@dataclass
class _Run:
    """The truth about one job: what it has trained, at what size and rate, paused until when."""

    spec: JobSpec
    done: float = 0.0
    size: int = 0
    rate: float = 0.0
    pause_until: float = -math.inf
    steady_since: float = math.inf
    last_observed: float = -math.inf
    version: int = 0
    first_start_s: float | None = None
    finished_s: float | None = None
    rescales: int = 0
    pause_s: float = 0.0


def simulate(
    trace: IdleTrace,
    jobs: Sequence[JobSpec],
    *,
    policy: str = "milp",
    options: SimOptions | None = None,
    policy_options: dict | None = None,
    progress: Callable[[float], None] | None = None,
    history: IdleTrace | None = None,
) -> SimResult:
    """Replay ``trace`` with ``jobs`` under the named policy (setup); returns what it measured.

    ``history``, a trace covering time before the window (e.g. the full trace), pre-trains the
    horizon estimate with the fragments that ended before the window starts — what a facility
    knows from its past — so it does not start from a prior.

    >>> from malleparsl.traces import trace_from_fragments
    >>> from malleparsl.model import JobSpec, ScalingCurve
    >>> tr = trace_from_fragments([("n1", 0, 100), ("n2", 0, 50)])
    >>> job = JobSpec("j", max_nodes=2, curve=ScalingCurve((1, 2), (1.0, 2.0)))
    >>> simulate(tr, [job], policy="upper-bound").samples
    150.0
    """
    opts = options or SimOptions()
    if opts.semantics == "bftrainer":
        from malleparsl.sim.bftrainer import simulate_bftrainer

        return simulate_bftrainer(
            trace, jobs, policy=policy, max_active=opts.max_active, tfwd_s=opts.tfwd_s,
            policy_options=policy_options, history=history, horizon=opts.horizon,
            progress=progress,
        )
    t_wall = time.perf_counter()
    rep = _Replay(trace, jobs, policy, opts, policy_options or {}, history)
    rep.run(progress)
    return rep.result(time.perf_counter() - t_wall)


class _Replay:
    """One run: the trace's event streams, the truth about every job, the controller."""

    def __init__(
        self,
        trace: IdleTrace,
        jobs: Sequence[JobSpec],
        policy: str,
        opts: SimOptions,
        policy_options: dict,
        history: IdleTrace | None,
    ) -> None:
        self.trace, self.policy, self.opts = trace, policy, opts
        pol, advisor, self.hide = make_setup(policy, **policy_options)
        self.free_costs = bool(getattr(pol, "ignores_costs", False))
        self.horizon = FragmentHorizon(quantile=opts.horizon_quantile) if opts.horizon else None
        if self.horizon is not None and history is not None:
            h = history.fragments
            past = h[h["end_s"] <= trace.start_s]
            self.horizon.record_many((past["end_s"] - past["start_s"]).to_numpy())
        uncapped = self.free_costs and not getattr(pol, "keeps_cap", False)
        self.ctl = Controller(
            policy=pol,
            advisor=advisor or KnownCurves(),
            max_active=None if uncapped else opts.max_active,
            tfwd_s=opts.tfwd_s,
            keep_history=True,
            horizon=self.horizon,
            plans=KnownPlans(),  # plan-aware jobs (sim.plans): runnable sizes, as live
        )
        self.rng = np.random.default_rng(opts.seed)
        self.t0, self.t1 = trace.start_s, trace.end_s
        f = trace.fragments.sort_values(["start_s", "node"], kind="stable")
        self.st_t, self.st_node = f["start_s"].to_numpy(), f["node"].tolist()
        self.st_end = f["end_s"].to_numpy()
        reveal = self.rng.random(len(f)) < opts.reveal_ends
        self.st_known = f["known_end"].to_numpy(bool) | reveal
        e = f.sort_values(["end_s", "node"], kind="stable")
        self.en_t, self.en_node = e["end_s"].to_numpy(), e["node"].tolist()
        self.en_start = e["start_s"].to_numpy()
        self.todo = sorted((j for j in jobs if j.submit_s < self.t1), key=lambda j: j.submit_s)
        if not all(j.curve is not None for j in self.todo):
            raise SpecError("every simulated job needs its true curve (JobSpec(curve=...))")
        self.runs = {j.job_id: _Run(j) for j in self.todo}
        self.fin: list[tuple[float, int, str]] = []  # (finish time, run version, job)
        self.running: set[str] = set()
        self.ev_rows: list[list] = []
        self.size_rows: list[tuple] = []
        self.solve: list[float] = []
        self.totals = dict(used=0.0, rescales=0, pause=0.0, ppause=0.0, pcost=0.0, preempt=0,
                           replans=0)
        self.si = self.ei = self.ji = self.n_done = self.n_act = 0
        self.now = self.t0
        self.last_replan = -math.inf

    # ---- the loop -------------------------------------------------------------------------
    def run(self, progress: Callable[[float], None] | None) -> None:
        n_ev = 0
        while True:
            nxt = self._next_time()
            if nxt >= self.t1:
                self._advance(self.t1)
                break
            self._advance(nxt)
            n_ev += 1
            lost = self._take_back()
            changed = bool(lost)
            changed |= self._finish_due()
            changed |= self._arrivals()
            if self.hide:
                changed |= self._measure()
            n_changed, solve_ms = 0, 0.0
            if self.ji > self.n_done and (changed or not self.opts.skip_idle_removals):
                n_changed, solve_ms = self._replan(lost)
            if changed:
                self.n_act = len(self.ctl.active_jobs)
            self.ev_rows.append([
                self.now, len(self.ctl.nodes), sum(self.runs[j].size for j in self.running),
                self.n_act, self.ji - self.n_done - self.n_act, 0.0, solve_ms, n_changed,
            ])
            if progress is not None and n_ev % 200 == 0:
                progress((self.now - self.t0) / (self.t1 - self.t0))
        if progress is not None:
            progress(1.0)

    def _next_time(self) -> float:
        return min(
            self.st_t[self.si] if self.si < len(self.st_t) else math.inf,
            self.en_t[self.ei] if self.ei < len(self.en_t) else math.inf,
            max(self.todo[self.ji].submit_s, self.t0) if self.ji < len(self.todo) else math.inf,
            self.fin[0][0] if self.fin else math.inf,
            self._next_reading() if self.hide and self.opts.reading_events else math.inf,
        )

    def _next_reading(self) -> float:
        """When the next due reading replans: readings that come within ``observe_replan_s`` of
        the last replan wait for it to pass, as in the live loop (one replan for a burst)."""
        due = min(map(self._reading_due, self.running), default=math.inf)
        return max(due, self.last_replan + self.opts.observe_replan_s)

    def _reading_due(self, jid: str) -> float:
        """When ``jid``'s next rate reading is due: after the warm-up at its size, then at
        most every ``observe_every_s``."""
        r, o = self.runs[jid], self.opts
        return max(r.steady_since + o.warmup_s, r.last_observed + o.observe_every_s)

    def _advance(self, t: float) -> None:
        """Train every running job from ``now`` to ``t``; the previous log row gets the mean."""
        now, dt = self.now, t - self.now
        if dt <= 0:
            return
        used, gained = 0, 0.0
        for jid in sorted(self.running):  # sorted: float sums independent of hash order
            r = self.runs[jid]
            used += r.size
            eff = t - max(now, r.pause_until)
            if eff > 0:
                before = r.done
                r.done = min(r.spec.total_samples, r.done + r.rate * eff)
                gained += r.done - before
        self.totals["used"] += used * dt
        if self.ev_rows:
            self.ev_rows[-1][5] = gained / dt
        self.now = t

    # ---- events ---------------------------------------------------------------------------
    def _take_back(self) -> dict[str, frozenset]:
        """Fragments ending now: the nodes go; returns what each job lost."""
        gone = []
        while self.ei < len(self.en_t) and self.en_t[self.ei] <= self.now:
            gone.append(self.en_node[self.ei])
            if self.horizon is not None and self.en_t[self.ei] < self.t1:
                self.horizon.record(self.en_t[self.ei] - self.en_start[self.ei])
            self.ei += 1
        return self.ctl.remove_nodes(gone, now_s=self.now) if gone else {}

    def _finish_due(self) -> bool:
        done = False
        while self.fin and self.fin[0][0] <= self.now:
            _, ver, jid = heapq.heappop(self.fin)
            r = self.runs[jid]
            if ver != r.version or r.finished_s is not None:
                continue  # stale: the job's rate changed since this entry was pushed
            r.done, r.finished_s, r.size, r.rate = r.spec.total_samples, self.now, 0, 0.0
            self.running.discard(jid)
            self.ctl.finish(jid, now_s=self.now)
            self.n_done += 1
            self.size_rows.append((self.now, jid, 0))
            done = True
        return done

    def _arrivals(self) -> bool:
        """New idle nodes (with announced ends where known) and newly submitted jobs."""
        added, ends = [], {}
        while self.si < len(self.st_t) and self.st_t[self.si] <= self.now:
            node = self.st_node[self.si]
            added.append(node)
            if self.st_known[self.si]:
                ends[node] = float(self.st_end[self.si])
            self.si += 1
        if added:
            self.ctl.add_nodes(added, now_s=self.now, end_s=ends)
        n0 = self.ji
        while self.ji < len(self.todo) and max(self.todo[self.ji].submit_s, self.t0) <= self.now:
            spec = self.todo[self.ji]
            hidden = dataclasses.replace(spec, curve=None) if self.hide else spec
            self.ctl.submit(hidden, now_s=self.now)
            self.ji += 1
        # a job that must queue behind a full cap changes nothing the policy sees
        cap = self.ctl.max_active
        admissible = self.ji > n0 and (cap is None or self.n_act < cap)
        return bool(added) or admissible

    def _measure(self) -> bool:
        """Noisy rate measurements for a learning advisor, after a warm-up at each size."""
        o, told = self.opts, False
        for jid in sorted(self.running):  # sorted: noise draws must not depend on str hashing
            r = self.runs[jid]
            if self.now >= self._reading_due(jid):
                noisy = max(0.0, r.rate * (1 + o.noise * self.rng.standard_normal()))
                self.ctl.observe(jid, n_nodes=r.size, samples_per_s=noisy, now_s=self.now)
                r.last_observed = self.now
                told = True
        return told

    # ---- decisions ------------------------------------------------------------------------
    def _replan(self, lost: dict[str, frozenset]) -> tuple[int, float]:
        """One controller replan; carry out its plan and charge the pauses."""
        now, ctl, tot = self.now, self.ctl, self.totals
        for jid in self.running:
            ctl.report_progress(jid, samples_done=self.runs[jid].done)
        plan = ctl.replan(now_s=now)
        self.last_replan = now
        tot["replans"] += 1
        self.solve.append(ctl.history[-1].solve_s)
        ctl.history.clear()
        changed = set(plan.changed_jobs) | set(lost)
        for jid in sorted(changed):
            r = self.runs[jid]
            new_size = ctl.allocation.size(jid)
            grows = jid in plan.start or jid in plan.grow
            if jid in lost:
                tot["preempt"] += 1
            if new_size == 0:
                r.size, r.rate = 0, 0.0
                self.running.discard(jid)
                r.version += 1
                self.size_rows.append((now, jid, 0))
                continue
            pause = 0.0
            if not self.free_costs:
                pause = r.spec.rescale_up_s if grows else r.spec.rescale_down_s
            r.pause_until = max(r.pause_until, now + pause)
            r.size, r.rate = new_size, r.spec.curve.rate(new_size)  # type: ignore[union-attr]
            r.steady_since = r.pause_until
            r.rescales += 1
            r.pause_s += pause
            if r.first_start_s is None:
                r.first_start_s = now
            self.running.add(jid)
            tot["rescales"] += 1
            tot["pause"] += pause
            if jid in lost:
                tot["ppause"] += pause
                tot["pcost"] += pause * r.rate
            if self.hide and pause > 0:
                ctl.observe_rescale(jid, kind="up" if grows else "down", pause_s=pause)
            self._schedule_finish(r)
            self.size_rows.append((now, jid, new_size))
        return len(changed), self.solve[-1] * 1e3

    def _schedule_finish(self, r: _Run) -> None:
        r.version += 1
        if r.size > 0 and r.rate > 0 and math.isfinite(r.spec.total_samples):
            left = (r.spec.total_samples - r.done) / r.rate
            heapq.heappush(self.fin, (max(self.now, r.pause_until) + left, r.version, r.spec.job_id))

    # ---- the answer -----------------------------------------------------------------------
    def result(self, wall_s: float) -> SimResult:
        runs, tot = self.runs.values(), self.totals
        job_rows = [
            (r.spec.job_id, r.spec.model, r.spec.submit_s, r.first_start_s, r.finished_s, r.done,
             r.rescales, r.pause_s, r.spec.total_samples)
            for r in runs
        ]
        return SimResult(
            policy=self.policy,
            trace=self.trace.name,
            start_s=self.t0,
            end_s=self.t1,
            samples=float(sum(r.done for r in runs)),
            idle_node_s=self.trace.idle_node_seconds(),
            used_node_s=tot["used"],
            rescales=int(tot["rescales"]),
            pause_s=tot["pause"],
            preempt_pause_s=tot["ppause"],
            preempt_cost_samples=tot["pcost"],
            preemptions=int(tot["preempt"]),
            jobs_done=self.n_done,
            jobs_submitted=len(self.todo),
            solve_s=np.asarray(self.solve),
            wall_s=wall_s,
            events=pd.DataFrame(self.ev_rows, columns=EVENT_COLUMNS),
            sizes=pd.DataFrame(self.size_rows, columns=SIZE_COLUMNS),
            jobs=pd.DataFrame(job_rows, columns=JOB_COLUMNS),
            replans=int(tot["replans"]),
        )
