"""Whether a process runs: the one test the project's clean-ups of dead runs' leftovers share.

Scratch directories of killed rehearsals (:mod:`malleparsl.executors.warmup`), test bed
namespaces of dead runs (:mod:`malleparsl.testbed.netns`) and a fault's stopped worker
(:mod:`malleparsl.executors.faults`) are all named or held by a pid.
"""

from __future__ import annotations

__all__ = ["process_alive"]


def process_alive(pid: int) -> bool:
    """True while ``pid`` runs or is stopped; a zombie (dead, not yet reaped) is not alive.

    Read from ``/proc``, so another user's process counts too (``kill(pid, 0)`` would need a
    permission it may not have)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            state = fh.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")
