"""Pilot jobs on scavenged Slurm nodes: Parsl's ``SlurmProvider``, one node per pilot, pinned.

A scavenged node can be taken back at any moment, so every pilot (Parsl block) holds exactly
one node (``--nodes=1 --nodelist=<node>``) and nodes leave independently. On top of Parsl's
``SlurmProvider`` (script template, ``sbatch``, status, ``scancel``) this provider

- pins each pilot to the node it is told (``pin``; :class:`~malleparsl.scavenger.slurm.
  SlurmScavenger` pins every node it announces, in order);
- refuses to hold more than ``node_cap`` pilots at once (:class:`NodeCapError`);
- refuses a partition whose ``PreemptMode`` is ``OFF``, or a QOS ``sacctmgr`` does not show as
  preemptible, unless ``allow_nonpreemptible=True``: scavenging must never delay the
  facility's own jobs;
- makes each pilot leave ``<signal_dir>/<job id>.term`` when it receives SIGTERM;
- sends every shell call through one ``run`` function (tests pass a fake).
"""

from __future__ import annotations

import logging

import typeguard
from parsl.launchers.base import Launcher
from parsl.providers import SlurmProvider

from malleparsl.errors import SpecError
from malleparsl.scavenger import values
from malleparsl.scavenger.pilots import NodeCapError, PinnedPilots
from malleparsl.scavenger.shell import Runner, default_runner
from malleparsl.scavenger.slurm_parse import parse_partition

log = logging.getLogger(__name__)

__all__ = ["NodeCapError", "ScavengingSlurmProvider"]


class ScavengingSlurmProvider(PinnedPilots, SlurmProvider):
    """``SlurmProvider`` for preemptible one-node pilots pinned to chosen idle nodes.

    Parameters
    ----------
    partition, qos, account : str, optional
        Where pilots go; the partition (or QOS) must be preemptible.
    node_cap : int
        Most pilots held at once (pending or running).
    walltime : str
        Pilot walltime, ``HH:MM:SS``; a pilot that times out is just another lost node.
    worker_init : str
        Shell lines run before the worker pool (``module load ...; source env/bin/activate``).
    allow_nonpreemptible : bool
        Permit a non-preemptible partition/QOS: only for tests or with the facility's consent.
    signal_dir : str, optional
        Shared directory for SIGTERM marker files (default ``<script_dir>/preempt``).
    run : callable, optional
        ``run(cmd) -> CommandResult``; default: the shell with the current environment.
    """

    @typeguard.typechecked
    def __init__(
        self,
        *,
        partition: str | None = None,
        qos: str | None = None,
        account: str | None = None,
        node_cap: int = 8,
        walltime: str = "00:30:00",
        worker_init: str = "",
        scheduler_options: str = "",
        allow_nonpreemptible: bool = False,
        signal_dir: str | None = None,
        exclusive: bool = True,
        cmd_timeout: int = 10,
        launcher: Launcher | None = None,
        run: Runner | None = None,
    ) -> None:
        if node_cap < 1:
            raise SpecError(f"node_cap must be an integer >= 1, got {node_cap!r}")
        for what, value in (("partition", partition), ("qos", qos), ("account", account)):
            values.scheduler_name(value, what=what)  # they reach #SBATCH lines
        values.walltime(walltime)
        if partition is None and qos is None:
            raise SpecError(
                "give a preemptible partition= or qos= for the pilots (e.g. partition='scavenger'"
                " or qos='preempt'); scavenging in the default partition could block other jobs"
            )
        self.run = run or default_runner(timeout_s=cmd_timeout)
        self.node_cap = node_cap
        self.allow_nonpreemptible = allow_nonpreemptible
        self.signal_dir = signal_dir
        self._init_pilots()
        self._checked = False
        kw = {"launcher": launcher} if launcher is not None else {}
        super().__init__(
            partition=partition, qos=qos, account=account, nodes_per_block=1,
            init_blocks=0, min_blocks=0, max_blocks=node_cap, walltime=walltime,
            worker_init=worker_init, scheduler_options=scheduler_options, exclusive=exclusive,
            cmd_timeout=cmd_timeout, **kw,
        )

    def check_preemptible(self) -> None:
        """Raise SpecError unless the pilots' partition or QOS is preemptible (checked once)."""
        if self._checked or self.allow_nonpreemptible:
            return
        if self.partition is not None:
            res = self.run(["scontrol", "show", "partition", self.partition, "-o"])
            fields = parse_partition(res.stdout) if res.returncode == 0 else {}
            if not fields:
                raise SpecError(f"partition {self.partition!r} not found ({res.stderr.strip()});"
                                " check the name with `sinfo -s`")
            mode = fields.get("PreemptMode", "").upper()
            if mode in ("", "OFF") and self.qos is None:
                raise SpecError(
                    f"partition {self.partition!r} has PreemptMode={mode or '?'}: pilots there "
                    "would hold nodes the facility's jobs need; use a preemptible partition or "
                    "QOS, or pass allow_nonpreemptible=True if the facility agrees"
                )
        if self.qos is not None:
            res = self.run(["sacctmgr", "-n", "-P", "show", "qos", self.qos, "format=Name,PreemptMode"])
            line = res.stdout.strip().splitlines()[0] if res.stdout.strip() else ""
            mode = line.split("|")[1].upper() if "|" in line else ""
            if res.returncode != 0 or mode in ("", "OFF"):
                raise SpecError(
                    f"cannot confirm that QOS {self.qos!r} is preemptible (sacctmgr said "
                    f"{line or res.stderr.strip()!r}); use a preemptible QOS or pass "
                    "allow_nonpreemptible=True if the facility agrees"
                )
        self._checked = True

    def _submit_pilot(
        self, command: str, tasks_per_node: int, job_name: str, node: str | None
    ) -> str:
        self.check_preemptible()

        def on(target: str) -> str:
            base_opts, base_init = self.scheduler_options, self.worker_init
            node = values.scheduler_name(target, what="node")
            self.scheduler_options = base_opts + f"#SBATCH --nodelist={node}\n"
            self.worker_init = self.trap_line("SLURM_JOB_ID") + base_init
            try:
                return SlurmProvider.submit(self, command, tasks_per_node, job_name)
            finally:
                self.scheduler_options, self.worker_init = base_opts, base_init

        return self._pinned_submit(on, node)

    def cancel(self, job_ids: list[str]) -> list[bool]:
        """Cancel pilots (a deliberate release, not a preemption)."""
        self._note_cancel(job_ids)
        return super().cancel(job_ids)
