"""``MalleableEngine``: a Globus Compute endpoint engine whose executor is the MalleableExecutor.

Scientists submit from a laptop through a Globus Compute ``Executor``; the endpoint at the
facility hands each task to its engine. This engine is Globus Compute's own
``GlobusComputeEngine`` (the HTEX wrapper) with two changes:

* its executor class is :class:`~malleparsl.executors.MalleableExecutor`, so nodes are scavenged
  pilot jobs that the allocator grows and shrinks, and its interchange is our affinity
  interchange (the stock engine would launch Parsl's);
* a task whose resource specification carries ``"malleable"`` is not run once as a packed
  payload: the engine unpacks the function and arguments with the endpoint's serializer,
  runs them as a malleable training job (a sequence of multi-node segments), and packs the
  job's result — or its error — as the ``Result`` message the endpoint expects.

Every other task takes the stock path unchanged. The YAML endpoint config can only name engines
inside ``globus_compute_endpoint.engines``, so wire this one from the endpoint's ``config.py``
(see ``docs/globus.md`` and ``site_configs/endpoints/``).
"""

from __future__ import annotations

import logging
import sys
import time
import typing as t
import uuid
from concurrent.futures import Future

from malleparsl.executors.executor import MalleableExecutor
from malleparsl.executors.protocol import as_entry
from malleparsl.extras import needs_extra

with needs_extra("malleparsl.executors.globus_engine (MalleableEngine)"):
    from globus_compute_common import messagepack
    from globus_compute_common.messagepack.message_types import Result, Task, TaskTransition
    from globus_compute_common.tasks import ActorName, TaskState
    from globus_compute_endpoint.engines import GlobusComputeEngine
    from globus_compute_endpoint.engines.base import GCExecutorFuture
    from globus_compute_endpoint.exception_handling import (
        get_error_string,
        get_result_error_details,
    )
    from globus_compute_sdk.serialize import ComputeSerializer

log = logging.getLogger(__name__)

MALLEABLE_KEY = "malleable"


class MalleableEngine(GlobusComputeEngine):
    """Globus Compute engine running tasks on a :class:`MalleableExecutor`.

    Takes every ``GlobusComputeEngine`` argument; ``executor=MalleableExecutor(...)`` (or the
    MalleableExecutor keyword arguments directly) sets the nodes, policy and provider.
    Scaling is the controller's business, so the engine's block strategy is off.

    Examples
    --------
    >>> from malleparsl.executors import MalleableExecutor
    >>> engine = MalleableEngine(executor=MalleableExecutor(nodes=2))  # doctest: +SKIP
    >>> engine.start(endpoint_id=uuid.uuid4(), run_dir="/tmp/ep")     # doctest: +SKIP
    """

    _ExecutorClass = MalleableExecutor

    def __init__(self, *args: t.Any, strategy: str | None = "none", **kwargs: t.Any) -> None:
        super().__init__(*args, strategy=strategy, **kwargs)

    def _get_compute_ix_launch_cmd(self) -> list[str]:
        """Launch our affinity interchange, not Parsl's stock one."""
        return [sys.executable, "-m", "malleparsl.executors.interchange"]

    def _submit(
        self,
        resource_specification: dict,
        func: t.Callable,
        packed_task: bytes,
        args: tuple[t.Any, ...] = (),
        kwargs: dict | None = None,
    ) -> GCExecutorFuture:
        if not resource_specification or MALLEABLE_KEY not in resource_specification:
            return super()._submit(resource_specification, func, packed_task, args, kwargs)
        task_id = args[0] if args else uuid.uuid4()
        kw = kwargs or {}
        return self._submit_malleable(
            resource_specification,
            packed_task,
            task_id=task_id,
            task_deserializers=kw.get("task_deserializers"),
            result_serializers=kw.get("result_serializers"),
        )

    def _submit_malleable(
        self,
        resource_specification: dict,
        packed_task: bytes,
        *,
        task_id: uuid.UUID,
        task_deserializers: t.Sequence[str] | None,
        result_serializers: t.Sequence[str] | None,
    ) -> GCExecutorFuture:
        """Unpack the task, run it as a malleable job, and pack its outcome as a Result."""
        begin = TaskTransition(
            timestamp=time.time_ns(), state=TaskState.EXEC_START, actor=ActorName.WORKER
        )
        out = GCExecutorFuture()
        try:
            task = messagepack.unpack(packed_task)
            if not isinstance(task, Task):
                raise TypeError(f"expected a packed Task message, got {type(task).__name__}")
            serde = ComputeSerializer(allowed_deserializer_types=task_deserializers)
            fn, fargs, fkwargs = serde.unpack_and_deserialize(task.task_buffer)
            entry = as_entry(fn)
            inner: Future = self.executor.submit(
                entry, {MALLEABLE_KEY: dict(resource_specification[MALLEABLE_KEY])},
                *fargs, **fkwargs,
            )
        except Exception:
            log.exception("task %s: could not start the malleable job", task_id)
            out.set_result(_error_result(task_id, begin))
            return out
        out.executor_task_id = f"malleable-{task_id}"

        def done(f: Future) -> None:
            try:
                value = f.result()
                data = serde.serialize_from_list(value, result_serializers or ())
                res = Result(task_id=task_id, data=data, task_statuses=[begin, _end()])
                out.set_result(messagepack.pack(res))
            except Exception:
                out.set_result(_error_result(task_id, begin))

        inner.add_done_callback(done)
        return out


def _end() -> TaskTransition:
    return TaskTransition(timestamp=time.time_ns(), state=TaskState.EXEC_END, actor=ActorName.WORKER)


def _error_result(task_id: uuid.UUID, begin: TaskTransition) -> bytes:
    """Pack the exception being handled the way the endpoint's own ``execute_task`` does."""
    code, user_message = get_result_error_details()
    err = get_error_string()
    res = Result(
        task_id=task_id,
        data=err,
        exception=err,
        error_details={"code": code, "user_message": user_message},
        task_statuses=[begin, _end()],
    )
    return messagepack.pack(res)
