"""A job with a fixed FSDP2 plan whose options do not name ``global_batch`` can be given a
size whose ranks do not split its batch (the controller cannot know the batch). Its ranks then
refuse the size in ``ctx.steps`` with an :class:`~malleparsl.plans.UnevenSplitError` carrying
the batch; the driver puts the job back to waiting (not failed: the size was the controller's
choice), the control loop limits it to the sizes that split the batch
(``Controller.limit_sizes``) and relaunches it there. Rank 0's progress records teach the same
sizes before any refusal. Before, every rank's ``SpecError`` failed the future and the result
was lost. A batch refused twice, or one no size in the bounds splits, fails the future with a
clear error: never a loop, never a hang.
"""

from __future__ import annotations

import json
import logging
import pickle
from concurrent.futures import Future

import pytest
from fake_store import DictStore

from malleparsl.allocator import make_policy
from malleparsl.controller import Controller
from malleparsl.errors import SpecError
from malleparsl.executors.control import ControlLoop
from malleparsl.executors.driver import DriverEvent, JobState, MalleableJob
from malleparsl.executors.planning import LinearPlaceholderAdvisor, spec_from_options
from malleparsl.executors.protocol import progress_key
from malleparsl.plans import UnevenSplitError

UNEVEN = "plan 'fsdp' needs the global batch to split evenly: global_batch=64 over 3 ranks"




class Ranks:
    """An executor whose rank tasks the test ends by hand."""

    def __init__(self) -> None:
        self.futures: list[tuple[str, Future]] = []

    def submit_to_node(self, node, func, info, *a, **k):  # noqa: ANN001, ANN002, ANN003, ANN201
        fut: Future = Future()
        self.futures.append((node, fut))
        return fut


def _loop(tmp_path, *, nodes=("a", "b", "c"), **options):  # noqa: ANN001, ANN003, ANN202
    """A control loop running job "p" (plan fsdp, no global_batch option) on ``nodes``."""
    ex, store = Ranks(), DictStore()
    opts = {"job_id": "p", "plan": "fsdp", "max_nodes": 3, **options}
    job = MalleableJob(spec=spec_from_options(opts), entry=print, options=opts, executor=ex,
                       store=store, store_host="h", store_port=1, ckpt_dir=str(tmp_path / "ck"),
                       post=lambda ev: None, clock=lambda: 5.0)
    loop = ControlLoop(executor=ex, policy="equal-share", ckpt_root=str(tmp_path))
    loop.controller.add_nodes(list(nodes), now_s=0)
    loop._handle(("submit", job))
    loop._replan()
    return loop, job, ex, store


def _refuse(loop, job, ex, *errors) -> None:  # noqa: ANN001, ANN002
    """Every rank of the running segment ends with ``errors`` (cycled)."""
    seg = job.segment
    for rank, (_, fut) in enumerate(ex.futures[-seg.world_size:]):
        fut.set_exception(errors[rank % len(errors)])
        loop._handle(("rank", "p", seg.index, rank, fut))


def test_ranks_refusing_their_size_relaunch_the_job_where_its_batch_splits(tmp_path,
                                                                           caplog) -> None:
    """Old code: the future failed with the ranks' SpecError; the job never ran again."""
    caplog.set_level(logging.WARNING, logger="malleparsl")
    loop, job, ex, store = _loop(tmp_path)
    assert len(job.segment.nodes) == 3
    _refuse(loop, job, ex, UnevenSplitError(UNEVEN, 64))
    assert not job.future.done() and job.state is JobState.WAITING
    assert loop.controller.jobs["p"].node_sizes == (1, 2) and job.restarts == 0
    loop._replan()
    assert job.state is JobState.RUNNING and len(job.segment.nodes) == 2
    assert job.segment.index == 1 and loop.controller.allocation.size("p") == 2
    said = [r.getMessage() for r in caplog.records]
    assert "job p: its plan cannot split global_batch=64 over segment 0's 3 rank(s); " \
           "relaunching at a size that does" in said
    assert "job 'p': node counts [1, 2] only from now on: plan 'fsdp' needs its loop's " \
           "global_batch=64 (ctx.steps) to split evenly over the ranks (1 a node); give " \
           "global_batch=64 in its malleable options to limit it from submit" in said


