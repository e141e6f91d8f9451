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


def _plural(kind: str) -> str:
    return kind[:-1] + "ies" if kind.endswith("y") and kind[-2:-1] not in "aeiou" else kind + "s"


def unknown_name(kind: str, name: str, valid: object) -> UnknownNameError:
    """Build the error for an unregistered name: the closest valid one (a typo is the usual
    cause), then all of them."""
    import difflib

    options = sorted(str(v) for v in valid)  # type: ignore[attr-defined]
    close = difflib.get_close_matches(str(name), options, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return UnknownNameError(
        f"unknown {kind} {name!r}{hint}; valid {_plural(kind)} are: {', '.join(options)}"
    )

