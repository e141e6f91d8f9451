"""Fused trial arrays: every fused trial trains exactly as it would alone.

In-process: fused layers + the vectorised optimizer against plain torch models and
``torch.optim`` (MLP, MLP with BatchNorm and dropout, CNN with BatchNorm; Adam, AdamW, SGD
with per-trial hyperparameters). On real local processes and a real gloo group
(:class:`LocalRunner`): an array rescaled 2 -> 1 node, and a trial dropped mid-run, each
compared with the trials trained alone.
"""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from malleparsl.apps.checkpoint import CheckpointStore
from malleparsl.apps.fused import request_drop, result_path, train_array
from malleparsl.apps.fused_digits import build_cnn, build_mlp, digits_data, train_alone
from malleparsl.apps.fused_layers import FusedSequential
from malleparsl.apps.fused_optim import FusedOptimizer, TrialHparams
from malleparsl.apps.local_runner import LocalRunner
from malleparsl.errors import SpecError

TOL = 1e-5
GB = 32
HPARAMS = {
    "adam": [{"optimizer": "adam", "lr": 1e-2 * (i + 1), "weight_decay": 0.01 * i,
              "beta1": 0.8 + 0.05 * i} for i in range(4)],
    "adamw": [{"optimizer": "adamw", "lr": 1e-2 * (i + 1), "weight_decay": 0.01 * i}
              for i in range(4)],
    "sgd": [{"optimizer": "sgd", "lr": 0.05 * (i + 1), "weight_decay": 1e-3 * i,
             "momentum": [0.0, 0.9, 0.5, 0.8][i]} for i in range(4)],
}
MODELS = {
    "mlp": (build_mlp, {"width": 32, "depth": 2, "activation": "gelu"}),
    "mlp-bn-dropout": (build_mlp, {"width": 32, "batchnorm": True, "dropout": 0.2}),
    "cnn-bn": (build_cnn, {"channels": 4, "batchnorm": True}),
}


def fused_losses(configs, seeds, steps, build):
    """Train the fused array in-process at size 1 as train_array does; losses per trial."""
    Xtr, ytr, _, _ = digits_data()
    models = []
    for cfg, s in zip(configs, seeds):
        torch.manual_seed(s)
        models.append(build(cfg))
    fm = FusedSequential.from_models(models)
    opt = FusedOptimizer(list(fm.parameters()), [TrialHparams.from_config(c) for c in configs])
    from malleparsl.apps.sharding import GlobalBatchSampler

    samplers = [GlobalBatchSampler(dataset_size=len(Xtr), global_batch=GB, world_size=1, rank=0,
                                   micro_batch=GB, seed=s) for s in seeds]
    out = [[] for _ in configs]
    for step in range(steps):
        idx = torch.stack([sm.global_indices(step) for sm in samplers])
        opt.zero_grad()
        logits = fm(Xtr[idx])
        sums = F.cross_entropy(logits.reshape(-1, 10), ytr[idx].reshape(-1),
                               reduction="none").view(len(configs), -1).sum(1)
        sums.sum().backward()
        for p in fm.parameters():
            p.grad /= GB
        opt.step()
        for i, v in enumerate((sums / GB).tolist()):
            out[i].append(v)
    return out, fm


@pytest.mark.parametrize("model", sorted(MODELS))
@pytest.mark.parametrize("kind", sorted(HPARAMS))
def test_fused_trials_match_each_trial_trained_alone(model, kind) -> None:
    build, arch = MODELS[model]
    configs = [{**arch, **hp, "seed": 10 + i} for i, hp in enumerate(HPARAMS[kind])]
    seeds = [10 + i for i in range(4)]
    steps = 15
    got, fm = fused_losses(configs, seeds, steps, build)
    for i, (cfg, s) in enumerate(zip(configs, seeds)):
        want, alone = train_alone(cfg, seed=s, steps=steps, global_batch=GB, build=build)
        assert max(abs(a - b) for a, b in zip(got[i], want)) <= TOL, (model, kind, i)
        # the exported trial loads into the plain model and gives its outputs (train mode:
        # under Adam a bias just before BatchNorm has a zero gradient up to rounding, so it
        # drifts by noise and shifts the running mean, but never a train-mode output)
        plain = build(cfg)
        plain.load_state_dict(fm.trial_state_dict(i))
        x = digits_data()[2][:50]
        assert torch.allclose(plain(x), alone(x), atol=1e-4)


