"""Faults to inject into a live :class:`MalleableExecutor`: one small class each, in a registry.

Each :class:`Fault` says what it breaks (:meth:`Fault.inject`, called at a random moment of a
running job) and what the system must do about it: finish the job with the right result
(``expect_error is None``) or fail it with an error of the given type. ``malleparsl bench
faults`` (:mod:`malleparsl.executors.bench_faults`) runs them on real processes.

New faults plug in with :func:`register_fault`. A fault with ``needs_netns`` (``cut-link``: a
host's link set down, a partition) runs on a rig whose nodes are emulated hosts of a
:class:`~malleparsl.testbed.NetnsTestbed` (``rig.bed``).
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
from abc import ABC, abstractmethod
from typing import Any, ClassVar

from malleparsl.errors import CheckpointWriteError, unknown_name
from malleparsl.executors.synthetic import STATE_FILE
from malleparsl.procs import process_alive

FAULTS: dict[str, type[Fault]] = {}


def register_fault(cls: type[Fault]) -> type[Fault]:
    """Class decorator: make ``cls`` available to the fault bench under ``cls.name``."""
    FAULTS[cls.name] = cls
    return cls


def get_fault(name: str) -> Fault:
    if name not in FAULTS:
        raise unknown_name("fault", name, FAULTS)
    return FAULTS[name]()


class Fault(ABC):
    """One kind of fault. ``rig`` is the bench's running system (executor ``rig.ex``, node
    source ``rig.src``, checkpoint folders); ``job`` the driver's ``MalleableJob``."""

    name: ClassVar[str]
    expect_error: ClassVar[type[BaseException] | None] = None  # None: the right result
    error_text: ClassVar[str] = ""  # the expected error's message must contain this
    kills_executor: ClassVar[bool] = False  # the bench starts a new executor afterwards
    note: str = ""  # what the fault saw, for the bench's record
    needs_tmpfs: ClassVar[bool] = False  # the job checkpoints to a small tmpfs
    needs_netns: ClassVar[bool] = False  # nodes are network-namespace hosts (``rig.bed``)

    @abstractmethod
    def inject(self, rig: Any, job: Any, rng: random.Random) -> str:
        """Break something now; return a one-line description of what was done."""

    def cleanup(self, rig: Any, job: Any) -> list[str]:
        """Undo what is left of the fault after the job ended; return problems found."""
        return []


def _victim(job: Any, rng: random.Random, rank: int | None = None) -> str:
    nodes = job.nodes
    if not nodes:
        raise RuntimeError(f"job {job.job_id} runs no segment: nothing to break")
    return nodes[rank] if rank is not None else rng.choice(nodes)


@register_fault
class SigkillPilot(Fault):
    """A node dies: SIGKILL of its pilot's manager and worker (a preemption)."""

    name = "sigkill-pilot"

    def inject(self, rig: Any, job: Any, rng: random.Random) -> str:
        node = _victim(job, rng)
        rig.ex.kill_node(node)
        return f"SIGKILL {node}"


@register_fault
class CancelPilot(Fault):
    """The batch scheduler cancels a node's pilot job behind the executor's back."""

    name = "cancel-pilot"

    def inject(self, rig: Any, job: Any, rng: random.Random) -> str:
        node = _victim(job, rng)
        rig.ex.provider.cancel([rig.ex.node_table.get(node).job_id])
        return f"cancelled the pilot of {node}"


@register_fault
class SigstopRank(Fault):
    """A rank hangs: SIGSTOP of the worker process that runs it. Its manager keeps beating,
    so only the driver's deadlines can find it; the node must be killed and left out."""

    name = "sigstop-rank"

    def inject(self, rig: Any, job: Any, rng: random.Random) -> str:
        node = _victim(job, rng)
        self.pid = int(rig.ex.node_info(node)["pid"])
        os.kill(self.pid, signal.SIGSTOP)
        return f"SIGSTOP worker {self.pid} on {node}"

    def cleanup(self, rig: Any, job: Any) -> list[str]:
        if not process_alive(self.pid):
            return []
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)
        return [f"stopped worker {self.pid} was left alive"]


@register_fault
class CutLink(Fault):
    """A partition: the victim host's link goes down (``ip link set <veth> down``); its pilot
    and rank live on, unreachable. The survivors' collective times out, the interchange
    declares the silent manager lost (heartbeat threshold), and the job restarts from its last
    checkpoint on the other hosts. ``cleanup`` brings the link back up; the rig lends the host
    again once the executor has dropped it."""

    name = "cut-link"
    needs_netns = True

    def inject(self, rig: Any, job: Any, rng: random.Random) -> str:
        self.host = _victim(job, rng)
        self.launched = len(job.history)  # segments launched before the cut
        rig.bed.cut(self.host)
        return f"cut the link of {self.host} ({rig.bed.host(self.host).veth} down)"

    def cleanup(self, rig: Any, job: Any) -> list[str]:
        rig.bed.restore(self.host)
        after = job.history[self.launched:]
        self.note = f"segments after the cut: {[list(s) for s in after]}"
        if any(self.host in nodes for nodes in after):
            return [f"a segment after the cut ran on the cut host {self.host}"]
        return []


