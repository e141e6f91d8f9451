"""@malleable_app: option checks, what Parsl is handed, in-process runs, pickling."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
from parsl.app.errors import wrap_error

from malleparsl.apps import MalleableApp, RankEntry, malleable_app
from malleparsl.apps.decorator import validate_options
from malleparsl.apps.examples_digits import train_mlp
from malleparsl.errors import SpecError
from malleparsl.executors.options import JOB_OPTIONS

PROFILE = {"params": 1e6, "act_per_sample": 1e4, "act_ckpt_per_sample": 1e3}


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
                    "curve": [[1, 10.0], [2, 19.0]], "job_id": "j-1",
                    "profile_key": f"{train_mlp.__module__}.train_mlp"}
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


def test_local_run_of_an_app_with_a_ckpt_dir_option(tmp_path) -> None:
    """Old code: TypeError (ckpt_dir given twice to TrainContext.local). The job's folder is
    not the local run's: it checkpoints only where told."""
    job_dir = tmp_path / "job"
    app = malleable_app(max_nodes=2, torch_threads=1, ckpt_dir=str(job_dir))(train_mlp)
    assert app.local(total_steps=3)["steps"] == 3
    assert not job_dir.exists()


def test_a_misspelt_option_is_refused_at_decoration_with_the_closest_name() -> None:
    """Old code: @malleable_app(global_bach=64) was accepted and the job ran without it."""
    with pytest.raises(SpecError) as err:
        malleable_app(max_nodes=2, global_bach=64)(train_mlp)
    msg = str(err.value)
    assert "job 'train_mlp'" in msg and "unknown malleable option 'global_bach'" in msg
    assert "(did you mean 'global_batch'?)" in msg and "valid malleable options are:" in msg
    assert "torch_threads" in msg and "extra_options" in msg


def test_a_misspelt_per_call_option_is_refused_before_submission() -> None:
    app = malleable_app(max_nodes=2)(train_mlp)
    dfk = RecordingDFK()
    app.data_flow_kernel = dfk
    with pytest.raises(SpecError, match="unknown malleable option 'max_node'.*'max_nodes'"):
        app(malleable_options={"max_node": 3})
    assert dfk.calls == []


def test_extra_options_let_the_training_function_read_its_own() -> None:
    app = malleable_app(max_nodes=2, extra_options=["warmup_steps"], warmup_steps=3)(train_mlp)
    assert app.malleable["warmup_steps"] == 3
    dfk = RecordingDFK()
    app.data_flow_kernel = dfk
    app(malleable_options={"warmup_steps": 5})
    assert dfk.calls[0][2]["app_kwargs"]["parsl_resource_specification"]["malleable"][
        "warmup_steps"] == 5


def test_errors_name_the_job_after_the_function() -> None:
    """Old code named every job 'app' (job_id's fallback)."""
    with pytest.raises(SpecError, match="job 'train_mlp': max_nodes must be"):
        malleable_app(max_nodes=0)(train_mlp)
    with pytest.raises(SpecError, match="job 'trial-3': max_nodes must be"):
        malleable_app(max_nodes=0, job_id="trial-3")(train_mlp)


@pytest.mark.parametrize(
    "opts, match",
    [
        ({"global_batch": 0}, "global_batch must be an integer >= 1"),
        ({"global_batch": 2.5}, "global_batch must be an integer >= 1"),
        ({"torch_threads": -1}, "torch_threads must be an integer >= 1"),
        ({"torch_threads": 0}, "torch_threads must be an integer >= 1"),
        ({"ckpt_interval_s": "x"}, "ckpt_interval_s must be a number >= 0"),
        ({"ckpt_interval_s": float("nan")}, "ckpt_interval_s must be a number >= 0"),
        ({"ckpt_every_steps": 0}, "ckpt_every_steps must be an integer >= 1"),
        ({"ckpt_keep": 0}, "ckpt_keep must be an integer >= 1"),
        ({"progress_interval_s": -1}, "progress_interval_s must be a number >= 0"),
        ({"pg_timeout_s": 0}, "pg_timeout_s must be a number > 0"),
        ({"pace_s_per_sample": "slow"}, "pace_s_per_sample must be a number"),
        ({"seed": 1.5}, "seed must be an integer >= 0"),
        ({"seed": True}, "seed must be an integer >= 0"),
        ({"micro_batch": 0}, "micro_batch must be an integer >= 1"),
        ({"max_restarts": -1}, "max_restarts must be an integer >= 0"),
        ({"deterministic": "no"}, "deterministic must be True or False"),
        ({"resume": 1}, "resume must be True or False"),
        ({"device": "gpu"}, "device must be 'auto', 'cpu' or 'cuda'"),
        ({"ckpt_dir": 3}, "ckpt_dir must be a directory path"),
        ({"plans": ["dp", "zer01"]}, "plans must be a non-empty list of plan families"),
        ({"plans": "dp"}, "plans must be a non-empty list"),
        ({"plan": "fsdpp"}, "plan='fsdpp' is not an execution plan"),
        ({"node_memory_bytes": -5}, "node_memory_bytes must be a number of bytes > 0"),
        ({"rank_memory_bytes": "40G"}, "rank_memory_bytes must be a number of bytes > 0"),
        ({"memory_profile": PROFILE}, "memory_profile needs global_batch"),
        ({"memory_profile": {"params": 1.0}, "global_batch": 8}, "missing 2 required"),
        ({"memory_profile": "big", "global_batch": 8}, "memory_profile must be a MemoryProfile"),
        ({"job_id": "../x"}, "job_id '../x' is not a safe name"),
        ({"rescale_up_s": "x"}, "rescale_up_s"),
    ],
)
def test_bad_values_are_refused_at_decoration_naming_the_option(opts, match) -> None:
    """Old code: these passed decoration and failed at .result() (global_batch=0), on the
    ranks after a warm-up (torch_threads=-1: torch's RuntimeError) or never (the rest)."""
    with pytest.raises(SpecError, match=match):
        malleable_app(max_nodes=2, **opts)(train_mlp)


