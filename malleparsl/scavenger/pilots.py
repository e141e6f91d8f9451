"""What every batch-scheduler scavenger shares: pinned one-node pilots and the poll loop.

Slurm and PBS Pro differ only in how they are asked (which nodes are idle, when they will be
needed, what state a pilot is in). The decisions are the same and live here:

- :class:`PinnedPilots`, a mixin for a Parsl provider: every block holds one node, pinned to
  the node named by :meth:`~PinnedPilots.pin` (FIFO), at most ``node_cap`` pilots at once, a
  SIGTERM marker file per pilot, and every shell call through one ``run`` function;
- :class:`PilotScavenger`, a :class:`~malleparsl.scavenger.base.NodeSource`: announces idle
  nodes (longest expected idle first, up to the cap) and pins each one, so the executor's
  ``add_node(name)`` -> ``provider.submit`` lands on ``name``; reports ``taken`` when a pilot
  ends without our asking (preempted, killed, requeued, vanished) or when an announced node gets
  no running pilot within ``claim_timeout_s``. Pilots we cancel end silently and their nodes
  rest for ``cooldown_s`` before being announced again.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shlex
import threading
import time
from abc import abstractmethod
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from malleparsl.errors import MalleparslError, SchedulerCommandError, SpecError
from malleparsl.scavenger.base import NodeEvent, NodeSource
from malleparsl.scavenger.shell import Runner

log = logging.getLogger(__name__)

PilotState = Literal["live", "waiting", "ended"]


class NodeCapError(MalleparslError, RuntimeError):
    """A pilot was requested while ``node_cap`` pilots are already held."""


class PinnedPilots:
    """Mixin for a Parsl ``ClusterProvider``: pinned one-node pilots under a cap.

    The host class calls :meth:`_init_pilots` in its constructor and wraps its ``submit`` with
    :meth:`_pinned_submit`, passing a function that applies the pin to the job script.
    """

    run: Runner
    node_cap: int
    signal_dir: str | None

    def _init_pilots(self) -> None:
        self.pilots: dict[str, str] = {}  # job id -> node, in submission order
        self.released: set[str] = set()  # job ids we cancelled ourselves
        self.ended: set[str] = set()  # job ids the scavenger saw end (before Parsl's status)
        self._pins: deque[str] = deque()
        self._pin_lock = threading.Lock()

    def execute_wait(self, cmd: str, timeout: int | None = None) -> tuple[int, str, str]:
        """Parsl's shell hook, routed through ``run`` (tests pass a fake) as an argument list.

        Parsl builds these lines itself (``sbatch <script>``, ``squeue --job '<ids>'``,
        ``scancel <ids>``); they are split like a shell would but never run by one."""
        res = self.run(shlex.split(cmd))
        return res.returncode, res.stdout, res.stderr

    def pin(self, node: str) -> None:
        """The next submitted pilot (FIFO) goes to ``node``."""
        with self._pin_lock:
            self._pins.append(node)

    def unpin(self, node: str) -> bool:
        """Forget a pin not used yet (the node was taken before its pilot was submitted)."""
        with self._pin_lock:
            try:
                self._pins.remove(node)
                return True
            except ValueError:
                return False

    def active_pilots(self) -> dict[str, str]:
        """``{job id: node}`` of pilots not known to have ended."""
        res = self.resources  # type: ignore[attr-defined]
        return {j: n for j, n in self.pilots.items()
                if j in res and not res[j]["status"].terminal
                and j not in self.released and j not in self.ended}

    def node_of(self, job_id: str) -> str | None:
        return self.pilots.get(job_id)

    def preempt_dir(self) -> str | None:
        """Where pilots leave ``<job id>.term`` when they get SIGTERM (a shared directory)."""
        if self.signal_dir is not None:
            return self.signal_dir
        sd = getattr(self, "script_dir", None)
        return os.path.join(sd, "preempt") if sd else None

    def trap_line(self, job_id_var: str) -> str:
        d = self.preempt_dir()
        if d is None:
            return ""
        # the folder is quoted once into a variable; the trap expands it when the signal comes
        return (f"_malleparsl_sig={shlex.quote(d)}; mkdir -p \"$_malleparsl_sig\"; "
                f"trap 'touch \"$_malleparsl_sig/${job_id_var}.term\"' TERM\n")

    def _pinned_submit(self, submit: Callable[[str], str], node: str | None = None) -> str:
        """Check the cap, call ``submit(node)``, record the pilot. ``node`` None = the next pin
        (FIFO); a named node also drops its pending pin, if any."""
        with self._pin_lock:
            held = len(self.active_pilots())
            if held >= self.node_cap:
                raise NodeCapError(f"{held} pilots already held, node_cap={self.node_cap}; "
                                   "release a node first or raise node_cap")
            if node is not None:
                with contextlib.suppress(ValueError):
                    self._pins.remove(node)
            elif self._pins:
                node = self._pins.popleft()
            else:
                raise SpecError(
                    "no node to pin this pilot to: use submit_to_node(..., node=name), or "
                    "provider.pin(node) first (the scavenger pins every node it announces)"
                )
            job_id = submit(node)
            self.pilots[job_id] = node
        log.info("pilot %s submitted on node %s", job_id, node)
        return job_id

    def submit_to_node(
        self, command: str, tasks_per_node: int, job_name: str = "parsl.pilot", *, node: str
    ) -> str:
        """Submit one pilot pinned to ``node`` (what ``MalleableExecutor.add_node`` calls)."""
        return self._submit_pilot(command, tasks_per_node, job_name, node)

    def submit(self, command: str, tasks_per_node: int, job_name: str = "parsl.pilot") -> str:
        """Submit one pilot on the next pinned node (Parsl's own block launches)."""
        return self._submit_pilot(command, tasks_per_node, job_name, None)

    def _submit_pilot(
        self, command: str, tasks_per_node: int, job_name: str, node: str | None
    ) -> str:
        raise NotImplementedError

    def _note_cancel(self, job_ids: list[str]) -> None:
        self.released.update(job_ids)


@dataclass
class _Held:
    """A node we announced: waiting for its pilot, or held by one."""

    node: str
    announced_wall: float
    job_id: str | None = None
    running_wall: float | None = None


class PilotScavenger(NodeSource):
    """The scheduler-independent poll loop; subclasses answer three questions."""

    def __init__(
        self,
        *,
        provider: PinnedPilots,
        node_cap: int | None = None,
        query_period_s: float = 1.0,
        claim_timeout_s: float = 15.0,
        cooldown_s: float = 30.0,
        retake_after_s: float = 10.0,
        min_idle_s: float = 0.0,
        return_after_s: float = 30.0,
        demand: Callable[[], int | None] | None = None,
        in_use: Callable[[], set[str]] | None = None,
        run: Runner | None = None,
        wall_clock: Callable[[], float] | None = None,
    ) -> None:
        for name, v in (("query_period_s", query_period_s), ("claim_timeout_s", claim_timeout_s),
                        ("cooldown_s", cooldown_s), ("retake_after_s", retake_after_s),
                        ("min_idle_s", min_idle_s), ("return_after_s", return_after_s)):
            if v < 0:
                raise SpecError(f"{name} must be >= 0 seconds, got {v!r}")
        self.provider = provider
        self.node_cap = provider.node_cap if node_cap is None else min(node_cap, provider.node_cap)
        if self.node_cap < 1:
            raise SpecError(f"node_cap must be >= 1, got {node_cap!r}")
        self.query_period_s = query_period_s
        self.claim_timeout_s = claim_timeout_s
        self.cooldown_s = cooldown_s
        self.retake_after_s = retake_after_s
        self.min_idle_s = min_idle_s
        self.return_after_s = return_after_s
        self.demand = demand
        self.in_use = in_use
        self._surplus_since: float | None = None
        self.run = run or provider.run
        self.wall_clock = wall_clock or time.time
        self.held: dict[str, _Held] = {}
        self.cooldown_until: dict[str, float] = {}
        self._last_query = -float("inf")
        self._seen_markers: set[str] = set()
        self._claimed: set[str] = set(provider.pilots)  # pilots older than us are not ours

    # ---- what a scheduler backend answers -------------------------------------------------
    @abstractmethod
    def idle_now(self) -> list[str]:
        """Nodes free now where a pilot could run (raise SchedulerCommandError on failure)."""

    @abstractmethod
    def idle_end_estimates(self, nodes: list[str], wall: float) -> dict[str, float]:
        """``{node: epoch s}`` when the scheduler will want each node (known ones only)."""

    @abstractmethod
    def pilot_states(self, job_ids: list[str]) -> dict[str, PilotState] | None:
        """State of each pilot; a missing id means it vanished; None = could not ask."""

    # ---- NodeSource ---------------------------------------------------------------------
    def poll(self, now_s: float) -> list[NodeEvent]:
        wall = self.wall_clock()
        events = self._check_markers(now_s)
        if wall - self._last_query >= self.query_period_s:
            self._last_query = wall
            try:
                events += self._check_pilots(now_s, wall)
                want = self._wanted()
                events += self._return_surplus(now_s, wall, want)
                events += self._discover(now_s, wall, want)
            except SchedulerCommandError as exc:  # a busy scheduler must not stop training
                log.warning("scheduler query failed; will retry next poll: %s", exc)
        return events

    def close(self) -> None:
        """Cancel every pilot still held (the executor normally does it at shutdown)."""
        live = list(self.provider.active_pilots())
        if live:
            self.provider.cancel(live)  # type: ignore[attr-defined]
        for h in self.held.values():
            self.provider.unpin(h.node)
        self.held.clear()

    # ---- preemption ---------------------------------------------------------------------
    def _check_markers(self, now_s: float) -> list[NodeEvent]:
        """SIGTERM marker files: a preempted pilot says so before the scheduler is asked."""
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
            h = self.held.get(node) if node is not None else None
            if h is not None and h.job_id in (job_id, None):
                self._lost(node, job_id, self.wall_clock())
                log.info("pilot %s on %s got SIGTERM: node taken", job_id, node)
                events.append(NodeEvent("taken", node, now_s))
        return events

    def _check_pilots(self, now_s: float, wall: float) -> list[NodeEvent]:
        """Match held nodes with their pilots; report nodes lost without our asking."""
        for job_id, node in self.provider.pilots.items():
            h = self.held.get(node)
            if h is not None and h.job_id is None and job_id not in self._claimed:
                h.job_id = job_id
                self._claimed.add(job_id)
        ids = [h.job_id for h in self.held.values()
               if h.job_id is not None and h.job_id not in self.provider.released]
        states = self.pilot_states(ids) if ids else {}
        if states is None:
            return []  # decide nothing on missing data
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
            state = states.get(h.job_id)
            if state == "live":
                h.running_wall = h.running_wall or wall
                continue
            if state == "waiting":
                if h.running_wall is None and wall - h.announced_wall <= self.claim_timeout_s:
                    continue  # still queued: give it time
                # queued too long (someone else got the node) or requeued after preemption
                self.provider.cancel([h.job_id])  # type: ignore[attr-defined]
            log.info("pilot %s on %s is %s: node taken", h.job_id, node, state or "gone")
            self._lost(node, h.job_id, wall)
            events.append(NodeEvent("taken", node, now_s))
        return events

    def _lost(self, node: str, job_id: str, wall: float) -> None:
        """The node's pilot ended without our asking: forget it, and let the executor drop
        its record before the node may be announced again (``retake_after_s``, default 10 s =
        the control loop's default ``release_grace_s``)."""
        self.provider.ended.add(job_id)
        del self.held[node]
        self.cooldown_until[node] = wall + self.retake_after_s

    # ---- discovery ----------------------------------------------------------------------
    def _wanted(self) -> int:
        """How many nodes to hold: the cap, or fewer when ``demand()`` says the jobs need fewer."""
        want = self.demand() if self.demand is not None else None
        return self.node_cap if want is None else max(0, min(self.node_cap, int(want)))

    def _return_surplus(self, now_s: float, wall: float, want: int) -> list[NodeEvent]:
        """Give back nodes no job needs: after ``return_after_s`` of surplus, report the
        unused ones ``taken`` so the executor releases their pilots (queued pilots first)."""
        surplus = len(self.held) - want
        if surplus <= 0:
            self._surplus_since = None
            return []
        if self._surplus_since is None:
            self._surplus_since = wall
        if wall - self._surplus_since < self.return_after_s:
            return []
        used = self.in_use() if self.in_use is not None else set()
        spare = sorted((h for h in self.held.values() if h.node not in used),
                       key=lambda h: (h.running_wall is not None, -h.announced_wall))
        events = []
        for h in spare[:surplus]:
            log.info("returning node %s: the jobs need %d nodes, %d held", h.node, want,
                     len(self.held))
            self.provider.unpin(h.node)
            del self.held[h.node]
            self.cooldown_until[h.node] = wall + self.cooldown_s
            events.append(NodeEvent("taken", h.node, now_s))
        self._surplus_since = None
        return events

    def _discover(self, now_s: float, wall: float, want: int | None = None) -> list[NodeEvent]:
        cap = self.node_cap if want is None else want
        room = cap - len(self.held)
        if room <= 0:
            return []
        fresh = [n for n in self.idle_now()
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
