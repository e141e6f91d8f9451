"""``ctx.steps`` against the job's global batch: a ``global_batch`` option that disagrees with
the loop's is refused (the controller capped the job's size with the option); a size whose
ranks outnumber the batch's samples (the options did not name it, so the controller could not
cap) trains right, its surplus ranks with empty local batches, and rank 0 says so.
"""

from __future__ import annotations

import logging

import pytest

torch = pytest.importorskip("torch")

from malleparsl.apps.context import TrainContext  # noqa: E402
from malleparsl.apps.sharding import check_global_batch  # noqa: E402
from malleparsl.errors import SpecError  # noqa: E402


def _ctx(rank: int = 0, world_size: int = 1, local_world_size: int = 1, **options) -> TrainContext:
    return TrainContext(rank=rank, world_size=world_size, local_world_size=local_world_size,
                        options={"torch_threads": 1, **options})


def test_a_global_batch_option_that_disagrees_with_the_loops_is_refused() -> None:
    ctx = _ctx(global_batch=32)
    try:
        with pytest.raises(SpecError, match=r"ctx.steps\(global_batch=64\) disagrees with the "
                           r"malleable option global_batch=32: .*at most 32 node\(s\) of 1 rank"
                           r".*pass the same value to both"):
            next(ctx.steps(3, global_batch=64, dataset_size=100))
        assert ctx.step == 0  # refused before any step
    finally:
        ctx.close()


def test_ctx_steps_takes_the_options_global_batch_and_needs_one() -> None:
    ctx = _ctx(global_batch=8)
    try:
        step = next(ctx.steps(3, dataset_size=100))
        assert len(step.sampler.global_indices(0)) == 8 and ctx.local_batch == 8
    finally:
        ctx.close()
    ctx = _ctx()
    try:
        with pytest.raises(SpecError, match=r"give global_batch=\.\.\., or global_batch in "):
            next(ctx.steps(3, dataset_size=100))
    finally:
        ctx.close()


def test_ranks_past_the_batch_train_nothing_and_rank_0_says_how_to_cap(caplog) -> None:
    """3 ranks (one node's worth each) of a batch of 2: rank 2's local batch is empty, the
    warning names global_batch, world_size and the option that makes the controller cap."""
    caplog.set_level(logging.WARNING, logger="malleparsl.apps.context")
    contexts = [_ctx(rank=r, world_size=3) for r in range(3)]
    try:
        firsts = [next(c.steps(2, global_batch=2, dataset_size=10)) for c in contexts]
        assert [c.local_batch for c in contexts] == [1, 1, 0]
        assert firsts[2].micro_batches() == []
        warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warned) == 1  # rank 0 only
        assert ("global_batch=2 feeds only 2 of world_size=3 ranks: 1 rank(s) train nothing"
                in warned[0])
        assert "Pass global_batch=2 in the app's malleable options" in warned[0]
        assert "never sizes the job past 2 node(s) of 1 rank(s)" in warned[0]
        assert all(c.notice == contexts[0].notice for c in contexts)
    finally:
        for c in reversed(contexts):  # each restores the torch settings it found
            c.close()


def test_check_global_batch_counts_nodes_by_ranks_per_node() -> None:
    assert check_global_batch(6, 6, ranks_per_node=2) is None
    assert check_global_batch(6, 4, option=6, ranks_per_node=2) is None
    note = check_global_batch(6, 8, ranks_per_node=2)
    assert "2 rank(s) train nothing" in note and "past 3 node(s) of 2 rank(s)" in note
    with pytest.raises(SpecError, match=r"option global_batch=5: .*at most 2 node\(s\) of 2 "):
        check_global_batch(6, 4, option=5, ranks_per_node=2)


