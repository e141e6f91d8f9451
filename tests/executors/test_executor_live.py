"""MalleableExecutor with real processes: LocalProvider pilots, HTEX managers, the interchange.

One executor with three emulated nodes serves the module (starting managers is the slow
part); tests that destroy nodes add their own and leave the others alone.
"""

from __future__ import annotations

import operator
import os
import subprocess
import threading
import time

import pytest
from parsl.executors.errors import InvalidResourceSpecification
from parsl.executors.high_throughput.errors import ManagerLost

from malleparsl.errors import SpecError
from malleparsl.site_configs.local import local_config

pytestmark = [pytest.mark.timeout(300), pytest.mark.slow]

HEARTBEAT_THRESHOLD = 3


def start_executor(run_dir: str, *, nodes: int, listener=None, **options):
    """Start the executor of ``local_config`` the way Parsl's DataFlowKernel does."""
    cfg = local_config(nodes=nodes, run_dir=run_dir, **options)
    ex = cfg.executors[0]
    ex.run_dir, ex.run_id, ex.log_config, ex.monitoring_messages = run_dir, "test", None, None
    ex.provider.script_dir = os.path.join(run_dir, "submit_scripts")
    os.makedirs(ex.provider.script_dir, exist_ok=True)
    if listener is not None:
        ex.add_node_listener(listener)
    ex.start()
    return ex


class Events:
    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []
        self.cv = threading.Condition()

    def __call__(self, event: str, node: str) -> None:
        with self.cv:
            self.seen.append((event, node))
            self.cv.notify_all()

    def wait(self, ev: tuple[str, str], timeout: float) -> bool:
        with self.cv:
            return self.cv.wait_for(lambda: ev in self.seen, timeout)


@pytest.fixture(scope="module")
def ex(tmp_path_factory):
    run_dir = str(tmp_path_factory.mktemp("malleable-live"))
    events = Events()
    ex = start_executor(
        run_dir, nodes=3, listener=events, malleable=False, heartbeat_period=1,
        heartbeat_threshold=HEARTBEAT_THRESHOLD,
    )
    ex.events = events
    try:
        ex.wait_for_nodes(3, timeout_s=180)
        yield ex
    finally:
        ex.shutdown()
        time.sleep(0.5)
        left = subprocess.run(["pgrep", "-f", run_dir], capture_output=True, text=True).stdout
        assert left.strip() == "", f"processes left behind after shutdown: {left}"


# Tasks are stdlib functions: workers cannot import this test module (rootdir import mode).
my_pid = os.getpid
sleeper = time.sleep


def test_nodes_become_ready_and_listeners_hear_it(ex):
    assert {"node-00", "node-01", "node-02"} <= ex.ready_nodes()
    for n in ("node-00", "node-01", "node-02"):
        assert ex.events.wait(("ready", n), 5)
        info = ex.node_info(n)
        assert info["pgid"] != os.getpgid(0) and info["pid"] != os.getpid()
    # each node is its own process group (its own pilot)
    assert len({ex.node_info(n)["pgid"] for n in ("node-00", "node-01", "node-02")}) == 3


def test_pinned_tasks_land_on_their_node(ex):
    nodes = ["node-00", "node-01", "node-02"]
    futs = {(n, i): ex.submit_to_node(n, my_pid) for n in nodes for i in range(4)}
    for (n, _), f in futs.items():
        assert f.result(timeout=60) == ex.node_info(n)["pid"]  # one worker per node
    # the same through an ordinary resource specification
    assert ex.submit(my_pid, {"node": "node-02"}).result(timeout=60) == ex.node_info("node-02")["pid"]


def test_ordinary_tasks_run_unchanged(ex):
    futs = [ex.submit(pow, {}, 2, i) for i in range(20)]
    assert [f.result(timeout=60) for f in futs] == [2**i for i in range(20)]
    assert ex.submit(my_pid, {"priority": 1}).result(timeout=60) in {
        ex.node_info(n)["pid"] for n in ex.ready_nodes()
    }
    with pytest.raises(InvalidResourceSpecification):
        ex.submit(my_pid, {"cores": 4})
    with pytest.raises(ZeroDivisionError):
        ex.submit(operator.truediv, {}, 1, 0).result(timeout=60)


def test_bad_node_names_and_disabled_malleable_jobs(ex):
    with pytest.raises(SpecError, match="unknown node 'nope'"):
        ex.submit_to_node("nope", my_pid)
    with pytest.raises(SpecError, match="already ready"):
        ex.add_node("node-00")
    with pytest.raises(SpecError, match="no control loop"):
        ex.submit(my_pid, {"malleable": {"min_nodes": 1}})


def test_release_node_fails_its_running_and_queued_tasks_at_once(ex):
    ex.add_node("rel-a")
    ex.wait_for_nodes(4, timeout_s=120)
    assert ex.events.wait(("ready", "rel-a"), 10)
    pgid = ex.node_info("rel-a")["pgid"]
    running = ex.submit_to_node("rel-a", sleeper, 3600)  # would outlive any deadline below
    queued = ex.submit_to_node("rel-a", my_pid)  # one worker: waits behind `running`
    time.sleep(1.0)
    ex.release_node("rel-a")
    for f in (running, queued):  # fail on release, not when the hour-long task would end
        with pytest.raises(ManagerLost):
            f.result(timeout=120)
    assert ex.events.wait(("lost", "rel-a"), 10)
    assert "rel-a" not in ex.ready_nodes()
    with pytest.raises(ManagerLost):  # submitting to a gone node fails, it does not hang
        ex.submit_to_node("rel-a", my_pid).result(timeout=5)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:  # the pilot's processes are gone
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.2)
    else:
        pytest.fail(f"process group {pgid} of the released node is still alive")
    # other nodes are untouched
    assert ex.submit_to_node("node-01", my_pid).result(timeout=60) == ex.node_info("node-01")["pid"]


def test_killed_node_is_detected_by_heartbeat_and_can_be_replaced(ex):
    ex.add_node("kill-a")
    ex.wait_for_nodes(4, timeout_s=120)
    assert ex.events.wait(("ready", "kill-a"), 10)
    running = ex.submit_to_node("kill-a", sleeper, 3600)  # would outlive any deadline below
    queued = ex.submit_to_node("kill-a", my_pid)
    time.sleep(1.0)
    ex.kill_node("kill-a")
    for f in (running, queued):  # failed by the heartbeat, not by the task's end
        with pytest.raises(ManagerLost):
            f.result(timeout=HEARTBEAT_THRESHOLD + 120)
    assert ex.events.wait(("lost", "kill-a"), 10)
    assert "kill-a" not in ex.ready_nodes()
    # the name can be used again: a new pilot becomes the node
    ex.add_node("kill-a")
    deadline = time.monotonic() + 120
    while "kill-a" not in ex.ready_nodes() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert ex.submit_to_node("kill-a", my_pid).result(timeout=60) == ex.node_info("kill-a")["pid"]
