"""``malleparsl bench worst-decisions``: find the slowest allocation decisions of a replay.

A control loop stalls as long as its slowest decision, so medians hide what matters. This
replays one simulator case with the policy wrapped in :class:`SlowestDecisions`, which times
every ``allocate`` call in wall *and* process CPU time (on a loaded machine wall time mostly
measures the wait for a core), keeps the ``top`` slowest by CPU time with their inputs, and
prints them with their size (jobs, nodes, options before and after the reduction, how the
solve ended). ``--dump DIR`` pickles those instances; ``--resolve FILE`` re-solves one alone,
so a slow case can be studied without replaying days of trace::

    malleparsl bench worst-decisions --trace theta --nodes 0:512 --hours 48 --dump /tmp/worst
    malleparsl bench worst-decisions --resolve /tmp/worst/worst_0.pkl --repeats 5
"""

from __future__ import annotations

import heapq
import json
import os
import pickle
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import typer

from malleparsl.allocator.base import AllocationPolicy, ClusterSnapshot, JobView
from malleparsl.model import Allocation

__all__ = ["SlowestDecisions", "bench_worst_decisions", "replay_instance", "run_recorded"]


class SlowestDecisions(AllocationPolicy):
    """Wrap a policy; time every decision and keep the ``top`` slowest (by CPU time) with inputs."""

    def __init__(self, inner: AllocationPolicy, *, top: int = 5) -> None:
        self.inner = inner
        self.top = top
        self.wall_s: list[float] = []
        self.cpu_s: list[float] = []
        self._heap: list[tuple[float, int, dict[str, Any], bytes]] = []

    def allocate(self, snapshot: ClusterSnapshot, jobs: Sequence[JobView]) -> Allocation:
        w0, c0 = time.perf_counter(), time.process_time()
        out = self.inner.allocate(snapshot, jobs)
        cpu, wall = time.process_time() - c0, time.perf_counter() - w0
        self.wall_s.append(wall)
        self.cpu_s.append(cpu)
        if len(self._heap) < self.top or cpu > self._heap[0][0]:
            info = {
                "decision": len(self.cpu_s) - 1,
                "now_s": snapshot.now_s,
                "wall_ms": round(1e3 * wall, 2),
                "cpu_ms": round(1e3 * cpu, 2),
                "jobs": len(jobs),
                "nodes": len(snapshot.nodes),
                **dict(getattr(self.inner, "last_stats", None) or {}),
            }
            blob = pickle.dumps((snapshot, list(jobs)))
            item = (cpu, len(self.cpu_s), info, blob)
            if len(self._heap) < self.top:
                heapq.heappush(self._heap, item)
            else:
                heapq.heapreplace(self._heap, item)
        return out

    def slowest(self) -> list[tuple[dict[str, Any], bytes]]:
        """The kept decisions, slowest first: (figures, pickled ``(snapshot, jobs)``)."""
        return [(info, blob) for _, _, info, blob in sorted(self._heap, reverse=True)]

    def figures(self) -> dict[str, float]:
        """Median, p95 and max of wall and CPU time per decision, in ms."""
        out: dict[str, float] = {"decisions": float(len(self.wall_s))}
        for name, xs in (("wall", self.wall_s), ("cpu", self.cpu_s)):
            a = 1e3 * np.asarray(xs or [0.0])
            out |= {
                f"{name}_median_ms": round(float(np.median(a)), 2),
                f"{name}_p95_ms": round(float(np.percentile(a, 95)), 2),
                f"{name}_max_ms": round(float(a.max()), 2),
            }
        return out


def run_recorded(  # noqa: PLR0913 - the simulate options that select a case
    *,
    trace: str,
    nodes: str,
    jobs: str,
    hours: float,
    start_h: float | None,
    policy: str,
    max_active: int,
    seed: int = 0,
    top: int = 5,
    policy_options: dict | None = None,
    semantics: str = "default",
) -> tuple[SlowestDecisions, Any]:
    """Replay a case as ``malleparsl simulate`` would, with the policy wrapped."""
    from malleparsl.sim.bftrainer import _BFReplay
    from malleparsl.sim.engine import SimOptions, _Replay
    from malleparsl.sim.windows import select_case
    from malleparsl.traces import load_trace

    full = load_trace(trace, nodes=nodes)
    case = select_case(full, trace, jobs, hours=hours, start_h=start_h, seed=seed)
    specs = case.specs
    opts = SimOptions(max_active=max_active or None, seed=seed, semantics=semantics)
    win, popts = case.window, policy_options or {}
    if semantics == "bftrainer":
        rep: Any = _BFReplay(
            win, specs, policy, opts.max_active, opts.tfwd_s, popts, full, opts.horizon
        )
    else:
        rep = _Replay(win, specs, policy, opts, popts, full)
    rec = SlowestDecisions(rep.ctl.policy, top=top)
    rep.ctl.policy = rec
    w0 = time.perf_counter()
    rep.run(None)
    return rec, rep.result(time.perf_counter() - w0)


