"""Simulator job sets with memory profiles: DP-only needs several nodes, plan-aware does not."""

from __future__ import annotations

import pytest

from malleparsl.data import load_jobset
from malleparsl.errors import SpecError
from malleparsl.plans import parse_plan
from malleparsl.sim.engine import simulate
from malleparsl.sim.plans import mean_jct_all_h, plan_jobsets, unused_node_h
from malleparsl.traces import trace_from_fragments


@pytest.mark.parametrize("layout", ["summit", "one-gpu"])
def test_a_third_of_the_jobs_need_several_nodes_under_dp_only(layout: str) -> None:
    """On Summit's layout (6 ranks of 16 GiB a node) every rank's DP peak fits its GPU at the
    DP minimum and not one node below; the replicated state fits one GPU (DP runs somewhere).
    Both layouts give every rank the same local batch, so the same DP minimum sizes."""
    from malleparsl.plans import ExecPlan, plan_memory
    from malleparsl.sim.plans import LAYOUTS

    lay = LAYOUTS[layout]
    jobs = load_jobset("imagenet", limit=30)
    dp_only, aware = plan_jobsets(jobs, dp_nodes=(4, 16), layout=layout)
    large = [(d, a) for d, a in zip(dp_only, aware) if d.meta.get("memory_profile")]
    assert len(large) == 10
    assert all(3 <= d.min_nodes <= 16 for d, _ in large)  # "need" drawn in 4..16
    assert sum(d.min_nodes for d, _ in large) / len(large) >= 6
    other, _ = plan_jobsets(jobs, dp_nodes=(4, 16), layout="one-gpu" if layout == "summit"
                            else "summit")
    assert [d.min_nodes for d in dp_only] == [d.min_nodes for d in other]
    assert all(a.min_nodes == 1 for _, a in large)  # accumulation / ZeRO-1 fit one node
    from malleparsl.plans import MemoryProfile

    for d, a in large:  # where plain DP fits, the plan-aware curve is DP's rate
        n = d.min_nodes
        prof = MemoryProfile.from_dict(d.meta["memory_profile"])
        gb = d.meta["global_batch"]
        assert gb == lay.global_batch and d.meta["ranks_per_node"] == lay.ranks_per_node
        peak = [plan_memory(prof, ExecPlan(), n=k * lay.ranks_per_node, global_batch=gb).peak
                for k in (n - 1, n)]
        assert peak[1] <= lay.rank_bytes < peak[0]
        assert 20 * prof.params <= lay.rank_bytes  # replicated state + sync buffer: one GPU
        assert a.curve.rate(n) == pytest.approx(d.curve.rate(n), rel=1e-12)
        assert 0 < a.curve.rate(1) < d.curve.rate(1)  # one node works, slower than DP would


