"""The test bed itself: each emulated host is its own network host, and nothing is left over."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from malleparsl.errors import SpecError
from malleparsl.testbed import NetnsTestbed, remove_stale
from malleparsl.testbed.netns import NS_PREFIX, ip

pytestmark = [pytest.mark.multihost, pytest.mark.timeout(120)]

CONNECT = ("import socket,sys\n"
           "try:\n"
           "    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=3).close()\n"
           "    print('connected')\n"
           "except OSError as e:\n"
           "    print('refused', e)\n")


def _listen(host: str) -> socket.socket:
    s = socket.create_server((host, 0))
    s.settimeout(5)
    return s


def _connect(bed, host, addr, port) -> str:
    return bed.run(host, [sys.executable, "-c", CONNECT, addr, str(port)]).stdout.strip()


def test_each_host_has_its_own_address_and_loopback(testbed):
    addrs = set()
    for h in testbed.hosts:
        out = testbed.run(h, ["ip", "-4", "-o", "addr"]).stdout
        assert h.address in out and testbed.bridge_address not in out
        addrs.add(h.address)
    assert len(addrs) == 3
    # the login node (root namespace) is reached on the bridge address, not on 127.0.0.1
    srv = _listen("127.0.0.1")
    assert _connect(testbed, "host-0", "127.0.0.1", srv.getsockname()[1]).startswith("refused")
    srv.close()
    srv = _listen(testbed.bridge_address)
    assert _connect(testbed, "host-1", testbed.bridge_address, srv.getsockname()[1]) == "connected"
    srv.close()


def test_a_cut_link_is_a_partition_and_restore_heals_it(testbed):
    srv = _listen(testbed.bridge_address)
    port = srv.getsockname()[1]
    testbed.cut("host-2")
    try:
        assert _connect(testbed, "host-2", testbed.bridge_address, port).startswith("refused")
        assert _connect(testbed, "host-0", testbed.bridge_address, port) == "connected"
    finally:
        testbed.restore("host-2")
    assert _connect(testbed, "host-2", testbed.bridge_address, port) == "connected"
    srv.close()


def test_stale_namespace_of_a_dead_run_is_removed_not_reused():
    if os.geteuid() != 0 and not os.environ.get("CI"):
        pytest.skip("network namespaces need root (CI runs these as root)")
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = f"{NS_PREFIX}{dead.pid}-zz-0"
    ip("netns", "add", stale)
    try:
        assert stale in remove_stale()
    finally:
        ip("netns", "del", stale, check=False)
    assert stale not in ip("netns", "list").stdout


def test_close_removes_everything_it_made():
    if os.geteuid() != 0 and not os.environ.get("CI"):
        pytest.skip("network namespaces need root (CI runs these as root)")
    bed = NetnsTestbed(2).start()
    names, bridge = [h.netns for h in bed.hosts], bed.bridge
    bed.close()
    listed = ip("netns", "list").stdout
    assert not any(n in listed for n in names)
    assert ip("link", "show", bridge, check=False).returncode != 0


@pytest.mark.parametrize("hosts", [0, 251, True, "3"])
def test_bad_host_counts_are_refused(hosts):
    with pytest.raises(SpecError, match="hosts must be an integer"):
        NetnsTestbed(hosts)
