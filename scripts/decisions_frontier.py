"""One replay (a window or the whole trace), samples at 24 / 72 / 168 h and the end, in one run.

docs/allocator.md, "Item 2: the 24 h window against the whole trace": a 24 h case is the first
day of the whole-trace run, so a policy's 24 h figure and its whole-trace figure are two points
of one trajectory. This builds the case as ``bench_decisions`` does (cap 10, default accounting)
and integrates ``SimResult.events`` (each interval's mean rate, pauses included) to those times.

    python scripts/decisions_frontier.py NODES HOURS ENTRY [ALPHA] [JOBS] [SEED]
    python scripts/decisions_frontier.py 0:128 0 "milp-horizon:...:slot=auto:tie_seed=1" 3
    python scripts/decisions_frontier.py 0:128 0 greedy 1 poisson:300:300 0

``HOURS`` 0 is the whole trace. ``ALPHA`` scales ``milp``'s slot tilt (``slot=...`` entries
only): each job's weight ``1 + ALPHA x S / r(lo)`` (``slot_weights`` replaced in this process;
1 is the shipped tilt). Prints one JSON line.
"""
import json
import sys
import time

import numpy as np

import malleparsl.allocator.milp as milp
from malleparsl.data import load_jobset
from malleparsl.sim.bench_decisions import parse_entry
from malleparsl.sim.engine import SimOptions, simulate
from malleparsl.sim.windows import replay_window
from malleparsl.sim.workloads import poisson_jobs
from malleparsl.traces import load_trace

nodes, hours, entry = sys.argv[1], float(sys.argv[2]), sys.argv[3]
alpha = float(sys.argv[4]) if len(sys.argv) > 4 else 1.0
jobs = sys.argv[5] if len(sys.argv) > 5 else "imagenet"
seed = int(sys.argv[6]) if len(sys.argv) > 6 else 0

if alpha != 1.0:
    def slot_weights(js, scale=1.0):
        lows = [float(j.curve.rate(max(1, j.lo))) for j in js]
        pos = [r for r in lows if r > 0]
        s = sum(pos) / len(pos) if pos else 0.0
        return [j.spec.weight * (1.0 + alpha * s / r) if r > 0 else j.spec.weight
                for j, r in zip(js, lows)]
    milp.slot_weights = slot_weights

full = load_trace("summit", nodes=nodes)
if jobs.startswith("poisson:"):
    _, n, mean = jobs.split(":")
    t0 = full.start_s + 20 * 3600
    specs = poisson_jobs(n_jobs=int(n), mean_interarrival_s=float(mean), seed=seed, start_s=t0)
else:
    specs = load_jobset(jobs)
    t0 = None  # a job log's replay opens at its first submission
tr = replay_window(full, hours, specs=specs, start_s=t0)
name, own = parse_entry(entry)
w = time.time()
r = simulate(tr, specs, policy=name, options=SimOptions(max_active=10, seed=seed), history=full,
             policy_options=own or None)
ev = r.events
t = ev["time_s"].to_numpy(float)
rate = ev["samples_per_s"].to_numpy(float)
ends = np.append(t[1:], r.end_s)
out = {"nodes": nodes, "hours": hours, "entry": entry, "alpha": alpha, "jobs": jobs, "seed": seed,
       "samples": r.samples, "jobs_done": r.jobs_done, "wall_s": time.time() - w,
       "start_s": r.start_s, "end_s": r.end_s, "integrated": float((rate * (ends - t)).sum()),
       "solve_median_ms": float(np.median(r.solve_s) * 1e3) if len(r.solve_s) else None,
       "solve_max_ms": float(np.max(r.solve_s) * 1e3) if len(r.solve_s) else None}
fin = r.jobs["finish_s"].to_numpy(float)
out["grid_h"] = list(range(12, 337, 12))
out["grid"] = [float((rate * np.clip(np.minimum(ends, r.start_s + 3600 * h) - t, 0, None)).sum()) for h in out["grid_h"]]
for h in (24, 72, 168):
    c = r.start_s + 3600 * h
    if c > r.end_s:
        continue
    out[f"s{h}"] = float((rate * np.clip(np.minimum(ends, c) - t, 0, None)).sum())
    out[f"done{h}"] = int(np.sum(fin <= c))
print(json.dumps(out), flush=True)
