"""The contract between the executor (which places ranks on nodes) and the apps layer (which
trains).

The executor knows nothing about torch models and the apps layer knows nothing about Parsl
blocks: a malleable job is a picklable *entry* callable plus arguments. For every segment (one
run of the job at one size) the executor runs ``entry(rank_info, *args, **kwargs)`` once per
node, pinned to that node, and reads back a :class:`SegmentOutcome` from each rank.

Coordination between the driver (in the executor's process) and the ranks goes through one
``torch.distributed.TCPStore`` that the executor serves; the keys are below. The apps layer uses
the same store (under a per-segment prefix) to form its process group.
"""

from __future__ import annotations

import importlib
import os
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

NodeId = str
DEFAULT_KEY_PREFIX = "malleparsl"


@dataclass(frozen=True)
class RankInfo:
    """Everything one rank needs to join its segment's process group and find its checkpoint."""

    job_id: str
    segment: int  # 0, 1, 2, ... : one more at every (re)launch of the job
    rank: int
    world_size: int
    node: NodeId
    nodes: tuple[NodeId, ...]  # this segment's nodes in rank order
    store_host: str
    store_port: int
    ckpt_dir: str  # shared directory for this job's checkpoints
    options: dict[str, Any] = field(default_factory=dict)  # the job's malleable options
    key_prefix: str = DEFAULT_KEY_PREFIX  # the executor's secret store namespace
    local_rank: int = 0  # this rank's index among the ranks on its node
    local_world_size: int = 1  # ranks on this node
    env: dict[str, str] = field(default_factory=dict)  # socket interface, device binding
    backend: str = "gloo"  # the collective backend the site config chose for this device

    @property
    def store_prefix(self) -> str:
        """Prefix for the process group of this segment (a fresh group per segment)."""
        return f"{self.key_prefix}/{self.job_id}/seg{self.segment}/pg"

    @property
    def stop_key(self) -> str:
        return stop_key(self.job_id, self.key_prefix)

    @property
    def progress_key(self) -> str:
        return progress_key(self.job_id, self.segment, self.key_prefix)


class GroupBrokenError(RuntimeError):
    """A collective failed because a peer rank died, hung or left (its node was lost or failed).

    Ranks raise it (``from`` the backend's error) so the driver can tell by type that the rank
    failed as a consequence of another one, not because of the user's code: gloo itself raises
    a plain ``RuntimeError`` whose text is no contract. The apps layer re-exports it.
    """


def stop_key(job_id: str, prefix: str = DEFAULT_KEY_PREFIX) -> str:
    """Driver sets this to the segment number (ASCII) that must stop at the next step boundary."""
    return f"{prefix}/{job_id}/stop"


def progress_key(job_id: str, segment: int, prefix: str = DEFAULT_KEY_PREFIX) -> str:
    """Rank 0 writes JSON ``{"step", "samples", "samples_per_s", "time"}`` here now and then."""
    return f"{prefix}/{job_id}/seg{segment}/progress"


def apply_rank_env(info: RankInfo) -> None:
    """Export the rank's environment (socket interface, device binding) in this worker before
    any socket or device is opened; every rank sets all of its keys, so a warm worker that ran
    another local rank before is rebound."""
    os.environ.update(info.env)


def new_key_prefix() -> str:
    """An unguessable store namespace for one executor: only its own rank tasks learn it.

    The store has no authentication; a client that reaches its port but does not know the
    prefix cannot name a job's keys (192 random bits), though it can still add keys of its own.
    """
    return f"{DEFAULT_KEY_PREFIX}/{secrets.token_urlsafe(24)}"


@dataclass
class SegmentOutcome:
    """What one rank returns when its segment ends without an exception.

    ``finished``: training completed; rank 0 carries ``result``. ``stopped``: a stop was
    requested, a checkpoint was written at ``step``, and the job should be relaunched.
    """

    status: Literal["finished", "stopped"]
    rank: int
    step: int
    samples: float
    samples_per_s: float | None = None
    result: Any = None
    first_step_time: float | None = None  # wall time (time.time()) of this segment's first step
    ckpt_save_s: float = 0.0  # seconds spent writing the stop checkpoint (excluded from rescale pauses)
    ckpt_load_s: float = 0.0  # seconds spent reading the checkpoint at segment start (excluded too)


# The apps layer sits above the executors; name its entry class by string, not by import.
ENTRY_FACTORY = "malleparsl.apps.entry:RankEntry"


def as_entry(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` as a per-rank entry: a plain training function ``fn(ctx, ...)`` (e.g. from a
    plain ``@python_app`` given a ``{"malleable": ...}`` resource specification, or a Globus
    Compute task) is wrapped in the apps layer's ``RankEntry``; an entry is returned as is.

    Any other callable taking ``(rank_info, ...)`` may opt out by setting
    ``fn.malleparsl_entry = True`` (the synthetic test entries do).
    """
    if getattr(fn, "malleparsl_entry", False):
        return fn
    mod_name, cls_name = ENTRY_FACTORY.split(":")
    entry_cls = getattr(importlib.import_module(mod_name), cls_name)
    # Parsl monitoring hands the executor its functools.wraps wrapper around the app's
    # function: an entry inside that wrapper is still an entry (the wrapper pops its own
    # keyword arguments and calls it per rank), so it must not be wrapped a second time.
    inner: Any = fn
    for _ in range(10):
        if inner is None:
            break
        if isinstance(inner, entry_cls) or getattr(inner, "malleparsl_entry", False):
            return fn
        inner = getattr(inner, "__wrapped__", None)
    return entry_cls(fn)
