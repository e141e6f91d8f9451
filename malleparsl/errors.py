"""Exception hierarchy: every error a user can cause derives from ``MalleparslError``.

Bad input raises a subclass of ``ValueError`` too, so ``except ValueError`` keeps working for
callers who do not know our names. Messages echo the bad value, state the rule and give the fix.
"""

from __future__ import annotations


class MalleparslError(Exception):
    """Base class of all malleparsl errors."""


class SpecError(MalleparslError, ValueError):
    """A job spec, scaling curve, allocation or config value is invalid."""


class UnknownNameError(MalleparslError, KeyError):
    """A policy, solver, data set or site name is not registered."""

    def __str__(self) -> str:  # KeyError quotes its message; keep ours readable
        return str(self.args[0]) if self.args else ""


class SolverError(MalleparslError, RuntimeError):
    """An allocation solver failed in a way that has no safe fallback."""


class CheckpointError(MalleparslError, RuntimeError):
    """No usable checkpoint could be read."""


class CheckpointWriteError(MalleparslError, OSError):
    """A checkpoint could not be written (e.g. the disk is full); the previous one is kept.

    A system error, not the user's: the executor fails the job with it instead of taking it
    for a bug in the training code, and does not retry into the same full disk.
    """


class SchedulerCommandError(MalleparslError, RuntimeError):
    """A batch-scheduler command failed; carries its return code, stdout and stderr."""

    def __init__(self, cmd: str, returncode: int, stdout: str, stderr: str) -> None:
        self.cmd, self.returncode, self.stdout, self.stderr = cmd, returncode, stdout, stderr
        super().__init__(
            f"command {cmd!r} failed with return code {returncode}\n"
            f"stdout: {stdout.strip()[:2000]}\nstderr: {stderr.strip()[:2000]}"
        )


class TraceFormatError(MalleparslError, ValueError):
    """A trace or job-log line cannot be parsed; names the file and line."""


def unknown_name(kind: str, name: str, valid: object) -> UnknownNameError:
    """Build the error for an unregistered name, listing the valid ones."""
    names = ", ".join(sorted(str(v) for v in valid))  # type: ignore[attr-defined]
    return UnknownNameError(f"unknown {kind} {name!r}; valid {kind}s are: {names}")

