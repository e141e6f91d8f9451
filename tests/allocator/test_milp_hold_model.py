"""`milp` options for studying the item-2 gap: tie-break variants, learnt holding time, exposure."""

import pytest

from malleparsl.allocator import ClusterSnapshot, JobView, make_policy
from malleparsl.allocator.objective import allocation_objective
from malleparsl.errors import SpecError
from malleparsl.model import JobSpec, ScalingCurve

LINEAR = ScalingCurve((1, 8), (100.0, 800.0))  # 100 samples/s per node


def _twins(n_jobs=4):
    """Jobs with one curve and no nodes: every split of the free nodes is worth the same."""
    return [JobView(JobSpec(f"j{i}", max_nodes=8, curve=LINEAR), LINEAR) for i in range(n_jobs)]


def test_tie_seed_changes_only_which_equal_answer_is_taken():
    snap = ClusterSnapshot(now_s=0.0, nodes=tuple(f"n{i}" for i in range(5)))
    jobs = _twins()
    plain = make_policy("milp").allocate(snap, jobs)
    assert make_policy("milp", tie_seed=None).allocate(snap, jobs) == plain
    best = allocation_objective(snap, jobs, plain)
    seen = set()
    for seed in range(6):
        alloc = make_policy("milp", tie_seed=seed).allocate(snap, jobs)
        assert allocation_objective(snap, jobs, alloc) == pytest.approx(best)
        seen.add(tuple(sorted(alloc.sizes().items())))
    assert len(seen) > 1  # the old code has one answer only (and refuses the option)


def test_tie_seed_must_be_an_integer():
    with pytest.raises(SpecError):
        make_policy("milp", tie_seed=1.5)


def _holder(up_s=10.0, down_s=10.0, total=float("inf")):
    spec = JobSpec("j", max_nodes=8, rescale_up_s=up_s, rescale_down_s=down_s,
                   total_samples=total, curve=LINEAR)
    return spec


def test_exposure_charges_the_shrink_pause_when_the_new_node_leaves_first():
    """Holding 1 node, +1 node for 25 s: gain 100/s x 25 s = 2,500; grow pause 10 s x 100 =
    1,000; exposure 10 s x 200 = 2,000. Without exposure it grows, with it it does not."""
    spec = _holder()
    job = JobView(spec, LINEAR, frozenset({"a"}))
    snap = ClusterSnapshot(now_s=0.0, nodes=("a", "b"), node_end_s={"b": 25.0})
    assert make_policy("milp-horizon").allocate(snap, [job]).size("j") == 2
    assert make_policy("milp-horizon", exposure=True).allocate(snap, [job]).size("j") == 1
    # a job done before the node leaves is not exposed
    short = JobView(_holder(total=5_000.0), LINEAR, frozenset({"a"}))
    assert make_policy("milp-horizon", exposure=True).allocate(snap, [short]).size("j") == 2


def test_exposure_each_pays_one_pause_per_departure():
    """Holding 1 node; free nodes leave at 50 s and 40 s. Grow to 2 (the 50 s node): 5,000 -
    1,000 - one departure 2,000 = 2,000. Grow to 3 (gain until 40 s): 8,000 - 1,000 - 3,000
    = 4,000 with one departure, 1,000 with two (``"each"``)."""
    job = JobView(_holder(), LINEAR, frozenset({"a"}))
    snap = ClusterSnapshot(now_s=0.0, nodes=("a", "b", "c"), node_end_s={"b": 50.0, "c": 40.0})
    assert make_policy("milp-horizon", exposure="first").allocate(snap, [job]).size("j") == 3
    assert make_policy("milp-horizon", exposure="each").allocate(snap, [job]).size("j") == 2


@pytest.mark.parametrize("bad", [{"exposure": "all"}, {"learn_hold": "mode"}])
def test_study_options_are_checked(bad):
    with pytest.raises(SpecError):
        make_policy("milp-horizon", **bad)


