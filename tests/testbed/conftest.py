"""Emulated hosts for the ``multihost`` tests: network namespaces made by malleparsl.testbed.

They need root and iproute2. CI runs as root, so there a missing tool or permission is a
failure, never a skip; on a developer's machine without root the tests skip.
"""

from __future__ import annotations

import os

import pytest

from malleparsl.testbed import NetnsTestbed, remove_stale
from malleparsl.testbed.netns import NS_PREFIX, ip


def _can_run() -> None:
    if os.geteuid() != 0 and not os.environ.get("CI"):
        pytest.skip("network namespaces need root (CI runs these as root)")


@pytest.fixture(scope="module")
def testbed():
    """Three emulated hosts, ``host-0`` .. ``host-2``; removed at the end of the module."""
    _can_run()
    with NetnsTestbed(3) as bed:
        yield bed


@pytest.fixture(scope="session", autouse=True)
def no_namespace_left_behind():
    """After the session no namespace of this process may remain (and none of a dead run)."""
    yield
    remove_stale()
    mine = [line.split()[0] for line in ip("netns", "list", check=False).stdout.splitlines()
            if line.startswith(f"{NS_PREFIX}{os.getpid()}-")]
    for ns in mine:
        ip("netns", "del", ns, check=False)
    assert not mine, f"namespaces left behind by this run: {mine}"

