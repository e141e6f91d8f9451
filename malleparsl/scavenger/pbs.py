"""Scavenge idle PBS Pro nodes (Polaris, Aurora) with pilots in a preemptable queue.

The same decisions as on Slurm (:mod:`malleparsl.scavenger.pilots`), asked of PBS Pro:

- idle now: ``pbsnodes -av`` nodes in state ``free`` with no job on them;
- until when: the scheduler's ``estimated.start_time``/``estimated.exec_vnode`` of queued jobs
  (``qstat -f``; PBS computes them when ``strict_ordering``/``backfill_depth`` is on, as at
  ALCF) and reservations (``pbs_rstat -f``);
- pilot states: ``qstat -x -f <ids>``: ``R``/``B`` live, ``Q``/``W``/``H``/``T`` waiting,
  ``E``/``F``/``X`` ended; ``S``/``U`` (suspended by a preemption) lose the node as well: the
  pilot is deleted and the node reported taken, like a requeued Slurm pilot.

Pilots go through Parsl's ``PBSProProvider``, one node each, pinned with ``-l
select=1:ncpus=N:host=<node>``, only into a preemptable queue (``preemptable`` on Polaris)
unless ``allow_nonpreemptible=True``. PBS Pro is not packaged for Debian: the tests run these
parsers and decisions on recorded command output (tests/scavenger/fixtures/).
"""

from __future__ import annotations

import logging

from parsl.launchers.base import Launcher
from parsl.providers import PBSProProvider

from malleparsl.errors import SpecError
from malleparsl.scavenger import values
from malleparsl.scavenger.pbs_parse import (
    LIVE_JOB_STATES,
    SUSPENDED_JOB_STATES,
    WAITING_JOB_STATES,
    free_nodes,
    parse_pbs_rstat,
    parse_pbsnodes,
    parse_qstat_f,
    pbs_idle_ends,
)
from malleparsl.scavenger.pilots import PilotScavenger, PilotState, PinnedPilots
from malleparsl.scavenger.shell import Runner, check, default_runner

log = logging.getLogger(__name__)

PREEMPTIBLE_QUEUES = frozenset({"preemptable", "preemptible", "preempt", "scavenger"})
"""Queue names taken as preemptible; PBS has no per-queue flag a user can query for it."""


