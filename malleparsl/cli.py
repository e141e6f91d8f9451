"""The ``malleparsl`` command line.

Each command lives beside the code it drives (``malleparsl/sim/cli.py``, ...) as a plain
typer-compatible function; this module only wires them up. Command modules import heavy
libraries (torch, parsl) inside the function body, so ``malleparsl --help`` stays fast. The CLI
is the top of the stack, so it may name modules of any layer.
"""

from __future__ import annotations

import importlib
import logging

import typer

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
    ("bench", "jpa", "malleparsl.jpa.bench:bench_jpa"),
    ("bench", "plans", "malleparsl.apps.bench_plans:bench_plans"),
    ("bench", "slurm", "malleparsl.scavenger.bench:bench_slurm"),
]


@app.callback()
def _main(verbose: bool = typer.Option(False, "--verbose", "-v", help="Log at INFO level.")) -> None:
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING,
        format="%(asctime)s %(name)s %(levelname)s: %(message)s",
    )


def _register() -> None:
    groups = {None: app, "bench": bench_app}
    for group, name, target in COMMANDS:
        mod_name, func_name = target.split(":")
        try:
            mod = importlib.import_module(mod_name)
        except ModuleNotFoundError as exc:
            if exc.name and mod_name.startswith(exc.name):
                continue  # that part of malleparsl is not installed or not written yet
            raise
        groups[group].command(name)(getattr(mod, func_name))


_register()

if __name__ == "__main__":
    app()
