"""A real Slurm 22.05 cluster on this machine: one ``slurmctld`` and N ``slurmd`` on loopback.

Tests and ``malleparsl bench slurm`` need a scheduler that really preempts, requeues and plans
starts, not a mock. Debian's ``slurmctld``/``slurmd``/``slurm-client`` run unprivileged-free
(as root, ``auth/none``) with emulated nodes: every node is one ``slurmd -N nXX`` process on
127.0.0.1 with its own port, spool and log (``%n`` in the paths). Two partitions share all
nodes: ``scavenger`` (PriorityTier=1, jobs there are cancelled when preempted) and ``main``
(PriorityTier=10, preempts ``scavenger``). Everything lives in one temp directory and
``SLURM_CONF`` points clients at it, so nothing touches ``/etc/slurm``.

Timing knobs (documented in docs/scavenger.md): ``KillWait`` is the SIGTERM-to-SIGKILL grace of a
preempted pilot; ``SlurmdTimeout``/``MessageTimeout`` bound how long a dead node goes unnoticed.

>>> with LocalSlurm(nodes=8) as slurm:                              # doctest: +SKIP
...     print(slurm.run("sinfo -h -o %D").stdout)
"""

from __future__ import annotations

import contextlib
import logging
import os
import shlex
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from malleparsl.errors import SchedulerCommandError, SpecError
from malleparsl.ports import free_port_block
from malleparsl.scavenger.shell import CommandResult, Runner, default_runner, run_command

log = logging.getLogger(__name__)

DAEMONS = ("slurmctld", "slurmd", "sinfo", "squeue", "sbatch", "scontrol", "scancel")

_CONF = """\
ClusterName=mp{tag}
SlurmctldHost={host}({ctld_addr})
SlurmctldPort={ctld_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/none
CredType=cred/none
AuthInfo=cred_expire=10
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool/%n
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd.%n.pid
SlurmctldLogFile={d}/slurmctld.log
SlurmdLogFile={d}/slurmd.%n.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SlurmdParameters=config_overrides
MpiDefault=none
SwitchType=switch/none
MailProg=/bin/true
ReturnToService=2
SchedulerType=sched/backfill
SchedulerParameters=bf_interval=1,bf_resolution=1,sched_min_interval=0
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
PreemptType=preempt/partition_prio
PreemptMode=CANCEL
JobCompType=jobcomp/filetxt
JobCompLoc={d}/jobcomp.txt
MinJobAge={min_job_age}
KillWait={kill_wait}
SlurmdTimeout={slurmd_timeout}
MessageTimeout={message_timeout}
InactiveLimit=0
Waittime=0
{node_lines}
PartitionName=scavenger Nodes=ALL Default=YES PriorityTier=1 PreemptMode={preempt_mode} MaxTime=INFINITE State=UP
PartitionName=main Nodes=ALL PriorityTier=10 PreemptMode=OFF MaxTime=INFINITE State=UP
"""


def slurm_installed() -> bool:
    """True when the Slurm daemons and client commands are on PATH."""
    return all(shutil.which(c) for c in DAEMONS)


