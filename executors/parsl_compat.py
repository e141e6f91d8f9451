"""Every private Parsl name malleparsl relies on, in one place.

Parsl's public API does not let an executor start, stop or name single blocks, nor pin a task
to one manager; malleparsl reaches into a few of its internals to do so. They are listed in
:data:`REQUIRED` (what, where, why) and the executor side goes through the small functions
below, so a Parsl release that renames one breaks here, loudly, and
``tests/executors/test_parsl_compat.py`` names the missing piece. The interchange subclass
(:mod:`malleparsl.executors.interchange`) overrides interchange methods and reads its state by
the names listed here too. ``pyproject.toml`` caps Parsl at the newest version checked.

>>> missing_names() == []                                   # doctest: +SKIP
True
"""

from __future__ import annotations

import importlib
import re
from dataclasses import dataclass
from typing import Any

TESTED_PARSL = "2026.10.26"


@dataclass(frozen=True)
class PrivateName:
    """One name we depend on: ``owner`` is ``module:Class`` or a module; ``kind`` says how it
    is checked (``attr``: on the class or module; ``instance``: set by the class's constructor,
    checked on a constructed executor; ``method``: a callable on the class; ``source``: assigned
    as ``self.NAME = ...`` somewhere in the class, e.g. in ``start()``)."""

    owner: str
    name: str
    kind: str
    why: str


REQUIRED: tuple[PrivateName, ...] = (
    # BlockProviderExecutor / HTEX: blocks started and stopped by name (executors/executor.py)
    PrivateName("parsl.executors.high_throughput.executor:HighThroughputExecutor", "_launch_block",
                "method", "start one block (one node) by id"),
    PrivateName("parsl.executors.high_throughput.executor:HighThroughputExecutor",
                "_get_launch_command", "method", "the pilot command for a provider's submit_to_node"),
    PrivateName("parsl.executors.high_throughput.executor:HighThroughputExecutor",
                "_block_id_counter", "instance", "block ids shared with Parsl's own scaling"),
    PrivateName("parsl.executors.high_throughput.executor:HighThroughputExecutor", "_status",
                "instance", "block states polled from the provider"),
    PrivateName("parsl.executors.high_throughput.executor:HighThroughputExecutor",
                "_simulated_status", "instance", "block states we set ourselves (failed, scaled in)"),
    PrivateName("parsl.executors.high_throughput.executor:HighThroughputExecutor",
                "blocks_to_job_id", "instance", "block id -> provider job id"),
    PrivateName("parsl.executors.high_throughput.executor:HighThroughputExecutor",
                "job_ids_to_block", "instance", "provider job id -> block id"),
    PrivateName("parsl.executors.high_throughput.executor:HighThroughputExecutor", "outgoing_q",
                "source", "the task queue to the interchange (control messages, pinned tasks)"),
    PrivateName("parsl.executors.high_throughput.executor:HighThroughputExecutor",
                "submit_payload", "method", "submit a packed task with our resource spec"),
    PrivateName("parsl.jobs.error_handlers", "_get_error", "attr",
                "the error text of failed blocks (executors/nodes.py)"),
    # Interchange internals used by AffinityInterchange (executors/interchange.py)
    PrivateName("parsl.executors.high_throughput.interchange:Interchange", "process_task_incoming",
                "method", "overridden: tasks carrying a node affinity are queued per block"),
    PrivateName("parsl.executors.high_throughput.interchange:Interchange", "process_tasks_to_send",
                "method", "overridden: pinned tasks go to their block's manager"),
    PrivateName("parsl.executors.high_throughput.interchange:Interchange", "expire_bad_managers",
                "method", "extended: pinned tasks of a lost block fail"),
    PrivateName("parsl.executors.high_throughput.interchange:Interchange", "_ready_managers",
                "source", "manager id -> record with block_id, tasks, hostname"),
    PrivateName("parsl.executors.high_throughput.interchange", "PKL_SHUTDOWN_CODE", "attr",
                "tells a dropped block's manager to exit"),
)


def _resolve(owner: str) -> Any:
    mod_name, _, cls_name = owner.partition(":")
    mod = importlib.import_module(mod_name)
    return getattr(mod, cls_name) if cls_name else mod


def missing_names() -> list[str]:
    """Human-readable descriptions of every required name the installed Parsl lacks."""
    import inspect

    out: list[str] = []
    executor = None
    for p in REQUIRED:
        try:
            owner = _resolve(p.owner)
        except (ImportError, AttributeError) as exc:
            out.append(f"{p.owner} ({p.why}): {exc}")
            continue
        if p.kind in ("attr", "method"):
            ok = hasattr(owner, p.name) and (p.kind == "attr" or callable(getattr(owner, p.name)))
        elif p.kind == "instance":
            if executor is None:
                from parsl.executors import HighThroughputExecutor

                executor = HighThroughputExecutor(label="compat-check")
            ok = hasattr(executor, p.name)
        else:  # "source": an attribute set outside __init__ (in start()): read the class
            assigned = re.compile(rf"self\.{re.escape(p.name)}\s*[:=]")
            ok = bool(assigned.search(inspect.getsource(owner))) or hasattr(owner, p.name)
        if not ok:
            out.append(f"{p.owner}.{p.name} ({p.kind}; used to {p.why})")
    return out


# ---- the executor side's only ways in -------------------------------------------------------
def new_block_id(executor: Any) -> str:
    return str(executor._block_id_counter.get_id())


def launch_block(executor: Any, block_id: str) -> Any:
    """Start one block through the provider; returns the provider's job id."""
    return executor._launch_block(block_id)


def launch_command(executor: Any, block_id: str) -> str:
    return executor._get_launch_command(block_id)


def set_block_status(executor: Any, block_id: str, status: Any, *, simulated: bool = True) -> None:
    """Record a block's state; ``simulated`` also keeps it against the next provider poll."""
    executor._status[block_id] = status
    if simulated:
        executor._simulated_status[block_id] = status


def block_status(executor: Any) -> dict[str, Any]:
    """Block id -> ``JobStatus`` as last polled (a copy)."""
    return dict(executor._status)


def block_error(status: dict[str, Any]) -> Exception:
    """Parsl's summary error for failed blocks."""
    from parsl.jobs.error_handlers import _get_error

    return _get_error(status)
