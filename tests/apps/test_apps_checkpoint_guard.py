"""Checkpoint hardening: safe job ids, layout fingerprints, reused folders, a full disk."""

from __future__ import annotations

import contextlib
import os
import subprocess
import uuid

import pytest
import torch

from malleparsl.apps.checkpoint import CheckpointStore, state_layout
from malleparsl.apps.context import TrainContext
from malleparsl.errors import CheckpointError, CheckpointWriteError, SpecError
from malleparsl.names import check_safe_name

BAD_IDS = ["../..", "/etc", "a/b", "", ".hidden", "x\ny", "two words", "..", 7, None]


@pytest.mark.parametrize("bad", BAD_IDS)
def test_unsafe_job_ids_are_rejected_with_the_rule(bad) -> None:
    with pytest.raises(SpecError, match="not a safe name"):
        check_safe_name(bad)


def test_safe_job_ids_pass() -> None:
    for ok in ("job-1", "hpo-t3-r0", "G00001-linear", "local-ab12", "a.b_c+d"):
        assert check_safe_name(ok) == ok


class _NoNodes:
    """Just enough of an executor for the control loop to start with no nodes."""

    def submit_to_node(self, *a, **k):  # pragma: no cover - never called without nodes
        raise AssertionError("no nodes")

    def add_node_listener(self, fn) -> None:
        pass

    def ready_nodes(self) -> list:
        return []


@pytest.mark.parametrize("bad", ["../..", "/tmp/evil", "a/../../b"])
def test_control_loop_rejects_a_job_id_that_escapes_the_checkpoint_root(tmp_path, bad) -> None:
    from malleparsl.executors.control import ControlLoop
    from malleparsl.executors.options import ControlOptions

    loop = ControlLoop(
        executor=_NoNodes(),
        policy="greedy",
        ckpt_root=str(tmp_path),
        options=ControlOptions(store_address="127.0.0.1", warm_nodes=False),
    )
    loop.start()
    try:
        with pytest.raises(SpecError, match="not a safe name"):
            loop.submit_job(lambda: None, {"job_id": bad, "min_nodes": 1, "max_nodes": 1})
    finally:
        loop.stop(timeout_s=30)
    assert list(tmp_path.iterdir()) == []


