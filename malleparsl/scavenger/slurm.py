"""Scavenge idle Slurm nodes: discover them, estimate how long they stay idle, notice preemption.

:class:`SlurmScavenger` is a :class:`~malleparsl.scavenger.base.NodeSource` (the shared poll
loop is :class:`~malleparsl.scavenger.pilots.PilotScavenger`). Slurm answers its questions:

- idle now: ``sinfo -N -p <partition>`` nodes in state ``idle`` or ``planned`` (idle, but kept
  by the backfill scheduler for a pending job's future start);
- until when: the earliest planned start of a pending job naming the node (``squeue --start``'s
  SchedNodes, ``%Y``) or of a reservation (``scontrol show reservation``); times are asked in
  epoch seconds (``SLURM_TIME_FORMAT=%s``) and returned on the caller's clock;
- pilot states: ``squeue -t all -j <ids>`` (``PREEMPTED``, ``CANCELLED``, ... = ended;
  ``PENDING``/``REQUEUED`` = waiting; a purged id = vanished).

Query Slurm at most every ``query_period_s`` (1 s on the local Slurm; 30-60 s is polite at a
facility, where the pilots' SIGTERM marker files on the shared filesystem still report a
preemption within one poll).

>>> prov = ScavengingSlurmProvider(partition="scavenger", node_cap=4)   # doctest: +SKIP
>>> src = SlurmScavenger(provider=prov)                                 # doctest: +SKIP
>>> src.poll(now_s=0.0)                                                 # doctest: +SKIP
[NodeEvent(kind='idle', node='n01', time_s=0.0, end_s=None), ...]
"""

from __future__ import annotations

import logging

from malleparsl.errors import SpecError
from malleparsl.scavenger.pilots import PilotScavenger, PilotState
from malleparsl.scavenger.shell import check
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

_EPOCH = ["env", "SLURM_TIME_FORMAT=%s"]  # times as epoch seconds; no shell


class SlurmScavenger(PilotScavenger):
    """Idle-node events from a Slurm cluster, with pilots through ``provider``.

    Parameters
    ----------
    provider : ScavengingSlurmProvider
        Submits the pilots; its partition is where idle nodes are looked for.
    node_cap : int, optional
        Most nodes announced or held at once (default and upper bound: the provider's cap).
    query_period_s : float
        Least time between two rounds of scheduler queries.
    claim_timeout_s : float
        An announced node without a running pilot after this long is reported taken.
    cooldown_s : float
        A node we released is not announced again for this long.
    min_idle_s : float
        Skip nodes the scheduler will want back sooner than this.
    demand : callable, optional
        ``demand() -> int | None``: nodes the jobs could use; hold no more than that (None or
        no callable: up to the cap). Surplus nodes not in ``in_use()`` are returned (reported
        ``taken``, so the executor releases their pilots) after ``return_after_s``.
    in_use : callable, optional
        ``in_use() -> set of nodes`` that jobs hold now; those are never returned.
    """

    provider: ScavengingSlurmProvider

    def __init__(self, *, provider: ScavengingSlurmProvider, **options) -> None:
        if not isinstance(provider, ScavengingSlurmProvider):
            raise SpecError(
                f"provider must be a ScavengingSlurmProvider, got {type(provider).__name__}; "
                "build one with site_configs.slurm_scavenger or ScavengingSlurmProvider(...)"
            )
        super().__init__(provider=provider, **options)
        self.partition = provider.partition
        self._planned_state: set[str] = set()

    def idle_now(self) -> list[str]:
        part = ["-p", self.partition] if self.partition else []
        states = parse_sinfo_nodes(check(self.run, ["sinfo", "-h", "-N", *part, "-o", "%N|%T"]))
        self._planned_state = {n for n, st in states.items() if st == "planned"}
        return idle_nodes(states)

    def idle_end_estimates(self, nodes: list[str], wall: float) -> dict[str, float]:
        start = self.run([*_EPOCH, "squeue", "-h", "-t", "PD", "--start", "-o", "%i|%S|%Y"])
        resv = self.run([*_EPOCH, "scontrol", "show", "reservation", "-o"])
        planned = parse_squeue_start(start.stdout) if start.returncode == 0 else []
        reservations = parse_reservations(resv.stdout) if resv.returncode == 0 else []
        ends = idle_ends(nodes, planned, reservations, now=wall)
        # a node Slurm shows "planned" is kept for a pending job; if that job's start cannot
        # be found (e.g. it is about to start on nodes it is preempting), treat it as needed now
        for n in self._planned_state & set(nodes):
            ends.setdefault(n, wall)
        return ends

    def pilot_states(self, job_ids: list[str]) -> dict[str, PilotState] | None:
        # unknown (purged) ids make squeue complain, but it still lists the others
        res = self.run(["squeue", "-h", "-t", "all", "-j", ",".join(job_ids), "-o", "%i|%T|%N"])
        if res.returncode != 0 and "Invalid job id" not in res.stderr:
            return None
        out: dict[str, PilotState] = {}
        for job_id, (state, _nodes) in parse_job_states(res.stdout).items():
            if state in LIVE_STATES:
                out[job_id] = "live"
            elif state in WAITING_STATES:
                out[job_id] = "waiting"
            else:
                if state not in ENDED_STATES:
                    log.warning("pilot %s in unexpected state %s; treating it as lost",
                                job_id, state)
                out[job_id] = "ended"
        return out
