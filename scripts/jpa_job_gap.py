"""Which jobs make a run's gap to the oracle, and what the JPA saw (docs/jpa-log.md, session 22).

Replays one zoo family (or ImageNet) on the Summit trace under the oracle (``milp``, true
curves) and ``milp+jpa``, then splits the gap job by job: each job's samples in both runs, its
share of normalised progress, when it started and finished, node-seconds and seconds running,
and its true curve (relative to one node). The per-job gaps sum exactly to the run's gap.

- ``--job J`` prints J's sizes over time in both runs;
- ``--window T0:T1`` prints the advisor's view at every decision in that window (seconds on the
  trace's clock): per job its size, whether it is probed, its planning curve against the truth
  at 1, 2, 4, 8, 16 and 32 nodes, and its readings (mean samples/s per size).

    python scripts/jpa_job_gap.py --family long --nodes 0:512 --seed 0
    python scripts/jpa_job_gap.py --family long --nodes 0:512 --seed 0 --job Z0007-long-0-5
    python scripts/jpa_job_gap.py --family dip --nodes 0:512 --seed 2 --window 56050:56053
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import numpy as np
import pandas as pd

from malleparsl.jpa.advisor import JobProfilingAdvisor
from malleparsl.jpa.bench_zoo import zoo_case
from malleparsl.jpa.sim_setups import SIM_DEFAULTS
from malleparsl.model import JobSpec
from malleparsl.sim.engine import SimOptions, SimResult, simulate
from malleparsl.traces import IdleTrace, load_trace

VIEW_SIZES = (1, 2, 4, 8, 16, 32)


def case(family: str, nodes: str, seed: int, hours: float = 24.0) -> tuple[IdleTrace, list[JobSpec]]:
    """The Summit window and the jobs of one case, as ``bench jpa --jobs zoo`` replays it."""
    return zoo_case(load_trace("summit", nodes=nodes), family, seed=seed, hours=hours)


def replay(trace: IdleTrace, specs: list[JobSpec], seed: int,
           on_views: Callable[[float, list, JobProfilingAdvisor], None] | None = None,
           ) -> tuple[SimResult, SimResult]:
    """The oracle's and the JPA's runs of one case; ``on_views`` sees each of the JPA's views."""
    opts = SimOptions(noise=0.03, seed=seed)
    oracle = simulate(trace, specs, policy="milp", options=opts)
    adv = JobProfilingAdvisor(**SIM_DEFAULTS)  # type: ignore[arg-type]
    if on_views is not None:
        views = adv.views

        def watched(snapshot, jobs, allocation):  # noqa: ANN001, ANN202
            out = views(snapshot, jobs, allocation)
            on_views(snapshot.now_s, out, adv)
            return out

        adv.views = watched  # type: ignore[method-assign]
    jpa = simulate(trace, specs, policy="milp+jpa", options=opts, policy_options={"advisor": adv})
    return oracle, jpa


def _held(sizes: pd.DataFrame, job: str, end_s: float) -> tuple[float, float]:
    """Node-seconds and seconds running (on any nodes) of ``job`` in a size log."""
    s = sizes[sizes.job == job].sort_values("time_s")
    if s.empty:
        return 0.0, 0.0
    dt = np.diff(np.append(s.time_s.to_numpy(float), end_s))
    n = s.nodes.to_numpy(float)
    return float((n * dt).sum()), float(dt[n > 0].sum())


