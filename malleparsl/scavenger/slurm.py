"""Scavenge idle Slurm nodes: discover them, estimate how long they stay idle, notice preemption.

:class:`SlurmScavenger` is a :class:`~malleparsl.scavenger.base.NodeSource`. Every
:meth:`~SlurmScavenger.poll` it

1. announces nodes that ``sinfo`` shows plainly ``idle`` in the pilots' partition as ``idle``
   events, up to ``node_cap`` nodes held or announced at once. Each event carries ``end_s``, the
   time the scheduler will want the node back: the earliest planned start of a pending job
   naming it (``squeue --start``'s SchedNodes) or of a reservation (``scontrol show
   reservation``), converted to the caller's clock; None when nothing is planned. It also pins
   the node on the provider, so the executor's pilot for that event lands on it;
2. reports ``taken`` when a node's pilot ended without us asking: preempted (state
   ``PREEMPTED``, or the SIGTERM marker file the pilot leaves), cancelled by an admin, failed,
   timed out, requeued, or vanished from ``squeue``; or when an announced node got no running
   pilot in time (someone else took it first).

Pilots we cancel ourselves (the executor released the node) end silently, and their nodes are
not announced again for ``cooldown_s``. The scheduler is queried at most every ``query_period_s``
(1 s on the local Slurm; 30-60 s is polite at a facility, where the SIGTERM markers on the
shared filesystem still give preemption notice within a poll).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass

from malleparsl.errors import SchedulerCommandError, SpecError
from malleparsl.scavenger.base import NodeEvent, NodeSource
from malleparsl.scavenger.shell import Runner, check, default_runner
from malleparsl.scavenger.slurm_parse import (
    ENDED_STATES,
    LIVE_STATES,
    WAITING_STATES,
    idle_ends,
    idle_nodes,
    parse_job_states,
    parse_reservations,
    parse_sinfo_nodes,
    parse_squeue_start,
)
from malleparsl.scavenger.slurm_provider import ScavengingSlurmProvider

log = logging.getLogger(__name__)


@dataclass
class _Held:
    """A node we announced: waiting for its pilot, or held by one."""

    node: str
    announced_wall: float
    job_id: str | None = None
    running_wall: float | None = None


class SlurmScavenger(NodeSource):
    """Idle-node events from a Slurm cluster, with pilots through ``provider``.

    >>> prov = ScavengingSlurmProvider(partition="scavenger", node_cap=4)   # doctest: +SKIP
    >>> src = SlurmScavenger(provider=prov)                                 # doctest: +SKIP
    >>> src.poll(now_s=0.0)                                                 # doctest: +SKIP
    [NodeEvent(kind='idle', node='n01', time_s=0.0, end_s=None), ...]
    """

    def __init__(
        self,
        *,
        provider: ScavengingSlurmProvider,
        node_cap: int | None = None,
        query_period_s: float = 1.0,
        claim_timeout_s: float = 15.0,
        cooldown_s: float = 30.0,
        min_idle_s: float = 0.0,
        run: Runner | None = None,
        wall_clock: Callable[[], float] | None = None,
    ) -> None:
        if not isinstance(provider, ScavengingSlurmProvider):
            raise SpecError(
                f"provider must be a ScavengingSlurmProvider, got {type(provider).__name__}; "
                "build one with site_configs.slurm_scavenger or ScavengingSlurmProvider(...)"
            )
        for name, v in (("query_period_s", query_period_s), ("claim_timeout_s", claim_timeout_s),
                        ("cooldown_s", cooldown_s), ("min_idle_s", min_idle_s)):
            if v < 0:
                raise SpecError(f"{name} must be >= 0 seconds, got {v!r}")
        self.provider = provider
        self.node_cap = provider.node_cap if node_cap is None else min(node_cap, provider.node_cap)
        if self.node_cap < 1:
            raise SpecError(f"node_cap must be >= 1, got {node_cap!r}")
        self.partition = provider.partition
        self.query_period_s = query_period_s
        self.claim_timeout_s = claim_timeout_s
        self.cooldown_s = cooldown_s
        self.min_idle_s = min_idle_s
        self.run = run or provider.run or default_runner()
        self.wall_clock = wall_clock or time.time
        self.held: dict[str, _Held] = {}
        self.cooldown_until: dict[str, float] = {}
        self._last_query = -float("inf")
        self._seen_markers: set[str] = set()
        self._claimed: set[str] = set(provider.pilots)  # pilots older than us are not ours

    # ---- NodeSource ---------------------------------------------------------------------
    def poll(self, now_s: float) -> list[NodeEvent]:
        wall = self.wall_clock()
        events = self._check_markers(now_s)
        if wall - self._last_query >= self.query_period_s:
            self._last_query = wall
            try:
                events += self._check_pilots(now_s, wall)
                events += self._discover(now_s, wall)
            except SchedulerCommandError as exc:  # a busy scheduler must not stop training
                log.warning("Slurm query failed; will retry next poll: %s", exc)
        return events

    def close(self) -> None:
        """Cancel every pilot still held (the executor normally does it at shutdown)."""
        live = list(self.provider.active_pilots())
        if live:
            self.provider.cancel(live)
        for h in self.held.values():
            self.provider.unpin(h.node)
        self.held.clear()

    # ---- preemption ---------------------------------------------------------------------
    def _check_markers(self, now_s: float) -> list[NodeEvent]:
        """SIGTERM marker files: a preempted pilot says so before squeue is even asked."""
        d = self.provider.preempt_dir()
        if d is None or not os.path.isdir(d):
            return []
        events = []
        for fn in os.listdir(d):
            job_id = fn.removesuffix(".term")
            if fn in self._seen_markers or job_id in self.provider.released:
                continue
            self._seen_markers.add(fn)
            node = self.provider.node_of(job_id)
            if node is not None and self._drop(node, job_id):
                log.info("pilot %s on %s got SIGTERM: node taken", job_id, node)
                events.append(NodeEvent("taken", node, now_s))
        return events

    def _check_pilots(self, now_s: float, wall: float) -> list[NodeEvent]:
        """Match held nodes with their pilots' states; report nodes lost without our asking."""
        for job_id, node in self.provider.pilots.items():
            h = self.held.get(node)
            if h is not None and h.job_id is None and job_id not in self._claimed:
                h.job_id = job_id
                self._claimed.add(job_id)
        ids = [h.job_id for h in self.held.values() if h.job_id is not None]
        states = {}
        if ids:
            # unknown (purged) ids make squeue complain but it still lists the others
            res = self.run(f"squeue -h -t all -j {','.join(ids)} -o '%i|%T|%N'")
            if res.returncode != 0 and "Invalid job id" not in res.stderr:
                return []  # scheduler busy or down: decide nothing on missing data
            states = parse_job_states(res.stdout)
        events = []
        for node, h in list(self.held.items()):
            if h.job_id is None:
                if wall - h.announced_wall > self.claim_timeout_s:
                    log.info("no pilot for announced node %s after %.0f s", node,
                             self.claim_timeout_s)
                    self.provider.unpin(node)
                    del self.held[node]
                    events.append(NodeEvent("taken", node, now_s))
                continue
            if h.job_id in self.provider.released:
                del self.held[node]  # released on purpose: no event, and rest a while
                self.cooldown_until[node] = wall + self.cooldown_s
                continue
            state = states.get(h.job_id, ("GONE", []))[0]
            if state in LIVE_STATES:
                h.running_wall = h.running_wall or wall
                continue
            if state in WAITING_STATES and h.running_wall is None:
                if wall - h.announced_wall <= self.claim_timeout_s:
                    continue  # still queued, give it time
                self.provider.cancel([h.job_id])  # someone else got the node first
            elif state in WAITING_STATES:
                self.provider.cancel([h.job_id])  # requeued after preemption: drop it
            elif state not in ENDED_STATES and state != "GONE":
                log.warning("pilot %s in unexpected state %s; treating it as lost", h.job_id, state)
            log.info("pilot %s on %s is %s: node taken", h.job_id, node, state)
            self._drop(node, h.job_id)
            events.append(NodeEvent("taken", node, now_s))
        return events

    def _drop(self, node: str, job_id: str) -> bool:
        h = self.held.get(node)
        if h is None or h.job_id not in (job_id, None):
            return False
        del self.held[node]
        return True

    # ---- discovery ----------------------------------------------------------------------
    def _discover(self, now_s: float, wall: float) -> list[NodeEvent]:
        room = self.node_cap - len(self.held)
        if room <= 0:
            return []
        part = f" -p {self.partition}" if self.partition else ""
        states = parse_sinfo_nodes(check(self.run, f"sinfo -h -N{part} -o '%N|%T'"))
        fresh = [n for n in idle_nodes(states)
                 if n not in self.held and self.cooldown_until.get(n, 0.0) <= wall]
        if not fresh:
            return []
        ends = self.idle_end_estimates(fresh, wall)
        # longest expected idle first (unknown = longest), then by name for determinism
        fresh.sort(key=lambda n: (-(ends.get(n, float("inf"))), n))
        events = []
        for node in fresh:
            end_wall = ends.get(node)
            if end_wall is not None and end_wall - wall < max(self.min_idle_s, 1e-9):
                continue
            if len(events) >= room:
                break
            end_s = None if end_wall is None else now_s + (end_wall - wall)
            self.held[node] = _Held(node, wall)
            self.provider.pin(node)
            events.append(NodeEvent("idle", node, now_s, end_s))
        if events:
            log.info("announcing idle nodes %s", [e.node for e in events])
        return events

    def idle_end_estimates(self, nodes: list[str], wall: float) -> dict[str, float]:
        """``{node: epoch s}`` when the scheduler plans to use each node (known ones only)."""
        env = "SLURM_TIME_FORMAT=%s "
        start = self.run(f"{env}squeue -h -t PD --start -o '%i|%S|%Y'")
        resv = self.run(f"{env}scontrol show reservation -o")
        planned = parse_squeue_start(start.stdout) if start.returncode == 0 else []
        reservations = parse_reservations(resv.stdout) if resv.returncode == 0 else []
        return idle_ends(nodes, planned, reservations, now=wall)
