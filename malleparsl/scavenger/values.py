"""Checks for values that reach a batch script or a scheduler command line.

Parsl writes ``#SBATCH --partition=<value>`` / ``#PBS -q <value>`` lines from provider
arguments, so a newline in a value starts a new directive (or a shell line) and a ``;`` may run
a command. Scheduler names (partitions, QOS, accounts, queues, node names) are therefore limited
to the characters the schedulers themselves allow; walltimes to their documented forms.
``worker_init`` and ``scheduler_options`` are the user's own script lines by design and are not
restricted beyond this note.
"""

from __future__ import annotations

import re

from malleparsl.errors import SpecError

_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:+@-]{0,127}")
_WALLTIME = re.compile(r"(\d+-)?\d{1,4}:[0-5]\d:[0-5]\d")
_SELECT = re.compile(r"[A-Za-z0-9_.:=+-]*")


def scheduler_name(value: str | None, *, what: str) -> str | None:
    """A partition, QOS, account, queue or node name: letters, digits and ``_.:+@-`` only."""
    if value is None:
        return None
    if not isinstance(value, str) or not _NAME.fullmatch(value):
        raise SpecError(
            f"{what} {value!r} is not a valid scheduler name: use letters, digits and '_.:+@-' "
            "(no spaces, newlines, quotes or shell characters such as ';$`|&')"
        )
    return value


def walltime(value: str, *, what: str = "walltime") -> str:
    """``HH:MM:SS`` or ``D-HH:MM:SS`` (what both Slurm and PBS accept)."""
    if not isinstance(value, str) or not _WALLTIME.fullmatch(value):
        raise SpecError(
            f"{what} {value!r} is not a walltime: write HH:MM:SS (e.g. '01:00:00' for one "
            "hour) or D-HH:MM:SS"
        )
    return value


def select_resources(value: str, *, what: str = "select_options") -> str:
    """Extra PBS ``-l select`` resources such as ``ngpus=4:mem=64gb``."""
    if not isinstance(value, str) or not _SELECT.fullmatch(value):
        raise SpecError(
            f"{what} {value!r} may hold only letters, digits and '_.:=+-' "
            "(e.g. 'ngpus=4'); no spaces, newlines or shell characters"
        )
    return value

