"""malleparsl.executors: the Parsl executor that grows and shrinks training jobs.

Names are imported lazily so that ``import malleparsl.executors.bench`` (the CLI) does not pay
for Parsl's import until a command runs.
"""

from __future__ import annotations

from typing import Any

__all__ = ["MalleableExecutor"]


def __getattr__(name: str) -> Any:
    if name == "MalleableExecutor":
        from malleparsl.executors.executor import MalleableExecutor

        return MalleableExecutor
    raise AttributeError(f"module 'malleparsl.executors' has no attribute {name!r}")
