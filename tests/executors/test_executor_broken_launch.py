"""A pilot whose worker command cannot run fails every task with the reason, instead of hanging.

The classic site mistake: the venv that holds ``process_worker_pool.py`` is not on the compute
nodes' PATH, so each pilot's shell exits 127. Real pilots (LocalProvider), a real DFK.
"""

from __future__ import annotations

import time

import pytest

parsl = pytest.importorskip("parsl")
pytest.importorskip("torch.distributed")

from parsl.jobs.errors import TooManyJobFailuresError  # noqa: E402

from malleparsl.apps import malleable_app  # noqa: E402
from malleparsl.apps.examples_digits import train_mlp  # noqa: E402
from malleparsl.executors.driver import JobAbortedError  # noqa: E402
from malleparsl.site_configs.local import local_config  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def test_unrunnable_worker_command_fails_plain_and_malleable_tasks_quickly(tmp_path):
    cfg = local_config(nodes=2, run_dir=str(tmp_path / "runinfo"), ckpt_root=str(tmp_path / "ck"),
                       launch_cmd="malleparsl-no-such-worker-command --for-this-test")
    dfk = parsl.load(cfg)
    try:
        @parsl.python_app(executors=["malleable"])
        def add(a, b):
            return a + b

        t0 = time.monotonic()
        plain = add(2, 3)
        job = malleable_app(min_nodes=1, max_nodes=2, torch_threads=1)(train_mlp)(total_steps=5)
        with pytest.raises(Exception) as info:
            plain.result(timeout=120)
        assert "EXIT CODE: 127" in str(info.value) or isinstance(
            info.value.__cause__, TooManyJobFailuresError), repr(info.value)
        with pytest.raises(JobAbortedError, match="(?s)cannot start nodes.*EXIT CODE: 127.*command not found"):
            job.result(timeout=60)
        took = time.monotonic() - t0
        print(f"both failed after {took:.1f} s")
        with pytest.raises(TooManyJobFailuresError):  # later submissions fail at once
            add(1, 1).result(timeout=10)
    finally:
        dfk.cleanup()
        parsl.clear()
