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


def test_a_plain_trial_checkpoints_in_its_own_folder_whatever_the_options_say(tmp_path):
    """A runner's options for every trial may name a ckpt_dir (the malleable path's per-call
    folder overrides it); the plain path ran into 'got multiple values for ckpt_dir'."""
    ck, other = tmp_path / "trial", tmp_path / "shared"
    r = run_plain_trial(train_digits, {**CFG, "epochs": 1}, str(ck),
                        {"torch_threads": 1, "ckpt_dir": str(other)})
    assert r["steps"] > 0 and any(ck.iterdir()) and not other.exists()


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


def test_a_decorated_train_fn_keeps_its_options_and_gets_what_the_runner_was_given():
    """A @malleable_app passed as train_fn was used as is: the runner's max_nodes, options and
    rescale hint were dropped without a word (a sweep asked for 8 nodes ran at the app's 1)."""
    from malleparsl.apps import malleable_app

    app = malleable_app(train_digits, min_nodes=2, max_nodes=16, rescale_up_s=3.0,
                        extra_options=("note",), executors=["malleable"])
    calls = []
    r = AppTrialRunner(train_fn=app, max_nodes=8, options={"torch_threads": 2, "note": "x"})
    r._app = lambda cfg, malleable_options: calls.append(malleable_options)
    r._submit("search", Suggestion("t0", {"lr": 0.1}, budget=1), "search-t0-r0", "/tmp/ck")
    opts = calls[-1]
    assert (r.min_nodes, r.max_nodes) == (2, 8)
    assert opts["max_nodes"] == 8 and "min_nodes" not in opts  # the app's own 2 stays
    assert opts["torch_threads"] == 2 and opts["note"] == "x" and opts["ckpt_dir"] == "/tmp/ck"
    assert "rescale_up_s" not in opts and opts["rescale_down_s"] == 0.5  # the app set up only
    own = AppTrialRunner(train_fn=app)
    assert (own.min_nodes, own.max_nodes) == (2, 16)
    with pytest.raises(SpecError, match="torch_thread"):
        AppTrialRunner(train_fn=app, options={"torch_thread": 2})
    with pytest.raises(SpecError, match="min_nodes <= max_nodes"):
        AppTrialRunner(train_fn=app, max_nodes=1)


class _Recorder:
    """Stands in for the malleable app: keeps the options each call would submit with."""

    def __init__(self):
        self.calls = []

    def __call__(self, *args, malleable_options=None, **kwargs):
        import concurrent.futures as cf

        self.calls.append(dict(malleable_options or {}))
        return cf.Future()


def _spec(runner, opts, ranks_per_node):
    """The controller's spec of one submitted trial: the app's options, then the call's."""
    from malleparsl.executors.planning import spec_from_options

    return spec_from_options({**runner.options, "min_nodes": runner.min_nodes,
                              "max_nodes": runner.max_nodes, **opts},
                             ranks_per_node=ranks_per_node)


def test_app_runner_caps_each_trial_at_the_global_batch_its_training_function_uses(tmp_path):
    from malleparsl.workflows.digits import global_batch_of

    r = AppTrialRunner(train_fn=train_digits, max_nodes=8, global_batch_of=global_batch_of,
                       ckpt_root=tmp_path)
    r._app = rec = _Recorder()
    r._submit("search", Suggestion("t0", {**CFG, "batch_size": 6}, budget=1), "search-t0-r0",
              str(tmp_path / "t0"))
    opts = rec.calls[-1]
    # the batch train_digits splits (config batch_size), so ctx.steps agrees with the option
    assert opts["global_batch"] == 6
    assert _spec(r, opts, 2).max_nodes == 3 and _spec(r, opts, 1).max_nodes == 6
    # without it the runner cannot know what train_fn does with its config: no cap
    plain = AppTrialRunner(train_fn=train_digits, max_nodes=8)
    plain._app = rec = _Recorder()
    plain._submit("search", Suggestion("t0", {**CFG, "batch_size": 6}, budget=1), "j", None)
    assert "global_batch" not in rec.calls[-1] and _spec(plain, rec.calls[-1], 2).max_nodes == 8
    with pytest.raises(SpecError, match="global_batch_of"):
        AppTrialRunner(train_fn=train_digits, global_batch_of=6)