@register_fault
class InterchangeKilled(Fault):
    """The interchange process dies: every task and job fails naming it, new work is refused."""

    name = "interchange-killed"
    expect_error = Exception  # JobAbortedError; checked by its text, which names the cause
    error_text = "interchange"
    kills_executor = True

    def inject(self, rig: Any, job: Any, rng: random.Random) -> str:
        pid = rig.ex.interchange_proc.pid
        os.kill(pid, signal.SIGKILL)
        return f"SIGKILL interchange {pid}"


class _BadCheckpoint(Fault):
    """The newest checkpoint is damaged, then rank 0's node dies, so the restart must read it:
    the job resumes from the checkpoint before it (no step lost or counted twice)."""

    def damage(self, path: str, data: bytes) -> bytes:
        raise NotImplementedError

    def inject(self, rig: Any, job: Any, rng: random.Random) -> str:
        node = _victim(job, rng, rank=0)  # rank 0 writes the checkpoints: stop it first
        rig.ex.kill_node(node)
        path = os.path.join(job.ckpt_dir, STATE_FILE)
        with open(path, "rb") as fh:
            data = fh.read()
        with open(path, "wb") as fh:
            fh.write(self.damage(path, data))
        return f"SIGKILL {node} (rank 0), {self.name} {path} ({len(data)} bytes)"


@register_fault
class CorruptCheckpoint(_BadCheckpoint):
    name = "corrupt-checkpoint"

    def damage(self, path: str, data: bytes) -> bytes:
        return bytes(b ^ 0x5A for b in data)


@register_fault
class TruncatedCheckpoint(_BadCheckpoint):
    name = "truncated-checkpoint"

    def damage(self, path: str, data: bytes) -> bytes:
        return data[: len(data) // 2]


@register_fault
class DiskFull(Fault):
    """The checkpoint file system fills up: the job fails with ``CheckpointWriteError`` (not a
    user error, not retried) and its previous checkpoint stays readable."""

    name = "disk-full"
    expect_error = CheckpointWriteError
    needs_tmpfs = True

    def inject(self, rig: Any, job: Any, rng: random.Random) -> str:
        self.filler = os.path.join(rig.tmpfs, f"filler-{job.job_id}")
        chunk = b"\0" * 65536
        with open(self.filler, "wb") as fh:
            try:
                while True:
                    fh.write(chunk)
                    fh.flush()
            except OSError:
                pass
        with contextlib.suppress(OSError), open(self.filler + ".tail", "wb") as fh:
            while True:  # fill the last bytes too
                fh.write(b"\0" * 512)
                fh.flush()
        return f"filled {rig.tmpfs}"

    def cleanup(self, rig: Any, job: Any) -> list[str]:
        from malleparsl.executors.synthetic import _load

        problems = []
        try:
            state = _load(job.ckpt_dir)
            if not state.get("step"):
                problems.append("no previous checkpoint was kept")
        except Exception as exc:  # the previous checkpoint must survive the full disk
            problems.append(f"previous checkpoint unreadable: {exc!r}")
        for p in (self.filler, self.filler + ".tail"):
            with contextlib.suppress(OSError):
                os.unlink(p)
        return problems


@register_fault
class SolverTimeLimit(Fault):
    """The MILP solver hits its time limit at every replan from now on; the policy must fall
    back to a valid allocation and the job must still finish."""

    name = "solver-time-limit"

    def inject(self, rig: Any, job: Any, rng: random.Random) -> str:
        from malleparsl.allocator.milp import MilpPolicy

        statuses = self.statuses = []

        class Recording(MilpPolicy):  # notes what every replan's solver did
            def allocate(self, snapshot: Any, jobs: Any) -> Any:
                out = super().allocate(snapshot, jobs)
                if jobs:
                    res = self.last_result
                    statuses.append("fallback" if self.last_fallback else
                                     res.status if res is not None else "none")
                return out

        # no LP-bound shortcut, no exact dynamic programme: the MILP solver runs, and stops at
        # the limit, at every replan
        self.policy = Recording(solver="highs", time_limit_s=1e-6, reduce=False, dp=False)
        rig.ex.control.set_policy(self.policy)
        rig.lent.append(rig.fresh_name())
        rig.src.idle(rig.lent[-1])  # an event, so the loop replans with it now
        return "MILP time limit 1e-6 s"

    def cleanup(self, rig: Any, job: Any) -> list[str]:
        rig.ex.control.set_policy(rig.policy)
        self.note = f"replans: {', '.join(self.statuses) or 'none'}"
        return []
