"""MalleableEngine driven offline the way a Globus Compute endpoint drives it.

Tasks are packed with the SDK's ComputeSerializer into messagepack ``Task`` messages and handed
to ``engine.submit``; results come back as packed ``Result`` messages, which we unpack and
deserialize like the web service would. The nodes are real HTEX pilots on this machine.
"""

from __future__ import annotations

import operator
import uuid

import pytest
from globus_compute_common import messagepack
from globus_compute_common.messagepack.message_types import Result, Task
from globus_compute_endpoint.engines.base import GCFuture
from globus_compute_sdk.serialize import ComputeSerializer

from malleparsl.apps.examples_digits import train_mlp
from malleparsl.executors import MalleableExecutor
from malleparsl.executors.globus_engine import MalleableEngine


# Functions travel by reference (as dill pickles importable functions), so they must be
# importable on the workers: use library and example functions, not ones defined here.
def _pack(serde: ComputeSerializer, fn, *args, **kwargs) -> tuple[uuid.UUID, bytes]:
    task_id = uuid.uuid4()
    buf = serde.pack_buffers([serde.serialize(fn), serde.serialize(args), serde.serialize(kwargs)])
    return task_id, messagepack.pack(Task(task_id=task_id, task_buffer=buf))


def _result(serde: ComputeSerializer, fut: GCFuture, timeout: float = 240) -> Result:
    res = messagepack.unpack(fut.result(timeout=timeout))
    assert isinstance(res, Result)
    return res


@pytest.fixture
def engine(tmp_path):
    ex = MalleableExecutor(
        nodes=2, policy="equal-share", address="127.0.0.1", encrypted=False,
        ckpt_root=str(tmp_path / "ckpt"),
    )
    eng = MalleableEngine(executor=ex)
    eng.start(endpoint_id=uuid.uuid4(), run_dir=str(tmp_path / "ep"))
    yield eng
    eng.shutdown()


def test_engine_runs_plain_and_malleable_tasks_and_packs_errors(engine):
    serde = ComputeSerializer()

    tid, packed = _pack(serde, operator.add, 2, 3)
    plain = GCFuture(tid)
    engine.submit(plain, packed, resource_specification={})

    tid, packed = _pack(serde, train_mlp, total_steps=30, global_batch=32)
    train = GCFuture(tid)
    spec = {"malleable": {"min_nodes": 1, "max_nodes": 2, "job_id": "gc-digits"}}
    engine.submit(train, packed, resource_specification=spec)

    tid, packed = _pack(serde, train_mlp, total_steps=30, fail_at_step=3)
    bad = GCFuture(tid)
    engine.submit(bad, packed, resource_specification={"malleable": {"max_nodes": 2}})

    res = _result(serde, plain)
    assert res.task_id == plain.gc_task_id
    assert not res.is_error, res.data
    assert serde.deserialize(res.data) == 5

    res = _result(serde, train)
    assert not res.is_error, res.data
    out = serde.deserialize(res.data)
    assert out["steps"] == 30 and 0.0 <= out["accuracy"] <= 1.0

    res = _result(serde, bad)
    assert res.is_error
    assert "fail_at_step=3 reached" in res.data and "ValueError" in res.data


def test_engine_uses_the_affinity_interchange(engine):
    assert "malleparsl.executors.interchange" in " ".join(engine.executor.interchange_launch_cmd)
