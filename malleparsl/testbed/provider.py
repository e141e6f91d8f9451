"""``NetnsProvider``: Parsl's ``LocalProvider`` that starts each node's pilot on its own host.

:class:`~malleparsl.executors.MalleableExecutor` asks a provider with ``submit_to_node`` for a
pilot on a named node; this one wraps the launch command in ``nsenter --net=...`` of the
emulated host with that name, so the pilot (manager and workers) lives in that host's network
namespace and reaches the interchange over the bridge, as a compute node reaches a login node.
A node name that is not a host gets the host with the fewest pilots (sticky per name).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from parsl.providers import LocalProvider

from malleparsl.testbed.netns import NetnsTestbed


class NetnsProvider(LocalProvider):
    """A ``LocalProvider`` whose node pilots run inside a :class:`NetnsTestbed`'s hosts."""

    def __init__(self, testbed: NetnsTestbed, **kwargs: Any) -> None:
        kwargs.setdefault("init_blocks", 0)
        kwargs.setdefault("min_blocks", 0)
        kwargs.setdefault("max_blocks", 10_000)
        super().__init__(**kwargs)
        self.testbed = testbed
        self.placed: dict[str, str] = {}  # node name -> host name
        self._live: dict[Any, str] = {}  # job id -> host of a pilot not cancelled

    def host_for(self, node: str) -> str:
        names = {h.name for h in self.testbed.hosts}
        if node in names:
            return node
        if node not in self.placed:
            load = Counter(self._live.values())
            self.placed[node] = min(sorted(names), key=lambda h: load[h])
        return self.placed[node]

    def submit_to_node(self, command: str, tasks_per_node: int, job_name: str, *,
                       node: str) -> Any:
        """Start ``command`` on the host of ``node``; returns the provider's job id."""
        host = self.host_for(node)
        job_id = self.submit(self.testbed.wrap(host, command), tasks_per_node, job_name)
        self._live[job_id] = host
        return job_id

    def cancel(self, job_ids: list[Any]) -> list[bool]:
        for j in job_ids:
            self._live.pop(j, None)
        return super().cancel(job_ids)
