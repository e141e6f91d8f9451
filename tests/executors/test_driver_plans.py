"""The driver's side of execution plans: it runs the plan it is told for each size and reports
every progress reading with that plan as a typed field (no parsing back from its log)."""

from __future__ import annotations

import json
from concurrent.futures import Future

from fake_store import DictStore

from malleparsl.executors.driver import JobState, MalleableJob, ProgressReading
from malleparsl.executors.protocol import progress_key
from malleparsl.model import JobSpec
from malleparsl.plans import MemoryProfile, parse_plan

MIB = 2**20
PROFILE = MemoryProfile(params=70_000, act_per_sample=2 * MIB, act_ckpt_per_sample=0.3 * MIB)
OPTS = {"job_id": "p", "memory_profile": PROFILE.as_dict(), "global_batch": 48,
        "node_memory_bytes": 64 * MIB}




class Submits:
    def __init__(self) -> None:
        self.infos: list = []

    def submit_to_node(self, node, func, info, *a, **k):  # noqa: ANN001, ANN002, ANN003, ANN201
        self.infos.append(info)
        return Future()


def make(tmp_path, plan_for=None, options=OPTS):  # noqa: ANN001, ANN201
    ex, store = Submits(), DictStore()
    job = MalleableJob(spec=JobSpec("p", max_nodes=3), entry=print, options=options, executor=ex,
                       store=store, store_host="h", store_port=1, ckpt_dir=str(tmp_path / "ck"),
                       post=lambda ev: None, clock=lambda: 5.0, plan_for=plan_for)
    return job, ex, store


def test_the_driver_runs_the_plan_it_is_told_and_reports_it_typed(tmp_path) -> None:
    asked = []

    def plan_for(n: int):  # noqa: ANN202
        asked.append(n)
        return parse_plan("ckpt@mb=8")

    job, ex, store = make(tmp_path, plan_for)
    job.reconcile(frozenset({"a", "b"}))
    assert asked == [2] and {i.options["plan"] for i in ex.infos} == {"ckpt@mb=8"}
    assert job.plan_log == [(0, 2, "ckpt@mb=8", 5.0)]
    store.set(progress_key("p", 0), json.dumps({"time": 7.0, "samples_per_s": 120.0}))
    got = job.read_progress()
    assert got == ProgressReading(2, 120.0, parse_plan("ckpt@mb=8"))
    assert job.read_progress() is None  # the same record again: nothing new


def test_without_a_profiler_the_prior_chooses_and_fixed_plans_are_not_reported(tmp_path) -> None:
    job, ex, store = make(tmp_path)  # a job with plans but nobody to ask: the prior's choice
    job.reconcile(frozenset({"a"}))
    assert ex.infos[0].options["plan"] == "dp@mb=24"  # plain DP does not fit one node
    fixed, ex2, store2 = make(tmp_path, plan_for=lambda n: parse_plan("dp"),
                              options={"job_id": "p", "plan": "zero1"})
    fixed.reconcile(frozenset({"a", "b"}))
    assert ex2.infos[0].options["plan"] == "zero1"  # the job's own plan, not asked for one
    store2.set(progress_key("p", 0), json.dumps({"time": 1.0, "samples_per_s": 9.0}))
    assert fixed.read_progress() == ProgressReading(2, 9.0, None)


def test_a_size_no_plan_fits_leaves_the_job_waiting_with_a_clear_error(tmp_path) -> None:
    import pytest

    from malleparsl.executors.driver import JobState
    from malleparsl.plans import MemoryBudgetError

    job, ex, _ = make(tmp_path, options={**OPTS, "node_memory_bytes": 0.1 * MIB})
    with pytest.raises(MemoryBudgetError, match="no execution plan fits 0.1 MiB per node at 1"):
        job.reconcile(frozenset({"a"}))
    assert job.state is JobState.WAITING and job.segment is None and not ex.infos


