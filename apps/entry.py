"""The entry the executor runs once per rank and segment: ``run_rank`` and its picklable wrapper.

The executor's driver calls ``entry(rank_info, *args, **kwargs)`` on every node of a segment
(see :mod:`malleparsl.executors.protocol`). ``run_rank`` builds the :class:`TrainContext`,
calls the user's training function, and turns the way it ended into the protocol's answer:

* the function returned -> ``SegmentOutcome(status="finished")``, rank 0 carrying the result;
* :class:`RescaleRequested` came out of the loop -> ``SegmentOutcome(status="stopped")`` (the
  checkpoint is already on disk);
* any other exception propagates unchanged, so the app's future fails with the user's own
  exception and traceback; :class:`GroupBrokenError` marks ranks that failed only because a
  peer went away.

Whatever happens, the rank leaves its process group, which makes blocked peers fail fast
instead of waiting for the collective timeout. Workers stay warm between segments, so
``import torch`` is paid once per worker, not once per rescale.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from typing import Any

from parsl.app.errors import wrap_error

from malleparsl.apps.context import RescaleRequested, TrainContext
from malleparsl.executors.protocol import RankInfo, SegmentOutcome

log = logging.getLogger(__name__)

RESOURCE_SPEC_KW = "parsl_resource_specification"
_WRAP_ERROR_CODE = wrap_error(lambda: None).__code__  # shared by every wrap_error wrapper


def run_rank(
    rank_info: RankInfo, user_fn: Callable[..., Any], *args: Any, **kwargs: Any
) -> SegmentOutcome:
    """Run one rank of one segment of a malleable job; see the module docstring.

    >>> # what the driver does for rank i of a k-node segment, on node i:
    >>> # outcome = run_rank(RankInfo(job_id="j", segment=0, rank=i, world_size=k, ...),
    >>> #                    train_fn, lr=0.1)
    """
    kwargs.pop(RESOURCE_SPEC_KW, None)  # Parsl hands it to the function; the user never sees it
    t0 = time.monotonic()
    ctx = TrainContext.from_rank_info(rank_info)
    log.info(
        "job %s segment %d rank %d/%d on %s joined in %.3f s",
        rank_info.job_id, rank_info.segment, rank_info.rank, rank_info.world_size,
        rank_info.node, time.monotonic() - t0,
    )
    try:
        result = user_fn(ctx, *args, **kwargs)
        status = "finished"
    except RescaleRequested:
        status, result = "stopped", None
    finally:
        ctx.close()
    return SegmentOutcome(
        status=status,  # type: ignore[arg-type]
        rank=ctx.rank,
        step=ctx.step,
        samples=ctx.samples,
        samples_per_s=ctx.samples_per_s,
        result=result if ctx.rank == 0 else None,
        first_step_time=ctx.first_step_time,
        ckpt_save_s=ctx.ckpt_save_s,
        ckpt_load_s=ctx.ckpt_load_s,
    )


class RankEntry:
    """A picklable ``entry(rank_info, *args, **kwargs)`` around a user training function.

    It carries the function's name and docstring (so Parsl's task records and monitoring show
    the user's name) and can also run the function in-process with :meth:`local`.
    """

    def __init__(self, user_fn: Callable[..., Any]) -> None:
        if not callable(user_fn):
            raise TypeError(f"RankEntry needs a callable training function, got {user_fn!r}")
        # A function from a plain @python_app arrives inside Parsl's wrap_error, which would turn
        # exceptions (and the broken-group errors of peers) into return values: peel it off.
        while getattr(user_fn, "__code__", None) is _WRAP_ERROR_CODE:
            user_fn = user_fn.__wrapped__  # type: ignore[attr-defined]
        self.user_fn = user_fn
        functools.update_wrapper(self, user_fn)

    def __call__(self, rank_info: RankInfo, *args: Any, **kwargs: Any) -> SegmentOutcome:
        return run_rank(rank_info, self.user_fn, *args, **kwargs)

    def local(
        self,
        *args: Any,
        ckpt_dir: str | None = None,
        options: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> Any:
        """Run the training function here, at size 1, without Parsl (for debugging).

        ``options`` are the malleable options the ranks would see (``torch_threads``, ...).
        """
        kwargs.pop(RESOURCE_SPEC_KW, None)
        # the job's own ckpt_dir is not this run's (TrainContext.local drops it): a local run
        # writing there would leave checkpoints of another writer in the live job's folder
        ctx = TrainContext.local(ckpt_dir=ckpt_dir, options=options)
        try:
            return self.user_fn(ctx, *args, **kwargs)
        finally:
            ctx.close()

    def __getstate__(self) -> dict[str, Any]:
        # update_wrapper copies __wrapped__ and __dict__; only the function itself is needed
        return {"user_fn": self.user_fn}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["user_fn"])  # type: ignore[misc]

    def __repr__(self) -> str:
        return f"RankEntry({getattr(self.user_fn, '__qualname__', self.user_fn)!r})"
