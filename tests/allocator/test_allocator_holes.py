"""Jobs whose runnable sizes have holes (``JobView.sizes``): no policy ever answers a hole.

FSDP2 runs only where the global batch splits evenly, so an execution plan job may run at 2
and 4 nodes but not 3. The curves here are linear (a hole is as attractive as its neighbours),
so only the view's ``sizes`` keeps a policy out of it; the controller tests lose a node of such
a job at 4 nodes and check that the nodes it cannot use go to another job at once.
"""

from __future__ import annotations

import itertools
import logging

import pytest

from malleparsl.allocator import make_policy
from malleparsl.allocator.base import AllocationPolicy, ClusterSnapshot, JobView, policy_names
from malleparsl.allocator.objective import allowed_sizes, best_count_objective
from malleparsl.allocator.placement import fallback_counts
from malleparsl.controller import Controller
from malleparsl.errors import SpecError
from malleparsl.model import Allocation, JobSpec, ScalingCurve

LINEAR = ScalingCurve((1, 8), (100.0, 800.0))
MIB = 2**20


def _policy(name: str) -> AllocationPolicy:
    if name == "jpa":  # probe placement first, then milp; no probe pending here

        class NoProbes:
            def probe_requests(self) -> dict[str, int]:
                return {}

        return make_policy("jpa", advisor=NoProbes())
    return make_policy(name)


def _cases() -> list[tuple[int, list[JobView]]]:
    """Clusters of 1-9 nodes; holed jobs idle or holding a hole (a node lost at 4 leaves 3)."""
    out = []
    for n, held in itertools.product((1, 3, 5, 6, 9), (0, 1, 3)):
        nodes = [f"n{i}" for i in range(n)]
        held = min(held, n)
        jobs = [
            JobView(JobSpec("f", max_nodes=8, rescale_up_s=5, rescale_down_s=3, curve=LINEAR),
                    LINEAR, frozenset(nodes[:held]), sizes=(2, 4, 8)),
            JobView(JobSpec("g", min_nodes=1, max_nodes=5, curve=LINEAR, submit_s=1.0),
                    LINEAR, sizes=(1, 3, 5)),
            JobView(JobSpec("h", max_nodes=8, curve=LINEAR, submit_s=2.0), LINEAR,
                    frozenset(nodes[held:held + 1])),
        ]
        out.append((n, jobs))
    return out


@pytest.mark.parametrize("name", policy_names())
def test_no_policy_answers_a_size_the_job_cannot_run_at(name: str) -> None:
    for n, jobs in _cases():
        snap = ClusterSnapshot(now_s=0.0, nodes=tuple(f"n{i}" for i in range(n)))
        alloc = _policy(name).allocate(snap, jobs)
        for j in jobs:
            k = alloc.size(j.job_id)
            assert j.allows(k), f"{name}: {j.job_id} got {k} of {n} nodes, sizes {j.sizes}"
        assert alloc.used_nodes <= set(snap.nodes)


def test_a_probe_in_a_hole_is_not_placed() -> None:
    class Probe:
        def probe_requests(self) -> dict[str, int]:
            return {"f": 3}

    jobs = [JobView(JobSpec("f", max_nodes=8, curve=LINEAR), LINEAR, sizes=(2, 4))]
    snap = ClusterSnapshot(now_s=0.0, nodes=("a", "b", "c"))
    got = make_policy("jpa", advisor=Probe(), inner="greedy").allocate(snap, jobs)
    assert got.size("f") == 2  # the inner policy's answer, not a probe at 3


