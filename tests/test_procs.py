"""``process_alive``: the pid test behind the clean-ups of dead runs' leftovers."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from malleparsl.procs import process_alive


def test_a_running_process_is_alive_and_an_exited_one_is_not():
    assert process_alive(os.getpid())
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()  # exited and reaped
    assert not process_alive(p.pid)


def test_a_zombie_is_not_alive():
    """Dead but not yet reaped by its parent: ``kill(pid, 0)`` would still call it alive."""
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.monotonic() + 30
    while process_alive(p.pid) and time.monotonic() < deadline:
        time.sleep(0.02)  # not waited for: it stays a zombie until p.wait()
    assert not process_alive(p.pid)
    with open(f"/proc/{p.pid}/stat") as fh:  # still there, as a zombie
        assert fh.read().rsplit(")", 1)[1].split()[0] == "Z"
    p.wait()


def test_without_procfs_a_signal_probe_answers(monkeypatch, tmp_path):
    """On a system without /proc (macOS) every pid would read as dead, and a sweep would take a
    live worker's scratch directory for a dead one's: a signal-0 probe answers there."""
    import malleparsl.procs as procs

    monkeypatch.setattr(procs, "PROC", str(tmp_path / "no-procfs"))
    assert process_alive(os.getpid())
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    assert not process_alive(p.pid)