@pytest.mark.parametrize("learn", [True, "mean", "median"])
def test_learn_hold_values_growth_over_how_long_grown_nodes_were_kept(learn):
    """A grow onto a node idle for 1,000 s; the node is taken back after 5 s. Learnt, growth
    then pays over 5 s (gain 500 < pause 1,000): the next long-lived node is declined."""
    spec = _holder()
    pol = make_policy("milp-horizon", learn_hold=learn)
    fixed = make_policy("milp-horizon")
    snap0 = ClusterSnapshot(now_s=0.0, nodes=("a", "b"), node_end_s={"b": 1000.0})
    job0 = JobView(spec, LINEAR, frozenset({"a"}))
    assert pol.allocate(snap0, [job0]).size("j") == 2  # nothing learnt yet: as milp-horizon
    snap1 = ClusterSnapshot(now_s=5.0, nodes=("a",))  # "b" taken back after 5 s
    pol.allocate(snap1, [JobView(spec, LINEAR, frozenset({"a"}))])
    snap2 = ClusterSnapshot(now_s=10.0, nodes=("a", "c"), node_end_s={"c": 1000.0})
    job2 = JobView(spec, LINEAR, frozenset({"a"}))
    assert fixed.allocate(snap2, [job2]).size("j") == 2
    assert pol.allocate(snap2, [job2]).size("j") == 1


def test_exposure_each_counts_every_departure_of_the_nodes_a_grow_takes():
    """The one-pool model's pool is the free nodes, then other jobs' nodes: not sorted as one.
    j holds a; b (free) leaves at 60 s, k's nodes at 50, 80 and 70 s. A grow to 3 takes b and
    the 80 s node: two departures, two shrink pauses (10 s x 300/s each), as ``grow_terms``
    counts them (the running minimum of the pool, 60 and 60, saw one)."""
    from malleparsl.allocator.countmodel import build_options
    from malleparsl.allocator.placement import node_horizons

    def spec(name):
        return JobSpec(name, max_nodes=8, rescale_up_s=10.0, rescale_down_s=10.0, curve=LINEAR)

    j = JobView(spec("j"), LINEAR, frozenset({"a"}))
    k = JobView(spec("k"), LINEAR, frozenset({"c", "d", "e"}))
    ends = {"a": 1000.0, "b": 60.0, "c": 50.0, "d": 80.0, "e": 70.0}
    snap = ClusterSnapshot(now_s=0.0, nodes=tuple(ends), node_end_s=ends)
    h = node_horizons(snap, default_s=None, cap_s=None)

    def value_at_3(exposure):
        t = build_options(snap, [j, k], h, horizon_aware=True, max_levels=1, exposure=exposure)
        (row,) = [i for i in range(len(t)) if t.job[i] == 0 and t.size[i] == 3]
        return float(t.value[row])

    assert value_at_3("first") - value_at_3("each") == pytest.approx(10.0 * 300.0)


@pytest.mark.parametrize("opts", [{"exposure": "each"}, {"learn_hold": "median"}])
def test_horizon_options_without_horizons_are_refused(opts):
    """They value grows over the nodes' horizons; plain milp has none (silently ignored before)."""
    with pytest.raises(SpecError, match="horizon"):
        make_policy("milp", **opts)


def test_learn_hold_survives_a_node_taken_back_at_the_instant_it_was_added():
    """A 0 s kept sample gave a 0 s cap, which node_horizons refuses: the policy crashed."""
    spec = _holder()
    pol = make_policy("milp-horizon", learn_hold="mean")
    snap0 = ClusterSnapshot(now_s=0.0, nodes=("a", "b"), node_end_s={"b": 1000.0})
    assert pol.allocate(snap0, [JobView(spec, LINEAR, frozenset({"a"}))]).size("j") == 2
    snap1 = ClusterSnapshot(now_s=0.0, nodes=("a",))  # "b" gone at the same instant
    assert pol.allocate(snap1, [JobView(spec, LINEAR, frozenset({"a"}))]).size("j") == 1
    snap2 = ClusterSnapshot(now_s=1.0, nodes=("a", "c"), node_end_s={"c": 1000.0})
    pol.allocate(snap2, [JobView(spec, LINEAR, frozenset({"a"}))])  # no SpecError