def test_the_control_loop_fails_a_job_no_plan_fits_instead_of_leaving_it_waiting(tmp_path) -> None:
    """Never a hang: a size with no valid plan (here the driver's own prior: the profiler does
    not know the job) fails the user's future with the clear error and frees the job's nodes."""
    import pytest

    from malleparsl.executors.control import ControlLoop
    from malleparsl.plans import MemoryBudgetError

    job, ex, _ = make(tmp_path, options={**OPTS, "node_memory_bytes": 0.1 * MIB})
    loop = ControlLoop(executor=ex, policy="milp", ckpt_root=str(tmp_path))
    loop.controller.add_nodes(["a", "b"], now_s=0)
    loop._handle(("submit", job))
    loop._replan()
    assert job.future.done() and job.segment is None  # never launched
    with pytest.raises(MemoryBudgetError, match="no execution plan fits 0.1 MiB per node"):
        job.future.result(timeout=0)
    assert not loop.controller.allocation.nodes_of("p")  # its nodes are free again
    loop._replan()  # and nothing is retried
    assert job.segment is None and job.resolutions == 1


def test_nodes_of_a_job_failed_for_want_of_a_plan_go_to_the_others_at_once(tmp_path) -> None:
    """The replan that fails a job runs again, so its nodes do not idle until the next event."""
    from malleparsl.executors.control import ControlLoop

    job, ex, store = make(tmp_path, options={**OPTS, "node_memory_bytes": 0.1 * MIB})
    plain = MalleableJob(spec=JobSpec("q", max_nodes=4), entry=print, options={"job_id": "q"},
                         executor=ex, store=store, store_host="h", store_port=1,
                         ckpt_dir=str(tmp_path / "ckq"), post=lambda ev: None, clock=lambda: 5.0)
    loop = ControlLoop(executor=ex, policy="equal-share", ckpt_root=str(tmp_path))
    loop.controller.add_nodes(["a", "b", "c", "d"], now_s=0)
    loop._handle(("submit", job))
    loop._handle(("submit", plain))
    loop._replan()
    assert job.future.done()  # failed: no plan fits
    assert len(loop.controller.allocation.nodes_of("q")) == 4  # in the same pass
    assert loop.replans == 2


def test_a_failed_replan_does_not_fail_a_job_on_the_kept_allocation(tmp_path, monkeypatch) -> None:
    """After a replan error the kept allocation may be stale: the job waits for the next one."""
    from malleparsl.executors.control import ControlLoop

    job, ex, _ = make(tmp_path, options={**OPTS, "node_memory_bytes": 0.1 * MIB})
    loop = ControlLoop(executor=ex, policy="equal-share", ckpt_root=str(tmp_path))
    loop.controller.add_nodes(["a", "b"], now_s=0)
    loop._handle(("submit", job))
    loop.controller.replan(now_s=1.0)
    assert loop.controller.allocation.nodes_of("p")  # the kept allocation gives it nodes

    def broken(**_kw):  # noqa: ANN003, ANN202
        raise RuntimeError("solver crashed")

    monkeypatch.setattr(loop.controller, "replan", broken)
    loop._replan()
    assert not job.future.done() and job.segment is None


def test_the_control_loop_reports_the_jobs_trained_samples_to_the_controller(tmp_path) -> None:
    """Live as in the simulator, policies and the JPA see what a job has left: the samples in
    rank 0's progress record reach ``Controller.report_progress`` (they were never reported
    live, so every view showed the spec's whole total as remaining)."""
    from malleparsl.executors.control import ControlLoop

    ex, store = Submits(), DictStore()
    job = MalleableJob(spec=JobSpec("p", max_nodes=2, total_samples=1000.0), entry=print,
                       options={"job_id": "p"}, executor=ex, store=store, store_host="h",
                       store_port=1, ckpt_dir=str(tmp_path / "ck"), post=lambda ev: None,
                       clock=lambda: 5.0)
    loop = ControlLoop(executor=ex, policy="equal-share", ckpt_root=str(tmp_path))
    loop.controller.add_nodes(["a", "b"], now_s=0)
    loop._handle(("submit", job))
    loop._replan()
    assert job.segment is not None
    store.set(progress_key("p", job.segment.index),
              json.dumps({"time": 7.0, "samples_per_s": 50.0, "samples": 300.0}))
    assert job.read_progress() == ProgressReading(2, 50.0, None, 300.0)
    store.set(progress_key("p", job.segment.index),
              json.dumps({"time": 8.0, "samples_per_s": 50.0, "samples": 400.0}))
    loop._tick()
    assert loop.controller.jobs["p"].done_samples == 400.0


