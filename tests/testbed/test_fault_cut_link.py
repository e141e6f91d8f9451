"""The fault bench's ``cut-link`` fault on real emulated hosts (network namespaces).

A job runs across the test bed's three hosts; at a random step one host's link goes down (its
pilot lives on, unreachable). The job must finish with every step counted once, with no segment
after the cut on the cut host; the link must come back up, and the host, lent again, must rejoin.
"""

from __future__ import annotations

import random

import pytest

parsl = pytest.importorskip("parsl")
pytest.importorskip("torch.distributed")

from malleparsl.executors.bench_faults import Rig, run_one  # noqa: E402
from malleparsl.executors.bench_multihost import COLLECTIVE_TIMEOUT_S  # noqa: E402
from malleparsl.executors.faults import CutLink, get_fault  # noqa: E402
from malleparsl.testbed.netns import ip  # noqa: E402

pytestmark = [pytest.mark.multihost, pytest.mark.slow, pytest.mark.timeout(300)]


def test_cut_link_job_finishes_right_on_the_others_and_the_host_rejoins(testbed, tmp_path):
    rig = Rig(str(tmp_path), 3, gloo_timeout_s=COLLECTIVE_TIMEOUT_S, bed=testbed)
    try:
        rng = random.Random(1)
        fault = get_fault("cut-link")
        assert isinstance(fault, CutLink) and fault.needs_netns
        rec = None
        for attempt in range(1, 4):  # None: the job ended before the cut (not a result)
            rec = run_one(rig, fault, attempt, rng)
            if rec is not None:
                break
        assert rec is not None, "the job always finished before the cut"
        assert rec["survived"] and not rec["result_lost"] and not rec["hang"], rec
        assert rec["recovery_s"] is not None and rec["recovery_s"] > 0, rec
        host = fault.host
        assert rec["what"].startswith(f"cut the link of {host}")
        job = rig.ex.control.jobs[f"f{attempt:04d}-cut-link"]
        after = job.history[fault.launched:]
        assert after and all(host not in nodes for nodes in after), job.history
        assert job.history[fault.launched - 1].count(host) == 1  # it ran there before
        veth = testbed.host(host).veth
        assert ",UP" in ip("-o", "link", "show", veth).stdout  # cleanup restored the link
        rig.top_up(timeout_s=240)  # the host is lent again and its new pilot joins
        assert host in rig.ex.ready_nodes()
    finally:
        closed = rig.close()
    assert closed, "the executor's shutdown hung"