def test_summit_nodes_shard_over_their_six_gpus() -> None:
    """A model whose replicated DP state (20 B a parameter) exceeds one 16 GiB V100 while
    ZeRO-1's (16 B at its checkpoint gather) fits: on Summit's layout ZeRO-1 over one node's
    6 ranks runs it from 1 node, plain DP at no size (no DP-only job); on the one-gpu layout
    (old code: the only one) ZeRO-1 needs 2 nodes. Collectives inside one node use NVLink."""
    from malleparsl.model import JobSpec, ScalingCurve
    from malleparsl.plans import MemoryProfile
    from malleparsl.sim.plans import LAYOUTS, SUMMIT_GPU_BYTES, PlanCosts, plan_job
    from malleparsl.site_configs.accelerators import accelerator_memory_bytes

    assert accelerator_memory_bytes("summit") == SUMMIT_GPU_BYTES
    assert LAYOUTS["summit"].ranks_per_node == 6
    params = int(SUMMIT_GPU_BYTES / 18)
    prof = MemoryProfile(params=params, act_per_sample=2e6, act_ckpt_per_sample=2e5,
                         unit_params=params / 8)
    dp = ScalingCurve((1, 2, 4, 8), (600.0, 1150.0, 2200.0, 4200.0))
    spec = JobSpec("big", max_nodes=8, curve=dp)
    d, a = plan_job(spec, prof, layout="summit")
    assert d is None  # DP's replicated state never fits a GPU, whatever the size
    assert a is not None and a.min_nodes == 1
    assert a.meta["plans"][1] == a.meta["plans"][2] == "zero1"
    assert a.meta["ranks_per_node"] == 6 and a.meta["global_batch"] == 1536
    # DP's measured step (per node) plus ZeRO-1's broadcast of W (r-1)/r over r = 6n ranks:
    # over NVLink inside one node, over InfiniBand across two
    costs = PlanCosts()
    w = 4 * params
    t1 = 1536 / dp.rate(1) + 5 / 6 * w / costs.intra_node_bytes_per_s
    t2 = 1536 / dp.rate(2) + 11 / 12 * w / costs.link_bytes_per_s
    assert a.curve.rate(1) == pytest.approx(1536 / t1, rel=1e-9)
    assert a.curve.rate(2) == pytest.approx(1536 / t2, rel=1e-9)
    # a node of one 16 GiB rank (the older layout): nothing to shard over at 1 node
    d1, a1 = plan_job(spec, prof, layout="one-gpu")
    assert d1 is None and a1 is not None and a1.min_nodes == 2
    with pytest.raises(SpecError, match="never fits"):  # the job-set builder refuses it
        plan_jobsets([spec], large_every=1, dp_nodes=(40, 40), layout="summit")


def test_plan_aware_job_runs_on_a_fragment_dp_only_cannot_use() -> None:
    jobs = load_jobset("imagenet", limit=3)
    dp_only, aware = plan_jobsets(jobs, dp_nodes=(4, 4))
    big = dp_only[2].job_id
    t0 = dp_only[2].submit_s
    tr = trace_from_fragments([(f"n{i}", t0, t0 + 7200) for i in range(2)])
    got = {name: simulate(tr, [j for j in js if j.job_id == big], policy="milp")
           for name, js in (("dp", dp_only), ("aware", aware))}
    assert got["dp"].samples == 0  # 2 idle nodes < the 4 plain DP needs
    assert got["aware"].samples > 0


def test_unused_capacity_and_jct_over_all_jobs() -> None:
    """DP-only leaves the 2-node fragment idle while its job waits; plan-aware uses it. The
    all-jobs JCT counts the unfinished DP-only job up to the window's end."""
    jobs = load_jobset("imagenet", limit=3)
    dp_only, aware = plan_jobsets(jobs, dp_nodes=(4, 4))
    big = dp_only[2].job_id
    t0 = dp_only[2].submit_s
    tr = trace_from_fragments([(f"n{i}", t0, t0 + 7200) for i in range(2)])
    got = {name: simulate(tr, [j for j in js if j.job_id == big], policy="milp")
           for name, js in (("dp", dp_only), ("aware", aware))}
    assert unused_node_h(got["dp"]) == pytest.approx(2 * 2.0, rel=1e-6)  # 2 nodes for 2 h
    assert unused_node_h(got["aware"]) < 0.1  # only the start's pause
    assert got["dp"].summary()["mean_jct_h"] is None  # nothing finished
    assert mean_jct_all_h(got["dp"]) == pytest.approx(2.0, rel=1e-6)
    assert mean_jct_all_h(got["aware"]) <= 2.0 + 1e-9


def test_bench_plans_simulator_options() -> None:
    """``bench plans --no-cpu``: the comparison with every job large and no cap, as JSON."""
    import json

    from typer.testing import CliRunner

    from malleparsl.cli import app

    runner = CliRunner()
    res = runner.invoke(app, [
        "bench", "plans", "--no-cpu", "--json", "--sim-limit", "6", "--sim-hours", "6",
        "--sim-samples-scale", "0.01", "--sim-large-every", "1", "--sim-max-active", "0",
        "--sim-dp-nodes", "8:12",
    ])
    assert res.exit_code == 0, res.output
    row = json.loads(res.stdout.strip().splitlines()[-1])
    assert row["large_jobs"] == 6 and row["limit"] == 6
    for key in ("jct_ratio_vs_dp_only", "jct_all_ratio_vs_dp_only", "samples_ratio_vs_dp_only"):
        assert row[key] is not None and row[key] > 0, key
    assert row["plan_aware"]["unused_node_h"] <= row["dp_only"]["unused_node_h"]
    assert row["layout"] == "summit" and row["ranks_per_node"] == 6
    bad = runner.invoke(app, ["bench", "plans", "--no-cpu", "--sim-dp-nodes", "5:3"])
    assert bad.exit_code == 2 and "--sim-dp-nodes" in bad.output
    bad = runner.invoke(app, ["bench", "plans", "--no-cpu", "--sim-layout", "summitt"])
    assert bad.exit_code == 2 and "--sim-layout" in bad.output


