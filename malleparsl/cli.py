"""The ``malleparsl`` command line.

Each command lives beside the code it drives (``malleparsl/sim/cli.py``, ...) as a plain
typer-compatible function; this module only wires them up. Command modules import heavy
libraries (torch, parsl) inside the function body, so ``malleparsl --help`` stays fast. The CLI
is the top of the stack, so it may name modules of any layer.
"""

from __future__ import annotations

import functools
import importlib
import logging
import os
import sys
from collections.abc import Callable
from typing import Any

import typer

from malleparsl import __version__
from malleparsl.errors import SpecError, TraceFormatError, UnknownNameError
from malleparsl.extras import as_missing_extra

app = typer.Typer(
    help="Train DNNs on a supercomputer's idle nodes from Parsl workflows.",
    no_args_is_help=True,
    add_completion=False,
)
bench_app = typer.Typer(help="Benchmarks that print figures.", no_args_is_help=True)
app.add_typer(bench_app, name="bench")

# (group, command name, "module:function"); a module not written yet is skipped.
COMMANDS: list[tuple[str | None, str, str]] = [
    (None, "demo", "malleparsl.workflows.demo:demo"),
    (None, "simulate", "malleparsl.sim.cli:simulate"),
    ("bench", "allocator", "malleparsl.allocator.bench:bench_allocator"),
    ("bench", "executor", "malleparsl.executors.bench:bench_executor"),
    ("bench", "faults", "malleparsl.executors.bench_faults:bench_faults"),
    ("bench", "jpa", "malleparsl.jpa.bench:bench_jpa"),
    ("bench", "fused", "malleparsl.apps.bench_fused:bench_fused"),
    ("bench", "decisions", "malleparsl.sim.bench_decisions:bench_decisions"),
    ("bench", "worst-decisions", "malleparsl.sim.bench_worst:bench_worst_decisions"),
    ("bench", "multihost", "malleparsl.executors.bench_multihost:bench_multihost"),
    ("bench", "plans", "malleparsl.apps.bench_plans:bench_plans"),
    ("bench", "slurm", "malleparsl.scavenger.bench:bench_slurm"),
]


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"malleparsl {__version__}")
        raise typer.Exit()


@app.callback()
def _main(
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Log at INFO level."),
    version: bool = typer.Option(  # noqa: ARG001 - handled by the eager callback
        False, "--version", is_eager=True, callback=_print_version, help="Print the version."
    ),
) -> None:
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING,
        format="%(asctime)s %(name)s %(levelname)s: %(message)s",
    )
    # Parsl starts its interchange and worker pools by command name: an un-activated venv's
    # ``bin/malleparsl`` must still find them.
    bin_dir = os.path.dirname(sys.executable)
    if bin_dir not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = bin_dir + os.pathsep + os.environ.get("PATH", "")


def _needs_extra_command(error: Exception):  # noqa: ANN202
    """A stand-in for a command whose module needs a missing extra: it says which, in one line."""

    def command(ctx: typer.Context) -> None:  # noqa: ARG001
        raise error

    return command


USER_ERRORS: tuple[type[BaseException], ...] = (
    SpecError, UnknownNameError, TraceFormatError, FileNotFoundError, NotADirectoryError,
    IsADirectoryError, PermissionError,
)
"""What a user's mistake raises: shown as one ``error: ...`` line and exit status 2, no
traceback. Anything else is a bug or a system fault and keeps its traceback."""


def user_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap a command so that :data:`USER_ERRORS` become ``error: ...`` and exit status 2."""

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except USER_ERRORS as exc:
            msg = " ".join(str(exc).split()) or type(exc).__name__
            if isinstance(exc, OSError) and exc.filename and exc.filename not in msg:
                msg = f"{exc.filename}: {msg}"
            print(f"error: {msg}", file=sys.stderr, flush=True)
            raise typer.Exit(2) from None

    return run


def _register() -> None:
    groups = {None: app, "bench": bench_app}
    for group, name, target in COMMANDS:
        mod_name, func_name = target.split(":")
        try:
            mod = importlib.import_module(mod_name)
        except ModuleNotFoundError as exc:
            if exc.name and mod_name.startswith(exc.name):
                continue  # that part of malleparsl is not installed or not written yet
            missing = as_missing_extra(exc, f"malleparsl {' '.join(filter(None, (group, name)))}")
            if missing is None:
                raise
            extra = {"ignore_unknown_options": True, "allow_extra_args": True}
            groups[group].command(name, context_settings=extra, add_help_option=False,
                                  help=str(missing))(_needs_extra_command(missing))
            continue
        groups[group].command(name)(user_errors(getattr(mod, func_name)))


_register()


def main() -> None:
    """The ``malleparsl`` entry point: a missing extra is one ``error:`` line, not a traceback."""
    try:
        app()
    except ModuleNotFoundError as exc:
        command = " ".join(a for a in sys.argv[1:3] if not a.startswith("-"))
        missing = as_missing_extra(exc, f"malleparsl {command}".strip())
        if missing is None:
            raise
        print(f"error: {missing}", file=sys.stderr)
        raise SystemExit(1) from None


if __name__ == "__main__":
    main()
