"""Emulated hosts on one machine: a Linux network namespace per host, joined by one bridge.

At a facility every node is its own network host; on one machine every pilot shares
``127.0.0.1``, so a component that hands out a loopback address looks fine here and fails there.
:class:`NetnsTestbed` gives each emulated host what a real node has: its own network stack
(inside a namespace ``127.0.0.1`` is that namespace's loopback), one interface (``eth0`` by
default, the same name on every host, so one ``GLOO_SOCKET_IFNAME`` fits all) with an address in
a private test subnet picked per run, and a link to the "login node" (the root namespace, which
holds the bridge address: run the interchange and the rendezvous store there). Cutting a host's
link (:meth:`NetnsTestbed.cut`) is a partition, not a kill: its processes live on.

Commands run on a host through ``nsenter --net=/var/run/netns/NAME`` (``ip netns exec``
remounts ``/sys``, which breaks ``slurmd``). :class:`NetnsProvider` puts each node's Parsl pilot
on its host.

Needs root and iproute2. Names carry the creating process's pid; a namespace or bridge of ours
whose pid is dead (a test run that was killed) is removed by the next :meth:`NetnsTestbed.start`
or by :func:`remove_stale`, never reused.

>>> with NetnsTestbed(hosts=3) as bed:           # doctest: +SKIP
...     bed.run(bed.hosts[0], ["ip", "-4", "-o", "addr"])
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import os
import random
import shlex
import shutil
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from malleparsl.errors import MalleparslError, SpecError
from malleparsl.procs import process_alive

log = logging.getLogger(__name__)

NS_PREFIX = "mpns-"  # namespaces: mpns-<pid>-<tag>-<i>
LINK_PREFIX = "mpb"  # bridge mpb<pidhex><tag>, root-side veths mpv<pidhex><tag><i>
VETH_PREFIX = "mpv"
NETNS_DIR = "/var/run/netns"
SUBNET_POOL = ipaddress.ip_network("10.213.0.0/16")  # one /24 of it per run


class TestbedError(MalleparslError, RuntimeError):
    """A namespace command failed; carries the command, its return code and its stderr."""

    __test__ = False  # not a pytest test class


@dataclass(frozen=True)
class Host:
    """One emulated host: its namespace, its address and the root-side end of its link."""

    name: str  # what the executor calls the node (``host-0``, ...)
    netns: str
    address: str
    ifname: str  # the host's interface inside its namespace
    veth: str  # the link's end in the root namespace (set down to cut the host off)

    @property
    def nsenter(self) -> list[str]:
        """The command prefix that runs a program on this host."""
        return ["nsenter", f"--net={NETNS_DIR}/{self.netns}"]


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    """Run ``ip ARGS``; a failure raises :class:`TestbedError` with stderr."""
    cmd = ["ip", *args]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    if check and res.returncode != 0:
        raise TestbedError(f"{shlex.join(cmd)} failed (rc={res.returncode}): {res.stderr.strip()}")
    return res


def require_tools() -> None:
    """Raise a clear error when this machine cannot host the test bed."""
    missing = [t for t in ("ip", "nsenter") if shutil.which(t) is None]
    if missing:
        raise TestbedError(
            f"missing {missing}: install iproute2 and util-linux (scripts/setup-system.sh does)"
        )
    if os.geteuid() != 0:
        raise TestbedError("network namespaces need root (CI runs as root)")


def _kill_ns_processes(netns: str) -> None:
    res = ip("netns", "pids", netns, check=False)
    for tok in res.stdout.split():
        with contextlib.suppress(ValueError, ProcessLookupError):
            os.kill(int(tok), signal.SIGKILL)


def remove_stale() -> list[str]:
    """Remove our namespaces and bridges left by processes that are gone; returns their names."""
    removed: list[str] = []
    res = ip("netns", "list", check=False)
    for line in res.stdout.splitlines():
        name = line.split()[0] if line.strip() else ""
        if not name.startswith(NS_PREFIX):
            continue
        try:
            pid = int(name[len(NS_PREFIX):].split("-")[0])
        except ValueError:
            continue
        if not process_alive(pid):
            _kill_ns_processes(name)
            ip("netns", "del", name, check=False)
            removed.append(name)
    res = ip("-o", "link", "show", "type", "bridge", check=False)
    for line in res.stdout.splitlines():
        parts = line.split(":")
        name = parts[1].strip().split("@")[0] if len(parts) > 1 else ""
        if not name.startswith(LINK_PREFIX) or len(name) < len(LINK_PREFIX) + 8:
            continue
        try:
            pid = int(name[len(LINK_PREFIX):len(LINK_PREFIX) + 6], 16)
        except ValueError:
            continue
        if not process_alive(pid):
            ip("link", "del", name, check=False)
            removed.append(name)
    if removed:
        log.warning("removed stale test bed objects of dead runs: %s", removed)
    return removed


def _used_networks() -> list[ipaddress.IPv4Network]:
    res = ip("-o", "-4", "addr", "show", check=False)
    nets = []
    for line in res.stdout.splitlines():
        toks = line.split()
        if "inet" in toks:
            nets.append(ipaddress.ip_interface(toks[toks.index("inet") + 1]).network)
    return nets


def _pick_subnet(rng: random.Random) -> ipaddress.IPv4Network:
    used = _used_networks()
    subnets = list(SUBNET_POOL.subnets(new_prefix=24))
    rng.shuffle(subnets)
    for net in subnets:
        if not any(net.overlaps(u) for u in used):
            return net
    raise TestbedError(f"no free /24 left in {SUBNET_POOL}")


class NetnsTestbed:
    """``hosts`` emulated hosts; see the module docstring. Use as a context manager.

    Parameters
    ----------
    hosts : number of hosts (1..250).
    ifname : the interface name inside every host (a facility's would be ``hsn0``, ``bond0``...).
    names : the hosts' node names; default ``host-0``, ``host-1``, ...
    """

    def __init__(self, hosts: int, *, ifname: str = "eth0",
                 names: Sequence[str] | None = None) -> None:
        if isinstance(hosts, bool) or not isinstance(hosts, int) or not 1 <= hosts <= 250:
            raise SpecError(f"hosts must be an integer in 1..250, got {hosts!r}")
        names = list(names) if names is not None else [f"host-{i}" for i in range(hosts)]
        if len(names) != hosts or len(set(names)) != hosts:
            raise SpecError(f"names must be {hosts} distinct node names, got {names!r}")
        self.n, self.ifname, self.names = hosts, ifname, names
        self.hosts: list[Host] = []
        self.bridge = ""
        self.bridge_address = ""
        self.subnet: ipaddress.IPv4Network | None = None
        self._by_name: dict[str, Host] = {}

    # ---- lifecycle ------------------------------------------------------------------------
    def start(self) -> NetnsTestbed:
        require_tools()
        remove_stale()
        rng = random.Random()
        pid = os.getpid()
        tag = f"{rng.randrange(256):02x}"
        self.subnet = _pick_subnet(rng)
        addrs = list(self.subnet.hosts())
        self.bridge = f"{LINK_PREFIX}{pid:06x}{tag}"
        self.bridge_address = str(addrs[0])
        try:
            ip("link", "add", self.bridge, "type", "bridge")
            ip("addr", "add", f"{self.bridge_address}/{self.subnet.prefixlen}", "dev", self.bridge)
            ip("link", "set", self.bridge, "up")
            for i, name in enumerate(self.names):
                host = Host(name=name, netns=f"{NS_PREFIX}{pid}-{tag}-{i}",
                            address=str(addrs[i + 1]), ifname=self.ifname,
                            veth=f"{VETH_PREFIX}{pid:06x}{tag}{i}")
                self._add_host(host)
        except BaseException:
            self.close()
            raise
        log.info("test bed: %d hosts on %s (bridge %s at %s)", self.n, self.subnet,
                 self.bridge, self.bridge_address)
        return self

    def _add_host(self, h: Host) -> None:
        peer = f"{h.veth}p"
        ip("netns", "add", h.netns)
        self.hosts.append(h)
        self._by_name[h.name] = h
        ip("link", "add", h.veth, "type", "veth", "peer", "name", peer)
        ip("link", "set", peer, "netns", h.netns)
        ip("link", "set", h.veth, "master", self.bridge)
        ip("link", "set", h.veth, "up")
        ns = ["-n", h.netns]
        ip(*ns, "link", "set", peer, "name", h.ifname)
        ip(*ns, "addr", "add", f"{h.address}/{self.subnet.prefixlen}", "dev", h.ifname)  # type: ignore[union-attr]
        ip(*ns, "link", "set", h.ifname, "up")
        ip(*ns, "link", "set", "lo", "up")

    def close(self) -> None:
        """Kill what runs on the hosts, delete namespaces, links and the bridge. Idempotent."""
        for h in self.hosts:
            _kill_ns_processes(h.netns)
            ip("netns", "del", h.netns, check=False)
            ip("link", "del", h.veth, check=False)
        self.hosts, self._by_name = [], {}
        if self.bridge:
            ip("link", "del", self.bridge, check=False)
            self.bridge = ""

    def __enter__(self) -> NetnsTestbed:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ---- use ------------------------------------------------------------------------------
    def host(self, name: str) -> Host:
        try:
            return self._by_name[name]
        except KeyError:
            raise SpecError(f"no emulated host named {name!r}; hosts: {sorted(self._by_name)}") from None

    def cut(self, name: str) -> None:
        """Partition host ``name``: its link goes down, its processes keep running."""
        ip("link", "set", self.host(name).veth, "down")

    def restore(self, name: str, *, timeout_s: float = 5.0) -> None:
        """Bring host ``name``'s link back up, and return once it carries traffic.

        Neighbour entries that failed while the link was down answer "No route to host" until
        they expire (seen in CI: a connect right after ``restore`` refused), so both ends'
        are flushed; then wait (bounded) for the link to be up at both ends."""
        h = self.host(name)
        ip("link", "set", h.veth, "up")
        ip("neigh", "flush", "to", h.address, check=False)
        self.run(h, ["ip", "neigh", "flush", "dev", h.ifname], check=False)
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            outer = ip("-o", "link", "show", h.veth, check=False).stdout
            inner = self.run(h, ["ip", "-o", "link", "show", h.ifname]).stdout
            if "LOWER_UP" in outer and "LOWER_UP" in inner:
                return
            time.sleep(0.05)

    def run(self, name: str | Host, argv: Sequence[str], **kw: Any) -> subprocess.CompletedProcess:
        """Run ``argv`` on a host and wait for it (``subprocess.run`` keyword arguments pass)."""
        h = name if isinstance(name, Host) else self.host(name)
        kw.setdefault("capture_output", True)
        kw.setdefault("text", True)
        kw.setdefault("timeout", 60)
        return subprocess.run([*h.nsenter, *argv], **kw)

    def wrap(self, name: str, command: str) -> str:
        """A shell command line that runs ``command`` (a shell string) on host ``name``."""
        return shlex.join([*self.host(name).nsenter, "/bin/sh", "-c", command])