def test_packed_runner_caps_each_array_at_its_trials_global_batch(tmp_path):
    from malleparsl.workflows.digits import global_batch_of, steps_of, train_digits_array
    from malleparsl.workflows.packing import PackedTrialRunner

    r = PackedTrialRunner(array_fn=train_digits_array, steps_of=steps_of, pack=2,
                          train_fn=train_digits, max_nodes=8, ckpt_root=str(tmp_path),
                          global_batch_of=global_batch_of, budget_unit="samples")
    try:
        r._array_app = rec = _Recorder()
        chunk = [("search", Suggestion(t, {**CFG, "batch_size": 5, "lr": lr}, budget=50),
                  str(tmp_path / t), None, 0.0) for t, lr in (("a", 0.1), ("b", 0.01))]
        r._launch(chunk)
        opts = rec.calls[-1]
        assert opts["global_batch"] == 5  # train_digits_array's batch for these trials
        assert opts["total_samples"] == 2 * steps_of({**CFG, "batch_size": 5, "samples": 50}) * 5
        assert _spec(r, opts, 2).max_nodes == 2 and _spec(r, opts, 1).max_nodes == 5
    finally:
        r.close()


def test_global_batch_of_is_the_batch_the_digits_functions_give_ctx_steps(tmp_path):
    """The option the runners pass is checked by ctx.steps against the loop's own batch: it
    agrees for train_digits and train_digits_array, a different value fails the trial."""
    from malleparsl.apps.context import TrainContext
    from malleparsl.workflows.digits import global_batch_of, steps_of, train_digits_array

    cfg = {**CFG, "batch_size": 32, "samples": 320}
    for name, gb in (("alone", global_batch_of(cfg)), ("other", global_batch_of(cfg) + 1)):
        ctx = TrainContext.local(ckpt_dir=str(tmp_path / name), torch_threads=1, global_batch=gb)
        try:
            if name == "alone":
                assert train_digits(ctx, cfg)["samples"] == 320.0
            else:
                with pytest.raises(SpecError, match=r"ctx.steps\(global_batch=32\) disagrees"):
                    train_digits(ctx, cfg)
        finally:
            ctx.close()
    assert global_batch_of({}) == 64  # train_digits' default batch
    ctx = TrainContext.local(ckpt_dir=str(tmp_path / "arr"), torch_threads=1,
                             global_batch=global_batch_of(cfg))
    trials = [{"trial_id": t, "config": {**cfg, "lr": lr}, "dir": str(tmp_path / t), "seed": 0,
               "start_step": None} for t, lr in (("a", 1e-2), ("b", 3e-3))]
    try:
        assert train_digits_array(ctx, trials=trials, stops=[steps_of(cfg)])["steps"] == 10
    finally:
        ctx.close()


def test_a_global_batch_of_that_is_no_sample_count_names_the_trial_and_numpy_ints_pass(tmp_path):
    """Before, the runner applied int() to whatever global_batch_of returned: 32.5 became 32,
    which then disagreed with the 32.5 train_fn might use, inside the ranks."""
    np = pytest.importorskip("numpy")
    for got, ok in ((np.int64(6), True), (6.5, False), ("6", False), (None, False)):
        r = AppTrialRunner(train_fn=train_digits, max_nodes=8, ckpt_root=tmp_path,
                           global_batch_of=lambda cfg, got=got: got)
        r._app = rec = _Recorder()
        args = ("search", Suggestion("t0", dict(CFG), budget=1), "search-t0-r0",
                str(tmp_path / "t0"))
        if ok:
            r._submit(*args)
            assert rec.calls[-1]["global_batch"] == 6 and type(rec.calls[-1]["global_batch"]) is int
        else:
            with pytest.raises(SpecError, match=r"global_batch_of\(.*\) returned"):
                r._submit(*args)


def test_the_array_sizer_measures_at_the_batch_the_arrays_train(tmp_path, monkeypatch):
    """The sizer read config['batch_size'] even when the runner's global_batch_of says another
    batch: it measured fused throughput at a batch the arrays never train."""
    import malleparsl.apps.bench_fused as bench_fused
    from malleparsl.workflows.packing import ArraySizer

    seen = []

    def fake_rate(build, config, b, *, gb, steps):  # noqa: ANN001, ANN202
        seen.append(gb)
        return float(b), 1.0

    monkeypatch.setattr(bench_fused, "fused_rate", fake_rate)
    ArraySizer(build=None, max_size=2, global_batch_of=lambda cfg: 2 * cfg["batch_size"]).size_for(
        {"batch_size": 8})
    ArraySizer(build=None, max_size=2).size_for({"batch_size": 8})
    assert seen == [16, 16, 8, 8]
