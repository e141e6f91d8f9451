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
- Replans are skipped when the only change is that *unused* idle nodes vanished: the previous
  answer is then still feasible and an optimal policy would keep it.
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
from malleparsl.sim.result import EVENT_COLUMNS, SIZE_COLUMNS, SimResult
from malleparsl.sim.setups import make_setup
from malleparsl.traces import IdleTrace

log = logging.getLogger(__name__)


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
    seed: int = 0
    skip_idle_removals: bool = True

    def __post_init__(self) -> None:
        if not 0 <= self.reveal_ends <= 1:
            raise SpecError(f"reveal_ends must be in [0, 1], got {self.reveal_ends!r}")
        if self.noise < 0 or self.warmup_s < 0 or self.observe_every_s < 0:
            raise SpecError("noise, warmup_s and observe_every_s must be >= 0")


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
    t_wall = time.perf_counter()
    pol, advisor, hide = make_setup(policy, **(policy_options or {}))
    free_costs = bool(getattr(pol, "ignores_costs", False))
    horizon = FragmentHorizon(quantile=opts.horizon_quantile) if opts.horizon else None
    if horizon is not None and history is not None:
        h = history.fragments
        past = h[h["end_s"] <= trace.start_s]
        horizon.record_many((past["end_s"] - past["start_s"]).to_numpy())
    ctl = Controller(
        policy=pol,
        advisor=advisor or KnownCurves(),
        max_active=None if free_costs and not getattr(pol, "keeps_cap", False)
        else opts.max_active,
        tfwd_s=opts.tfwd_s,
        keep_history=True,
        horizon=horizon,
    )
    rng = np.random.default_rng(opts.seed)
    t0, t1 = trace.start_s, trace.end_s

    f = trace.fragments.sort_values(["start_s", "node"], kind="stable")
    st_t, st_node = f["start_s"].to_numpy(), f["node"].tolist()
    st_end = f["end_s"].to_numpy()
    st_known = f["known_end"].to_numpy(bool) | (rng.random(len(f)) < opts.reveal_ends)
    e = f.sort_values(["end_s", "node"], kind="stable")
    en_t, en_node, en_start = e["end_s"].to_numpy(), e["node"].tolist(), e["start_s"].to_numpy()
    todo = sorted((j for j in jobs if j.submit_s < t1), key=lambda j: j.submit_s)
    if not all(j.curve is not None for j in todo):
        raise SpecError("every simulated job needs its true curve (JobSpec(curve=...))")
    runs = {j.job_id: _Run(j) for j in todo}
    fin: list[tuple[float, int, str]] = []
    running: set[str] = set()

    ev_rows: list[list] = []
    size_rows: list[tuple] = []
    solve: list[float] = []
    totals = dict(used=0.0, rescales=0, pause=0.0, ppause=0.0, pcost=0.0, preempt=0, replans=0)
    si = ei = ji = 0
    now = t0
    n_ev = n_done = n_act = 0

    def advance(t: float) -> None:
        dt = t - now
        if dt <= 0:
            return
        used, gained = 0, 0.0
        for jid in running:
            r = runs[jid]
            used += r.size
            eff = t - max(now, r.pause_until)
            if eff > 0:
                before = r.done
                r.done = min(r.spec.total_samples, r.done + r.rate * eff)
                gained += r.done - before
        totals["used"] += used * dt
        if ev_rows:  # the previous event's row: mean throughput until this event
            ev_rows[-1][5] = gained / dt

    def schedule_finish(r: _Run, t: float) -> None:
        r.version += 1
        if r.size > 0 and r.rate > 0 and math.isfinite(r.spec.total_samples):
            left = (r.spec.total_samples - r.done) / r.rate
            heapq.heappush(fin, (max(t, r.pause_until) + left, r.version, r.spec.job_id))

    while True:
        nxt = min(
            st_t[si] if si < len(st_t) else math.inf,
            en_t[ei] if ei < len(en_t) else math.inf,
            max(todo[ji].submit_s, t0) if ji < len(todo) else math.inf,
            fin[0][0] if fin else math.inf,
        )
        if nxt >= t1:
            advance(t1)
            now = t1
            break
        advance(nxt)
        now = nxt
        n_ev += 1
        must_replan = False
        # 1. nodes taken back
        gone = []
        while ei < len(en_t) and en_t[ei] <= now:
            gone.append(en_node[ei])
            if horizon is not None and en_t[ei] < t1:
                horizon.record(en_t[ei] - en_start[ei])
            ei += 1
        lost = ctl.remove_nodes(gone, now_s=now) if gone else {}
        if lost:
            must_replan = True
        # 2. jobs done
        while fin and fin[0][0] <= now:
            _, ver, jid = heapq.heappop(fin)
            r = runs[jid]
            if ver != r.version or r.finished_s is not None:
                continue
            r.done, r.finished_s, r.size, r.rate = r.spec.total_samples, now, 0, 0.0
            running.discard(jid)
            ctl.finish(jid, now_s=now)
            n_done += 1
            size_rows.append((now, jid, 0))
            must_replan = True
        # 3. new idle nodes and new jobs
        added, ends = [], {}
        while si < len(st_t) and st_t[si] <= now:
            added.append(st_node[si])
            if st_known[si]:
                ends[st_node[si]] = float(st_end[si])
            si += 1
        if added:
            ctl.add_nodes(added, now_s=now, end_s=ends)
            must_replan = True
        while ji < len(todo) and max(todo[ji].submit_s, t0) <= now:
            spec = todo[ji]
            ctl.submit(dataclasses.replace(spec, curve=None) if hide else spec, now_s=now)
            ji += 1
            must_replan = True
        # 4. measurements for a learning advisor
        if hide:
            for jid in running:
                r = runs[jid]
                if now - r.steady_since >= opts.warmup_s and now - r.last_observed >= opts.observe_every_s:
                    noisy = max(0.0, r.rate * (1 + opts.noise * rng.standard_normal()))
                    ctl.observe(jid, n_nodes=r.size, samples_per_s=noisy, now_s=now)
                    r.last_observed = now
                    must_replan = True
        # 5. replan and carry out the plan
        n_changed, solve_ms = 0, 0.0
        if ji > n_done and (must_replan or not opts.skip_idle_removals):
            plan = ctl.replan(now_s=now)
            totals["replans"] += 1
            solve.append(ctl.history[-1].solve_s)
            solve_ms = solve[-1] * 1e3
            ctl.history.clear()
            changed = set(plan.changed_jobs) | set(lost)
            for jid in changed:
                r = runs[jid]
                new_size = ctl.allocation.size(jid)
                grows = jid in plan.start or jid in plan.grow
                if jid in lost:
                    totals["preempt"] += 1
                if new_size == 0:
                    r.size, r.rate = 0, 0.0
                    running.discard(jid)
                    r.version += 1
                    size_rows.append((now, jid, 0))
                    continue
                pause = 0.0 if free_costs else (
                    r.spec.rescale_up_s if grows else r.spec.rescale_down_s
                )
                r.pause_until = max(r.pause_until, now + pause)
                r.size, r.rate = new_size, r.spec.curve.rate(new_size)  # type: ignore[union-attr]
                r.steady_since = r.pause_until
                r.rescales += 1
                r.pause_s += pause
                if r.first_start_s is None:
                    r.first_start_s = now
                running.add(jid)
                totals["rescales"] += 1
                totals["pause"] += pause
                if jid in lost:
                    totals["ppause"] += pause
                    totals["pcost"] += pause * r.rate
                if hide and pause > 0:
                    ctl.observe_rescale(jid, kind="up" if grows else "down", pause_s=pause)
                schedule_finish(r, now)
                size_rows.append((now, jid, new_size))
            n_changed = len(changed)
        if must_replan:
            n_act = len(ctl.active_jobs)
        ev_rows.append([
            now, len(ctl.nodes), sum(runs[j].size for j in running), n_act, ji - n_done - n_act,
            0.0, solve_ms, n_changed,
        ])
        if progress is not None and n_ev % 200 == 0:
            progress((now - t0) / (t1 - t0))
    if progress is not None:
        progress(1.0)

    job_rows = [
        (r.spec.job_id, r.spec.model, r.spec.submit_s, r.first_start_s, r.finished_s, r.done,
         r.rescales, r.pause_s)
        for r in runs.values() if r.spec.submit_s < t1
    ]
    return SimResult(
        policy=policy,
        trace=trace.name,
        start_s=t0,
        end_s=t1,
        samples=float(sum(r.done for r in runs.values())),
        idle_node_s=trace.idle_node_seconds(),
        used_node_s=totals["used"],
        rescales=int(totals["rescales"]),
        pause_s=totals["pause"],
        preempt_pause_s=totals["ppause"],
        preempt_cost_samples=totals["pcost"],
        preemptions=int(totals["preempt"]),
        jobs_done=sum(r.finished_s is not None for r in runs.values()),
        jobs_submitted=len(todo),
        solve_s=np.asarray(solve),
        wall_s=time.perf_counter() - t_wall,
        events=pd.DataFrame(ev_rows, columns=EVENT_COLUMNS),
        sizes=pd.DataFrame(size_rows, columns=SIZE_COLUMNS),
        jobs=pd.DataFrame(job_rows, columns=[
            "job", "model", "submit_s", "start_s", "finish_s", "samples", "rescales", "pause_s",
        ]),
        replans=int(totals["replans"]),
    )