@pytest.mark.parametrize("opts", [{"max_levels": 2}, {"horizon_cap_s": 300.0},
                                  {"default_horizon_s": 600.0}])
def test_every_horizon_only_option_is_refused_without_horizons(opts):
    with pytest.raises(SpecError, match="horizon"):
        make_policy("milp", **opts)


@pytest.mark.parametrize("cap", [0.0, -5.0, "300"])
def test_a_bad_horizon_cap_is_refused_when_the_policy_is_built(cap):
    """Not at the first decision of a live run."""
    with pytest.raises(SpecError, match="horizon_cap_s"):
        make_policy("milp-horizon", horizon_cap_s=cap)


def test_calibrate_scales_horizons_by_how_long_grows_really_lasted():
    """Five grows onto nodes predicted to stay 1,000 s, each taken back after 5 s: the median
    realised / predicted is 0.005. A node predicted to stay 1,000 s is then worth 5 s (gain
    500 < pause 1,000: declined); one predicted to stay 1e6 s is worth 5,000 s (taken). A cap
    at the kept time (``learn_hold="median"``) declines both."""
    spec = _holder()
    pol = make_policy("milp-horizon", learn_hold="calibrate")
    capped = make_policy("milp-horizon", learn_hold="median")
    for i in range(5):
        t = 100.0 * i
        snap = ClusterSnapshot(now_s=t, nodes=("a", f"b{i}"), node_end_s={f"b{i}": t + 1000})
        for p in (pol, capped):
            got = p.allocate(snap, [JobView(spec, LINEAR, frozenset({"a"}))]).size("j")
            assert got == 2 or p is capped  # the cap has learnt 5 s after the first one
            held = JobView(spec, LINEAR, frozenset({"a"}))  # b_i taken back after 5 s
            p.allocate(ClusterSnapshot(now_s=t + 5, nodes=("a",)), [held])
    job = JobView(spec, LINEAR, frozenset({"a"}))
    short = ClusterSnapshot(now_s=600.0, nodes=("a", "c"), node_end_s={"c": 1600.0})
    long = ClusterSnapshot(now_s=600.0, nodes=("a", "d"), node_end_s={"d": 600.0 + 1e6})
    assert make_policy("milp-horizon").allocate(short, [job]).size("j") == 2
    assert pol.allocate(short, [job]).size("j") == 1
    assert pol.allocate(long, [job]).size("j") == 2
    assert capped.allocate(long, [job]).size("j") == 1


def test_calibrate_waits_for_enough_finished_grows():
    """Before five grows have ended, horizons are the estimator's (as ``milp-horizon``)."""
    spec = _holder()
    pol = make_policy("milp-horizon", learn_hold="calibrate")
    snap = ClusterSnapshot(now_s=0.0, nodes=("a", "b"), node_end_s={"b": 1000.0})
    assert pol.allocate(snap, [JobView(spec, LINEAR, frozenset({"a"}))]).size("j") == 2
    pol.allocate(ClusterSnapshot(now_s=5.0, nodes=("a",)), [JobView(spec, LINEAR, frozenset({"a"}))])
    snap2 = ClusterSnapshot(now_s=10.0, nodes=("a", "c"), node_end_s={"c": 1010.0})
    assert pol.allocate(snap2, [JobView(spec, LINEAR, frozenset({"a"}))]).size("j") == 2


def _arrive_every(pol, gap_s, n):
    """``n + 1`` decisions ``gap_s`` apart, a fresh idle node at each (short-lived: no grow)."""
    spec = _holder()
    for i in range(n + 1):
        t = gap_s * i
        snap = ClusterSnapshot(now_s=t, nodes=("a", f"b{i}"), node_end_s={f"b{i}": t + 1.0})
        pol.allocate(snap, [JobView(spec, LINEAR, frozenset({"a"}))])
    return gap_s * (n + 1)