def test_unsupported_layer_and_mixed_optimizers_are_refused() -> None:
    with pytest.raises(SpecError, match="cannot be fused; supported"):
        FusedSequential.from_models([torch.nn.Sequential(torch.nn.LSTM(4, 4))])
    with pytest.raises(SpecError, match="SeededDropout"):
        FusedSequential.from_models([torch.nn.Sequential(torch.nn.Dropout(0.1))] * 2)
    with pytest.raises(SpecError, match="one architecture"):
        FusedSequential.from_models([build_mlp({"width": 8}), build_mlp({"width": 16})])
    p = [torch.nn.Parameter(torch.zeros(2, 3))]
    with pytest.raises(SpecError, match="one optimizer kind"):
        FusedOptimizer(p, [TrialHparams("adam"), TrialHparams("sgd")])


def _trials(tmp_path, n=3):
    cfg = [{"width": 32, "optimizer": "adam", "lr": 3e-3 * (i + 1), "weight_decay": 1e-3 * i}
           for i in range(n)]
    return [{"trial_id": f"t{i}", "config": c, "seed": 5 + i, "dir": str(tmp_path / f"t{i}")}
            for i, c in enumerate(cfg)]


@pytest.fixture(scope="module")
def runner(tmp_path_factory):
    with LocalRunner(nodes=2, ckpt_root=str(tmp_path_factory.mktemp("fused-ckpt")),
                     preload=("malleparsl.apps.fused_digits", "sklearn.datasets")) as r:
        yield r


def test_array_rescaled_2_to_1_matches_the_trials_trained_alone(runner, tmp_path) -> None:
    trials = _trials(tmp_path)
    rep = runner.run(train_array, schedule=[(2, 12), (1, None)], job_id="arr-rescale",
                     options={"torch_threads": 1}, trials=trials, build=build_mlp,
                     data=digits_data, global_batch=GB, stops=[20, 40])
    assert rep.finished and rep.sizes == [2, 1]
    assert [o.status for o in rep.segments[0]] == ["stopped", "stopped"]
    for t in trials:
        got = [h["loss"] for h in rep.result["trials"][t["trial_id"]]["history"]]
        want, _ = train_alone(t["config"], seed=t["seed"], steps=40, global_batch=GB,
                              build=build_mlp)
        assert len(got) == 40
        assert max(abs(a - b) for a, b in zip(got, want)) <= TOL
        # rung results were written at each stop, and the trial was exported in the
        # TrainContext format (a plain training function can resume it alone)
        doc = json.loads(result_path(runner.ckpt_root / "arr-rescale", t["trial_id"], 20).read_text())
        assert doc["steps"] == 20 and 0 <= doc["accuracy"] <= 1
        step, payload = CheckpointStore(directory=t["dir"]).load_latest()
        assert step == 40 and set(payload["state"]) == {"model", "optimizer"}


def test_a_dropped_trial_leaves_mid_run_and_the_others_are_unaffected(runner, tmp_path) -> None:
    trials = _trials(tmp_path)
    job = "arr-drop"

    def on_segment(seg, nodes):
        if seg == 1:  # the job is stopped at step >= 8: ask it to drop t1 when it resumes
            request_drop(runner.ckpt_root / job, ["t1"])

    rep = runner.run(train_array, schedule=[(1, 8), (1, None)], job_id=job,
                     on_segment=on_segment, options={"torch_threads": 1}, trials=trials,
                     build=build_mlp, data=digits_data, global_batch=GB, stops=[30])
    assert rep.finished
    res = rep.result
    assert res["dropped"] == ["t1"] and sorted(res["trials"]) == ["t0", "t2"]
    for t in (trials[0], trials[2]):
        got = [h["loss"] for h in res["trials"][t["trial_id"]]["history"]]
        want, _ = train_alone(t["config"], seed=t["seed"], steps=30, global_batch=GB,
                              build=build_mlp)
        assert len(got) == 30 and max(abs(a - b) for a, b in zip(got, want)) <= TOL
    # the dropped trial stopped training where it left, and was exported there
    step, payload = CheckpointStore(directory=trials[1]["dir"]).load_latest()
    assert 8 <= step < 30 and len(payload["history"]) == step
    want, _ = train_alone(trials[1]["config"], seed=trials[1]["seed"], steps=step,
                          global_batch=GB, build=build_mlp)
    assert max(abs(h["loss"] - w) for h, w in zip(payload["history"], want)) <= TOL


