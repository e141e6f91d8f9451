"""Run trials as Parsl apps: malleable jobs on a MalleableExecutor, or plain one-node tasks.

:class:`AppTrialRunner` turns every suggestion of a search into one call of a
``@malleable_app``: a job the executor's controller sizes between ``min_nodes`` and
``max_nodes``, grows when nodes come and shrinks when they go. The rung's budget reaches the
training function as an ordinary hyperparameter (``config["epochs"]`` or
``config["samples"]``), and every rung of a trial shares one checkpoint folder, so a promoted
trial resumes where its previous rung ended. With ``malleable=False`` each trial is instead an
ordinary HTEX task on one node (the same training function, run with a one-rank
``TrainContext``): the fallback for executors that cannot resize jobs.

>>> runner = AppTrialRunner(train_fn=print, min_nodes=1, max_nodes=2)   # doctest: +SKIP
>>> Workflow().add(TrialStage("search", make_asha)); wf.run(runner)     # doctest: +SKIP
"""

from __future__ import annotations

import concurrent.futures as cf
import logging
import os
from collections.abc import Callable, Mapping
from typing import Any

from malleparsl.errors import SpecError

from .runner import TrialRunner
from .scheduler import Suggestion

log = logging.getLogger(__name__)


def run_plain_trial(train_fn: Callable[..., Any], config: Mapping[str, Any],
                    ckpt_dir: str | None, options: Mapping[str, Any]) -> Any:
    """The non-malleable path: ``train_fn(ctx, config)`` with a one-rank local context.

    The trial's ``ckpt_dir`` wins over one in ``options`` (the runner's options for every
    trial): each trial checkpoints in its own folder, as on the malleable path."""
    from malleparsl.apps.context import TrainContext

    ctx = TrainContext.local(ckpt_dir=ckpt_dir, options=options)
    try:
        return train_fn(ctx, dict(config))
    finally:
        ctx.close()



def _decorated_options(train_fn: Any) -> dict[str, Any] | None:
    """A ``@malleable_app``'s own options (None for a plain function)."""
    from malleparsl.apps.decorator import MalleableApp

    return dict(train_fn.malleable) if isinstance(train_fn, MalleableApp) else None


def batch_of(global_batch_of: Callable[[Mapping[str, Any]], int],
             config: Mapping[str, Any]) -> int:
    """``global_batch_of(config)`` checked as the option ``global_batch`` is (a sample count:
    a numpy integer is one, 32.5 or "32" is not): a wrong value names the trial's config here,
    not as a disagreement inside its ranks."""
    from malleparsl.plans import global_batch_option

    got = global_batch_of(config)
    try:
        gb = global_batch_option({"global_batch": got})
        if gb is None:
            raise SpecError("global_batch must be an integer >= 1, got None")
    except SpecError as exc:
        raise SpecError(f"global_batch_of({dict(config)!r}) returned {got!r}: {exc}") from None
    return gb

