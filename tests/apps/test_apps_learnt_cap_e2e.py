"""A learnt cap follows the loop's latest global batch, through Parsl and the real executor
(3 emulated nodes, gloo): the digits MLP trains 60 steps of batch 2, then up to step 400 of
batch 6, with ``max_nodes=3`` and no ``global_batch`` option. Rank 0's first record of batch 2
caps the job at 2 nodes; its first of batch 6 lifts the cap and the job grows back to 3.
Before, the cap only went down: the second phase stayed on 2 nodes. The losses are those of
one process throughout.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

import pytest

parsl = pytest.importorskip("parsl")
pytest.importorskip("torch.distributed")

from live_parsl import live_executor  # noqa: E402

from malleparsl.apps import malleable_app  # noqa: E402
from malleparsl.apps.entry import RankEntry  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]
HERE = Path(__file__).parent
NODE_TIMEOUT_S = 300


@pytest.fixture
def pilots_import_this_folder():  # the ranks import phased_app from here
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = f"{HERE}{os.pathsep}{old}" if old else str(HERE)
    try:
        yield
    finally:
        if old is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = old


def test_a_later_phase_with_a_larger_batch_gets_its_nodes_back(
        tmp_path, pilots_import_this_folder, caplog) -> None:
    from phased_app import train_phases

    caplog.set_level(logging.INFO, logger="malleparsl.controller")
    warm = ("torch.distributed", "malleparsl.apps.examples_digits", "phased_app")
    with live_executor(tmp_path, ["n0", "n1", "n2"], warm=warm) as (ex, _):
        app = malleable_app(min_nodes=1, max_nodes=3, torch_threads=1, pace_s_per_sample=1e-2,
                            progress_interval_s=0.2)(train_phases)
        fut = app(malleable_options={"job_id": "phased"})
        sizes: list[int] = []  # segment sizes in the order seen
        deadline = time.monotonic() + NODE_TIMEOUT_S
        while not fut.done() and time.monotonic() < deadline:
            view = ex.snapshot().jobs.get("phased")
            size = view.world_size if view is not None and view.segment is not None else 0
            if size and (not sizes or sizes[-1] != size):
                sizes.append(size)
            time.sleep(0.02)
        result = fut.result(timeout=1)
    assert sizes[:2] == [3, 2] and sizes[-1] == 3, sizes  # capped at 2, then grown back
    hist = result["history"]
    assert {h["world_size"] for h in hist if h["batch"] == 6} >= {3}
    base = RankEntry(train_phases).local(options={"torch_threads": 1})["history"]
    assert result["steps"] == 400
    assert [h["loss"] for h in hist] == pytest.approx([h["loss"] for h in base], rel=0,
                                                      abs=1e-12)
    said = [(r.levelname, r.getMessage()) for r in caplog.records
            if "'phased': max_nodes" in r.getMessage()]
    assert [(lvl, m.split(" (ctx.steps)")[0]) for lvl, m in said] == [
        ("WARNING", "job 'phased': max_nodes 3 -> 2 from now on: its loop splits "
                    "global_batch=2 samples a step"),
        ("INFO", "job 'phased': max_nodes 2 -> 3 from now on: its loop splits "
                 "global_batch=6 samples a step")], said