class ScavengingPBSProProvider(PinnedPilots, PBSProProvider):
    """``PBSProProvider`` for one-node pilots pinned to chosen idle nodes, under a cap.

    Parameters
    ----------
    queue : str
        A preemptable queue (``preemptable`` on Polaris); others need allow_nonpreemptible.
    account : str, optional
        Project to charge (``-A``).
    node_cap, walltime, worker_init, signal_dir, run, allow_nonpreemptible :
        As for :class:`~malleparsl.scavenger.slurm_provider.ScavengingSlurmProvider`.
    cpus_per_node : int
        ``ncpus`` in the select statement (64 on Polaris).
    select_options : str
        Extra ``-l select`` resources, e.g. ``"ngpus=4"``.
    """

    def __init__(
        self,
        *,
        queue: str,
        account: str | None = None,
        node_cap: int = 8,
        walltime: str = "00:30:00",
        cpus_per_node: int = 1,
        select_options: str = "",
        scheduler_options: str = "",
        worker_init: str = "",
        allow_nonpreemptible: bool = False,
        signal_dir: str | None = None,
        cmd_timeout: int = 30,
        launcher: Launcher | None = None,
        run: Runner | None = None,
    ) -> None:
        if isinstance(node_cap, bool) or not isinstance(node_cap, int) or node_cap < 1:
            raise SpecError(f"node_cap must be an integer >= 1, got {node_cap!r}")
        for what, value in (("queue", queue), ("account", account)):
            values.scheduler_name(value, what=what)  # they reach #PBS lines
        values.walltime(walltime)
        values.select_resources(select_options)
        if queue not in PREEMPTIBLE_QUEUES and not allow_nonpreemptible:
            raise SpecError(
                f"queue {queue!r} is not known to be preemptable (known: "
                f"{', '.join(sorted(PREEMPTIBLE_QUEUES))}); pilots there would hold nodes the "
                "facility's jobs need; use the preemptable queue, or pass "
                "allow_nonpreemptible=True if the facility agrees"
            )
        self.run = run or default_runner(timeout_s=cmd_timeout)
        self.node_cap = node_cap
        self.signal_dir = signal_dir
        self._init_pilots()
        kw = {"launcher": launcher} if launcher is not None else {}
        super().__init__(
            account=account, queue=queue, scheduler_options=scheduler_options,
            select_options=select_options, worker_init=worker_init, nodes_per_block=1,
            cpus_per_node=cpus_per_node, init_blocks=0, min_blocks=0, max_blocks=node_cap,
            walltime=walltime, cmd_timeout=cmd_timeout, **kw,
        )

    def _submit_pilot(
        self, command: str, tasks_per_node: int, job_name: str, node: str | None
    ) -> str:
        def on(target: str) -> str:
            base_sel, base_init = self.select_options, self.worker_init
            sel = base_sel.lstrip(":")
            host = values.scheduler_name(target, what="node")
            self.select_options = ":" + ":".join(p for p in (sel, f"host={host}") if p)
            self.worker_init = self.trap_line("PBS_JOBID") + base_init
            try:
                return PBSProProvider.submit(self, command, tasks_per_node, job_name)
            finally:
                self.select_options, self.worker_init = base_sel, base_init

        return self._pinned_submit(on, node)

    def cancel(self, job_ids: list[str]) -> list[bool]:
        """Delete pilots (a deliberate release, not a preemption)."""
        self._note_cancel(job_ids)
        return super().cancel(job_ids)


class PBSScavenger(PilotScavenger):
    """Idle-node events from PBS Pro, with pilots through ``provider``.

    >>> prov = ScavengingPBSProProvider(queue="preemptable", account="MyProj")  # doctest: +SKIP
    >>> src = PBSScavenger(provider=prov, query_period_s=30)                     # doctest: +SKIP
    """

    provider: ScavengingPBSProProvider

    def __init__(self, *, provider: ScavengingPBSProProvider, **options) -> None:
        if not isinstance(provider, ScavengingPBSProProvider):
            raise SpecError(
                f"provider must be a ScavengingPBSProProvider, got {type(provider).__name__}"
            )
        options.setdefault("query_period_s", 30.0)  # be gentle with a facility's PBS server
        super().__init__(provider=provider, **options)

    def idle_now(self) -> list[str]:
        return free_nodes(parse_pbsnodes(check(self.run, ["pbsnodes", "-av"])))

    def idle_end_estimates(self, nodes: list[str], wall: float) -> dict[str, float]:
        q = self.run(["qstat", "-f"])
        r = self.run(["pbs_rstat", "-f"])
        jobs = parse_qstat_f(q.stdout) if q.returncode == 0 else []
        resv = parse_pbs_rstat(r.stdout) if r.returncode == 0 else []
        return pbs_idle_ends(nodes, jobs, resv, now=wall)

    def pilot_states(self, job_ids: list[str]) -> dict[str, PilotState] | None:
        res = self.run(["qstat", "-x", "-f", *job_ids])
        if res.returncode != 0 and not res.stdout.strip():
            if "Unknown Job Id" in res.stderr:
                return {}  # all purged from the history: every pilot vanished
            return None
        out: dict[str, PilotState] = {}
        for job in parse_qstat_f(res.stdout):
            jid = next((j for j in job_ids if j == job.job_id or j.startswith(job.job_id + ".")
                        or job.job_id.startswith(j + ".")), job.job_id)
            if job.state in LIVE_JOB_STATES:
                out[jid] = "live"
            elif job.state in WAITING_JOB_STATES or job.state in SUSPENDED_JOB_STATES:
                out[jid] = "waiting"  # after having run: requeued or suspended -> deleted, taken
            else:
                out[jid] = "ended"
        return out