def test_a_batch_refused_twice_fails_the_future_with_the_ranks_error(tmp_path) -> None:
    loop, job, ex, store = _loop(tmp_path)
    _refuse(loop, job, ex, UnevenSplitError(UNEVEN, 64))
    loop._replan()
    err = UnevenSplitError(UNEVEN, 64)
    _refuse(loop, job, ex, err)  # as if the controller could not avoid the size
    assert job.future.exception(timeout=0) is err and job.state is JobState.DONE
    assert loop.controller.jobs["p"].status.value == "done"


def test_no_size_that_splits_the_batch_fails_the_future_naming_the_fix(tmp_path) -> None:
    loop, job, ex, store = _loop(tmp_path, min_nodes=3)
    _refuse(loop, job, ex, UnevenSplitError(UNEVEN, 64))
    with pytest.raises(SpecError, match=r"plan 'fsdp' needs global_batch=64 to split evenly "
                       r"over the ranks, and no size from min_nodes=3 to max_nodes=3 node\(s\) "
                       r".*or run another plan"):
        job.future.result(timeout=0)
    assert loop.controller.jobs["p"].status.value == "done"
    assert loop.controller.allocation.size("p") == 0  # its nodes freed


def test_a_user_error_among_the_refusals_fails_the_future_as_before(tmp_path) -> None:
    loop, job, ex, store = _loop(tmp_path)
    bug = ValueError("the user's own bug")
    _refuse(loop, job, ex, UnevenSplitError(UNEVEN, 64), bug)  # not a re-run: the driver's
    assert job.state is JobState.DONE and job.future.exception() is not None  # first error
    assert job.uneven_ahead == {} and loop.controller.jobs["p"].node_sizes is None


def test_a_progress_record_limits_the_sizes_before_any_refusal(tmp_path, caplog) -> None:
    """The job runs on 2 nodes and reports batch 64; a third node appears. Old code: the
    controller grew it to 3, where its ranks would refuse the size (a lost segment). A later
    batch that splits at every size lifts the limit."""
    caplog.set_level(logging.INFO, logger="malleparsl.controller")
    loop, job, ex, store = _loop(tmp_path, nodes=("a", "b"))
    store.set(progress_key("p", job.segment.index), json.dumps(
        {"time": 7.0, "samples_per_s": 50.0, "samples": 640.0, "global_batch": 64}))
    assert loop._tick() and loop.controller.jobs["p"].node_sizes == (1, 2)
    loop.controller.add_nodes(["c"], now_s=8)
    loop._replan()
    assert loop.controller.allocation.size("p") == 2 and job.state is JobState.RUNNING
    store.set(progress_key("p", job.segment.index), json.dumps(
        {"time": 8.0, "samples_per_s": 50.0, "samples": 700.0, "global_batch": 48}))
    assert loop._tick() and loop.controller.jobs["p"].node_sizes is None  # 48 splits over 3
    loop._replan()
    assert loop.controller.allocation.size("p") == 3
    said = [(r.levelname, r.getMessage()) for r in caplog.records if "from now on" in r.getMessage()]
    assert said == [
        ("WARNING", "job 'p': node counts [1, 2] only from now on: plan 'fsdp' needs its loop's "
                    "global_batch=64 (ctx.steps) to split evenly over the ranks (1 a node); give "
                    "global_batch=64 in its malleable options to limit it from submit"),
        ("INFO", "job 'p': every node count from now on: plan 'fsdp' needs its loop's "
                 "global_batch=48 (ctx.steps) to split evenly over the ranks (1 a node)")]


def test_the_refusal_reaches_the_driver_with_its_batch() -> None:
    """Ranks' exceptions cross process boundaries pickled: the batch must survive."""
    got = pickle.loads(pickle.dumps(UnevenSplitError(UNEVEN, 64, step=60)))
    assert type(got) is UnevenSplitError and got.global_batch == 64 and str(got) == UNEVEN
    assert got.step == 60
    assert isinstance(got, SpecError)