def job_gaps(oracle: SimResult, jpa: SimResult, specs: list[JobSpec]) -> pd.DataFrame:
    """Per job: samples in both runs, the progress gap (JPA minus oracle, in jobs' worth),
    starts, finishes, node-seconds and running seconds; sorted by the progress gap."""
    o = oracle.jobs.set_index("job")
    j = jpa.jobs.set_index("job").reindex(o.index)
    out = pd.DataFrame({
        "samples_oracle": o.samples, "samples_jpa": j.samples.fillna(0.0),
        "total": o.total_samples, "start_oracle": o.start_s, "start_jpa": j.start_s,
        "finish_oracle": o.finish_s, "finish_jpa": j.finish_s,
    })
    out["progress_gap"] = (out.samples_jpa - out.samples_oracle) / out.total
    for name, res in (("oracle", oracle), ("jpa", jpa)):
        held = [_held(res.sizes, job, res.end_s) for job in out.index]
        out[f"node_s_{name}"] = [h[0] for h in held]
        out[f"run_s_{name}"] = [h[1] for h in held]
    curves = {s.job_id: s.curve for s in specs}
    out["curve"] = [
        [round(curves[job].rate(n) / curves[job].rate(1), 2)
         for n in VIEW_SIZES[1:] if n <= max(curves[job].nodes)]
        for job in out.index
    ]
    return out.sort_values("progress_gap")


def _view_printer(truth: dict[str, object], t0: float, t1: float):  # noqa: ANN202
    def show(now_s: float, views: list, adv: JobProfilingAdvisor) -> None:
        if not t0 <= now_s <= t1:
            return
        print(f"--- t = {now_s:.0f} s")
        for v in views:
            rec = adv.records[v.spec.job_id]
            top = max(v.curve.nodes)
            plan = [round(v.curve.rate(n)) if n <= top else None for n in VIEW_SIZES]
            true = [round(truth[v.spec.job_id].rate(n)) for n in VIEW_SIZES]  # type: ignore[attr-defined]
            obs = {n: round(float(np.mean(x))) for n, x in sorted(rec.obs.items()) if x}
            print(f"  {v.spec.job_id}: {len(v.current)} nodes, probed {rec.probe is not None}, "
                  f"predictable {adv.predictable(rec)}, prior {rec.prior is not None}\n"
                  f"    plan {plan}\n    true {true}\n    read {obs}")
    return show


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--family", required=True)
    ap.add_argument("--nodes", default="0:512")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--hours", type=float, default=24.0)
    ap.add_argument("--top", type=int, default=5, help="jobs to list, largest losses first")
    ap.add_argument("--job", help="print this job's sizes over time in both runs")
    ap.add_argument("--window", help="T0:T1, print the advisor's view at decisions in it")
    a = ap.parse_args(argv)
    trace, specs = case(a.family, a.nodes, a.seed, a.hours)
    hook = None
    if a.window:
        t0, t1 = (float(x) for x in a.window.split(":"))
        hook = _view_printer({s.job_id: s.curve for s in specs}, t0, t1)
    oracle, jpa = replay(trace, specs, a.seed, hook)
    gaps = job_gaps(oracle, jpa, specs)
    if not oracle.samples > 0:
        raise SystemExit(f"the oracle trained nothing in these {a.hours:g} h: no gap to split")
    print(f"{a.family} {a.nodes} seed {a.seed}: samples {100 * jpa.samples / oracle.samples:.1f} % "
          f"of the oracle, progress {100 * jpa.progress / oracle.progress:.1f} % "
          f"(gap {gaps.progress_gap.sum():+.3f} jobs' worth of {oracle.progress:.3f})")
    with pd.option_context("display.width", 250, "display.max_columns", 20):
        print(gaps.head(a.top).round({"progress_gap": 3, "start_oracle": 0, "start_jpa": 0,
                                      "finish_oracle": 0, "finish_jpa": 0, "node_s_oracle": 0,
                                      "node_s_jpa": 0, "run_s_oracle": 0, "run_s_jpa": 0}))
    if a.job:
        for name, res in (("oracle", oracle), ("jpa", jpa)):
            s = res.sizes[res.sizes.job == a.job].sort_values("time_s")
            print(f"{name}: " + ", ".join(f"{t:.0f}s:{n}" for t, n in zip(s.time_s, s.nodes)))


if __name__ == "__main__":
    main()
