"""malleparsl.executors: the Parsl executor that grows and shrinks training jobs.

Names are imported lazily so that ``import malleparsl.executors.bench`` (the CLI) does not pay
for Parsl's import until a command runs.
"""

from __future__ import annotations

from typing import Any

__all__ = ["ControlOptions", "MalleableExecutor"]


def __getattr__(name: str) -> Any:
    if name == "MalleableExecutor":
        from malleparsl.executors.executor import MalleableExecutor

        return MalleableExecutor
    if name == "ControlOptions":
        from malleparsl.executors.options import ControlOptions

        return ControlOptions
    raise AttributeError(f"module 'malleparsl.executors' has no attribute {name!r}")