def test_the_probe_wrapper_hands_the_inner_policy_whole_views() -> None:
    """The views of the jobs not probed reach the inner policy with every field but the nodes
    reserved for probes: runnable sizes, and progress (old code rebuilt them field by field
    and dropped ``remaining_samples``/``attained_samples``, so an inner ``hold-jct`` ranked
    every job by its whole size whenever the curve advisor reported progress)."""

    class Probe:
        def probe_requests(self) -> dict[str, int]:
            return {"p": 1}

    class Recording(AllocationPolicy):
        def allocate(self, snapshot, jobs):  # noqa: ANN001, ANN201
            self.seen = list(jobs)
            return Allocation.empty()

    q = JobView(JobSpec("q", max_nodes=8, total_samples=1000.0, curve=LINEAR), LINEAR,
                frozenset({"b", "c"}), remaining_samples=5.0, attained_samples=995.0,
                sizes=(2, 4))
    p = JobView(JobSpec("p", max_nodes=8, curve=LINEAR), LINEAR)
    inner = Recording()
    snap = ClusterSnapshot(now_s=0.0, nodes=("a", "b", "c"))
    got = make_policy("jpa", advisor=Probe(), inner=inner).allocate(snap, [p, q])
    assert got.nodes_of("p") == {"a"}
    (seen,) = inner.seen
    assert (seen.remaining, seen.attained_samples, seen.sizes) == (5.0, 995.0, (2, 4))
    assert seen.current == {"b", "c"}


def test_view_sizes_helpers_and_the_exact_optimum_skip_holes() -> None:
    v = JobView(JobSpec("f", min_nodes=2, max_nodes=6, curve=LINEAR), LINEAR, sizes=(1, 2, 4, 8))
    assert [v.size_upto(k) for k in range(0, 9)] == [0, 0, 2, 2, 4, 4, 4, 4, 4]
    assert [v.size_from(k) for k in (0, 3, 4, 5)] == [2, 4, 4, 0]
    assert [v.allows(k) for k in range(0, 9)] == [True, False, True, False, True] + [False] * 4
    assert list(allowed_sizes(v, 9)) == [0, 2, 4] and list(allowed_sizes(v, 3)) == [0, 2]
    plain = JobView(JobSpec("p", min_nodes=2, max_nodes=6, curve=LINEAR), LINEAR)
    assert [plain.size_upto(k) for k in (1, 3, 9)] == [0, 3, 6] and plain.size_from(7) == 0
    with pytest.raises(SpecError, match="strictly increasing"):
        JobView(JobSpec("f", curve=LINEAR), LINEAR, sizes=(2, 2))
    snap = ClusterSnapshot(now_s=0.0, nodes=("a", "b", "c"))
    assert best_count_objective(snap, [v])[1] == {"f": 2}
    held = JobView(v.spec, LINEAR, frozenset("abc"), sizes=(2, 4))
    assert fallback_counts(snap, [held]) == {"f": 2}


def _plan_job(job_id: str = "f") -> JobSpec:
    """An FSDP2-only job (140 MiB nodes, 64 samples, SGD with momentum): runs at 2 and 4 nodes, not 3."""
    from malleparsl.executors.planning import spec_from_options
    from malleparsl.plans import MemoryProfile

    prof = MemoryProfile(params=10_000_000, act_per_sample=2e6, act_ckpt_per_sample=2e5,
                         unit_params=500_000, opt_states=1, zero_overhead=1.3)
    return spec_from_options({
        "job_id": job_id, "min_nodes": 1, "max_nodes": 4, "memory_profile": prof.as_dict(),
        "global_batch": 64, "node_memory_bytes": 140 * MIB, "total_samples": 1e9})


def _controller(policy: AllocationPolicy) -> Controller:
    from malleparsl.executors.planning import LinearPlaceholderAdvisor
    from malleparsl.jpa.plans import PlanProfiler

    return Controller(policy=policy, advisor=LinearPlaceholderAdvisor(), plans=PlanProfiler())


def test_a_node_lost_at_4_goes_with_the_one_the_job_cannot_use_to_another_job() -> None:
    """Old code: ``static`` kept the job at 3 nodes, the controller snapped it to 2 after the
    policy had answered, and the third node sat idle while job h waited for a node."""
    ctl = _controller(make_policy("static"))
    ctl.add_nodes(["a", "b", "c", "d", "e"], now_s=0)
    ctl.submit(_plan_job(), now_s=0)
    ctl.replan(now_s=0)
    assert ctl.allocation.nodes_of("f") == {"a", "b", "c", "d"}
    ctl.submit(JobSpec("g", max_nodes=2), now_s=1)
    ctl.submit(JobSpec("h", max_nodes=2), now_s=1)
    ctl.replan(now_s=1)
    assert ctl.allocation.size("g") == 1 and ctl.allocation.size("h") == 0  # static: 1 free
    ctl.remove_nodes(["c"], now_s=2)  # f holds 3: a hole
    ctl.replan(now_s=2)
    assert ctl.allocation.size("f") == 2 and ctl.allocation.nodes_of("f") <= {"a", "b", "d"}
    assert ctl.allocation.size("h") == 1 and ctl.plan_for("f", 2).fsdp