def test_fsdp_costs_its_gathers_and_runs_where_only_it_fits() -> None:
    """A model whose parameters and Adam state fit a 16 GiB node only sharded by FSDP2 (DP and
    ZeRO-1 keep a full copy of the gradients plus the sync buffer, ZeRO-1's checkpoint gathers
    the optimizer shards; FSDP2 writes and reads its checkpoints sharded, 20 / n B a parameter
    at its step): the plan-aware curve runs it from 2 nodes on ``fsdp`` (from 8 while its
    checkpoints gathered the plain state, 12 B a parameter on top of its shards), at DP's
    measured step plus FSDP2's extra traffic, 3 W (n-1)/n bytes
    in 3 rounds per pass instead of DP's one all-reduce of 2 W (n-1)/n; without FSDP2 no plan fits."""
    import math

    from malleparsl.jpa.plans import plan_aware_curve
    from malleparsl.model import ScalingCurve
    from malleparsl.plans import FAMILIES, MemoryProfile
    from malleparsl.sim.plans import SUMMIT_GPU_BYTES, MeasuredPlusPlanCosts, PlanCosts

    params = int(SUMMIT_GPU_BYTES / 15)  # at its sync DP needs 20 B a parameter, ZeRO-1 16 B
    # (at its checkpoint, any size), FSDP2 20 / n B at its step (10 at 2 nodes)
    prof = MemoryProfile(params=params, act_per_sample=1e6, act_ckpt_per_sample=1e5,
                         unit_params=params / 8)
    dp = ScalingCurve((1, 2, 4, 8), (100.0, 190.0, 360.0, 640.0))
    costs = PlanCosts()
    perf = MeasuredPlusPlanCosts(prof, dp, costs)
    gb = 256
    with_fsdp = plan_aware_curve(perf, global_batch=gb, budget=SUMMIT_GPU_BYTES, n_max=8,
                                 bases=FAMILIES)
    without = plan_aware_curve(perf, global_batch=gb, budget=SUMMIT_GPU_BYTES, n_max=8,
                               bases=tuple(b for b in FAMILIES if not b.startswith("fsdp")))
    assert without.curve is None and without.min_nodes is None
    assert with_fsdp.min_nodes == 2 and all(with_fsdp.plans[n].fsdp for n in (2, 4, 8))
    assert with_fsdp.plans[8].name == "fsdp"
    assert with_fsdp.curve is not None and with_fsdp.curve.rate(1) == 0.0
    assert with_fsdp.curve.rate(3) == 0.0  # 256 samples do not split over 3
    w = 4 * params
    for n in (8,):  # one pass a step (k = 1): one more W (n-1)/n, two more rounds
        extra = (n - 1) / n * w / costs.link_bytes_per_s + 2 * math.log2(n) * costs.latency_s
        assert with_fsdp.curve.rate(n) == pytest.approx(gb / (gb / dp.rate(n) + extra), rel=1e-9)
    # with micro-batches every pass re-gathers: 3 k - 2 extra W (n-1)/n, 3 k - 1 extra rounds
    t4 = perf.step_time(parse_plan("fsdp@mb=32"), n=2, global_batch=gb)
    extra = (3 * 4 - 2) / 2 * w / costs.link_bytes_per_s + (3 * 4 - 1) * costs.latency_s
    assert t4 == pytest.approx(gb / dp.rate(2) + 3 * costs.micro_batch_s + extra, rel=1e-9)


