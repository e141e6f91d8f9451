"""``highspy``, imported so that HiGHS's banner never reaches stdout.

The first ``highspy.Highs()`` of a process prints "Running HiGHS ... Copyright" to the C
stdout; from highspy 1.16 it does so in the constructor, before any option (``output_flag``)
can be set. That line would corrupt the JSON that ``--json`` commands print. Importing this
module creates that first instance with file descriptor 1 pointed at ``/dev/null``; HiGHS
prints the banner once per process, so later instances stay quiet.
"""

from __future__ import annotations

import contextlib
import os
import sys

import highspy

__all__ = ["highspy"]


def _swallow_banner() -> None:
    with contextlib.suppress(AttributeError, OSError, ValueError):
        sys.stdout.flush()  # what Python buffered must not land in /dev/null
    saved = os.dup(1)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 1)
        highspy.Highs().setOptionValue("output_flag", False)
    finally:
        os.dup2(saved, 1)
        os.close(saved)
        os.close(devnull)


_swallow_banner()
