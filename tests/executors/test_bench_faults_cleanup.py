"""The fault bench undoes every fault, also when the job hangs (a cut link left down would
break the test bed's host for every later fault)."""

from __future__ import annotations

import random

import pytest

parsl = pytest.importorskip("parsl")
pytest.importorskip("torch.distributed")

from malleparsl.executors import bench_faults  # noqa: E402
from malleparsl.executors.faults import Fault  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


class _Noted(Fault):
    """Injects nothing; notes that the bench undid it."""

    name = "noted"

    def __init__(self) -> None:
        self.cleaned = 0

    def inject(self, rig, job, rng) -> str:
        return "nothing"

    def cleanup(self, rig, job) -> list[str]:
        self.cleaned += 1
        return []


def test_a_fault_whose_job_hangs_is_cleaned_up_all_the_same(tmp_path, monkeypatch):
    monkeypatch.setattr(bench_faults, "JOB_DEADLINE_S", 0.0)  # every job "hangs" at once
    rig = bench_faults.Rig(str(tmp_path), 3, gloo_timeout_s=3.0)
    try:
        fault = _Noted()
        rec = None
        for attempt in range(1, 4):
            rec = bench_faults.run_one(rig, fault, attempt, random.Random(attempt))
            if rec is not None:
                break
        assert rec is not None and rec["hang"], rec
        assert fault.cleaned == 1, rec
    finally:
        rig.close()
