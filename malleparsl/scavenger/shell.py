"""The one door to the scheduler: every command of the scavengers goes through here.

Like Parsl's ``execute_wait``, a single function runs a command and returns its return code and
output, so tests replace it (``SlurmScavenger(run=fake)``) with recorded output instead of
needing a scheduler. Commands are **argument lists run without a shell**: a partition named
``x; touch pwned`` is one odd argument, never a second command. :func:`check` turns a failure
into a :class:`~malleparsl.errors.SchedulerCommandError` carrying the code, stdout and stderr.
"""

from __future__ import annotations

import logging
import shlex
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from malleparsl.errors import SchedulerCommandError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CommandResult:
    """What a command returned."""

    returncode: int
    stdout: str
    stderr: str


Runner = Callable[[Sequence[str]], CommandResult]
"""``run(argv) -> CommandResult``: the signature every scavenger accepts as ``run=``."""


def argv_of(cmd: Sequence[str]) -> list[str]:
    """``cmd`` as a list of strings; a single string is refused (it would need a shell)."""
    if isinstance(cmd, (str, bytes)):
        raise TypeError(
            f"scheduler commands are argument lists, not strings: got {cmd!r}; "
            "write e.g. ['squeue', '-j', job_id]"
        )
    return [str(a) for a in cmd]


def run_command(
    cmd: Sequence[str], *, timeout_s: float = 10.0, env: Mapping[str, str] | None = None
) -> CommandResult:
    """Run ``cmd`` (an argument list, no shell); a timeout becomes return code 124 (as
    coreutils' ``timeout``) and a missing program 127 (as a shell would)."""
    argv = argv_of(cmd)
    log.debug("running %s", shlex.join(argv))
    try:
        p = subprocess.run(
            argv, capture_output=True, text=True, timeout=timeout_s,
            env=dict(env) if env is not None else None,
        )
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        return CommandResult(124, out, f"timed out after {timeout_s} s")
    except (FileNotFoundError, PermissionError) as exc:
        return CommandResult(127, "", f"{argv[0]}: {exc.strerror}")
    return CommandResult(p.returncode, p.stdout, p.stderr)


def default_runner(env: Mapping[str, str] | None = None, timeout_s: float = 10.0) -> Runner:
    """A runner bound to an environment (e.g. one with ``SLURM_CONF``)."""

    def run(cmd: Sequence[str]) -> CommandResult:
        return run_command(cmd, timeout_s=timeout_s, env=env)

    return run


def check(run: Runner, cmd: Sequence[str]) -> str:
    """Run ``cmd`` and return its stdout; raise SchedulerCommandError when it fails."""
    res = run(argv_of(cmd))
    if res.returncode != 0:
        raise SchedulerCommandError(shlex.join(cmd), res.returncode, res.stdout, res.stderr)
    return res.stdout