def test_a_rehearsal_does_not_write_into_the_trials_folders(tmp_path) -> None:
    """The executor rehearses an entry on a fresh node (scratch checkpoint folder, options
    ``rehearsal=True``); exporting the trials from there would plant checkpoints mid-rung."""
    from malleparsl.apps.context import TrainContext

    trials = _trials(tmp_path, n=2)
    ctx = TrainContext.local(ckpt_dir=str(tmp_path / "scratch"), rehearsal=True)
    try:
        out = train_array(ctx, trials=trials, build=build_mlp, data=digits_data,
                          global_batch=GB, stops=[3])
    finally:
        ctx.close()
    assert out["steps"] == 3
    assert not any((tmp_path / t["trial_id"]).exists() for t in trials)


def test_a_rehearsal_does_not_read_the_trials_folders(tmp_path) -> None:
    """While the real array runs it rewrites its trials' folders, which may then hold trials at
    different steps; a rehearsal reading them failed ("trials of one array must start at one
    step", a warm-up failure warning in the demo) and left the node cold."""
    from malleparsl.apps.context import TrainContext

    trials = _trials(tmp_path, n=2)

    def run(ts, stops, **opts):
        ctx = TrainContext.local(ckpt_dir=str(tmp_path / f"ckpt-{len(ts)}-{stops[-1]}"), **opts)
        try:
            return train_array(ctx, trials=ts, build=build_mlp, data=digits_data,
                               global_batch=GB, stops=stops)
        finally:
            ctx.close()

    run(trials, [3])  # both trials exported at step 3
    run(trials[1:], [6])  # t1 alone on to step 6
    steps = [CheckpointStore(directory=t["dir"]).load_latest()[0] for t in trials]
    assert steps == [3, 6]
    out = run(trials, [2], rehearsal=True)  # before: SpecError, starts {t0: 3, t1: 6}
    assert out["steps"] == 2  # the rehearsal trained from scratch, in its own folder
    assert [CheckpointStore(directory=t["dir"]).load_latest()[0] for t in trials] == steps


def test_trials_checkpointed_at_different_steps_start_together_from_a_step_they_share(
        tmp_path) -> None:
    """A trial promoted from an array that trained it past the rung's stop has a newer
    checkpoint than the trials it is packed with next: the array failed ("trials of one array
    must start at one step", the quick demo's rung 1 lost two trials). Now every trial starts
    from the newest step they all have, and trains as if alone."""
    from malleparsl.apps.context import TrainContext

    trials = _trials(tmp_path, n=2)

    def run(ts, stops):
        ctx = TrainContext.local(ckpt_dir=str(tmp_path / f"ckpt-{len(ts)}-{stops[-1]}"),
                                 torch_threads=1)
        try:
            return train_array(ctx, trials=ts, build=build_mlp, data=digits_data,
                               global_batch=GB, stops=stops)
        finally:
            ctx.close()

    run(trials, [3])  # both exported at step 3
    run(trials[1:], [6])  # t1 alone on to step 6
    out = run(trials, [8])  # before: SpecError, starts {t0: 3, t1: 6}
    assert out["steps"] == 8
    for t in trials:
        got = [h["loss"] for h in out["trials"][t["trial_id"]]["history"]]
        want, _ = train_alone(t["config"], seed=t["seed"], steps=8, global_batch=GB,
                              build=build_mlp)
        assert len(got) == 8 and max(abs(a - b) for a, b in zip(got, want)) <= TOL