def test_the_controllers_snap_of_a_lost_node_hands_the_freed_node_on_at_once(caplog) -> None:
    """A policy that keeps every job where it is (a hole too) and fills free nodes: its answer
    is refused, the kept allocation's hole is snapped to 2 nodes, and the policy is asked again
    with that, so the freed node goes to g in the same replan (old code: idle until the next)."""

    class KeepAndFill(AllocationPolicy):
        def allocate(self, snapshot, jobs):  # noqa: ANN001, ANN201
            out = {j.job_id: set(j.current) for j in jobs}
            free = sorted(set(snapshot.nodes) - set().union(*out.values()))
            out["g"] = out.get("g", set()) | set(free[: 2 - len(out.get("g", ()))])
            return Allocation({k: frozenset(v) for k, v in out.items() if k in
                               {j.job_id for j in jobs}})

    caplog.set_level(logging.INFO, logger="malleparsl.controller")
    ctl = _controller(KeepAndFill())
    ctl.add_nodes(["a", "b", "c", "d"], now_s=0)
    ctl.submit(_plan_job(), now_s=0)
    ctl.submit(JobSpec("g", max_nodes=2), now_s=0)
    ctl.allocation = Allocation({"f": frozenset("abcd")})  # f running at 4
    ctl.replan(now_s=0)
    assert ctl.allocation.size("f") == 4 and ctl.allocation.size("g") == 0
    ctl.remove_nodes(["c"], now_s=1)
    plan = ctl.replan(now_s=1)
    assert ctl.allocation.nodes_of("f") == {"a", "b"} and ctl.allocation.nodes_of("g") == {"d"}
    assert plan.start == {"g": frozenset({"d"})}
    assert any("no plan runs at 3 nodes" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("name", [p for p in policy_names() if p != "jpa"])
def test_through_the_controller_a_plan_jobs_holes_reach_no_policy_answer(name: str) -> None:
    """The live path: the plan profiler's view of an FSDP2-only job (runs at 2, 4 nodes; its
    curve 0 at 3) next to plain jobs, on 5-8 nodes. Old code: equal-share answered 3 of 7
    nodes (its share), and the controller snapped it to 2 afterwards."""

    class Recording(AllocationPolicy):
        def __init__(self, inner: AllocationPolicy) -> None:
            self.inner, self.sizes = inner, []

        def allocate(self, snapshot, jobs):  # noqa: ANN001, ANN201
            out = self.inner.allocate(snapshot, jobs)
            self.sizes.append(out.size("f"))
            return out

    for n in (5, 6, 7, 8):
        pol = Recording(make_policy(name))
        ctl = _controller(pol)
        ctl.add_nodes([f"n{i}" for i in range(n)], now_s=0)
        ctl.submit(_plan_job(), now_s=0)
        ctl.submit(JobSpec("g", max_nodes=4, curve=LINEAR), now_s=0)
        ctl.replan(now_s=0)
        ctl.remove_nodes(["n0"], now_s=1)
        ctl.replan(now_s=1)
        assert all(k in (0, 2, 4) for k in pol.sizes), (n, pol.sizes)


@pytest.mark.parametrize("name", ["milp", "milp-node"])
def test_the_exact_policies_reach_the_optimum_over_runnable_sizes(name: str) -> None:
    """Holes make the best count vector different from the hole-free one (3 of 5 nodes for f
    is out); the count MILP and the node MILP still reach the exact optimum over what is
    allowed (``best_count_objective``, a knapsack over ``allowed_sizes``)."""
    from malleparsl.allocator.objective import allocation_objective

    for n, jobs in _cases():
        snap = ClusterSnapshot(now_s=0.0, nodes=tuple(f"n{i}" for i in range(n)))
        best, _ = best_count_objective(snap, jobs)
        got = allocation_objective(snap, jobs, _policy(name).allocate(snap, jobs))
        assert got == pytest.approx(best, rel=1e-6, abs=1e-6), (name, n)