def test_learnt_sizes_follow_the_latest_batch_and_stay_in_the_bounds() -> None:
    ctl = Controller(policy=make_policy("equal-share"), advisor=LinearPlaceholderAdvisor())
    ctl.add_nodes([f"n{i}" for i in range(4)], now_s=0)
    ctl.submit(spec_from_options({"job_id": "a", "max_nodes": 4, "total_samples": 1e9}), now_s=0)
    assert ctl.limit_sizes("a", [1, 2, 4], why="batch 64")
    assert not ctl.limit_sizes("a", (4, 2, 1), why="again")
    ctl.replan(now_s=0)
    assert ctl.allocation.size("a") == 4
    ctl.remove_nodes(["n0"], now_s=1)
    ctl.replan(now_s=1)
    assert ctl.allocation.size("a") == 2  # 3 is a hole
    assert ctl.limit_sizes("a", range(1, 5), why="batch 48") and ctl.jobs["a"].node_sizes is None
    ctl.replan(now_s=2)
    assert ctl.allocation.size("a") == 3
    with pytest.raises(SpecError, match=r"sizes must be node counts within min_nodes..max_nodes"):
        ctl.limit_sizes("a", [2, 8], why="past max_nodes")


def test_an_advisor_pinned_at_a_learnt_hole_comes_down_to_a_size_the_job_runs_at() -> None:
    class Pinned(LinearPlaceholderAdvisor):  # pins the job at 3 (a probe)
        def views(self, snapshot, jobs, allocation):  # noqa: ANN001, ANN202
            import dataclasses

            return [dataclasses.replace(v, min_nodes=3, max_nodes=3)
                    for v in super().views(snapshot, jobs, allocation)]

    ctl = Controller(policy=make_policy("equal-share"), advisor=Pinned())
    ctl.add_nodes([f"n{i}" for i in range(4)], now_s=0)
    ctl.submit(spec_from_options({"job_id": "a", "max_nodes": 4, "total_samples": 1e9}), now_s=0)
    ctl.limit_sizes("a", [1, 2, 4], why="batch 64")
    ctl.replan(now_s=0)
    assert ctl.allocation.size("a") == 2


def test_the_driver_reports_the_refusal_as_its_own_event(tmp_path) -> None:
    loop, job, ex, store = _loop(tmp_path)
    seg = job.segment
    events = []
    for rank, (_, fut) in enumerate(ex.futures[-seg.world_size:]):  # after the warm-ups
        fut.set_exception(UnevenSplitError(UNEVEN, 64))
        events.append(job.on_rank_done(seg.index, rank, fut))
    assert events == [None, None, DriverEvent.UNEVEN] and job.uneven_ahead == {64: 0}


def test_the_pilot_demand_follows_the_learnt_sizes(tmp_path) -> None:
    """The site configs' demand hook sums the snapshot's max_nodes. Old code: 3 after the
    job learnt it runs at 1 or 2 only, so a pilot scavenger held a node for nothing."""
    from malleparsl.executors.snapshot import take_snapshot

    loop, job, ex, store = _loop(tmp_path)
    assert take_snapshot(loop).jobs["p"].max_nodes == 3
    _refuse(loop, job, ex, UnevenSplitError(UNEVEN, 64))
    assert take_snapshot(loop).jobs["p"].max_nodes == 2
    loop.controller.cap_nodes("p", 1, why="batch 1")
    assert take_snapshot(loop).jobs["p"].max_nodes == 1


def test_a_warm_up_phase_does_not_grow_the_job_back_into_the_size_refused_ahead(
        tmp_path, caplog) -> None:
    """A loop that warms up at batch 48 (splits over 1, 2 or 3 ranks) to step 60, then trains
    at 64: its segment on 3 nodes refuses 64 at step 60 and is relaunched on 2 from a
    checkpoint in the warm-up. Its records of 48 before step 60 keep it where 64 splits too;
    past step 60 the latest batch decides again, and 64 refused at a later phase is re-run.
    Old code: the first record of 48 lifted the limit, the job grew back to 3 and 64 was
    refused there again, which failed the future ('refused twice')."""
    caplog.set_level(logging.WARNING, logger="malleparsl.controller")
    loop, job, ex, store = _loop(tmp_path)

    def record(t, step, batch):  # noqa: ANN001, ANN202 - rank 0's record, read by a tick
        store.set(progress_key("p", job.segment.index), json.dumps(
            {"time": t, "step": step, "samples_per_s": 50.0, "samples": 48.0 * step,
             "global_batch": batch}))
        loop._tick()
        loop._replan()

    _refuse(loop, job, ex, UnevenSplitError(UNEVEN, 64, step=60))
    assert job.uneven_ahead == {64: 60}
    loop._replan()
    for t, step, batch in ((7.0, 50, 48), (8.0, 60, 48)):  # the warm-up's end, then 64
        record(t, step, batch)
        assert loop.controller.jobs["p"].node_sizes == (1, 2) and len(job.segment.nodes) == 2
    record(9.0, 61, 64)
    assert job.uneven_ahead == {} and loop.controller.jobs["p"].node_sizes == (1, 2)
    record(10.0, 200, 48)  # a later phase at 48: every size again
    assert loop.controller.jobs["p"].node_sizes is None and job.state is JobState.STOPPING
    seg = job.segment
    from malleparsl.executors.protocol import SegmentOutcome

    for rank, (_, fut) in enumerate(ex.futures[-seg.world_size:]):
        fut.set_result(SegmentOutcome("stopped", rank, 201, 48.0 * 201))
        loop._handle(("rank", "p", seg.index, rank, fut))
    loop._replan()
    assert len(job.segment.nodes) == 3
    _refuse(loop, job, ex, UnevenSplitError(UNEVEN, 64, step=300))  # 64 again, further on
    assert not job.future.done() and job.uneven_ahead == {64: 300}
    loop._replan()
    assert len(job.segment.nodes) == 2 and job.restarts == 0
    said = [r.getMessage() for r in caplog.records]
    assert not [m for m in said if "global_batch=48" in m and "from now on" in m]  # no change