def test_jct_floor_by_hand() -> None:
    """Three jobs, 1 h of capacity: per-node rates 10, 5 (best at 2 nodes) and 1 sample/s;
    needs 360 s, 1,440 s and 3,600 s of a node, so two can finish (1,800 s <= 3,600 s), not
    three. The two that waited longest (submitted at 0 and 600 s; the window ends at 3,600 s)
    count 0, the last its wait of 1,800 s: floor = 1,800 / 3 s."""
    from malleparsl.model import JobSpec, ScalingCurve
    from malleparsl.sim.plans import jct_all_floor_h

    specs = [
        JobSpec("a", max_nodes=1, total_samples=3600, submit_s=0, curve=ScalingCurve((1,), (10.0,))),
        JobSpec("b", max_nodes=4, total_samples=7200, submit_s=600,
                curve=ScalingCurve((1, 2, 4), (4.0, 10.0, 12.0))),
        JobSpec("c", max_nodes=1, total_samples=3600, submit_s=1800, curve=ScalingCurve((1,), (1.0,))),
    ]
    floor = jct_all_floor_h(specs, specs, start_s=0, end_s=3600, idle_node_s=3600)
    assert floor == pytest.approx(1800 / 3 / 3600)
    # the best per-node rate of any curve given for a job counts: a faster plan for "c"
    faster_c = [*specs, JobSpec("c", max_nodes=1, total_samples=3600, submit_s=1800,
                                curve=ScalingCurve((1,), (3.0,)))]
    assert jct_all_floor_h(specs, faster_c, start_s=0, end_s=3600, idle_node_s=3600) == 0.0
    with pytest.raises(SpecError, match="no curve"):
        jct_all_floor_h(specs, [JobSpec("a")], start_s=0, end_s=3600, idle_node_s=3600)
    # a job with no curve given is not one that cannot finish: c alone, 1 h of capacity, could
    # finish (floor 0); counting it as never finishing gave its wait (1,800 s), no lower bound
    with pytest.raises(SpecError, match="'c'"):
        jct_all_floor_h(specs[2:], specs[:2], start_s=0, end_s=3600, idle_node_s=3600)


def test_jct_floor_is_below_what_the_simulator_reaches() -> None:
    """On a saturated slice the floor bounds both variants' measured all-jobs mean JCT."""
    from malleparsl.sim.plans import compare_plans

    row = compare_plans(nodes="0:16", hours=6, limit=40, samples_scale=0.2, max_active=None)
    floor = row["jct_all_floor_h"]
    assert 0 < floor <= row["plan_aware"]["mean_jct_all_h"] + 1e-9
    assert floor <= row["dp_only"]["mean_jct_all_h"] + 1e-9
    assert row["jct_all_ratio_floor"] <= row["jct_all_ratio_vs_dp_only"] + 1e-9


@pytest.mark.parametrize("policy,semantics", [
    ("equal-share", "default"), ("static", "default"), ("hold", "default"), ("milp", "default"),
    ("equal-share", "bftrainer")])
def test_simulated_plan_jobs_run_only_at_sizes_with_a_plan(policy: str, semantics: str) -> None:
    """FSDP2 only (global batch 256): the jobs run at 2, 4, 8, ... nodes, not 3, 5, 6 or 7.
    The simulator's controller gets the runnable sizes as live (``KnownPlans``). Old code: it
    had no plan advisor, and equal-share and static ran a job at 3 of 7 nodes, a size with no
    plan (rate 0 in the curve; live, the controller snapped it to 2)."""
    jobs = load_jobset("imagenet", limit=2)
    _, aware = plan_jobsets(jobs, large_every=1, dp_nodes=(4, 4), bases=("fsdp",),
                             layout="one-gpu")
    assert all(sorted(a.meta["plans"])[:3] == [2, 4, 8] for a in aware)
    t0 = max(a.submit_s for a in aware)
    tr = trace_from_fragments([(f"n{i}", t0, t0 + 3 * 3600) for i in range(7)]
                              + [("n0", t0 + 3 * 3600 + 1, t0 + 4 * 3600)])
    from malleparsl.sim.engine import SimOptions

    res = simulate(tr, aware, policy=policy, options=SimOptions(semantics=semantics))
    sizes = set(res.sizes["nodes"])
    assert sizes <= {0, 2, 4, 8}, sizes
    assert res.samples > 0