def test_good_values_of_every_checked_option_pass() -> None:
    app = malleable_app(
        max_nodes=2, global_batch=np.int64(64), torch_threads=1, ckpt_interval_s=1e9,
        ckpt_every_steps=None, ckpt_keep=2, progress_interval_s=0, pg_timeout_s=60,
        pace_s_per_sample=1e-3, seed=np.int32(4), micro_batch=8, max_restarts=0,
        deterministic=False, resume=True, device="cpu", ckpt_dir="/tmp/x",
        plans=("dp", "zero1"), node_memory_bytes=2**30, memory_profile=PROFILE, job_id="trial-3", step_delay_s=0.1,
    )(train_mlp)
    assert app.malleable["global_batch"] == 64
    assert malleable_app(job_id=7)(train_mlp).malleable["job_id"] == 7  # str(job_id) at submit


def test_every_option_a_consumer_reads_is_in_the_shared_list() -> None:
    """The modules that read a job's options read only names of JOB_OPTIONS (a new option
    must be listed there, or @malleable_app would refuse it)."""
    import importlib
    import re
    from pathlib import Path

    mods = ["apps.context", "apps.fused", "apps.plans", "executors.planning",
            "executors.control", "executors.driver", "plans", "workflows.digits"]
    text = {m: Path(importlib.import_module(f"malleparsl.{m}").__file__).read_text() for m in mods}
    read = set()
    for t in text.values():
        read |= set(re.findall(r'\b(?:options|opts)(?:\.get\(|\[)"(\w+)"', t))
    read |= set(re.findall(r'"(\w+)"', re.search(r"_SPEC_KEYS = \(([^)]*)\)",
                                                   text["executors.planning"]).group(1)))
    assert {"ckpt_keep", "plans", "global_batch", "memory_profile", "job_id"} <= read
    assert read <= set(JOB_OPTIONS), read - set(JOB_OPTIONS)


def test_the_docs_list_every_option() -> None:
    from pathlib import Path

    docs = Path(__file__).resolve().parents[2] / "docs" / "apps.md"
    if not docs.exists():
        pytest.skip("docs are not installed with the package")
    text = docs.read_text()
    missing = [k for k in JOB_OPTIONS if k != "rehearsal" and f"`{k}`" not in text]
    assert not missing, missing


def test_a_dfk_without_a_malleable_executor_is_refused_at_the_call(tmp_path) -> None:
    """Old code: Parsl failed the future with `Invalid Resource Specification Supplied:
    {'malleable'}`, which does not say what to do."""
    import parsl
    from parsl.config import Config
    from parsl.executors import ThreadPoolExecutor

    app = malleable_app(max_nodes=2)(train_mlp)
    parsl.load(Config(executors=[ThreadPoolExecutor(label="threads")],
                      run_dir=str(tmp_path / "runinfo")))
    try:
        with pytest.raises(SpecError) as err:
            app()
    finally:
        parsl.dfk().cleanup()
        parsl.clear()
    msg = str(err.value)
    assert "'train_mlp' needs a MalleableExecutor" in msg and "'threads' (ThreadPoolExecutor)" in msg
    assert "local_config" in msg


def test_executors_all_with_a_plain_executor_beside_is_refused_naming_the_malleable_one() -> None:
    from parsl.config import Config
    from parsl.executors import ThreadPoolExecutor

    from malleparsl.executors import MalleableExecutor

    dfk = RecordingDFK()
    dfk.config = Config(executors=[MalleableExecutor(nodes=0),
                                   ThreadPoolExecutor(label="threads")])
    dfk.executors = {e.label: e for e in dfk.config.executors}
    dfk.executors["_parsl_internal"] = ThreadPoolExecutor(label="_parsl_internal")
    app = malleable_app(max_nodes=2)(train_mlp)
    app.data_flow_kernel = dfk
    with pytest.raises(SpecError, match=r"executor 'threads'.*executors=\['malleable'\]"):
        app()
    assert dfk.calls == []
    picked = malleable_app(max_nodes=2, executors=["malleable"])(train_mlp)
    picked.data_flow_kernel = dfk
    assert picked() == "future"


