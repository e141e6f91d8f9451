"""The global-batch cap through Parsl and the real executor (3 emulated nodes, gloo).

The digits MLP with a global batch of 2 samples, ``max_nodes=3`` and 3 idle nodes:

* without ``global_batch`` in its options the controller cannot know the batch and starts it
  on all 3 nodes: rank 2 gets no sample; the driver's log says which ranks train nothing and
  how to cap, and rank 0's first progress record carries the batch, so the controller caps
  the job at 2 nodes from then on (before: it ran all its segments on 3); the trajectory is
  the one-process one throughout;
* with ``global_batch=2`` in its options it never runs on more than 2 nodes, with the same
  trajectory (before: 3 nodes, one idle rank);
* a fixed FSDP2 plan (``plan="fsdp"``, ``global_batch=64``) runs only at node counts whose ranks
  split the batch evenly: 1 or 2 of the 3 idle nodes, never 3 (before: 3 nodes, then
  ``ctx.steps``' SpecError failed the job), with the one-process trajectory;
* the same FSDP2 job *without* the option starts on 3 nodes (the controller cannot know the
  batch), its ranks refuse the size in ``ctx.steps`` with the batch in their error, and the
  executor relaunches it on 2 and never 3 again, with the one-process trajectory (before: the
  future failed with 'pass global_batch=64 in the app's malleable options', the result lost);
* ``min_nodes=3`` with ``global_batch=2`` fails its app future at submit with a SpecError,
  an option that disagrees with the loop's batch fails it before the first step, and a
  misspelt plan is refused by the executor's submit.
"""

from __future__ import annotations

import logging
import time

import pytest

parsl = pytest.importorskip("parsl")
pytest.importorskip("torch.distributed")

from live_parsl import live_executor  # noqa: E402

from malleparsl.apps import malleable_app  # noqa: E402
from malleparsl.apps.entry import RankEntry  # noqa: E402
from malleparsl.apps.examples_digits import train_mlp  # noqa: E402
from malleparsl.apps.examples_plans import train_blocks  # noqa: E402
from malleparsl.errors import SpecError  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]
NODE_TIMEOUT_S = 300
STEPS = 150
WARM = ("torch.distributed", "malleparsl.apps.examples_digits", "sklearn.datasets")


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("global-batch-e2e")
    with live_executor(tmp, ["n0", "n1", "n2"], warm=WARM) as (ex, _):
        yield ex


@pytest.fixture(scope="module")
def baseline():
    return [h["loss"] for h in RankEntry(train_mlp).local(
        total_steps=STEPS, global_batch=2, dtype="float64",
        options={"torch_threads": 1})["history"]]


def run(ex, job_id: str, fn=train_mlp, batch=2, pace=5e-3, **options):  # noqa: ANN001, ANN201
    """Run job_id (``fn``, train_mlp with batch 2 by default) to the end; its result and the
    (nodes, world size) its segments ran at, in order, sampled from the snapshots."""
    app = malleable_app(min_nodes=1, max_nodes=3, torch_threads=1, pace_s_per_sample=pace,
                        **options)(fn)
    fut = app(total_steps=STEPS, global_batch=batch, dtype="float64",
              malleable_options={"job_id": job_id})
    sizes: list[tuple[int, int]] = []  # in the order seen
    deadline = time.monotonic() + NODE_TIMEOUT_S
    while not fut.done() and time.monotonic() < deadline:
        view = ex.snapshot().jobs.get(job_id)
        if view is not None and view.segment is not None and view.world_size:
            size = (len(view.nodes), view.world_size)
            if not sizes or sizes[-1] != size:
                sizes.append(size)
        time.sleep(0.02)
    return fut.result(timeout=1), sizes


def test_without_the_option_surplus_ranks_idle_until_the_first_progress_caps_the_job(
        live, baseline, caplog) -> None:
    caplog.set_level(logging.WARNING, logger="malleparsl")
    result, sizes = run(live, "uncapped", progress_interval_s=0.2)
    assert (3, 3) in sizes  # the controller could not know: all three nodes
    assert (2, 2) in sizes  # until rank 0 said its batch: then two
    assert sizes[-1] == (2, 2)  # and it stayed there
    got = [h["loss"] for h in result["history"]]
    assert result["steps"] == STEPS and got == pytest.approx(baseline, rel=0, abs=1e-12)
    said = [r.getMessage() for r in caplog.records if "uncapped" in r.getMessage()]
    assert any("global_batch=2 feeds only 2 of world_size=3 ranks: 1 rank(s) train nothing"
               in m and "Pass global_batch=2 in the app's malleable options" in m
               for m in said), said
    capped = [m for m in said if "max_nodes 3 -> 2 from now on" in m]
    assert len(capped) == 1 and "global_batch=2" in capped[0], said


