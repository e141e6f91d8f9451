"""Whether a process runs: the one test the project's clean-ups of dead runs' leftovers share.

Scratch directories of killed rehearsals (:mod:`malleparsl.executors.warmup`), test bed
namespaces of dead runs (:mod:`malleparsl.testbed.netns`) and a fault's stopped worker
(:mod:`malleparsl.executors.faults`) are all named or held by a pid.
"""

from __future__ import annotations

import os

__all__ = ["process_alive"]

PROC = "/proc"
"""Where the process table is read (Linux's procfs)."""


def process_alive(pid: int) -> bool:
    """True while ``pid`` runs or is stopped; a zombie (dead, not yet reaped) is not alive.

    Read from procfs, so another user's process counts too (``kill(pid, 0)`` would need a
    permission it may not have). Without procfs (macOS: a laptop's workers) a signal-0 probe
    answers instead, where a zombie still counts as alive: a clean-up must never take a live
    process's files for a dead one's."""
    if not os.path.isdir(os.path.join(PROC, "self")):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:  # another user's process
            return True
        return True
    try:
        with open(os.path.join(PROC, str(pid), "stat")) as fh:
            state = fh.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")