def test_calls_of_one_function_share_the_jpas_curves_by_default() -> None:
    """Live jobs carried no model name, so the JPA never shared a measured curve between them
    (a sweep's every trial was probed afresh): the function names them unless the options do."""
    from malleparsl.executors.planning import spec_from_options
    from malleparsl.jpa.advisor import profile_key

    app = malleable_app(max_nodes=4)(train_mlp)
    key = f"{train_mlp.__module__}.train_mlp"
    assert app.malleable["profile_key"] == key
    assert profile_key(spec_from_options(app.malleable)) == key
    named = malleable_app(max_nodes=4, model="resnet50")(train_mlp)
    assert "profile_key" not in named.malleable
    spec = spec_from_options(named.malleable)
    assert spec.model == "resnet50" and profile_key(spec) == "resnet50"
    own = spec_from_options({"profile_key": "bert-base", "model": "bert"})
    assert profile_key(own) == "bert-base"  # the key wins over the model, as in the JPA
    for bad in ({"model": ""}, {"profile_key": 3}):
        with pytest.raises(SpecError, match="non-empty string"):
            malleable_app(max_nodes=2, **bad)(train_mlp)
        with pytest.raises(SpecError, match="non-empty string"):
            spec_from_options(bad)


def test_a_model_given_per_call_names_the_job_over_the_default_key() -> None:
    """The function's default profile_key outranks ``model`` in the JPA: a sweep over models
    with one training function (``malleable_options={"model": m}``) had every model share the
    function's curves. A key the user gave stays."""
    from malleparsl.executors.planning import spec_from_options
    from malleparsl.jpa.advisor import profile_key

    app = malleable_app(max_nodes=4)(train_mlp)
    dfk = RecordingDFK()
    app.data_flow_kernel = dfk
    app(malleable_options={"model": "resnet50"})
    app()
    sent = [c[2]["app_kwargs"]["parsl_resource_specification"]["malleable"] for c in dfk.calls]
    assert profile_key(spec_from_options(sent[0])) == "resnet50"
    assert profile_key(spec_from_options(sent[1])) == f"{train_mlp.__module__}.train_mlp"
    keyed = malleable_app(max_nodes=4, profile_key="mlp-digits")(train_mlp)
    keyed.data_flow_kernel = dfk
    keyed(malleable_options={"model": "resnet50"})
    sent = dfk.calls[-1][2]["app_kwargs"]["parsl_resource_specification"]["malleable"]
    assert profile_key(spec_from_options(sent)) == "mlp-digits"


def test_options_their_readers_take_as_unset_pass_and_bad_ones_are_spec_errors() -> None:
    """``ckpt_dir=None`` (the control loop's default folder) and ``plans=None`` (every family)
    were refused since the value checks, at decoration and now at every submit; ``plans=5``
    was a bare TypeError."""
    from malleparsl.executors.planning import spec_from_options

    for ok in ({"ckpt_dir": None}, {"plans": None}):
        validate_options({"max_nodes": 2, **ok})
        spec_from_options({"max_nodes": 2, **ok})
    for bad in (5, "dp", []):
        with pytest.raises(SpecError, match="plans must be a non-empty list"):
            validate_options({"max_nodes": 2, "plans": bad})


def test_numpy_flags_pass_as_numpy_counts_do() -> None:
    """``resume=rung > 0`` with a numpy rung is ``np.True_``: refused at every submit, while
    numpy integers passed for counts; a number is still no flag."""
    from malleparsl.executors.planning import spec_from_options

    flags = {"resume": np.bool_(True), "deterministic": np.bool_(False)}
    validate_options({"max_nodes": 2, "seed": np.int64(3), **flags})
    spec_from_options({"max_nodes": 2, **flags})
    with pytest.raises(SpecError, match="resume must be True or False"):
        spec_from_options({"max_nodes": 2, "resume": 1})


def test_a_job_with_automatic_plans_keeps_its_profile_key() -> None:
    """Old code: the plan options replaced the spec's meta, so a job with a memory_profile
    lost its profile_key (the function's default too) and never shared the JPA's curves."""
    from malleparsl.executors.planning import spec_from_options
    from malleparsl.jpa.advisor import profile_key

    app = malleable_app(max_nodes=4, global_batch=64, memory_profile=PROFILE)(train_mlp)
    spec = spec_from_options(app.malleable)
    assert "plan_options" in spec.meta
    assert profile_key(spec) == f"{train_mlp.__module__}.train_mlp"


def test_an_infinite_process_group_timeout_is_refused_at_submit() -> None:
    """Old code: pg_timeout_s=inf passed the checks and was an OverflowError on every rank
    (torch takes it as a timedelta) once the job held its nodes."""
    from malleparsl.executors.planning import spec_from_options

    spec_from_options({"max_nodes": 2, "pg_timeout_s": 3600})
    for bad in (float("inf"), 1e15):
        with pytest.raises(SpecError, match="pg_timeout_s must be a finite number"):
            spec_from_options({"max_nodes": 2, "pg_timeout_s": bad})
    with pytest.raises(SpecError, match="pg_timeout_s must be a number > 0"):
        spec_from_options({"max_nodes": 2, "pg_timeout_s": 0})
