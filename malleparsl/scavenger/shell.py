"""The one door to the shell: every scheduler command of the scavengers goes through here.

Like Parsl's ``execute_wait``, a single function runs a command line and returns its return
code and output, so tests replace it (``SlurmScavenger(run=fake)``) with recorded output instead
of needing a scheduler. :func:`check` turns a failure into a
:class:`~malleparsl.errors.SchedulerCommandError` carrying the code, stdout and stderr.
"""

from __future__ import annotations

import logging
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from malleparsl.errors import SchedulerCommandError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CommandResult:
    """What a command returned."""

    returncode: int
    stdout: str
    stderr: str


Runner = Callable[[str], CommandResult]
"""``run(cmd) -> CommandResult``: the signature every scavenger accepts as ``run=``."""


def run_command(
    cmd: str, *, timeout_s: float = 10.0, env: Mapping[str, str] | None = None
) -> CommandResult:
    """Run ``cmd`` in a shell; a timeout becomes return code 124 (as coreutils' ``timeout``)."""
    log.debug("running %s", cmd)
    try:
        p = subprocess.run(
            cmd, shell=True, capture_output=True, text=True, timeout=timeout_s,
            env=dict(env) if env is not None else None,
        )
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        return CommandResult(124, out, f"timed out after {timeout_s} s")
    return CommandResult(p.returncode, p.stdout, p.stderr)


def default_runner(env: Mapping[str, str] | None = None, timeout_s: float = 10.0) -> Runner:
    """A runner bound to an environment (e.g. one with ``SLURM_CONF``)."""

    def run(cmd: str) -> CommandResult:
        return run_command(cmd, timeout_s=timeout_s, env=env)

    return run


def check(run: Runner, cmd: str) -> str:
    """Run ``cmd`` and return its stdout; raise SchedulerCommandError when it fails."""
    res = run(cmd)
    if res.returncode != 0:
        raise SchedulerCommandError(cmd, res.returncode, res.stdout, res.stderr)
    return res.stdout
