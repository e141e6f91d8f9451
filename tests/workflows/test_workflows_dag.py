"""The DAG engine: stages start when their parents finish, overlap otherwise, edges carry
selected results, failures are contained, and no trial result is lost."""

import threading
import time

import pytest

from malleparsl.errors import SpecError
from malleparsl.workflows.dag import (
    FixedTrials,
    FunctionStage,
    TrialStage,
    Workflow,
    WorkflowError,
    top_k,
)
from malleparsl.workflows.hpo import ASHA
from malleparsl.workflows.runner import ThreadTrialRunner
from malleparsl.workflows.scheduler import Budget
from malleparsl.workflows.space import IntRange, SearchSpace


def fixed(*xs):
    return lambda inputs: FixedTrials(configs=[{"x": x} for x in xs])


def test_independent_stages_overlap_and_dependents_wait():
    def slow(cfg, budget):
        time.sleep(0.3)
        return {"accuracy": cfg["x"]}

    wf = Workflow()
    wf.add(TrialStage("a", fixed(1, 2)))
    wf.add(TrialStage("b", fixed(3, 4)))
    wf.add(TrialStage("c", lambda inp: FixedTrials(configs=inp["a"] + inp["b"])),
           after=["a", "b"], select=top_k(1))
    runner = ThreadTrialRunner(slow, max_workers=8)
    res = wf.run(runner, timeout_s=30)
    runner.close()
    rows = {(r.stage, r.trial_id): r for r in res.table.rows}
    a_rows = [r for r in res.table.rows if r.stage == "a"]
    b_rows = [r for r in res.table.rows if r.stage == "b"]
    c_rows = [r for r in res.table.rows if r.stage == "c"]
    # a and b ran at the same time
    assert min(r.finished_s for r in a_rows) > max(r.started_s for r in b_rows)
    # c started only after both parents finished and got their best trials (x=2 and x=4)
    assert min(r.started_s for r in c_rows) >= max(r.finished_s for r in a_rows + b_rows)
    assert sorted(r.config["x"] for r in c_rows) == [2, 4]
    assert len(rows) == 6 and res.wall_s > 0  # overlap is shown by the order above, not a time


def test_max_concurrent_limits_trials_in_flight():
    lock, now, peak = threading.Lock(), [0], [0]

    def fn(cfg, budget):
        with lock:
            now[0] += 1
            peak[0] = max(peak[0], now[0])
        time.sleep(0.05)
        with lock:
            now[0] -= 1
        return {"accuracy": 1.0}

    wf = Workflow()
    wf.add(TrialStage("s", fixed(*range(10)), max_concurrent=3, poll_s=0.01))
    runner = ThreadTrialRunner(fn, max_workers=10)
    res = wf.run(runner, timeout_s=30)
    assert len(res.table) == 10 and peak[0] == 3


def test_asha_stage_two_stage_sweep_keeps_every_result():
    space = SearchSpace({"x": IntRange(0, 100)})
    wf = Workflow()
    wf.add(TrialStage("search", lambda _: ASHA(space=space, n_trials=9, seed=1,
                                               budget=Budget(min_budget=1, max_budget=9, eta=3)),
                      max_concurrent=3, poll_s=0.01))
    wf.add(TrialStage("final", lambda inp: FixedTrials(configs=inp["search"], budget=27)),
           after=["search"], select=top_k(2))
    runner = ThreadTrialRunner(lambda cfg, b: {"accuracy": cfg["x"] / 100 + b / 1000},
                               max_workers=3)
    res = wf.run(runner, timeout_s=30)
    search = res.stages["search"].rows
    assert sum(r.rung == 0 for r in search) == 9
    assert all(r.metrics for r in res.table.rows), "every trial has its metrics"
    finished = [e for e in runner.events if e.kind == "finished"]
    assert len(finished) == len(res.table.rows)
    best = res.table.best()
    assert best.stage == "final" and best.budget == 27
    assert best.config["x"] == max(r.config["x"] for r in search)
    statuses = {r.status for r in search}
    assert statuses <= {"promoted", "stopped"}


def test_a_failing_trial_is_recorded_and_the_stage_goes_on():
    def fn(cfg, budget):
        if cfg["x"] == 2:
            raise RuntimeError("diverged")
        return {"accuracy": cfg["x"]}

    wf = Workflow()
    wf.add(TrialStage("s", fixed(1, 2, 3)))
    res = wf.run(ThreadTrialRunner(fn), timeout_s=30)
    failed = res.table.failed()
    assert [r.config["x"] for r in failed] == [2] and "diverged" in failed[0].error
    assert res.table.best().config["x"] == 3


def test_a_failed_stage_skips_its_dependents_but_keeps_other_results():
    wf = Workflow()
    wf.add(FunctionStage("boom", lambda inp: 1 / 0))
    wf.add(FunctionStage("after", lambda inp: "never"), after=["boom"])
    wf.add(TrialStage("other", fixed(5)))
    with pytest.raises(WorkflowError, match="after.*boom") as ei:
        wf.run(ThreadTrialRunner(lambda c, b: {"accuracy": 1}), timeout_s=30)
    assert [r.config["x"] for r in ei.value.result.table.rows] == [5]
    assert isinstance(ei.value.result.failed["boom"], ZeroDivisionError)


def test_graph_errors_name_the_problem():
    wf = Workflow()
    wf.add(FunctionStage("a", lambda i: 1))
    with pytest.raises(SpecError, match="used twice"):
        wf.add(FunctionStage("a", lambda i: 1))
    with pytest.raises(SpecError, match="unknown stage 'zz'"):
        wf.add(FunctionStage("b", lambda i: 1), after=["zz"])
    wf.add(FunctionStage("b", lambda i: 1), after=["a"])
    wf.graph.add_edge("b", "a", select=None)
    with pytest.raises(SpecError, match="cycle"):
        wf.run(ThreadTrialRunner(lambda c, b: 0))


def test_results_table_saves_csv_and_best_checkpoint(tmp_path):
    def fn(cfg, budget):
        return {"accuracy": cfg["x"] / 10}

    wf = Workflow()
    wf.add(TrialStage("s", fixed(1, 7, 3)))
    runner = ThreadTrialRunner(fn, ckpt_root=tmp_path / "ckpt")
    res = wf.run(runner, timeout_s=30)
    best = res.table.best()
    (tmp_path / "ckpt" / "s" / best.trial_id / "ckpt-5.pt").write_bytes(b"x")
    paths = res.table.save(tmp_path / "out")
    import json

    import pandas as pd

    df = pd.read_csv(paths["trials"])
    assert sorted(df["config.x"]) == [1, 3, 7]
    doc = json.loads(paths["best"].read_text())
    assert doc["config"] == {"x": 7} and doc["checkpoint"].endswith("ckpt-5.pt")


def test_a_trial_that_cannot_be_submitted_is_recorded_as_failed():
    class Refuses(ThreadTrialRunner):
        def _submit(self, stage, s, job_id, ckpt_dir):
            if s.config["x"] == 1:
                raise RuntimeError("executor is down")
            return super()._submit(stage, s, job_id, ckpt_dir)

    wf = Workflow()
    wf.add(TrialStage("s", fixed(1, 2)))
    res = wf.run(Refuses(lambda cfg, b: {"accuracy": cfg["x"]}), timeout_s=30)
    assert [(r.config["x"], r.status) for r in res.table.rows] == [(1, "failed"), (2, "stopped")]
    assert "executor is down" in res.table.failed()[0].error