def test_the_option_caps_the_job_at_the_nodes_its_batch_feeds(live, baseline) -> None:
    result, sizes = run(live, "capped", global_batch=2)
    assert sizes and max(n for n, _ in sizes) == 2  # three nodes idle, two given
    got = [h["loss"] for h in result["history"]]
    assert result["steps"] == STEPS and got == pytest.approx(baseline, rel=0, abs=1e-12)


def test_a_fixed_fsdp_plan_runs_only_where_its_ranks_split_the_batch(live) -> None:
    """BlockMLP under FSDP2 with a batch of 64 on 3 idle nodes: 64 does not split over 3 ranks.
    Old code: the controller gave the job 3 nodes and ``ctx.steps`` failed its future with
    'global_batch=64 over 3 ranks does not: run another plan or size'."""
    result, sizes = run(live, "fsdp-fixed", fn=train_blocks, batch=64, pace=2e-4,
                        plan="fsdp", global_batch=64)
    assert sizes and {n for n, _ in sizes} <= {1, 2} and (2, 2) in sizes, sizes
    base = RankEntry(train_blocks).local(total_steps=STEPS, global_batch=64, dtype="float64",
                                         options={"torch_threads": 1})["history"]
    got = [h["loss"] for h in result["history"]]
    assert result["steps"] == STEPS
    assert got == pytest.approx([h["loss"] for h in base], rel=0, abs=1e-9)
    assert {h["plan"] for h in result["history"] if h["world_size"] == 2} == {"fsdp"}


def test_a_fixed_fsdp_plan_without_the_option_is_rerun_where_its_ranks_split_the_batch(
        live, caplog) -> None:
    """Old code: segment 0 on 3 nodes, every rank's SpecError failed the future (the
    'pass global_batch=64 in the app's malleable options' error; result lost)."""
    caplog.set_level(logging.WARNING, logger="malleparsl")
    result, sizes = run(live, "fsdp-no-option", fn=train_blocks, batch=64, pace=2e-4,
                        plan="fsdp")
    assert sizes[0] == (3, 3) and (2, 2) in sizes, sizes  # the batch unknown until refused
    assert (3, 3) not in sizes[1:], sizes  # and never 3 again
    base = RankEntry(train_blocks).local(total_steps=STEPS, global_batch=64, dtype="float64",
                                         options={"torch_threads": 1})["history"]
    got = [h["loss"] for h in result["history"]]
    assert result["steps"] == STEPS
    assert got == pytest.approx([h["loss"] for h in base], rel=0, abs=1e-9)
    said = [r.getMessage() for r in caplog.records if "fsdp-no-option" in r.getMessage()]
    assert any("cannot split global_batch=64 over segment 0's 3 rank(s); relaunching" in m
               for m in said), said
    assert any("node counts [1, 2] only from now on: plan 'fsdp' needs its loop's "
               "global_batch=64" in m for m in said), said


def test_the_executor_refuses_a_misspelt_plan_at_submit(live) -> None:
    """Old code: accepted without global_batch; every rank then refused the plan."""
    with pytest.raises(SpecError, match=r"malleable option plan='zero7' is not an execution "
                       r"plan; valid plans: 'auto'"):
        live.submit(RankEntry(train_mlp), {"malleable": {"max_nodes": 2, "plan": "zero7"}})


def test_impossible_or_disagreeing_batches_fail_the_app_future(live) -> None:
    app = malleable_app(min_nodes=3, max_nodes=3, global_batch=2)(train_mlp)
    with pytest.raises(SpecError, match=r"min_nodes=3 is too large: 3 node\(s\) x "
                       r"ranks_per_node=1 = 3 ranks exceed global_batch=2"):
        app(total_steps=STEPS, global_batch=2).result(timeout=60)
    app = malleable_app(min_nodes=1, max_nodes=1, global_batch=4, torch_threads=1)(train_mlp)
    with pytest.raises(SpecError, match=r"ctx.steps\(global_batch=2\) disagrees with the "
                       r"malleable option global_batch=4"):
        app(total_steps=STEPS, global_batch=2).result(timeout=NODE_TIMEOUT_S)
