"""A packed ASHA sweep end to end on the real MalleableExecutor: trials fused into arrays,
paused trials leaving their arrays, promoted ones trained on or re-packed, no result lost."""

import json

import pytest

from malleparsl.executors.manual_source import ManualNodeSource
from malleparsl.workflows.demo import DemoSettings, run_demo

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def test_packed_asha_sweep_runs_trials_in_arrays_and_loses_none(tmp_path):
    settings = DemoSettings(out=str(tmp_path / "report"), quick=True, trials=6, final_top_k=1,
                            nodes=2, max_nodes=2, timeout_s=400, pack=True,
                            array_size=3,  # "auto" measures throughput: not for a test
                            step_delay_s=0.0)  # digits' own speed: no node comes or goes here
    summary = run_demo(settings, node_source=ManualNodeSource(nodes=["p0", "p1"]))
    pk = summary["packing"]
    print("packing:", json.dumps(pk), "best", summary["best_accuracy"], summary["mode"])
    assert summary["lost_runs"] == 0 and summary["failed_runs"] == 0, summary
    assert summary["stages_failed"] == []
    # the six rung-0 suggestions went into arrays (more than one trial per job)
    assert pk["arrays"] >= 1 and max(pk["array_sizes"]) >= 2, pk
    table = (tmp_path / "report" / "trials.csv").read_text().splitlines()
    # every search trial has a rung-0 result, and the search ended with a top-rung trial
    search = [ln for ln in table[1:] if ln.startswith("search,")]
    assert len({ln.split(",")[1] for ln in search}) == 6
    assert summary["best_accuracy"] > 0.5
    # ASHA paused trials at rung 0: they left their array (or it had ended) instead of
    # training on to the next rung
    assert pk["drops"] + pk["repacks"] >= 1, pk
    # a packed trial's result is the one it gets trained alone (train_digits, one process)
    import pandas as pd

    from malleparsl.apps.context import TrainContext
    from malleparsl.workflows.digits import train_digits

    # floats as text, parsed by Python: exact round trip of what the report wrote
    exact = {c: str for c in ("config.lr", "config.weight_decay", "budget", "metric.loss")}
    frame = pd.read_csv(tmp_path / "report" / "trials.csv", dtype=exact)
    row = frame[(frame.stage == "search") & (frame.rung == 0)].iloc[0]
    cfg = {"lr": float(row["config.lr"]), "weight_decay": float(row["config.weight_decay"]),
           "width": int(row["config.width"]), "epochs": float(row["budget"])}
    ctx = TrainContext.local(ckpt_dir=str(tmp_path / "alone"), torch_threads=1)
    try:
        alone = train_digits(ctx, cfg)
    finally:
        ctx.close()
    assert abs(alone["loss"] - float(row["metric.loss"])) <= 1e-5, (alone, dict(row))
    assert int(row["metric.steps"]) == alone["steps"]
