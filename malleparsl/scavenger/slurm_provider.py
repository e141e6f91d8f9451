"""Pilot jobs on scavenged Slurm nodes: Parsl's ``SlurmProvider``, one node per pilot, pinned.

A scavenged node can be taken back at any moment, so every pilot (Parsl block) holds exactly
one node (``--nodes=1 --nodelist=<node>``) and nodes leave independently. The provider

- pins each block to the node it is told to (:meth:`ScavengingSlurmProvider.pin`; the
  :class:`~malleparsl.scavenger.slurm.SlurmScavenger` pins every node it announces, in order,
  so the executor's ``add_node(name)`` -> ``provider.submit`` lands on node ``name``);
- refuses to hold more than ``node_cap`` pilots at once;
- refuses a partition whose ``PreemptMode`` is ``OFF`` (or a QOS that is not preemptible)
  unless ``allow_nonpreemptible=True``: scavenging must never block the facility's own jobs;
- makes every pilot leave a ``<job id>.term`` file in ``signal_dir`` when it receives SIGTERM,
  the fastest preemption signal on a shared filesystem (no scheduler query needed);
- sends every shell call through one ``run`` function (tests pass a fake).
"""

from __future__ import annotations

import logging
import os
import threading
from collections import deque

import typeguard
from parsl.launchers.base import Launcher
from parsl.providers import SlurmProvider

from malleparsl.errors import MalleparslError, SpecError
from malleparsl.scavenger.shell import Runner, default_runner
from malleparsl.scavenger.slurm_parse import parse_partition

log = logging.getLogger(__name__)


class NodeCapError(MalleparslError, RuntimeError):
    """A pilot was requested while ``node_cap`` pilots are already held."""