class AppTrialRunner(TrialRunner):
    """Submit each trial as a Parsl app on the executor labelled ``executor``.

    Parameters
    ----------
    train_fn
        ``train_fn(ctx, config) -> metrics dict``; ``config`` holds the trial's
        hyperparameters plus the rung budget under ``budget_unit``.
    budget_unit
        ``"epochs"`` or ``"samples"``: the key the budget is passed under.
    min_nodes, max_nodes
        Size bounds of every trial's malleable job (default 1 and 4). ``train_fn`` may be a
        ``@malleable_app`` already: its own options are then kept, the runner's
        ``min_nodes``, ``max_nodes`` and ``options``, where given, override them for every
        trial, and so does ``rescale_hint_s`` where the app sets no pause of its own; options
        the app does not know are refused here.
    samples_per_unit
        Samples in one budget unit (an epoch's samples); lets the controller know each job's
        remaining work (``total_samples``). Optional.
    rescale_hint_s
        The pause (s) a grow or shrink is expected to cost, passed as ``rescale_up_s`` /
        ``rescale_down_s``. Without it the allocator sees rescales as free and may stop a
        running trial to start an equal one (churn); measured pauses replace it when the JPA
        is on. ``None`` passes nothing.
    options
        Extra malleable options for every job (``torch_threads``, ``ckpt_interval_s``...).
    global_batch_of
        ``global_batch_of(config) -> int``: the global batch ``train_fn`` passes to
        ``ctx.steps`` for a trial's hyperparameters (e.g.
        :func:`malleparsl.workflows.digits.global_batch_of`). Each trial's job then carries it
        as its malleable option ``global_batch``, so the controller never gives a trial more
        nodes than its batch has samples for its ranks. ``None`` (the runner cannot know what
        a training function does with its config): a trial is capped only once its first
        progress record says its batch, and ``ctx.steps`` warns when ranks are left without
        a sample. It must be the value ``ctx.steps`` gets:
        a different one fails the trial (``SpecError``).
    malleable
        False runs every trial as a plain one-node task (no resizing).
    """

    def __init__(
        self,
        *,
        train_fn: Callable[..., Any],
        budget_unit: str = "epochs",
        min_nodes: int | None = None,
        max_nodes: int | None = None,
        executor: str = "malleable",
        ckpt_root: str | os.PathLike[str] | None = None,
        samples_per_unit: float | None = None,
        rescale_hint_s: float | None = 0.5,
        options: Mapping[str, Any] | None = None,
        global_batch_of: Callable[[Mapping[str, Any]], int] | None = None,
        malleable: bool = True,
    ) -> None:
        super().__init__(ckpt_root=ckpt_root)
        if budget_unit not in ("epochs", "samples"):
            raise SpecError(f"budget_unit must be 'epochs' or 'samples', got {budget_unit!r}")
        if not callable(train_fn):
            raise SpecError(f"train_fn must be a function (ctx, config) -> metrics, got {train_fn!r}")
        app_opts = _decorated_options(train_fn) if malleable else None
        given = {k: v for k, v in (("min_nodes", min_nodes), ("max_nodes", max_nodes))
                 if v is not None}
        base = app_opts if app_opts is not None else {"max_nodes": 4}  # a decorated app: its own
        min_nodes = min_nodes if min_nodes is not None else base.get("min_nodes", 1)
        max_nodes = max_nodes if max_nodes is not None else base.get("max_nodes", 1)
        if isinstance(min_nodes, bool) or not isinstance(min_nodes, int) or not 1 <= min_nodes <= max_nodes:
            raise SpecError(
                f"need integers 1 <= min_nodes <= max_nodes, got min_nodes={min_nodes!r}, "
                f"max_nodes={max_nodes!r}"
            )
        self.train_fn, self.budget_unit = train_fn, budget_unit
        self.min_nodes, self.max_nodes, self.executor = min_nodes, max_nodes, executor
        self.samples_per_unit = samples_per_unit
        # the expected pause, where the options (or a decorated app's own) set none
        hint = ({k: float(rescale_hint_s) for k in ("rescale_up_s", "rescale_down_s")}
                if rescale_hint_s is not None else {})
        self.options = {**hint, **dict(options or {})}
        if global_batch_of is not None and not callable(global_batch_of):
            raise SpecError(f"global_batch_of must be a function config -> global batch, got "
                            f"{global_batch_of!r}")
        self.global_batch_of = global_batch_of
        self.malleable = malleable
        # a @malleable_app train_fn keeps its own options; what the runner was given explicitly
        # goes with every call (before, a decorated app silently ignored all of it)
        self._app_call: dict[str, Any] = {}
        if app_opts is not None:
            from malleparsl.apps.decorator import validate_options

            self._app_call = {**{k: v for k, v in hint.items() if k not in app_opts},
                              **given, **dict(options or {})}
            validate_options({**app_opts, **self._app_call}, name=train_fn.__name__,
                             extra=train_fn.extra_options)
        self._app: Any = None
        self._prev_budget: dict[tuple[str, str], float] = {}

    def _build(self) -> Any:
        if self.malleable:
            from malleparsl.apps.decorator import MalleableApp, malleable_app

            if isinstance(self.train_fn, MalleableApp):
                return self.train_fn
            return malleable_app(self.train_fn, min_nodes=self.min_nodes, max_nodes=self.max_nodes,
                                 executors=[self.executor], **self.options)
        from parsl.app.python import PythonApp

        return PythonApp(run_plain_trial, executors=[self.executor])

    def config_for(self, s: Suggestion) -> dict[str, Any]:
        """The configuration the training function receives: hyperparameters plus budget."""
        return {**dict(s.config), self.budget_unit: s.budget}

    def _submit(self, stage: str, s: Suggestion, job_id: str, ckpt_dir: str | None) -> cf.Future:
        if self._app is None:
            self._app = self._build()
        cfg = self.config_for(s)
        if not self.malleable:
            fn = getattr(self.train_fn, "entry", None)
            fn = getattr(fn, "user_fn", self.train_fn)
            opts = {k: v for k, v in self.options.items() if not k.startswith("rescale_")}
            return self._app(fn, cfg, ckpt_dir, {**opts, "torch_threads": 1, "resume": s.rung > 0})
        opts: dict[str, Any] = {"job_id": job_id, "seed": int(s.config.get("seed", 0)),
                                "resume": s.rung > 0}  # a promoted trial continues its rung
        if ckpt_dir is not None:
            opts["ckpt_dir"] = ckpt_dir
        if self.global_batch_of is not None:  # the controller caps the trial's size at it
            opts["global_batch"] = batch_of(self.global_batch_of, cfg)
        if self.samples_per_unit:
            prev = self._prev_budget.get((stage, s.trial_id), 0.0)
            opts["total_samples"] = max(1.0, (s.budget - prev) * float(self.samples_per_unit))
            self._prev_budget[(stage, s.trial_id)] = s.budget
        opts = {**self._app_call, **opts}
        log.debug("submit %s (%s) with %s", job_id, cfg, opts)
        return self._app(cfg, malleable_options=opts)
