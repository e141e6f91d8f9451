"""The demo's training function, run in-process with a one-rank TrainContext: it resumes a
promoted trial from its checkpoint and reaches the demo's accuracy target."""

import pytest

from malleparsl.errors import CheckpointError, SpecError
from malleparsl.workflows.apprunner import AppTrialRunner, run_plain_trial
from malleparsl.workflows.digits import total_steps, train_digits
from malleparsl.workflows.scheduler import Suggestion

CFG = {"lr": 1e-2, "width": 64, "depth": 1, "batch_size": 64}


def test_rungs_resume_from_the_checkpoint_and_reach_the_target(tmp_path):
    ck = str(tmp_path / "trial")
    r1 = run_plain_trial(train_digits, {**CFG, "epochs": 2}, ck, {"torch_threads": 1})
    # the next rung continues the trial's checkpoint: it says so (a reused folder is refused)
    with pytest.raises(CheckpointError, match="already holds 1 checkpoint"):
        run_plain_trial(train_digits, {**CFG, "epochs": 18}, ck, {"torch_threads": 1})
    r2 = run_plain_trial(train_digits, {**CFG, "epochs": 18}, ck, {"torch_threads": 1,
                                                                    "resume": True})
    assert r1["steps"] == total_steps({**CFG, "epochs": 2}, 1437) == 45
    assert r2["steps"] == 405 and r2["samples"] == pytest.approx(405 * 64)
    assert r2["accuracy"] >= 0.95 and r2["accuracy"] > r1["accuracy"]
    # asking again for the budget already reached trains nothing and keeps the result
    r3 = run_plain_trial(train_digits, {**CFG, "epochs": 18}, ck, {"torch_threads": 1,
                                                                    "resume": True})
    assert r3["steps"] == 405 and r3["accuracy"] == pytest.approx(r2["accuracy"])


def test_a_config_without_budget_is_explained():
    with pytest.raises(SpecError, match="'epochs' or 'samples'"):
        total_steps({"batch_size": 32}, 100)


def test_app_runner_puts_the_budget_in_the_config_and_checks_its_arguments():
    r = AppTrialRunner(train_fn=train_digits, budget_unit="samples")
    cfg = r.config_for(Suggestion("t0", {"lr": 0.1}, rung=1, budget=5000))
    assert cfg == {"lr": 0.1, "samples": 5000}
    assert r.job_id("search", Suggestion("t0", {}, rung=2)) == "search-t0-r2"
    # a small rescale cost by default: without one the allocator may stop a running trial to
    # start an equal one (observed: 356 equal-size relaunches in one demo run)
    assert r.options["rescale_up_s"] == r.options["rescale_down_s"] == 0.5
    assert "rescale_up_s" not in AppTrialRunner(train_fn=train_digits, rescale_hint_s=None).options
    with pytest.raises(SpecError, match="min_nodes <= max_nodes"):
        AppTrialRunner(train_fn=train_digits, min_nodes=3, max_nodes=2)
    with pytest.raises(SpecError, match="budget_unit"):
        AppTrialRunner(train_fn=train_digits, budget_unit="steps")