def test_a_warm_up_phase_before_the_refused_step_keeps_the_guard(tmp_path) -> None:
    """Records of another batch before the step the loop needs the refused one from are no
    reason to try it again: a second refusal there (the controller chose a size it knew to
    avoid) fails the future, never a loop."""
    loop, job, ex, store = _loop(tmp_path)
    _refuse(loop, job, ex, UnevenSplitError(UNEVEN, 64, step=60))
    loop._replan()
    store.set(progress_key("p", job.segment.index), json.dumps(
        {"time": 7.0, "step": 50, "samples_per_s": 50.0, "samples": 2400.0, "global_batch": 48}))
    loop._tick()
    err = UnevenSplitError(UNEVEN, 64, step=60)
    _refuse(loop, job, ex, err)
    assert job.future.exception(timeout=0) is err and job.state is JobState.DONE


def test_a_jpa_probe_at_a_min_nodes_the_job_learnt_it_cannot_run_at_moves_to_one_it_can() -> None:
    """The JPA probes a new job at its min_nodes (3); its ranks refuse 3 (batch 64), so it runs
    at 4 or 8 only. Old code: the probe view stayed pinned at 3, which _bounded turned into 4,
    so the probe was never placed nor timed out: the job stayed at 4 of 40 idle nodes for
    good (and its probe held the JPA's probe budget)."""
    from malleparsl.executors.planning import build_policy

    pol, jpa = build_policy("jpa", {}, None)
    ctl = Controller(policy=pol, advisor=jpa)
    ctl.add_nodes([f"n{i:02d}" for i in range(40)], now_s=0)
    ctl.submit(spec_from_options({"job_id": "a", "min_nodes": 3, "max_nodes": 8, "plan": "fsdp",
                                  "total_samples": 1e12}), now_s=0)
    ctl.replan(now_s=0)
    assert ctl.allocation.size("a") == 3 and jpa.probe_requests() == {"a": 3}
    ctl.limit_sizes("a", (4, 8), why="batch 64")  # what the refusal at 3 teaches
    ctl.replan(now_s=1)
    assert jpa.probe_requests() == {"a": 4} and ctl.allocation.size("a") == 4
    for t in range(2, 40):  # readings at the probed size end the probe; the job then grows
        ctl.observe("a", n_nodes=ctl.allocation.size("a"), samples_per_s=100.0, now_s=30.0 * t)
        ctl.replan(now_s=30.0 * t)
    assert jpa.probe_requests() == {} and ctl.allocation.size("a") == 8


def test_a_later_phase_refuses_with_the_step_it_starts_from() -> None:
    """ctx.steps of a loop's second phase (64, after 60 steps of another batch) on 3 ranks:
    the error names step 60, where the loop needs 64 from."""
    pytest.importorskip("torch")
    from malleparsl.apps.context import TrainContext

    ctx = TrainContext(rank=0, world_size=3, local_world_size=1,
                       options={"torch_threads": 1, "plan": "fsdp"})
    try:
        ctx.step = 60  # as after the first phase's steps
        with pytest.raises(UnevenSplitError) as e:
            next(ctx.steps(100, global_batch=64, dataset_size=640))
    finally:
        ctx.close()
    assert (e.value.global_batch, e.value.step) == (64, 60)