def test_known_plans_name_the_plan_of_a_size_and_list_the_runnable_ones() -> None:
    from malleparsl.allocator.base import ClusterSnapshot, JobView
    from malleparsl.sim.plans import KnownPlans

    jobs = load_jobset("imagenet", limit=2)
    dp_only, aware = plan_jobsets(jobs, large_every=1, dp_nodes=(4, 4), bases=("fsdp",),
                             layout="one-gpu")
    kp = KnownPlans()
    kp.register(dp_only[1], 0.0)  # no plans: passes through
    assert kp.plan_for(dp_only[1].job_id, 3) is None
    kp.register(aware[0], 0.0)
    assert kp.plan_for(aware[0].job_id, 4) == parse_plan("fsdp")
    with pytest.raises(Exception, match="no plan runs at 3"):
        kp.plan_for(aware[0].job_id, 3)
    snap = ClusterSnapshot(now_s=0.0, nodes=("a", "b"))
    view = kp.adjust(snap, [JobView(aware[0], aware[0].curve)])[0]
    assert view.sizes == tuple(sorted(aware[0].meta["plans"]))


def test_known_plans_keep_a_job_off_sizes_below_its_first_plan() -> None:
    """A spec whose minimum is below its first plan (built by hand, not by ``plan_jobsets``):
    plans at 2-4 nodes, min_nodes 1. The view must not allow 1 node (old code: no hole above
    the first plan, so no sizes listed, and equal-share ran the job at 1 node, rate 0), as
    live, where the profiler raises the view's minimum to the first size a plan fits."""
    from malleparsl.allocator import make_policy
    from malleparsl.allocator.base import ClusterSnapshot, JobView
    from malleparsl.model import JobSpec, ScalingCurve
    from malleparsl.sim.plans import KnownPlans

    curve = ScalingCurve((1, 2, 4), (0.0, 200.0, 400.0))
    spec = JobSpec("f", max_nodes=4, curve=curve, meta={"plans": {2: "dp", 3: "dp", 4: "dp"}})
    kp = KnownPlans()
    kp.register(spec, 0.0)
    snap = ClusterSnapshot(now_s=0.0, nodes=("a",))
    (view,) = kp.adjust(snap, [JobView(spec, curve)])
    assert not view.allows(1) and view.allows(2)
    assert make_policy("equal-share").allocate(snap, [view]).size("f") == 0


def test_plan_jobsets_names_why_a_large_job_is_refused() -> None:
    """A large job whose DP fits (1 node) but whose allowed families cannot run at any size
    (ZeRO-1 alone, one rank a node, ``max_nodes=1``: nothing to shard over) is refused for
    that reason; the old message said data parallelism never fits and to lower dp_nodes,
    which it does and would not help."""
    from malleparsl.model import JobSpec, ScalingCurve

    spec = JobSpec("j", max_nodes=1, curve=ScalingCurve((1, 2), (600.0, 1150.0)))
    d, a = plan_jobsets([spec], large_every=1, dp_nodes=(1, 1), layout="one-gpu")
    assert d[0].min_nodes == a[0].min_nodes == 1  # DP fits at 1 node
    with pytest.raises(SpecError, match=r"no plan of \['zero1'\] fits up to 1 nodes "
                                        r"\(plain DP does from 1\)"):
        plan_jobsets([spec], large_every=1, dp_nodes=(1, 1), layout="one-gpu", bases=("zero1",))
    with pytest.raises(SpecError, match="data parallelism never fits up to 1 nodes"):
        plan_jobsets([spec], large_every=1, dp_nodes=(2, 2), layout="one-gpu")