@dataclass
class LocalSlurm:
    """Start (``start()`` or ``with``) and stop a local Slurm with ``nodes`` emulated nodes.

    ``env`` is the environment clients need (``SLURM_CONF``); :meth:`run` uses it.
    """

    nodes: int = 8
    kill_wait_s: int = 2
    preempt_mode: str = "CANCEL"  # of the scavenger partition: CANCEL or REQUEUE
    slurmd_timeout_s: int = 10
    message_timeout_s: int = 5
    min_job_age_s: int = 300
    workdir: str | None = None
    start_timeout_s: float = 20.0
    # emulated hosts (malleparsl.testbed.Host: ``address``, ``nsenter``), one per node: each
    # slurmd runs on its host with NodeAddr its address; slurmctld listens on ``ctld_address``
    hosts: tuple = ()
    ctld_address: str = "127.0.0.1"

    def __post_init__(self) -> None:
        if not 1 <= self.nodes <= 64:
            raise SpecError(f"nodes must be in 1..64 for a local Slurm, got {self.nodes!r}")
        if self.preempt_mode not in ("CANCEL", "REQUEUE"):
            raise SpecError(f"preempt_mode must be CANCEL or REQUEUE, got {self.preempt_mode!r}")
        self._procs: list[subprocess.Popen] = []
        self._own_dir = self.workdir is None
        self.dir = Path(self.workdir or tempfile.mkdtemp(prefix="mp-slurm-"))
        self.node_names = [f"n{i:02d}" for i in range(1, self.nodes + 1)]
        if self.hosts and len(self.hosts) != self.nodes:
            raise SpecError(f"hosts must give one emulated host per node ({self.nodes}), "
                            f"got {len(self.hosts)}")
        self.env: dict[str, str] = dict(os.environ)

    # ---- lifecycle ----------------------------------------------------------------------
    def write_config(self) -> Path:
        base = free_port_block(self.nodes + 1, lo=20000, hi=60000)
        for sub in ("state", "spool", "jobs"):
            (self.dir / sub).mkdir(parents=True, exist_ok=True)
        conf = self.dir / "slurm.conf"
        host = socket.gethostname().split(".")[0]
        node = "NodeName={name} NodeHostname={host} NodeAddr={addr} Port={port} CPUs=1 " \
               "RealMemory=1000 State=UNKNOWN"
        if self.hosts:
            lines = [node.format(name=n, host=host, addr=h.address, port=base + 1)
                     for n, h in zip(self.node_names, self.hosts)]
        else:
            lines = [node.format(name=f"n[01-{self.nodes:02d}]", host=host, addr="127.0.0.1",
                                 port=f"[{base + 1}-{base + self.nodes}]")]
        conf.write_text(
            _CONF.format(
                tag=base, host=host, ctld_port=base, ctld_addr=self.ctld_address,
                node_lines="\n".join(lines),
                d=self.dir,
                preempt_mode=self.preempt_mode,
                kill_wait=self.kill_wait_s, slurmd_timeout=self.slurmd_timeout_s,
                message_timeout=self.message_timeout_s, min_job_age=self.min_job_age_s,
            )
        )
        self.env["SLURM_CONF"] = str(conf)
        return conf

    def start(self) -> LocalSlurm:
        """Write the config, start the daemons, wait until every node is idle."""
        if not slurm_installed():
            raise RuntimeError(
                "Slurm is not installed; run `apt-get install -y slurmctld slurmd slurm-client` "
                "(scripts/setup-system.sh does it)"
            )
        self.write_config()
        self._spawn(["slurmctld", "-D", "-i"], "slurmctld.out")
        for i, name in enumerate(self.node_names):
            # nsenter --net, not `ip netns exec`: the latter remounts /sys and slurmd then dies
            on_host = list(self.hosts[i].nsenter) if self.hosts else []
            self._spawn([*on_host, "slurmd", "-D", "-N", name], f"slurmd.{name}.out")
        try:
            self.wait_idle(self.node_names, timeout_s=self.start_timeout_s)
        except BaseException:
            self.stop()
            raise
        log.info("local Slurm with %d nodes up in %s", self.nodes, self.dir)
        return self

    def _spawn(self, argv: list[str], out: str) -> None:
        fh = open(self.dir / out, "wb")  # noqa: SIM115 - closed by the child's lifetime
        self._procs.append(
            subprocess.Popen(argv, env=self.env, stdout=fh, stderr=subprocess.STDOUT,
                             start_new_session=True, cwd=self.dir)
        )
        fh.close()

    def stop(self) -> None:
        """Stop every daemon this object started (``scontrol shutdown``, then signals)."""
        if not self._procs:
            return
        self.cancel_all()
        self.run("scontrol shutdown", check=False, timeout_s=5)
        deadline = time.monotonic() + 5
        for p in self._procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
        for p in self._procs:
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    p.wait(timeout=5)
        self._procs.clear()
        self._kill_leftover_jobs()

    def cancel_all(self, *, wait_s: float = 5.0) -> None:
        """Cancel every job and wait until none is left running."""
        ids = self.run("squeue -h -o %i", check=False).stdout.split()
        if ids:
            self.run(["scancel", *ids], check=False)
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if not self.run("squeue -h -o %i", check=False).stdout.split():
                return
            time.sleep(0.1)

    def _kill_leftover_jobs(self) -> None:
        """Job processes (slurmstepd and its children) may outlive the daemons: find them by
        the ``SLURM_CONF`` of this cluster in their environment and end them by pid."""
        marker = f"SLURM_CONF={self.env['SLURM_CONF']}".encode()
        me = os.getpid()
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) == me:
                continue
            try:
                env = (entry / "environ").read_bytes().split(b"\0")
                is_job = any(v.startswith(b"SLURM_JOB_ID=") for v in env)
                is_stepd = (entry / "comm").read_text().strip() == "slurmstepd"
                if marker in env and (is_job or is_stepd):
                    os.kill(int(entry.name), signal.SIGKILL)
            except (OSError, ValueError):
                continue

    def cleanup(self) -> None:
        self.stop()
        if self._own_dir:
            shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> LocalSlurm:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.cleanup()

    # ---- helpers ------------------------------------------------------------------------
    def runner(self, timeout_s: float = 10.0) -> Runner:
        """A shell runner for scavengers and providers that talks to this cluster."""
        return default_runner(self.env, timeout_s=timeout_s)

    def run(
        self, cmd: str | Sequence[str], *, check: bool = True, timeout_s: float = 10
    ) -> CommandResult:
        """Run a Slurm client command against this cluster (no shell: a string is split as a
        shell would split it, for the test bed's own fixed lines)."""
        argv = shlex.split(cmd) if isinstance(cmd, str) else list(cmd)
        res = run_command(argv, timeout_s=timeout_s, env=self.env)
        if check and res.returncode != 0:
            raise SchedulerCommandError(shlex.join(argv), res.returncode, res.stdout, res.stderr)
        return res

    def node_states(self) -> dict[str, str]:
        out = self.run("sinfo -h -N -p scavenger -o '%N %T'").stdout
        return dict(line.split()[:2] for line in out.splitlines() if line.strip())

    def wait_idle(self, names: list[str], *, timeout_s: float = 20.0) -> None:
        """Block until every node in ``names`` is idle (raises TimeoutError otherwise)."""
        deadline = time.monotonic() + timeout_s
        states: dict[str, str] = {}
        while time.monotonic() < deadline:
            res = self.run("sinfo -h -N -p scavenger -o '%N %T'", check=False)
            if res.returncode == 0:
                states = dict(ln.split()[:2] for ln in res.stdout.splitlines() if ln.strip())
                if all(states.get(n) == "idle" for n in names):
                    return
            time.sleep(0.1)
        raise TimeoutError(f"Slurm nodes not idle after {timeout_s} s: {states}")

    def sbatch(self, args: str, script: str = "sleep 600") -> str:
        """Submit a batch job (``--wrap``); returns its job id."""
        res = self.run(["sbatch", "--parsable", "-o", "/dev/null", *shlex.split(args),
                        "--wrap", script])
        return res.stdout.strip().split(";")[0]

    def job_state(self, job_id: str) -> str:
        res = self.run(["squeue", "-h", "-j", job_id, "-o", "%T"], check=False)
        return res.stdout.strip() or "GONE"