@pytest.mark.parametrize("gap_s, grows", [(5.0, False), (1000.0, True)])
def test_arrivals_value_a_grow_only_until_nodes_would_come_anyway(gap_s, grows):
    """Idle nodes arrived every ``gap_s``; a node that stays 1,000 s is offered. Its gain
    (100/s) counts only until the next arrival: 5 s x 100 = 500 < the pause 1,000 (declined),
    1,000 s x 100 (taken). Plain ``milp-horizon`` takes it either way."""
    pol = make_policy("milp-horizon", arrivals="next")
    t = _arrive_every(pol, gap_s, 5)
    job = JobView(_holder(), LINEAR, frozenset({"a"}))
    snap = ClusterSnapshot(now_s=t, nodes=("a", "c"), node_end_s={"c": t + 1000.0})
    assert make_policy("milp-horizon").allocate(snap, [job]).size("j") == 2
    assert pol.allocate(snap, [job]).size("j") == (2 if grows else 1)


def test_arrivals_wait_for_enough_arrivals():
    """Before five arrivals the horizons are the estimator's (as ``milp-horizon``)."""
    pol = make_policy("milp-horizon", arrivals="next")
    t = _arrive_every(pol, 5.0, 3)
    job = JobView(_holder(), LINEAR, frozenset({"a"}))
    snap = ClusterSnapshot(now_s=t, nodes=("a", "c"), node_end_s={"c": t + 1000.0})
    assert pol.allocate(snap, [job]).size("j") == 2


@pytest.mark.parametrize("bad", [{"arrivals": "mean"}, {"arrivals": 3}])
def test_arrivals_refuses_unknown_values(bad):
    with pytest.raises(SpecError, match="arrivals"):
        make_policy("milp-horizon", **bad)
    with pytest.raises(SpecError):
        make_policy("milp", arrivals="next")  # a horizon option


def _pair(slow_up_s=30.0):
    """A fast job F (1,000/s per node) holding b, a slow one S (975/s) holding a; both nodes
    stay 1,000 s."""
    fast_c = ScalingCurve((1, 2), (1000.0, 2000.0))
    slow_c = ScalingCurve((1, 2), (975.0, 1950.0))
    fast = JobView(JobSpec("F", max_nodes=2, rescale_up_s=10.0, rescale_down_s=10.0,
                           curve=fast_c), fast_c, frozenset({"b"}))
    slow = JobView(JobSpec("S", max_nodes=2, rescale_up_s=slow_up_s, rescale_down_s=10.0,
                           curve=slow_c), slow_c, frozenset({"a"}))
    snap = ClusterSnapshot(now_s=0.0, nodes=("a", "b"), node_end_s={"a": 1000.0, "b": 1000.0})
    return snap, [fast, slow]


def test_refill_stop_charges_a_stopped_job_its_restart():
    """Moving a from S to F: F gains 1,000/s x 1,000 s - its pause 10 s x 2,000 = 980,000; S
    loses 975,000 and (``costs="pause"``) pays no pause at 0 nodes, so the move nets +5,000.
    But S is not done: it restarts later, paying 30 s x 975 = 29,250 (``refill="stop"``), and
    then the move does not pay."""
    snap, jobs = _pair()
    plain = make_policy("milp-horizon", costs="pause").allocate(snap, jobs)
    assert plain.sizes() == {"F": 2}
    kept = make_policy("milp-horizon", costs="pause", refill="stop").allocate(snap, jobs)
    assert kept.sizes() == {"F": 1, "S": 1}
    # a cheap restart (1 s x 975) is still worth the move
    snap, jobs = _pair(slow_up_s=1.0)
    cheap = make_policy("milp-horizon", costs="pause", refill="stop").allocate(snap, jobs)
    assert cheap.sizes() == {"F": 2}


