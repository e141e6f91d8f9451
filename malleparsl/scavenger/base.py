"""Sources of idle-node events: where the nodes come from.

A :class:`NodeSource` tells the live system (or a test) which nodes have become idle — with the
time they will be needed again, where the scheduler knows it — and which have been taken back.
Trace replay, Slurm and PBS Pro implement it; the executor turns its events into pilot jobs and
into :class:`~malleparsl.controller.Controller` events.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Literal

from malleparsl.model import NodeId


@dataclass(frozen=True)
class NodeEvent:
    """``idle``: ``node`` may be used until ``end_s`` (None = unknown). ``taken``: it is gone."""

    kind: Literal["idle", "taken"]
    node: NodeId
    time_s: float
    end_s: float | None = None


class NodeSource(ABC):
    """Polled by the live controller loop; returns the events since the last poll."""

    @abstractmethod
    def poll(self, now_s: float) -> list[NodeEvent]:
        """Events that happened up to ``now_s`` (seconds on the caller's clock)."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release anything the source holds (scheduler jobs, files)."""
