"""Where the free-running loss of ``milp+jpa`` against the oracle goes (docs/jpa-log.md, session 9).

Replays a zoo family (or ImageNet) under the oracle (``milp``, true curves) and ``milp+jpa``,
both audited (:class:`~malleparsl.jpa.audit.DecisionAudit`; the answers are unchanged), and
splits the gap of the JPA's samples (and normalised progress) against the oracle's exactly:

- ``decision``: the JPA's choices against the optimum of the allocator's objective *in the
  JPA's own state* (same jobs, nodes held, free nodes), valued by true rates: what decision
  efficiency sees (there weighted by samples and with pauses at their myopic cost);
- ``state``: that optimum against what the oracle trains at the same time in *its* state:
  other jobs active (under the cap of 10 a job finishing later delays the next admission),
  other sizes held (a rescale costs a pause, so sizes reached persist);
- ``pauses``: samples (progress) actually lost in rescale pauses, oracle minus JPA.

Rates are integrated over the decisions (time until the next one), as the audit does; the
progress versions weigh each job's rate by ``1 / total_samples``. Also per run, from the
per-job table and the size log with the true curves: node-seconds offered, used, idle;
``excess`` node-seconds (a job's nodes beyond the smallest size at least as fast) and the part
held while no node was idle; probe node-seconds; rescales; jobs started and finished; the extra
residence (start to finish) of the jobs both finished.

    python scripts/jpa_free_running.py --families plateau,long,peak,short --nodes 0:512 --seeds 0-3
    python scripts/jpa_free_running.py --families plateau --seeds 0 --true-curves   # mechanics
"""

from __future__ import annotations

import argparse
import json
import math

import numpy as np
import pandas as pd

from malleparsl.allocator.base import make_policy
from malleparsl.jpa.advisor import JobProfilingAdvisor
from malleparsl.jpa.audit import DecisionAudit
from malleparsl.jpa.bench_zoo import parse_seeds, zoo_case
from malleparsl.jpa.sim_setups import SIM_DEFAULTS
from malleparsl.sim.engine import SimOptions, simulate
from malleparsl.sim.setups import register_setup
from malleparsl.traces import load_trace


class RateAudit(DecisionAudit):
    """Also each decision's true progress rate (chosen and optimum): rates / job's total."""

    def __init__(self, truth):  # noqa: ANN001
        super().__init__(truth)
        self.prog: list[tuple[float, float]] = []

    def allocate(self, snapshot, jobs):  # noqa: ANN001, ANN201
        from malleparsl.allocator.objective import best_count_objective

        alloc = super().allocate(snapshot, jobs)
        true = [self._true_view(v) for v in jobs]
        _, best = best_count_objective(snapshot, true)
        self.prog.append(tuple(sum(v.curve.rate(k(v.job_id)) / v.spec.total_samples for v in true)
                               for k in (alloc.size, best.__getitem__)))
        return alloc

    def integrals(self, end_s: float) -> dict[str, float]:
        ds = self.decisions
        dt = np.diff([d.now_s for d in ds] + [max(end_s, ds[-1].now_s)])
        return {"chosen": float(dt @ [d.rate_chosen for d in ds]),
                "best": float(dt @ [d.rate_best for d in ds]),
                "chosen_p": float(dt @ [p[0] for p in self.prog]),
                "best_p": float(dt @ [p[1] for p in self.prog])}


_ORACLE: list[RateAudit] = []
register_setup("milp-audited", lambda **o: (_ORACLE[-1].bind(make_policy("milp")), None, False))