def _ctx(tmp_path, model, *, job_id="j", segment=0, **options) -> TrainContext:
    ctx = TrainContext(
        job_id=job_id,
        segment=segment,
        ckpt_dir=str(tmp_path),
        options={"torch_threads": 1, **options},
    )
    ctx.register(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
    return ctx


def _saved(tmp_path, model, *, step=4, job_id="j") -> None:
    ctx = _ctx(tmp_path, model, job_id=job_id)
    try:
        ctx.restore()
        ctx.step = step
        ctx.save()
    finally:
        ctx.close()


class OtherNet(torch.nn.Linear):
    """Same parameter names and shapes as ``Linear(2, 1)``, another model."""


def test_layout_names_class_keys_shapes_and_dtypes() -> None:
    lin = torch.nn.Linear(2, 1)
    assert state_layout(lin) == [
        "class:Linear",
        "bias:(1,):torch.float32",
        "weight:(1, 2):torch.float32",
    ]
    opt = torch.optim.Adam(lin.parameters())
    assert state_layout(opt) == [
        "class:Adam",
        "group0[0]:(1, 2):torch.float32",
        "group0[1]:(1,):torch.float32",
    ]


@pytest.mark.parametrize(
    "other",
    [
        lambda: torch.nn.Linear(3, 1),  # another shape
        lambda: OtherNet(2, 1),  # same shapes, another model class
        lambda: torch.nn.Linear(2, 1).double(),  # another dtype
    ],
)
def test_a_checkpoint_of_another_model_is_refused(tmp_path, other) -> None:
    torch.manual_seed(0)
    _saved(tmp_path, torch.nn.Linear(2, 1))
    ctx = _ctx(tmp_path, other(), segment=1)
    with pytest.raises(CheckpointError, match="does not fit this job's model"):
        ctx.restore()
    ctx.close()


def test_a_checkpoint_of_another_optimizer_is_refused(tmp_path) -> None:
    _saved(tmp_path, torch.nn.Linear(2, 1))
    ctx = TrainContext(job_id="j", segment=1, ckpt_dir=str(tmp_path), options={})
    model = torch.nn.Linear(2, 1)
    ctx.register(model=model, optimizer=torch.optim.Adam(model.parameters()))
    with pytest.raises(CheckpointError, match="optimizer: entry 0 is 'class:SGD'"):
        ctx.restore()
    ctx.close()


def test_the_same_layout_resumes(tmp_path) -> None:
    _saved(tmp_path, torch.nn.Linear(2, 1), step=4)
    ctx = _ctx(tmp_path, torch.nn.Linear(2, 1), segment=1)
    assert ctx.restore() and ctx.step == 4
    ctx.close()


def test_another_jobs_checkpoint_is_refused_unless_resume_is_asked(tmp_path) -> None:
    _saved(tmp_path, torch.nn.Linear(2, 1), job_id="writer")
    ctx = _ctx(tmp_path, torch.nn.Linear(2, 1), job_id="reader", segment=1)
    with pytest.raises(CheckpointError, match="written by job 'writer'.*resume=True"):
        ctx.restore()
    ctx.close()
    ctx = _ctx(tmp_path, torch.nn.Linear(2, 1), job_id="reader", resume=True)
    assert ctx.restore() and ctx.step == 4
    ctx.close()


def test_a_reused_folder_is_refused_at_the_first_segment_unless_resume(tmp_path) -> None:
    _saved(tmp_path, torch.nn.Linear(2, 1), step=100)  # an earlier run of the same job id
    fresh = _ctx(tmp_path, torch.nn.Linear(2, 1))
    with pytest.raises(CheckpointError, match="already holds 1 checkpoint.*newest step 100"):
        fresh.restore()
    fresh.close()
    again = _ctx(tmp_path, torch.nn.Linear(2, 1), resume=True)
    assert again.restore() and again.step == 100
    again.close()


def test_the_file_just_written_is_never_pruned(tmp_path) -> None:
    store = CheckpointStore(directory=tmp_path, keep=1)
    store.save({"w": torch.ones(1)}, step=100)  # a stale higher step
    path = store.save({"w": torch.zeros(1)}, step=5)
    assert path.exists()
    assert [c.step for c in store.list()] == [5]


@contextlib.contextmanager
def _small_disk(base, size_kib: int):
    """A real size-limited tmpfs (root, as in CI); else a folder whose writes fail ENOSPC."""
    path = base / f"tiny-{uuid.uuid4().hex[:6]}"
    path.mkdir()
    mounted = (
        os.geteuid() == 0
        and subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size_kib}k", "tmpfs", str(path)],
            capture_output=True,
        ).returncode
        == 0
    )
    try:
        yield path, mounted
    finally:
        if mounted:
            subprocess.run(["umount", str(path)], check=False)


def test_disk_full_keeps_the_previous_checkpoint_and_says_so(tmp_path, monkeypatch) -> None:
    with _small_disk(tmp_path, 64) as (d, mounted):
        store = CheckpointStore(directory=d, keep=3)
        store.save({"w": torch.ones(4)}, step=1)
        if not mounted:  # the write path fails as a full disk would
            import errno

            def full(fd):
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

            monkeypatch.setattr(os, "fsync", full)
        with pytest.raises(
            CheckpointWriteError,
            match=r"disk full.*step 2.*previous "
            r"checkpoint is kept \(step 1\)",
        ):
            store.save({"w": torch.ones(200_000)}, step=2)  # 800 kB > 64 KiB
        monkeypatch.undo()
        assert [c.step for c in store.list()] == [1]
        assert not [p for p in d.iterdir() if p.name.startswith(".tmp")]
        step, state = store.load_latest()
        assert step == 1 and state["w"].tolist() == [1.0] * 4


def test_layout_ignores_how_long_a_plain_data_history_is():
    # regression: a trial array's history grows every step; its checkpoint must still fit
    from malleparsl.apps.checkpoint import state_layout

    class Hist:
        def __init__(self, n):
            self.h = {"t0": [{"loss": 1.0}] * n}

        def state_dict(self):
            return {"history": self.h, "w": torch.zeros(2)}

    assert state_layout(Hist(1)) == state_layout(Hist(45))
    assert state_layout(Hist(1)) != state_layout(torch.nn.Linear(2, 1))


def test_an_object_may_give_its_own_layout():
    from malleparsl.apps.checkpoint import state_layout

    class Own:
        def checkpoint_layout(self):
            return ["class:Own", "trials:t0,t1"]

        def state_dict(self):
            return {"w": torch.zeros(3)}

    assert state_layout(Own()) == ["class:Own", "trials:t0,t1"]