def test_refill_stop_charges_the_restart_as_the_cost_rule_does():
    """Under ``costs="old-rate"`` a start from 0 nodes is free, so the restart a stop causes
    costs nothing and ``refill="stop"`` changes no decision: F's grow pays 10 s x 1,000, S's
    stop 10 s x 975 (old rate), the move nets +5,250 either way."""
    snap, jobs = _pair()
    for refill in ("none", "stop"):
        got = make_policy("milp-horizon", costs="old-rate", refill=refill).allocate(snap, jobs)
        assert got.sizes() == {"F": 2}


@pytest.mark.parametrize("bad", [{"refill": "all"}, {"refill": True}])
def test_refill_refuses_unknown_values(bad):
    with pytest.raises(SpecError, match="refill"):
        make_policy("milp-horizon", **bad)
    with pytest.raises(SpecError):
        make_policy("milp", refill="stop")  # a horizon option


def _slot_case():
    """F (4,000/s at 1 node, 4,100 at 2, 4,200 at 3) holds two nodes; S (50/s, one node at
    most) waits with none; one node is free. No pauses: F's grow adds 100/s, S's start 50/s."""
    fast_c = ScalingCurve((1, 2, 3), (4000.0, 4100.0, 4200.0))
    slow_c = ScalingCurve((1,), (50.0,))
    fast = JobView(JobSpec("F", max_nodes=3, curve=fast_c), fast_c, frozenset({"a", "b"}))
    slow = JobView(JobSpec("S", max_nodes=1, curve=slow_c), slow_c)
    return ClusterSnapshot(now_s=0.0, nodes=("a", "b", "c")), [fast, slow]


def test_slot_values_the_slot_a_job_frees_when_the_cap_binds():
    """S = (4,000 + 50) / 2 = 2,025. F's grow: 100 x (1 + 2,025 / 4,000) = 151; S's start:
    50 x (1 + 2,025 / 50) = 2,075. Under a binding cap (2 active jobs, ``slot=2``) S starts
    (a sample of S frees its slot 1/50 s sooner); below the cap the weights are 1 and F grows."""
    snap, jobs = _slot_case()
    assert make_policy("milp").allocate(snap, jobs).sizes() == {"F": 3}
    assert make_policy("milp", slot=2).allocate(snap, jobs).sizes() == {"F": 2, "S": 1}
    assert make_policy("milp", slot=3).allocate(snap, jobs).sizes() == {"F": 3}
    got = make_policy("milp-horizon", slot=2).allocate(snap, jobs)
    assert got.sizes() == {"F": 2, "S": 1}


def test_slot_auto_tilts_only_while_jobs_wait_behind_the_cap():
    """``slot="auto"`` reads the cap from the controller: the same case as above tilts (S starts)
    when the snapshot says a job is queued, and not (F grows) when none is, whatever the count of
    active jobs; an integer ``slot`` ignores ``queued``."""
    snap, jobs = _slot_case()
    waiting = ClusterSnapshot(now_s=0.0, nodes=snap.nodes, queued=1)
    assert make_policy("milp", slot="auto").allocate(snap, jobs).sizes() == {"F": 3}
    assert make_policy("milp", slot="auto").allocate(waiting, jobs).sizes() == {"F": 2, "S": 1}
    got = make_policy("milp-horizon", slot="auto").allocate(waiting, jobs)
    assert got.sizes() == {"F": 2, "S": 1}
    assert make_policy("milp", slot=3).allocate(waiting, jobs).sizes() == {"F": 3}


@pytest.mark.parametrize("bad", [{"slot": 0}, {"slot": True}, {"slot": 2.5}, {"slot": "cap"},
                                 {"slot": 2, "value": "work"}, {"slot": "auto", "value": "work"}])
def test_slot_refuses_bad_values(bad):
    with pytest.raises(SpecError, match="slot"):
        make_policy("milp", **bad)
