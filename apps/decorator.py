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
from collections.abc import Callable, Sequence
from typing import Any

from parsl.app.python import PythonApp

from malleparsl.apps.entry import RESOURCE_SPEC_KW, RankEntry
from malleparsl.errors import SpecError
from malleparsl.extras import require
from malleparsl.model import JobSpec, ScalingCurve
from malleparsl.plans import fixed_plan_option


def validate_options(options: dict[str, Any]) -> dict[str, Any]:
    """Check the malleable options a user gave; return a normalised copy.

    Raises :class:`~malleparsl.errors.SpecError` naming the bad value and the rule.
    """
    out = dict(options)
    curve = out.get("curve")
    if curve is not None:
        try:
            pairs = [(int(n), float(r)) for n, r in curve]
        except (TypeError, ValueError) as exc:
            raise SpecError(
                f"curve must be a list of [nodes, samples_per_s] pairs, got {curve!r}"
            ) from exc
        pairs.sort()
        ScalingCurve(tuple(n for n, _ in pairs), tuple(r for _, r in pairs))  # SpecError if bad
        out["curve"] = [list(p) for p in pairs]
    fixed_plan_option(out)  # a misspelt plan now, not on every rank once the job runs
    total = out.get("total_samples")
    JobSpec(  # reuse the model's checks (bounds, pauses, totals) with their messages
        job_id=str(out.get("job_id") or "app"),
        min_nodes=out.get("min_nodes", 1),
        max_nodes=out.get("max_nodes", 1),
        rescale_up_s=float(out.get("rescale_up_s") or 0.0),
        rescale_down_s=float(out.get("rescale_down_s") or 0.0),
        total_samples=math.inf if total is None else total,
    )
    return out


class MalleableApp(PythonApp):
    """A Parsl python app whose task is a malleable training job; see :func:`malleable_app`."""

    def __init__(
        self,
        func: Callable[..., Any],
        *,
        options: dict[str, Any],
        executors: list[str] | str = "all",
        data_flow_kernel: Any = None,
    ) -> None:
        self.entry = RankEntry(func)
        super().__init__(self.entry, data_flow_kernel=data_flow_kernel, executors=executors)
        # PythonApp wrapped the entry in wrap_error, which returns exceptions as values; the
        # driver needs them raised (a user error vs a lost node), so ship the bare entry.
        self.func = self.entry
        self.malleable = validate_options(options)

    def __call__(self, *args: Any, malleable_options: dict[str, Any] | None = None, **kwargs: Any):
        """Submit one training job; ``malleable_options`` overrides options for this call
        (e.g. ``{"job_id": "trial-3", "max_nodes": 2}``)."""
        opts = copy.deepcopy(self.malleable)
        if malleable_options:
            opts = validate_options({**opts, **malleable_options})
        spec = dict(kwargs.pop(RESOURCE_SPEC_KW, None) or {})
        spec["malleable"] = opts
        return super().__call__(*args, **{RESOURCE_SPEC_KW: spec}, **kwargs)

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
        Parsl executor labels, as for ``python_app``; must name a ``MalleableExecutor``.
    **options
        Passed to every rank in ``RankInfo.options``: e.g. ``job_id``, ``ckpt_dir``,
        ``seed``, ``micro_batch``, ``ckpt_interval_s``, ``torch_threads`` (see
        :class:`~malleparsl.apps.context.TrainContext`).
    """
    require("torch", feature="@malleable_app (training with torch.distributed)")
    opts: dict[str, Any] = {"min_nodes": min_nodes, "max_nodes": max_nodes, **options}
    for name, value in (
        ("total_samples", total_samples), ("curve", curve),
        ("rescale_up_s", rescale_up_s), ("rescale_down_s", rescale_down_s),
    ):
        if value is not None:
            opts[name] = value
    opts = validate_options(opts)

    def decorate(fn: Callable[..., Any]) -> MalleableApp:
        return MalleableApp(fn, options=opts, executors=executors, data_flow_kernel=data_flow_kernel)

    return decorate(function) if function is not None else decorate
