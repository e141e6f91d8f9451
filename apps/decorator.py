"""``@malleable_app``: turn a training function taking a ``TrainContext`` into a Parsl app.

The result is an ordinary Parsl :class:`~parsl.app.python.PythonApp`: calling it returns an
``AppFuture`` that resolves to the training function's return value (rank 0's). What makes it
malleable is the function Parsl ships, a :class:`~malleparsl.apps.entry.RankEntry`, and the
resource specification every call carries, ``{"malleable": {...options...}}``, which
:class:`~malleparsl.executors.MalleableExecutor` hands to its driver instead of running the task
once. So the app must run on a ``MalleableExecutor`` (pick it with ``executors=[label]`` when a
config has several executors).

>>> from malleparsl.apps import malleable_app
>>> @malleable_app(min_nodes=1, max_nodes=4, total_samples=64 * 300)
... def train(ctx, lr=0.1):
...     ...                                   # see malleparsl.apps.examples_digits
>>> train.malleable["max_nodes"]
4
>>> # future = train(lr=0.05); future.result()   # inside `with parsl.load(config):`
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

from parsl.app.python import PythonApp
from parsl.dataflow.dflow import DataFlowKernelLoader

from malleparsl.apps.entry import RESOURCE_SPEC_KW, RankEntry
from malleparsl.errors import SpecError
from malleparsl.executors.executor import MalleableExecutor
from malleparsl.executors.options import check_job_options
from malleparsl.extras import require
from malleparsl.model import JobSpec, ScalingCurve
from malleparsl.names import check_safe_name
from malleparsl.plans import fixed_plan_option, global_batch_option, node_budget, plan_options


def validate_options(options: dict[str, Any], *, name: str = "app",
                     extra: Collection[str] = ()) -> dict[str, Any]:
    """Check the malleable options a user gave; return a normalised copy.

    ``name`` labels the job in messages when the options give no ``job_id`` (the training
    function's name); ``extra`` names options the training function reads itself. Raises
    :class:`~malleparsl.errors.SpecError` naming the job, the bad option and the rule: an
    unknown name (with the closest valid one, :data:`~malleparsl.executors.options.JOB_OPTIONS`)
    or a bad value, here rather than on the ranks once the job holds its nodes.
    """
    out = dict(options)
    job_id = out.get("job_id")
    if job_id is not None:
        check_safe_name(str(job_id), what="job_id")  # it becomes <ckpt_root>/<job_id>
    job = str(job_id or name)
    check_job_options(out, job=job, extra=extra)
    curve = out.get("curve")
    if curve is not None:
        try:
            pairs = [(int(n), float(r)) for n, r in curve]
        except (TypeError, ValueError) as exc:
            raise SpecError(
                f"job {job!r}: curve must be a list of [nodes, samples_per_s] pairs, got {curve!r}"
            ) from exc
        pairs.sort()
        ScalingCurve(tuple(n for n, _ in pairs), tuple(r for _, r in pairs))  # SpecError if bad
        out["curve"] = [list(p) for p in pairs]
    try:
        fixed_plan_option(out)  # a misspelt plan now, not on every rank once the job runs
        global_batch_option(out)  # global_batch=0 now, not at .result()
        for key in ("node_memory_bytes", "rank_memory_bytes"):  # each alone: ranks_per_node
            node_budget({key: out.get(key)})  # is the executor's, known only at submit
        try:  # the profile and its global_batch as submit reads them (budgets checked above)
            plan_options({**out, "node_memory_bytes": None, "rank_memory_bytes": None})
        except SpecError:
            raise
        except (TypeError, ValueError, AttributeError) as exc:
            raise SpecError(f"memory_profile must be a MemoryProfile or its dict "
                            f"(MemoryProfile.as_dict()), got {out.get('memory_profile')!r}: "
                            f"{exc}") from None
    except SpecError as exc:
        raise SpecError(f"job {job!r}: {exc}") from None
    total = out.get("total_samples")
    JobSpec(  # reuse the model's checks (bounds, pauses, totals) with their messages
        job_id=job,
        min_nodes=out.get("min_nodes", 1),
        max_nodes=out.get("max_nodes", 1),
        rescale_up_s=out.get("rescale_up_s") or 0.0,  # as given: JobSpec names a bad one
        rescale_down_s=out.get("rescale_down_s") or 0.0,
        total_samples=math.inf if total is None else total,
    )
    return out


def _takes_malleable(executor: Any) -> bool:
    """Whether ``executor`` runs ``{"malleable": ...}`` tasks: a MalleableExecutor, or Parsl's
    GlobusComputeExecutor (its endpoint's engine may be a MalleableEngine; only it can tell)."""
    return isinstance(executor, MalleableExecutor) or any(
        c.__name__ == "GlobusComputeExecutor" for c in type(executor).__mro__)


class MalleableApp(PythonApp):
    """A Parsl python app whose task is a malleable training job; see :func:`malleable_app`."""

    def __init__(
        self,
        func: Callable[..., Any],
        *,
        options: dict[str, Any],
        executors: list[str] | str = "all",
        data_flow_kernel: Any = None,
        extra_options: Collection[str] = (),
    ) -> None:
        self.entry = RankEntry(func)
        super().__init__(self.entry, data_flow_kernel=data_flow_kernel, executors=executors)
        # PythonApp wrapped the entry in wrap_error, which returns exceptions as values; the
        # driver needs them raised (a user error vs a lost node), so ship the bare entry.
        self.func = self.entry
        self.extra_options = tuple(extra_options)
        self.malleable = validate_options(options, name=self.__name__, extra=self.extra_options)
        self._default_key = "model" not in self.malleable and "profile_key" not in self.malleable
        if self._default_key:
            # calls of one training function share the JPA's measured curves (a sweep's trials
            # start from what the first measured, rescaled to their own level)
            self.malleable["profile_key"] = f"{func.__module__}.{func.__qualname__}"

    def __call__(self, *args: Any, malleable_options: dict[str, Any] | None = None, **kwargs: Any):
        """Submit one training job; ``malleable_options`` overrides options for this call
        (e.g. ``{"job_id": "trial-3", "max_nodes": 2}``)."""
        opts = copy.deepcopy(self.malleable)
        if malleable_options:
            if (self._default_key and malleable_options.get("model") is not None
                    and "profile_key" not in malleable_options):
                del opts["profile_key"]  # the call's model names it: the default key outranks it
            opts = validate_options({**opts, **malleable_options}, name=self.__name__,
                                    extra=self.extra_options)
        self._check_executors()
        spec = dict(kwargs.pop(RESOURCE_SPEC_KW, None) or {})
        spec["malleable"] = opts
        return super().__call__(*args, **{RESOURCE_SPEC_KW: spec}, **kwargs)

    def _check_executors(self) -> None:
        """Refuse a call Parsl would send to an executor that cannot run a malleable job (it
        would fail with Parsl's ``Invalid Resource Specification Supplied: {'malleable'}``)."""
        dfk = self.data_flow_kernel or DataFlowKernelLoader.dfk()
        loaded = getattr(dfk, "executors", None)
        if not isinstance(loaded, Mapping):
            return  # a stand-in for the DataFlowKernel (tests)
        # the config's executors: what DataFlowKernel.submit picks from at random for "all"
        # (the DFK adds an internal one of its own, not a candidate)
        config = getattr(getattr(dfk, "config", None), "executors", None)
        own = [e.label for e in config] if config is not None else list(loaded)
        want_all = isinstance(self.executors, str) and self.executors.lower() == "all"
        labels = own if want_all else list(self.executors)
        ok = [k for k in own if k in loaded and _takes_malleable(loaded[k])]
        bad = [k for k in labels if k in loaded and not _takes_malleable(loaded[k])]
        if not bad:
            return
        kinds = ", ".join(f"{k!r} ({type(loaded[k]).__name__})" for k in bad)
        pick = (f"; pick it with @malleable_app(executors={ok!r}, ...)" if ok else
                "; load a config that has one, e.g. "
                "parsl.load(malleparsl.site_configs.local.local_config(nodes=2))")
        raise SpecError(
            f"malleable app {self.__name__!r} needs a MalleableExecutor, but Parsl may send it "
            f"to executor {kinds}{pick}")

    def local(self, *args: Any, ckpt_dir: str | None = None, **kwargs: Any) -> Any:
        """Run the training function in this process at size 1 (no Parsl, no executor)."""
        return self.entry.local(*args, ckpt_dir=ckpt_dir, options=self.malleable, **kwargs)


def malleable_app(
    function: Callable[..., Any] | None = None,
    *,
    min_nodes: int = 1,
    max_nodes: int = 1,
    total_samples: float | None = None,
    curve: Sequence[Sequence[float]] | None = None,
    rescale_up_s: float | None = None,
    rescale_down_s: float | None = None,
    executors: list[str] | str = "all",
    data_flow_kernel: Any = None,
    extra_options: Collection[str] = (),
    **options: Any,
) -> Any:
    """Decorate ``fn(ctx: TrainContext, *args, **kwargs)`` as a malleable Parsl app.

    Parameters
    ----------
    min_nodes, max_nodes
        The sizes the job may run at; the allocator picks within them as nodes come and go.
    total_samples
        Samples the job trains in all (lets ``ctx.steps()`` derive its step count and the
        allocator estimate time to finish).
    curve
        Known throughput ``[[nodes, samples_per_s], ...]``; without it the Job Profiling
        Advisor learns the curve online.
    rescale_up_s, rescale_down_s
        Hints for the pause a grow / shrink costs (measured values replace them).
    executors
        Parsl executor labels, as for ``python_app``; must name a ``MalleableExecutor`` (a
        call that Parsl could send elsewhere is a ``SpecError``).
    extra_options
        Names of options the training function reads itself from ``ctx.options``.
    **options
        Passed to every rank in ``RankInfo.options``: e.g. ``job_id``, ``ckpt_dir``,
        ``seed``, ``global_batch``, ``micro_batch``, ``ckpt_interval_s``, ``torch_threads``
        (all of them: :data:`~malleparsl.executors.options.JOB_OPTIONS`). A name not there nor
        in ``extra_options``, or a bad value, is a ``SpecError`` at decoration (the name's
        closest valid one suggested).
    """
    require("torch", feature="@malleable_app (training with torch.distributed)")
    opts: dict[str, Any] = {"min_nodes": min_nodes, "max_nodes": max_nodes, **options}
    for name, value in (
        ("total_samples", total_samples), ("curve", curve),
        ("rescale_up_s", rescale_up_s), ("rescale_down_s", rescale_down_s),
    ):
        if value is not None:
            opts[name] = value

    def decorate(fn: Callable[..., Any]) -> MalleableApp:
        return MalleableApp(fn, options=opts, executors=executors,
                            data_flow_kernel=data_flow_kernel, extra_options=extra_options)

    return decorate(function) if function is not None else decorate