def replay_instance(path: Path, policy: AllocationPolicy, repeats: int) -> dict[str, Any]:
    """Re-solve a dumped instance ``repeats`` times; times and the objective reached."""
    from malleparsl.allocator.objective import allocation_objective

    data = pickle.loads(path.read_bytes())
    snap, views = data["snapshot"], data["jobs"]
    walls, cpus, value = [], [], None
    for _ in range(repeats):
        w0, c0 = time.perf_counter(), time.process_time()
        alloc = policy.allocate(snap, views)
        cpus.append(time.process_time() - c0)
        walls.append(time.perf_counter() - w0)
        value = allocation_objective(snap, views, alloc)
    return {
        "instance": str(path),
        "jobs": len(views),
        "nodes": len(snap.nodes),
        "recorded_cpu_ms": data["info"].get("cpu_ms"),
        "wall_ms": [round(1e3 * w, 2) for w in walls],
        "cpu_ms": [round(1e3 * c, 2) for c in cpus],
        "objective": value,
        **dict(getattr(policy, "last_stats", None) or {}),
    }


def _policy_options(pairs: list[str]) -> dict[str, Any]:
    """``["dp=false", "time_limit_s=5"]`` -> ``{"dp": False, "time_limit_s": 5}``."""
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key.strip():
            raise typer.BadParameter(f"--option {pair!r}: write KEY=VALUE, e.g. time_limit_s=5")
        try:
            out[key.strip()] = json.loads(raw)
        except json.JSONDecodeError:
            out[key.strip()] = raw
    return out


def bench_worst_decisions(  # noqa: PLR0913 - CLI options
    trace: str = typer.Option("summit", help="Trace: 'summit', 'theta', a CSV or an SWF log."),
    nodes: str = typer.Option("0:128", help="Node slice START:END."),
    jobs: str = typer.Option("imagenet", help="Job set (as `malleparsl simulate --jobs`)."),
    hours: float = typer.Option(0.0, help="Window length in hours (0 = to the trace's end)."),
    start_h: float | None = typer.Option(None, help="Window start, hours since the trace start."),
    policy: str = typer.Option("milp", help="Policy (setup) to time."),
    max_active: int = typer.Option(10, help="Concurrent-job cap (0 = none)."),
    semantics: str = typer.Option("default", help="Accounting: 'default' or 'bftrainer'."),
    seed: int = typer.Option(0, help="Seed of generated jobs (poisson:N)."),
    top: int = typer.Option(5, help="How many of the slowest decisions to keep."),
    dump: Path | None = typer.Option(None, help="Pickle the slowest instances here."),  # noqa: B008
    resolve: Path | None = typer.Option(None, help="Re-solve this dumped instance instead."),  # noqa: B008
    repeats: int = typer.Option(3, help="With --resolve: solves of the instance."),
    option: list[str] = typer.Option(  # noqa: B008 - typer's way
        [], help="Policy option KEY=VALUE (VALUE in JSON), e.g. dp=false time_limit_s=5."
    ),
) -> None:
    """The slowest decisions of one replay (wall and CPU time, instance size), or one re-solved."""
    from malleparsl.sim.setups import make_setup

    options = _policy_options(option)
    if resolve is not None:
        row = replay_instance(resolve, make_setup(policy, **options)[0], repeats)
        sys.stdout.write(json.dumps(row) + "\n")
        return
    rec, res = run_recorded(
        trace=trace, nodes=nodes, jobs=jobs, hours=hours, start_h=start_h, policy=policy,
        max_active=max_active, top=top, policy_options=options, semantics=semantics,
        seed=seed,
    )
    head = {
        "case": f"{trace} {nodes} {jobs} start_h={start_h} hours={hours} cap={max_active} "
        f"{semantics} seed={seed}",
        "policy": policy,
        "options": options,
        "samples": res.samples,
        "load_avg_1m": round(os.getloadavg()[0], 2),
        "sim_wall_s": round(res.wall_s, 1),
        **rec.figures(),
    }
    sys.stdout.write(json.dumps(head) + "\n")
    if dump is not None:
        dump.mkdir(parents=True, exist_ok=True)
    for k, (info, blob) in enumerate(rec.slowest()):
        sys.stdout.write(json.dumps(info) + "\n")
        if dump is not None:
            snap, views = pickle.loads(blob)
            payload = {"policy": policy, "info": info, "snapshot": snap, "jobs": views}
            (dump / f"worst_{k}.pkl").write_bytes(pickle.dumps(payload))