def records(res, specs) -> dict:  # noqa: ANN001
    """Node-seconds, excess, pause losses, jobs, from the per-job table and the size log."""
    fin = {r.job: (float(r.finish_s) if pd.notna(r.finish_s) else res.end_s)
           for r in res.jobs.itertuples()}
    last: dict[str, tuple[float, int]] = {}
    segs: dict[str, list] = {j: [] for j in specs}
    for t, j, n in res.sizes.itertuples(index=False):
        if j in last and last[j][1] > 0 and t > last[j][0]:
            segs[j].append((last[j][0], min(t, fin[j]), last[j][1]))
        last[j] = (t, n)
    for j, (t0, n0) in last.items():
        if n0 > 0 and fin[j] > t0:
            segs[j].append((t0, fin[j], n0))
    ev = res.events
    t = ev["time_s"].to_numpy()
    ends = np.append(t[1:], res.end_s)
    idle = np.maximum(ev["idle_nodes"].to_numpy() - ev["used_nodes"].to_numpy(), 0)
    gross = gross_p = excess = 0.0
    steps: list[tuple[float, int]] = []
    for j, spec in specs.items():
        r = spec.curve.rates_upto(max(spec.max_nodes, 1))
        for t0, t1, n in segs[j]:
            n = min(n, len(r) - 1)
            m = int(np.argmax(r[1 : n + 1] >= r[n] * (1 - 1e-9))) + 1  # smallest as fast
            gross += r[n] * (t1 - t0)
            gross_p += r[n] * (t1 - t0) / spec.total_samples
            excess += (n - m) * (t1 - t0)
            if n > m:
                steps += [(t0, n - m), (t1, m - n)]
    steps.sort()
    st = np.array([s[0] for s in steps])
    level = np.cumsum([s[1] for s in steps]) if steps else np.zeros(0)
    ex_full = 0.0  # excess held while no node was idle: nodes another job could have had
    for k in np.flatnonzero(idle <= 0):
        a0, a1 = t[k], ends[k]
        i = int(np.searchsorted(st, a0, side="right")) - 1
        while a0 < a1:
            b = min(a1, st[i + 1] if i + 1 < len(st) else math.inf)
            ex_full += (level[i] if i >= 0 else 0.0) * (b - a0)
            a0, i = b, i + 1
    jt = res.jobs
    return {"samples": res.samples, "progress": res.progress, "offered_ns": res.idle_node_s,
            "used_ns": res.used_node_s, "idle_ns": float((ends - t) @ idle),
            "excess_ns": excess, "excess_full_ns": ex_full, "rescales": res.rescales,
            "pause_loss": gross - res.samples, "pause_loss_p": gross_p - res.progress,
            "started": int(jt["start_s"].notna().sum()), "finished": int(jt["finish_s"].notna().sum()),
            "fin": {r.job: (float(r.start_s), float(r.finish_s)) for r in jt.itertuples()
                    if pd.notna(r.finish_s)}}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--families", required=True)
    ap.add_argument("--nodes", default="0:512")
    ap.add_argument("--seeds", default="0,1")
    ap.add_argument("--hours", type=float, default=24.0)
    ap.add_argument("--noise", type=float, default=0.03)
    ap.add_argument("--true-curves", action="store_true",
                    help="hand the advisor every job's true curve (hide_curves=False): mechanics only")
    a = ap.parse_args()
    for sl in a.nodes.split(","):
        full = load_trace("summit", nodes=sl)
        for fam in a.families.split(","):
            for seed in parse_seeds(a.seeds):
                tr, specs = zoo_case(full, fam, seed=seed, hours=a.hours)
                truth = {j.job_id: j for j in specs}
                live = {j.job_id: j for j in specs if j.submit_s < tr.end_s}
                opts = SimOptions(noise=a.noise, seed=seed)
                _ORACLE.append(RateAudit(truth))
                ro = simulate(tr, specs, policy="milp-audited", options=opts)
                adv = JobProfilingAdvisor(**SIM_DEFAULTS)
                audit = RateAudit(truth)
                rj = simulate(tr, specs, policy="milp+jpa", options=opts, policy_options={
                    "advisor": adv, "audit": audit, "hide_curves": not a.true_curves})
                if ro.samples <= 0 or ro.progress <= 0:
                    raise SystemExit(f"{fam} {sl} seed {seed}: the oracle trained nothing in "
                                     f"{a.hours} h: nothing to compare (a longer --hours)")
                o, j = records(ro, live), records(rj, live)
                io, ij = _ORACLE[-1].integrals(ro.end_s), audit.integrals(rj.end_s)
                split = {}
                for p, key in (("", "samples"), ("_p", "progress")):
                    ref = o[key] / 100
                    split[key] = {
                        "gap": (j[key] - o[key]) / ref,
                        "decision": (ij["chosen" + p] - ij["best" + p]) / ref,
                        "state": (ij["best" + p] - io["chosen" + p]) / ref,
                        "pauses": (o["pause_loss" + p] - j["pause_loss" + p]) / ref,
                    }
                of, jf = o.pop("fin"), j.pop("fin")
                both = set(of) & set(jf)
                extra = sum((jf[k][1] - jf[k][0]) - (of[k][1] - of[k][0]) for k in both)
                row = {"family": fam, "nodes": sl, "seed": seed, "true_curves": a.true_curves,
                       "pct_samples": 100 * rj.samples / ro.samples,
                       "pct_progress": 100 * rj.progress / ro.progress,
                       **audit.summary(rj.end_s), "split": split,
                       "probe_ns": adv.probe_ns, "extra_residence_h": extra / 3600,
                       "jobs_both_finished": len(both), "oracle": o, "jpa": j}
                print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
