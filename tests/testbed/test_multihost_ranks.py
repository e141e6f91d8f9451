"""Two ranks per node across three emulated hosts: one rank per accelerator.

Each node runs ``ranks_per_node=2`` rank tasks on its two workers; each rank exports the device
binding its site config asks for (here ``ROCR_VISIBLE_DEVICES`` = accelerator ``0`` or ``1`` by
local rank, as on Frontier) and the hosts' interface for gloo/NCCL, and checks both from inside
the rank (``multihost_app.train_bound``). The global batch is split over all ranks of all
nodes, so the loss trajectory through a grow (4 -> 6 ranks) and a shrink (6 -> 4) equals an
unrescaled one-process run (which equals the one-rank-per-node run) to 1e-5.
"""

from __future__ import annotations

import datetime
import time

import pytest

parsl = pytest.importorskip("parsl")
dist = pytest.importorskip("torch.distributed")

from testbed_env import worker_init  # noqa: E402

from malleparsl.apps.entry import RankEntry  # noqa: E402
from malleparsl.apps.examples_digits import train_digits  # noqa: E402
from malleparsl.executors.bench_multihost import netns_config  # noqa: E402
from malleparsl.executors.manual_source import ManualNodeSource  # noqa: E402
from malleparsl.executors.options import ControlOptions  # noqa: E402
from malleparsl.executors.synthetic import synthetic_entry  # noqa: E402

pytestmark = [pytest.mark.multihost, pytest.mark.slow, pytest.mark.timeout(600)]
NODE_TIMEOUT_S = 300
ACCELERATORS = ("0", "1")
VAR = "ROCR_VISIBLE_DEVICES"


def wait_for(cond, timeout_s=NODE_TIMEOUT_S, what="a condition"):
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def stepping(ex, job_id, size):
    v = ex.snapshot().jobs.get(job_id)
    return v is not None and len(v.nodes) == size and v.state == "running" and v.stepping


def test_two_ranks_per_node_across_hosts_match_one_process(testbed, tmp_path):
    from multihost_app import train_bound

    hosts = [h.name for h in testbed.hosts]
    src = ManualNodeSource(nodes=hosts)
    control = ControlOptions(poll_period_s=0.1, socket_ifname=testbed.ifname, ranks_per_node=2,
                             accelerators=ACCELERATORS, device_env_var=VAR,
                             release_grace_s=2.0)
    dfk = parsl.load(netns_config(testbed, node_source=src, control=control,
                                  max_workers_per_node=2, run_dir=str(tmp_path / "runinfo"),
                                  ckpt_root=str(tmp_path / "ckpt"), worker_init=worker_init()))
    ex = dfk.executors["malleable"]
    try:
        ex.wait_for_nodes(3, NODE_TIMEOUT_S)
        wait_for(lambda: len(ex.snapshot().nodes) == 3, what="three planned hosts")
        snap = ex.snapshot()
        store = dist.TCPStore(snap.store_host, snap.store_port, None, False,
                              timeout=datetime.timedelta(seconds=10))
        # a blocker holds one host, so the training job starts on two and grows to three
        blocker = ex.submit(synthetic_entry, {"malleable": {"job_id": "blocker", "min_nodes": 1,
                                                            "max_nodes": 1}},
                            steps=10**6, step_s=0.05, progress_every_s=0.1,
                            finish_key="test/blocker/finish")
        wait_for(lambda: stepping(ex, "blocker", 1), what="the blocker")
        assert ex.snapshot().jobs["blocker"].world_size == 2  # two ranks on its one node
        steps = 600
        opts = {"job_id": "digits", "min_nodes": 1, "max_nodes": 3, "torch_threads": 1,
                "progress_interval_s": 0.2, "ckpt_interval_s": 1e9, "pace_s_per_sample": 2e-3}
        fut = ex.submit(RankEntry(train_bound), {"malleable": opts}, device_var=VAR,
                        accelerators=list(ACCELERATORS), ifname=testbed.ifname, arch="mlp",
                        total_steps=steps, dtype="float64")
        wait_for(lambda: stepping(ex, "digits", 2), what="digits on 2 hosts (4 ranks)")
        assert ex.snapshot().jobs["digits"].world_size == 4
        store.set("test/blocker/finish", "1")
        blocker.result(timeout=60)
        wait_for(lambda: stepping(ex, "digits", 3), what="growth to 3 hosts (6 ranks)")
        assert ex.snapshot().jobs["digits"].world_size == 6
        src.take(ex.snapshot().jobs["digits"].nodes[0])
        wait_for(lambda: stepping(ex, "digits", 2), what="the shrink to 2 hosts (4 ranks)")
        res = fut.result(timeout=NODE_TIMEOUT_S)
        wait_for(lambda: ex.snapshot().jobs["digits"].state == "done", 10, "the final snapshot")
        v = ex.snapshot().jobs["digits"]
    finally:
        dfk.cleanup()
        parsl.clear()
    assert [len(h) for h in v.history] == [2, 3, 2] and v.resolutions == 1
    assert [r.kind for r in v.rescales] == ["up", "down"]
    assert res["rank0_binding"] == {"local_rank": 0, VAR: "0", "host": res["rank0_binding"]["host"],
                                    "world_size": 4}
    ref = RankEntry(train_digits).local(arch="mlp", total_steps=steps, dtype="float64",
                                        ckpt_dir=str(tmp_path / "ref"),
                                        options={"torch_threads": 1})
    got = [h["loss"] for h in res["history"]]
    want = [h["loss"] for h in ref["history"]]
    assert len(got) == len(want) == steps
    assert max(abs(a - b) for a, b in zip(got, want)) < 1e-5
