"""State-matched comparison of JPA planning-curve variants (docs/jpa-log.md, decision efficiency).

Replays the default ``milp+jpa`` (the trajectory is the default's) and, at each decision, also
computes what each variant would choose in exactly that state: the variant's planning curves
from the same records (their caches saved and restored), the same probes, the same inner
policy; both scored by :class:`~malleparsl.jpa.audit.DecisionAudit` with the true curves. Prints
one JSON row per run: default decision efficiency and, per variant, the difference in points and
the share of time the variant is worse in the same state. A variant sets advisor attributes
(``adv.NAME:VALUE``) or constants of ``jpa.estimate`` / ``jpa.knowledge`` (``est.`` / ``kn.``).

    python scripts/jpa_state_matched.py --families dip,peak --nodes 0:512 --seeds 0-3 \
        --variant k2=adv.kappa:2 --variant beyond1=est.BEYOND_SIGMA:1.0

``--diagnose`` instead attributes the estimate loss of the default replay to jobs, one at a
time fixed at the JPA's size in the optimum, by kind (under / over the optimum's size; inside,
beyond or below the sizes explored; fitted or model-free; nodes idle; started from a prior):

    python scripts/jpa_state_matched.py --diagnose --families dip,peak --nodes 0:512 --seeds 0,1
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import sys

import numpy as np

import malleparsl.jpa.estimate as est_mod
import malleparsl.jpa.knowledge as kn_mod
from malleparsl.jpa.advisor import JobProfilingAdvisor
from malleparsl.jpa.audit import DecisionAudit
from malleparsl.jpa.bench_zoo import parse_seeds, zoo_case
from malleparsl.jpa.sim_setups import SIM_DEFAULTS
from malleparsl.sim.engine import SimOptions, simulate
from malleparsl.traces import load_trace


def parse_variant(text: str) -> tuple[str, list[tuple[str, str, object]]]:
    name, _, body = text.partition("=")
    sets = []
    for part in body.split(","):
        target, value = part.split(":")
        where, attr = target.split(".")
        v: object = {"True": True, "False": False, "None": None}.get(value, value)
        if isinstance(v, str):
            v = float(v)
        sets.append((where, attr, v))
    return name, sets


class VariantAudit(DecisionAudit):
    def __init__(self, truth, variants):  # noqa: ANN001
        super().__init__(truth)
        self.variants = variants
        self.vdec: dict[str, list] = {name: [] for name, _ in variants}

    def allocate(self, snapshot, jobs):  # noqa: ANN001, ANN201
        for name, sets in self.variants:
            vjobs = self._variant_views(snapshot, jobs, sets)
            # a copy: a stateful policy (learn_hold, arrivals, tie_seed) must learn only from
            # the real run's decisions, not from the variants'
            valloc = copy.deepcopy(self.policy).allocate(snapshot, vjobs)
            self.vdec[name].append(self._score(snapshot, jobs, valloc))
        return super().allocate(snapshot, jobs)

    def _variant_views(self, snapshot, jobs, sets):  # noqa: ANN001, ANN202
        adv: JobProfilingAdvisor = self.advisor  # type: ignore[assignment]
        old = []
        for where, attr, v in sets:
            obj = {"adv": adv, "est": est_mod, "kn": kn_mod}[where]
            old.append((obj, attr, getattr(obj, attr)))
            setattr(obj, attr, v)
        saved_pred = dict(adv._last_pred)
        out = []
        try:
            for v in jobs:
                rec = adv.records.get(v.job_id)
                if rec is None or rec.probe is not None or not adv.predictable(rec):
                    out.append(v)
                    continue
                cache, plans = rec._cache, rec.plan_cache
                rec._cache, rec.plan_cache = None, {}
                try:
                    n_tab = max(
                        v.spec.min_nodes, min(v.spec.max_nodes, max(len(snapshot.nodes), 1))
                    )
                    curve = adv.planning_curve(rec, n_tab)
                finally:
                    rec._cache, rec.plan_cache = cache, plans
                out.append(dataclasses.replace(v, curve=curve) if curve is not None else v)
        finally:
            for obj, attr, val in reversed(old):
                setattr(obj, attr, val)
            adv._last_pred = saved_pred
        return out


def eff(decs, end_s):  # noqa: ANN001, ANN201
    if not decs:
        raise SystemExit("no decisions were audited: nothing to compare")
    t = np.array([d.now_s for d in decs] + [max(end_s, decs[-1].now_s)])
    dt = np.diff(t)
    best = np.array([d.best for d in decs])
    chosen = np.array([d.chosen for d in decs])
    return dt, best, chosen


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--families", required=True)
    ap.add_argument("--nodes", default="0:512")
    ap.add_argument("--seeds", default="0-3")
    ap.add_argument("--hours", type=float, default=24.0)
    ap.add_argument("--noise", type=float, default=0.03)
    ap.add_argument("--variant", action="append", default=[])
    a = ap.parse_args()
    variants = [parse_variant(v) for v in a.variant]
    for sl in a.nodes.split(","):
        full = load_trace("summit", nodes=sl)
        for fam in a.families.split(","):
            for seed in parse_seeds(a.seeds):
                tr, specs = zoo_case(full, fam, seed=seed, hours=a.hours)
                adv = JobProfilingAdvisor(**SIM_DEFAULTS)
                audit = VariantAudit({j.job_id: j for j in specs}, variants)
                res = simulate(
                    tr,
                    specs,
                    policy="milp+jpa",
                    options=SimOptions(noise=a.noise, seed=seed),
                    policy_options={"advisor": adv, "audit": audit},
                )
                dt, best, chosen = eff(audit.decisions, res.end_s)
                ref = float(dt @ best)
                if ref <= 0:
                    raise SystemExit(
                        f"{fam} {sl} seed {seed}: the optimum is worth 0 over the "
                        "window (no idle nodes?): nothing to compare"
                    )
                row = {
                    "family": fam,
                    "nodes": sl,
                    "seed": seed,
                    "default": 100 * float(dt @ chosen) / ref,
                    "samples": res.samples,
                }
                for name, _ in variants:
                    vch = np.array([d.chosen for d in audit.vdec[name]])
                    row[name] = 100 * float(dt @ (vch - chosen)) / ref
                    row[name + "_worse_t"] = float(dt @ (vch < chosen - 1e-9)) / float(dt.sum())
                print(json.dumps(row), flush=True)


class DiagAudit(DecisionAudit):
    """Attributes the estimate loss to jobs (one at a time fixed at the JPA's size), by kind."""

    def __init__(self, truth):  # noqa: ANN001
        super().__init__(truth)
        self.acc: dict[str, list[float]] = {}
        self._pending: list = []

    def allocate(self, snapshot, jobs):  # noqa: ANN001, ANN201
        from malleparsl.allocator.objective import best_count_objective
        from malleparsl.jpa.audit import best_value

        alloc = super().allocate(snapshot, jobs)
        adv = self.advisor
        true = [self._true_view(v) for v in jobs]
        n, tfwd = len(snapshot.nodes), snapshot.tfwd_s
        sizes = {v.job_id: alloc.size(v.job_id) for v in jobs}
        probes, unknown = self._constrained(jobs, sizes)
        fixed = {j: sizes[j] for j in probes | unknown}
        _, counts = best_count_objective(snapshot, true)
        base = self.decisions[-1].best_known_free
        idle = n - sum(sizes.values())
        items = []
        for v, tv in zip(jobs, true):
            j = v.job_id
            if j in fixed or sizes[j] == counts[j]:
                continue
            rec = adv.records[j]
            loss = base - best_value(true, n, tfwd, fixed | {j: sizes[j]})
            ex = rec.explored() or [1]
            own = rec.measured_sizes or [0]
            c, o = sizes[j], counts[j]
            if o > c:
                kind = "under_beyond" if o > max(ex) else "under_inside"
            elif c > max(ex):
                kind = "over_beyond"
            elif o < min(own):
                kind = "over_below_own"
            else:
                kind = "over_inside"
            est = rec._cache[1] if rec._cache else None
            kind += "_mf" if est is not None and est.model_free else "_fit"
            kind += "_idle" if idle > 0 else ""
            kind += "_prior" if rec.prior is not None else ""
            pc = v.curve
            ratio_o = pc.rate(o) / max(tv.curve.rate(o), 1e-12) if o > 0 else 1.0
            ratio_c = pc.rate(c) / max(tv.curve.rate(c), 1e-12) if c > 0 else 1.0
            items.append((kind, loss, ratio_o, ratio_c))
        self._pending.append((snapshot.now_s, items))
        return alloc

    def table(self, end_s, ref):  # noqa: ANN001, ANN201
        t = [p[0] for p in self._pending] + [end_s]
        out: dict[str, list[float]] = {}
        for (now, items), nxt in zip(self._pending, t[1:]):
            dt = max(nxt - now, 0.0)
            for kind, loss, ro, rc in items:
                a = out.setdefault(kind, [0.0, 0.0, 0.0, 0.0])
                a[0] += dt * loss
                a[1] += dt * loss * ro
                a[2] += dt * loss * rc
                a[3] += dt
        return {
            k: {
                "pts": round(100 * a[0] / ref, 2),
                "plan/true at opt": round(a[1] / a[0], 2) if a[0] else None,
                "plan/true at chosen": round(a[2] / a[0], 2) if a[0] else None,
                "time_h": round(a[3] / 3600, 1),
            }
            for k, a in sorted(out.items(), key=lambda kv: -kv[1][0])
        }


def diagnose() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--diagnose", action="store_true")
    ap.add_argument("--families", required=True)
    ap.add_argument("--nodes", default="0:512")
    ap.add_argument("--seeds", default="0")
    a = ap.parse_args()
    for sl in a.nodes.split(","):
        full = load_trace("summit", nodes=sl)
        for fam in a.families.split(","):
            for seed in parse_seeds(a.seeds):
                tr, specs = zoo_case(full, fam, seed=seed, hours=24)
                adv = JobProfilingAdvisor(**SIM_DEFAULTS)
                audit = DiagAudit({j.job_id: j for j in specs})
                res = simulate(
                    tr,
                    specs,
                    policy="milp+jpa",
                    options=SimOptions(noise=0.03, seed=seed),
                    policy_options={"advisor": adv, "audit": audit},
                )
                dt, best, chosen = eff(audit.decisions, res.end_s)
                ref = float(dt @ best)
                if ref <= 0:
                    raise SystemExit(
                        f"{fam} {sl} seed {seed}: the optimum is worth 0 over the "
                        "window (no idle nodes?): nothing to compare"
                    )
                s = audit.summary(res.end_s)
                print(
                    json.dumps(
                        {
                            "family": fam,
                            "nodes": sl,
                            "seed": seed,
                            "eff": round(s["decision_eff"], 2),
                            "est": round(s["de_loss_estimate"], 2),
                            "kinds": audit.table(res.end_s, ref),
                        }
                    ),
                    flush=True,
                )


if __name__ == "__main__":
    sys.exit(diagnose() if "--diagnose" in sys.argv else main())
