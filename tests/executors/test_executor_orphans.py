"""A client that dies by SIGKILL leaves no interchange, manager or worker behind."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.timeout(300), pytest.mark.slow]

CLIENT = Path(__file__).with_name("executor_orphan_client.py")


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is dead for our purpose
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except FileNotFoundError:
        return False


def test_killed_client_takes_interchange_and_nodes_with_it(tmp_path):
    proc = subprocess.Popen([sys.executable, str(CLIENT), str(tmp_path)],
                            stdout=subprocess.PIPE, text=True, start_new_session=True)
    node_pgid = None
    try:
        line = proc.stdout.readline()
        assert line.startswith("READY"), f"client did not start: {line!r}"
        _, ix_pid, node_pgid = line.split()
        proc.kill()  # SIGKILL: no atexit, no shutdown()
        proc.wait(10)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and alive(int(ix_pid)):
            time.sleep(0.2)
        assert not alive(int(ix_pid)), "the interchange outlived its client"
        while time.monotonic() < deadline:
            left = subprocess.run(["pgrep", "-f", str(tmp_path)], capture_output=True, text=True)
            if not left.stdout.strip():
                break
            time.sleep(0.5)
        else:
            pytest.fail(f"node processes outlived the client: {left.stdout}")
    finally:  # clean up by id whatever the assertions found alive
        for pgid in (proc.pid, int(node_pgid) if node_pgid else None):
            if pgid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pgid, signal.SIGKILL)