def _running_loop(tmp_path, *, ranks_per_node, min_nodes=1):  # noqa: ANN001, ANN202
    """A control loop running job "p" (no global_batch option, max_nodes=3) on 3 nodes."""
    from malleparsl.executors.control import ControlLoop

    ex, store = Submits(), DictStore()
    job = MalleableJob(spec=JobSpec("p", min_nodes=min_nodes, max_nodes=3), entry=print,
                       options={"job_id": "p"},
                       executor=ex, store=store, store_host="h", store_port=1,
                       ckpt_dir=str(tmp_path / "ck"), post=lambda ev: None, clock=lambda: 5.0,
                       ranks_per_node=ranks_per_node)
    loop = ControlLoop(executor=ex, policy="equal-share", ckpt_root=str(tmp_path))
    loop.controller.add_nodes(["a", "b", "c"], now_s=0)
    loop._handle(("submit", job))
    loop._replan()
    return loop, job, store


def test_a_job_without_global_batch_is_capped_once_its_loop_reports_the_batch(tmp_path,
                                                                              caplog) -> None:
    """Rank 0's record carries the global batch ctx.steps splits; the control loop lowers the
    job's bound to the nodes it feeds (2 ranks a node, batch 2: 1 node) for every later
    decision, and says so once. Old code: the job kept its 3 nodes, 4 of 6 ranks idle."""
    import logging

    caplog.set_level(logging.WARNING, logger="malleparsl.controller")
    loop, job, store = _running_loop(tmp_path, ranks_per_node=2)
    assert len(job.segment.nodes) == 3
    for t in (7.0, 8.0):
        store.set(progress_key("p", job.segment.index), json.dumps(
            {"time": t, "samples_per_s": 50.0, "samples": 100.0 * t, "global_batch": 2}))
        assert loop._tick() is (t == 7.0)  # the first record lowers the bound: replan
    assert loop.controller.jobs["p"].node_cap == 1
    loop._replan()
    assert loop.controller.allocation.size("p") == 1
    assert job.state is JobState.STOPPING  # to relaunch on the one node its batch feeds
    said = [r.getMessage() for r in caplog.records if "max_nodes" in r.getMessage()]
    assert said == ["job 'p': max_nodes 3 -> 1 from now on: its loop splits global_batch=2 "
                    "samples a step (ctx.steps) over 2 rank(s) a node: past 1 node(s) a rank "
                    "trains nothing; give global_batch=2 in its malleable options to cap it "
                    "from submit"]


def test_a_later_phase_with_a_larger_batch_lifts_the_learnt_cap(tmp_path, caplog) -> None:
    """Rank 0's records say batch 2 (1 node of 2 ranks), then, in the loop's second phase,
    batch 6 (3 nodes): the job gets its 3 nodes back. Old code: the cap only went down, the
    job stayed on 1 node for the rest of its run."""
    import logging

    caplog.set_level(logging.INFO, logger="malleparsl.controller")
    loop, job, store = _running_loop(tmp_path, ranks_per_node=2)
    assert loop._cap_to_batch("p", job, 2) and not loop._cap_to_batch("p", job, 2)
    loop._replan()
    assert loop.controller.allocation.size("p") == 1
    assert loop._cap_to_batch("p", job, 4) and loop.controller.jobs["p"].node_cap == 2
    assert loop._cap_to_batch("p", job, 6) and loop.controller.jobs["p"].node_cap is None
    loop._replan()
    assert loop.controller.allocation.size("p") == 3
    said = [m for r in caplog.records if "max_nodes" in (m := r.getMessage())]
    assert said[1:] == ["job 'p': max_nodes 1 -> 2 from now on: its loop splits global_batch=4 "
                        "samples a step (ctx.steps) over 2 rank(s) a node now",
                        "job 'p': max_nodes 2 -> 3 from now on: its loop splits global_batch=6 "
                        "samples a step (ctx.steps) over 2 rank(s) a node now"]