def test_compare_plans_reports_a_layout_given_as_a_node_layout_by_name() -> None:
    """``compare_plans(layout=NodeLayout(...))`` (accepted, as by plan_jobsets) reported the
    object itself, which ``bench plans``' JSON output cannot serialise."""
    import json

    from malleparsl.sim.plans import LAYOUTS, compare_plans

    row = compare_plans(nodes="0:4", hours=1, limit=3, samples_scale=0.05,
                        layout=LAYOUTS["one-gpu"])
    assert row["layout"] == "one-gpu" and row["ranks_per_node"] == 1
    assert json.loads(json.dumps(row, default=float))["layout"] == "one-gpu"


def test_summit_at_global_batch_256_caps_jobs_where_every_rank_has_a_sample() -> None:
    """Summit's 6 ranks a node with global batch 256: 43 nodes are 258 ranks, two without a
    sample (old code: 64 nodes ran 384 ranks at a local batch of 1, 128 ranks idle). Both
    versions of a large job stop at 42 nodes; a job whose minimum is past that is refused."""
    import dataclasses

    jobs = [j for j in load_jobset("imagenet", limit=12) if j.max_nodes > 42][:1]
    assert jobs, "needs an imagenet job allowed more than 42 nodes"
    dp_only, aware = plan_jobsets(jobs, large_every=1, dp_nodes=(4, 4), global_batch=256)
    assert dp_only[0].max_nodes == 42 and max(aware[0].meta["plans"]) == 42
    assert aware[0].curve.rate(43) == 0.0 < aware[0].curve.rate(42)
    late = dataclasses.replace(jobs[0], min_nodes=43)
    with pytest.raises(SpecError, match=r"43 node\(s\) x ranks_per_node=6 = 258 ranks exceed "
                       r"global_batch=256"):
        plan_jobsets([late], large_every=1, dp_nodes=(4, 4), global_batch=256)


@pytest.mark.parametrize("bad", [0, -1, 1.5, True])
def test_plan_jobsets_refuses_a_bad_large_every(bad: object) -> None:
    """Old code: ZeroDivisionError (0), a silent all-small or odd split (others)."""
    with pytest.raises(SpecError, match=r"large_every must be an integer >= 1.*got"):
        plan_jobsets(load_jobset("imagenet", limit=3), large_every=bad)


def test_fsdp_inside_one_summit_node_pays_nvlink_latency_not_infinibands() -> None:
    """FSDP2 over one node's 6 ranks: its extra rounds are ring steps over NVLink
    (``intra_node_latency_s``), over 2 nodes over InfiniBand (``latency_s``); old code charged
    InfiniBand's 10 us inside the node too."""
    import math

    from malleparsl.model import ScalingCurve
    from malleparsl.plans import MemoryProfile
    from malleparsl.sim.plans import MeasuredPlusPlanCosts, PlanCosts

    params = 10_000_000
    prof = MemoryProfile(params=params, act_per_sample=1e6, act_ckpt_per_sample=1e5)
    dp = ScalingCurve((1, 2), (600.0, 1150.0))
    costs = PlanCosts()
    perf = MeasuredPlusPlanCosts(prof, dp, costs, ranks_per_node=6)
    w, gb = 4 * params, 1536  # 256 samples a rank at 1 node: 4 micro-batches of 64
    plan = parse_plan("fsdp@mb=64")
    slow_ib = MeasuredPlusPlanCosts(prof, dp, PlanCosts(latency_s=1.0), ranks_per_node=6)
    assert slow_ib.step_time(plan, n=6, global_batch=gb) == perf.step_time(plan, n=6,
                                                                           global_batch=gb)
    assert costs.intra_node_latency_s < costs.latency_s
    for nodes, bw, lat in ((1, costs.intra_node_bytes_per_s, costs.intra_node_latency_s),
                           (2, costs.link_bytes_per_s, costs.latency_s)):
        n = 6 * nodes
        k = math.ceil(gb / n / 64)
        extra = (costs.micro_batch_s * (k - 1) + (3 * k - 2) * (n - 1) / n * w / bw
                 + (3 * k - 1) * math.log2(n) * lat)
        got = perf.step_time(plan, n=n, global_batch=gb)
        assert got == pytest.approx(gb / dp.rate(nodes) + extra, rel=1e-12)
