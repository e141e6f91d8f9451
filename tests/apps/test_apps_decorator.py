"""@malleable_app: option checks, what Parsl is handed, in-process runs, pickling."""

from __future__ import annotations

import pickle

import pytest
from parsl.app.errors import wrap_error

from malleparsl.apps import MalleableApp, RankEntry, malleable_app
from malleparsl.apps.decorator import validate_options
from malleparsl.apps.examples_digits import train_mlp
from malleparsl.errors import SpecError


class RecordingDFK:
    """Stands in for the DataFlowKernel: records what PythonApp.__call__ submits."""

    def __init__(self) -> None:
        self.calls = []

    def submit(self, func, app_args, **kw):
        self.calls.append((func, app_args, kw))
        return "future"


def test_call_carries_the_malleable_resource_spec_and_the_bare_entry() -> None:
    app = malleable_app(min_nodes=2, max_nodes=4, total_samples=6400, curve=[[1, 10], [2, 19]],
                        seed=7)(train_mlp)
    assert isinstance(app, MalleableApp) and app.__name__ == "train_mlp"
    dfk = RecordingDFK()
    app.data_flow_kernel = dfk
    assert app(lr=0.1, malleable_options={"job_id": "j-1", "max_nodes": 3}) == "future"
    func, args, kw = dfk.calls[0]
    assert isinstance(func, RankEntry) and func.user_fn is train_mlp
    spec = kw["app_kwargs"]["parsl_resource_specification"]["malleable"]
    assert spec == {"min_nodes": 2, "max_nodes": 3, "seed": 7, "total_samples": 6400,
                    "curve": [[1, 10.0], [2, 19.0]], "job_id": "j-1"}
    assert kw["app_kwargs"]["lr"] == 0.1
    app(lr=0.2)  # per-call overrides do not leak into the next call
    assert "job_id" not in dfk.calls[1][2]["app_kwargs"]["parsl_resource_specification"]["malleable"]


@pytest.mark.parametrize(
    "opts, match",
    [
        ({"min_nodes": 3, "max_nodes": 2}, "min_nodes"),
        ({"min_nodes": 0}, "min_nodes"),
        ({"max_nodes": 2.5}, "max_nodes"),
        ({"total_samples": -1}, "total_samples"),
        ({"rescale_up_s": -3}, "rescale_up_s"),
        ({"curve": [[1, 5], [1, 6]]}, "strictly increasing"),
        ({"curve": "fast"}, "curve must be a list"),
    ],
)
def test_bad_options_raise_spec_error_naming_the_value(opts, match) -> None:
    with pytest.raises(SpecError, match=match):
        validate_options(opts)


def test_rank_entry_peels_parsl_wrap_error_and_pickles() -> None:
    entry = RankEntry(wrap_error(train_mlp))
    assert entry.user_fn is train_mlp and entry.__name__ == "train_mlp"
    clone = pickle.loads(pickle.dumps(entry))
    assert clone.user_fn is train_mlp


def test_local_run_in_process() -> None:
    app = malleable_app(max_nodes=2, torch_threads=1)(train_mlp)
    out = app.local(total_steps=5)
    assert out["steps"] == 5 and len(out["history"]) == 5