class ScavengingSlurmProvider(SlurmProvider):
    """``SlurmProvider`` for preemptible one-node pilots pinned to chosen idle nodes.

    Parameters
    ----------
    partition, qos, account : str, optional
        Where pilots go. The partition (or QOS) must be preemptible.
    node_cap : int
        Most pilots held at once (pending or running).
    walltime : str
        Pilot walltime, ``HH:MM:SS``; a pilot that times out is just another lost node.
    worker_init : str
        Shell lines run before the worker pool (``module load ...; source env/bin/activate``).
    allow_nonpreemptible : bool
        Permit a non-preemptible partition/QOS: only for tests or with the facility's consent.
    signal_dir : str, optional
        Shared directory for the SIGTERM marker files (default: ``<script_dir>/preempt``).
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
        if partition is None and qos is None:
            raise SpecError(
                "give a preemptible partition= or qos= for the pilots (e.g. partition='scavenger'"
                " or qos='preempt'); scavenging in the default partition could block other jobs"
            )
        self.run = run or default_runner(timeout_s=cmd_timeout)
        self.node_cap = node_cap
        self.allow_nonpreemptible = allow_nonpreemptible
        self.signal_dir = signal_dir
        kw = {"launcher": launcher} if launcher is not None else {}
        super().__init__(
            partition=partition, qos=qos, account=account, nodes_per_block=1,
            init_blocks=0, min_blocks=0, max_blocks=node_cap, walltime=walltime,
            worker_init=worker_init, scheduler_options=scheduler_options, exclusive=exclusive,
            cmd_timeout=cmd_timeout, **kw,
        )
        self.pilots: dict[str, str] = {}  # job id -> node
        self.released: set[str] = set()  # job ids we cancelled ourselves
        self._pins: deque[str] = deque()
        self._lock = threading.Lock()
        self._checked = False

    # ---- the one door to the shell --------------------------------------------------------
    def execute_wait(self, cmd: str, timeout: int | None = None) -> tuple[int, str, str]:
        res = self.run(cmd)
        return res.returncode, res.stdout, res.stderr

    # ---- pinning and caps -------------------------------------------------------------------
    def pin(self, node: str) -> None:
        """The next :meth:`submit` (in FIFO order) goes to ``node``."""
        with self._lock:
            self._pins.append(node)

    def unpin(self, node: str) -> bool:
        """Forget a pin not used yet (the node was taken before its pilot was submitted)."""
        with self._lock:
            try:
                self._pins.remove(node)
                return True
            except ValueError:
                return False

    def active_pilots(self) -> dict[str, str]:
        """``{job id: node}`` of pilots not known to have ended."""
        return {j: n for j, n in self.pilots.items()
                if j in self.resources and not self.resources[j]["status"].terminal}

    def node_of(self, job_id: str) -> str | None:
        return self.pilots.get(job_id)

    def check_preemptible(self) -> None:
        """Raise SpecError unless the pilots' partition or QOS is preemptible (checked once)."""
        if self._checked or self.allow_nonpreemptible:
            return
        if self.partition is not None:
            res = self.run(f"scontrol show partition {self.partition} -o")
            fields = parse_partition(res.stdout) if res.returncode == 0 else {}
            mode = fields.get("PreemptMode", "").upper()
            if res.returncode != 0 or not fields:
                raise SpecError(f"partition {self.partition!r} not found ({res.stderr.strip()}); "
                                "check the name with `sinfo -s`")
            if mode in ("", "OFF") and self.qos is None:
                raise SpecError(
                    f"partition {self.partition!r} has PreemptMode={mode or '?'}: pilots there "
                    "would block the facility's jobs; use a preemptible partition or QOS, or "
                    "pass allow_nonpreemptible=True if the facility agrees"
                )
        if self.qos is not None:
            res = self.run(f"sacctmgr -n -P show qos {self.qos} format=Name,PreemptMode")
            line = res.stdout.strip().splitlines()[0] if res.stdout.strip() else ""
            mode = line.split("|")[1].upper() if "|" in line else ""
            if res.returncode != 0 or mode in ("", "OFF"):
                raise SpecError(
                    f"cannot confirm that QOS {self.qos!r} is preemptible (sacctmgr said "
                    f"{line or res.stderr.strip()!r}); use a preemptible QOS or pass "
                    "allow_nonpreemptible=True if the facility agrees"
                )
        self._checked = True

    def submit(self, command: str, tasks_per_node: int, job_name: str = "parsl.slurm") -> str:
        """Submit one pilot on the next pinned node; raise NodeCapError at the cap."""
        self.check_preemptible()
        with self._lock:
            if len(self.active_pilots()) >= self.node_cap:
                raise NodeCapError(
                    f"{len(self.active_pilots())} pilots already held, node_cap={self.node_cap}; "
                    "release a node first or raise node_cap"
                )
            if not self._pins:
                raise SpecError(
                    "no node to pin this pilot to: call provider.pin(node) (the SlurmScavenger "
                    "does it for every idle node it announces) before submitting"
                )
            node = self._pins.popleft()
            base_opts, base_init = self.scheduler_options, self.worker_init
            self.scheduler_options = base_opts + f"#SBATCH --nodelist={node}\n"
            self.worker_init = self._trap_line() + base_init
            try:
                job_id = super().submit(command, tasks_per_node, job_name)
            finally:
                self.scheduler_options, self.worker_init = base_opts, base_init
            self.pilots[job_id] = node
        log.info("pilot %s submitted on node %s", job_id, node)
        return job_id

    def _trap_line(self) -> str:
        d = self.preempt_dir()
        if d is None:
            return ""
        return f"mkdir -p {d}; trap 'touch {d}/$SLURM_JOB_ID.term' TERM\n"

    def preempt_dir(self) -> str | None:
        if self.signal_dir is not None:
            return self.signal_dir
        sd = getattr(self, "script_dir", None)
        return os.path.join(sd, "preempt") if sd else None

    def cancel(self, job_ids: list[str]) -> list[bool]:
        """Cancel pilots (a deliberate release, not a preemption)."""
        self.released.update(job_ids)
        return super().cancel(job_ids)
