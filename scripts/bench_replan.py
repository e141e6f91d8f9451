"""Replan time of the shared Controller with many jobs, per policy.

Usage: python scripts/bench_replan.py [jobs] [nodes] [reps] [policies]. Jobs have no plans
(the common case); the controller has the live default PlanProfiler, so adjust() runs too.
Each rep removes one node and adds it back (two replans), so the policy sees a changing input.
Prints the median and the minimum per replan; on a shared machine compare minima of
interleaved runs.
"""
import statistics
import sys
import time

import numpy as np

from malleparsl.allocator import make_policy
from malleparsl.controller import Controller
from malleparsl.jpa.plans import PlanProfiler
from malleparsl.model import JobSpec, ScalingCurve

J = int(sys.argv[1]) if len(sys.argv) > 1 else 200
N = int(sys.argv[2]) if len(sys.argv) > 2 else 512
REPS = int(sys.argv[3]) if len(sys.argv) > 3 else 20
POLS = (sys.argv[4] if len(sys.argv) > 4 else "hold,equal-share,greedy,milp,milp-horizon").split(",")
rng = np.random.default_rng(0)
curves = [ScalingCurve.amdahl(rate1=float(rng.uniform(50, 500)), parallel_fraction=float(p),
                              max_nodes=64) for p in rng.uniform(0.8, 0.999, 40)]
for pol in POLS:
    ctl = Controller(policy=make_policy(pol), max_active=None, plans=PlanProfiler(),
                     keep_history=False)
    nodes = [f"n{i:04d}" for i in range(N)]
    ctl.add_nodes(nodes, now_s=0)
    for i in range(J):
        c = curves[i % len(curves)]
        ctl.submit(JobSpec(f"j{i}", min_nodes=1 + i % 3, max_nodes=64, curve=c,
                           rescale_up_s=15, rescale_down_s=10, total_samples=1e8,
                           submit_s=float(i)), now_s=0)
    ctl.replan(now_s=0)
    ts = []
    t = 1.0
    for r in range(REPS):
        node = nodes[r % N]
        for step in (0, 1):
            if step == 0:
                ctl.remove_nodes([node], now_s=t)
            else:
                ctl.add_nodes([node], now_s=t)
            t0 = time.perf_counter()
            ctl.replan(now_s=t)
            ts.append(time.perf_counter() - t0)
            t += 60
    print(f"{pol:14s} jobs={J} nodes={N} replans={len(ts)} median_ms={1e3*statistics.median(ts):.2f} "
          f"min_ms={1e3*min(ts):.2f}", flush=True)