@pytest.mark.slow
def test_a_fused_trial_array_past_its_batch_trains_each_trial_as_alone(tmp_path) -> None:
    """Three gloo ranks, a global batch of 2: before, rank 2's empty batch crashed the fused
    layers ("cannot reshape tensor of 0 elements") and failed the whole array."""
    from malleparsl.apps.fused import train_array
    from malleparsl.apps.fused_digits import build_mlp, digits_data, train_alone
    from malleparsl.apps.local_runner import LocalRunner

    trials = [{"trial_id": f"t{i}", "config": {"width": 16, "optimizer": "adam",
                                               "lr": 3e-3 * (i + 1)},
               "seed": 5 + i, "dir": str(tmp_path / f"t{i}")} for i in range(2)]
    with LocalRunner(nodes=3, ckpt_root=str(tmp_path / "ckpt"),
                     preload=("malleparsl.apps.fused_digits", "sklearn.datasets")) as runner:
        rep = runner.run(train_array, schedule=[(3, None)], job_id="arr", trials=trials,
                         options={"torch_threads": 1}, build=build_mlp, data=digits_data,
                         global_batch=2, stops=[10])
    assert rep.finished and rep.sizes == [3]
    for t in trials:
        got = [h["loss"] for h in rep.result["trials"][t["trial_id"]]["history"]]
        want, _ = train_alone(t["config"], seed=t["seed"], steps=10, global_batch=2,
                              build=build_mlp)
        assert len(got) == 10 and max(abs(a - b) for a, b in zip(got, want)) <= 1e-5


@pytest.mark.parametrize("bad", ["64", 0])
def test_a_global_batch_that_is_no_sample_count_is_refused_before_any_notice(bad,
                                                                             caplog) -> None:
    """Old code: check_global_batch compared first, so "64" (a batch read from a text config)
    raised a bare TypeError from inside ctx.steps, and 0 logged a warning advising
    global_batch=0 in the options, before the sampler's SpecError."""
    caplog.set_level(logging.WARNING, logger="malleparsl.apps.context")
    ctx = _ctx()
    try:
        with pytest.raises(SpecError, match=r"global_batch must be an integer >= 1, got "):
            next(ctx.steps(3, global_batch=bad, dataset_size=100))
        assert ctx.notice is None and not caplog.records
    finally:
        ctx.close()


def test_a_batch_smaller_than_one_nodes_ranks_is_not_told_to_name_the_option() -> None:
    """Old code advised global_batch=2 in the options "so the controller never sizes the job
    past 0 node(s)": that option refuses the job at submit (cap_to_batch)."""
    from malleparsl.plans import cap_to_batch

    note = check_global_batch(2, 4, ranks_per_node=4)
    assert "2 rank(s) train nothing" in note and "Pass global_batch" not in note
    assert note.endswith("global_batch=2 has fewer samples than one node's 4 ranks, so some "
                         "rank trains nothing at any size: raise global_batch to at least 4 or "
                         "run fewer ranks per node")
    with pytest.raises(SpecError):  # what following the old advice did
        cap_to_batch(1, 1, global_batch=2, ranks_per_node=4)
    assert "Pass global_batch=2" in check_global_batch(2, 8, ranks_per_node=2)  # 1 node feeds


def test_a_misspelt_plan_is_refused_where_the_app_is_declared_or_called() -> None:
    """Old code: @malleable_app(plan="fsdpp") was accepted; the job failed on its ranks."""
    from malleparsl.apps import malleable_app
    from malleparsl.apps.examples_digits import train_mlp

    with pytest.raises(SpecError, match=r"malleable option plan='fsdpp' is not an execution "
                       r"plan; valid plans: 'auto', 'dp'"):
        malleable_app(max_nodes=2, plan="fsdpp")(train_mlp)
    app = malleable_app(max_nodes=2, plan="fsdp")(train_mlp)
    with pytest.raises(SpecError, match=r"plan='zero7' is not an execution plan"):
        app(malleable_options={"plan": "zero7"})


def test_plan_auto_without_a_memory_profile_trains_as_plain_dp() -> None:
    """Accepted at submit (no automatic plans without a profile: the driver names none).
    Old code: every rank failed with "unknown plan 'auto'"."""
    from malleparsl.apps.entry import RankEntry
    from malleparsl.apps.examples_digits import train_mlp

    def run(**options):  # noqa: ANN003, ANN202
        return [h["loss"] for h in RankEntry(train_mlp).local(
            total_steps=3, global_batch=4, dtype="float64",
            options={"torch_threads": 1, **options})["history"]]

    assert _ctx(plan="auto").plan.name == "dp"
    assert run(plan="auto") == run()