def test_a_learnt_cap_below_one_node_says_to_raise_the_batch_not_to_name_it(tmp_path,
                                                                          caplog) -> None:
    """4 ranks a node, a loop batch of 2: the job keeps its one node (min_nodes) and the
    warning says what helps. Old code: 'past 0 node(s) a rank trains nothing; give
    global_batch=2 in its malleable options', an option that refuses the job at submit."""
    import logging

    caplog.set_level(logging.WARNING, logger="malleparsl.controller")
    loop, job, store = _running_loop(tmp_path, ranks_per_node=4)
    assert loop._cap_to_batch("p", job, 2) and loop.controller.jobs["p"].node_cap == 1
    said = [r.getMessage() for r in caplog.records if "max_nodes" in r.getMessage()]
    assert said == ["job 'p': max_nodes 3 -> 1 from now on: its loop splits global_batch=2 "
                    "samples a step (ctx.steps) over 4 rank(s) a node: global_batch=2 has "
                    "fewer samples than one node's 4 ranks, so some rank trains nothing at any "
                    "size: raise global_batch to at least 4 or run fewer ranks per node"]


def test_a_learnt_cap_below_min_nodes_says_min_nodes_holds_it_not_to_name_the_batch(
        tmp_path, caplog) -> None:
    """2 ranks a node, a loop batch of 2 (1 node feeds it), min_nodes=2: the job stays at 2
    and the warning says why. Old code advised 'give global_batch=2 in its malleable options',
    which the submit check then refuses (min_nodes=2 is past that cap)."""
    import logging

    caplog.set_level(logging.WARNING, logger="malleparsl.controller")
    loop, job, store = _running_loop(tmp_path, ranks_per_node=2, min_nodes=2)
    assert loop._cap_to_batch("p", job, 2) and loop.controller.jobs["p"].node_cap == 2
    said = [r.getMessage() for r in caplog.records if "max_nodes" in r.getMessage()]
    assert said == ["job 'p': max_nodes 3 -> 2 from now on: its loop splits global_batch=2 "
                    "samples a step (ctx.steps) over 2 rank(s) a node: past 1 node(s) a rank "
                    "trains nothing, but its min_nodes=2 keeps it there: lower min_nodes or "
                    "raise global_batch"]


def test_a_learnt_cap_lowers_the_jobs_demand_the_pilot_scavengers_hold_nodes_for(tmp_path) -> None:
    """The site configs' demand hook (jobs_demand) sums the snapshot's max_nodes: the learnt
    cap must show there, or a pilot scavenger keeps holding nodes the controller never gives
    the job. Old code: the snapshot kept the submitted max_nodes=3 (demand 3, 2 nodes idle)."""
    from types import SimpleNamespace

    from malleparsl.executors.snapshot import take_snapshot
    from malleparsl.site_configs.common import jobs_demand

    loop, job, store = _running_loop(tmp_path, ranks_per_node=2)
    executor = SimpleNamespace(control=loop, snapshot=lambda: take_snapshot(loop))
    assert take_snapshot(loop).jobs["p"].max_nodes == 3 and jobs_demand(executor) == 3
    store.set(progress_key("p", job.segment.index), json.dumps(
        {"time": 7.0, "samples_per_s": 50.0, "samples": 700.0, "global_batch": 2}))
    assert loop._tick()
    assert take_snapshot(loop).jobs["p"].max_nodes == 1 and jobs_demand(executor) == 1
