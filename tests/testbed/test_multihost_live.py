"""A malleable job across three emulated hosts (network namespaces): grow, shrink, a cut link.

The interchange, control loop and store run on the login node (the bridge address); each
node's pilot runs on its own host, where 127.0.0.1 is that host's own loopback, so a component
handing out a loopback address would fail here as at a facility.
"""

from __future__ import annotations

import datetime
import time

import pytest

parsl = pytest.importorskip("parsl")
dist = pytest.importorskip("torch.distributed")

from testbed_env import worker_init  # noqa: E402

from malleparsl.executors.bench_multihost import (  # noqa: E402
    COLLECTIVE_TIMEOUT_S,
    netns_config,
)
from malleparsl.executors.manual_source import ManualNodeSource  # noqa: E402
from malleparsl.executors.options import ControlOptions  # noqa: E402
from malleparsl.executors.synthetic import synthetic_entry  # noqa: E402

pytestmark = [pytest.mark.multihost, pytest.mark.slow, pytest.mark.timeout(600)]
NODE_TIMEOUT_S = 240


def wait_for(cond, timeout_s=NODE_TIMEOUT_S, what="a condition"):
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def interface_address() -> str:
    """Runs on a worker: the address of the host's eth0."""
    import subprocess

    out = subprocess.run(["ip", "-4", "-o", "addr", "show", "eth0"], capture_output=True,
                         text=True, check=True).stdout
    return out.split()[3].split("/")[0]


@pytest.fixture(scope="module")
def live(testbed, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("multihost")
    hosts = [h.name for h in testbed.hosts]
    src = ManualNodeSource(nodes=hosts[:2])  # the third host is lent by the first test
    control = ControlOptions(poll_period_s=0.1, socket_ifname=testbed.ifname,
                             release_grace_s=2.0, fail_grace_s=COLLECTIVE_TIMEOUT_S + 10)
    dfk = parsl.load(netns_config(testbed, node_source=src, control=control,
                                  run_dir=str(run_dir / "runinfo"),
                                  ckpt_root=str(run_dir / "ckpt"), worker_init=worker_init()))
    ex = dfk.executors["malleable"]
    try:
        ex.wait_for_nodes(2, NODE_TIMEOUT_S)
        snap = ex.snapshot()
        store = dist.TCPStore(snap.store_host, snap.store_port, None, False,
                              timeout=datetime.timedelta(seconds=10))
        yield ex, src, store, testbed
    finally:
        dfk.cleanup()
        parsl.clear()


def view(ex, job_id):
    return ex.snapshot().jobs[job_id]


def stepping(ex, job_id, size):
    v = ex.snapshot().jobs.get(job_id)
    return v is not None and len(v.nodes) == size and v.state == "running" and v.stepping


def start(ex, job_id, **kw):
    fut = ex.submit(synthetic_entry, {"malleable": {"job_id": job_id, "min_nodes": 1,
                                                    "max_nodes": 3}},
                    progress_every_s=0.1, timeout_s=COLLECTIVE_TIMEOUT_S, **kw)
    wait_for(lambda: job_id in ex.snapshot().jobs, 30, "admission")
    return fut


def test_store_and_interchange_listen_on_the_bridge_address_only(live):
    ex, _, _, bed = live
    snap = ex.snapshot()
    assert snap.store_host == bed.bridge_address and ex.address == bed.bridge_address
    # every pilot is on its own host, with that host's address
    seen = {n: ex.submit_to_node(n, interface_address).result(60) for n in ex.ready_nodes()}
    assert seen == {n: bed.host(n).address for n in seen}
    with pytest.raises(Exception, match="(?i)connect|refused|timed? ?out"):
        dist.TCPStore("127.0.0.1", snap.store_port, None, False,
                      timeout=datetime.timedelta(seconds=2))


def test_job_grows_and_shrinks_across_hosts(live):
    ex, src, store, bed = live
    fut = start(ex, "grow-shrink", steps=10**6, step_s=0.05, ckpt_every=10,
                finish_key="test/gs/finish")
    wait_for(lambda: stepping(ex, "grow-shrink", 2), what="the job on 2 hosts")
    src.idle("host-2")
    wait_for(lambda: stepping(ex, "grow-shrink", 3), what="growth onto host-2")
    src.take("host-1")
    wait_for(lambda: stepping(ex, "grow-shrink", 2) and "host-1" not in
             view(ex, "grow-shrink").nodes, what="the shrink off host-1")
    store.set("test/gs/finish", "1")
    res = fut.result(timeout=120)
    assert res["sizes"] == [2, 3, 2] and res["total"] == float(res["steps"])
    wait_for(lambda: view(ex, "grow-shrink").state == "done", 10, "the final snapshot")
    v = view(ex, "grow-shrink")
    assert [r.kind for r in v.rescales] == ["up", "down"] and v.resolutions == 1
    assert v.history[1] == ("host-0", "host-1", "host-2")
    # give host-1 back for the next test
    wait_for(lambda: "host-1" not in ex.ready_nodes(), 60, "host-1's pilot to go")
    src.idle("host-1")
    wait_for(lambda: len(ex.ready_nodes()) == 3 and len(ex.snapshot().nodes) == 3,
             what="three ready hosts")


def test_cut_link_resumes_on_the_others_and_the_host_rejoins(live):
    ex, src, store, bed = live
    wait_for(lambda: len(ex.snapshot().nodes) == 3, what="three planned hosts")
    fut = start(ex, "partition", steps=10**6, step_s=0.05, ckpt_every=10,
                finish_key="test/part/finish")
    wait_for(lambda: stepping(ex, "partition", 3), what="the job on 3 hosts")
    time.sleep(1.0)
    victim = "host-2"
    bed.cut(victim)
    try:
        wait_for(lambda: stepping(ex, "partition", 2) and victim not in
                 view(ex, "partition").nodes, what="training on the other two hosts")
        assert view(ex, "partition").rescales[-1].kind == "restart"
    finally:
        bed.restore(victim)
    wait_for(lambda: victim not in ex.ready_nodes(), 60, "the cut host to be dropped")
    src.idle(victim)  # its link is back: offered again, it rejoins the job
    wait_for(lambda: stepping(ex, "partition", 3), what="the host to rejoin")
    store.set("test/part/finish", "1")
    res = fut.result(timeout=120)
    assert res["sizes"] == [3, 2, 3] and res["total"] == float(res["steps"])
    resumed = res["starts"][1]
    assert resumed > 0 and resumed % 10 == 0  # from the last checkpoint, not from scratch
    wait_for(lambda: view(ex, "partition").state == "done", 10, "the final snapshot")
    assert view(ex, "partition").resolutions == 1
