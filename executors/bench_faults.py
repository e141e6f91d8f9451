"""``malleparsl bench faults``: inject real faults at random moments of real malleable jobs.

One :class:`MalleableExecutor` (emulated nodes through ``LocalProvider``, a pool topped up after
every loss) runs a stream of short :func:`~malleparsl.executors.synthetic.synthetic_entry` jobs
(real gloo groups, real checkpoints); into each it injects one fault from
:data:`~malleparsl.executors.faults.FAULTS` when the job reaches a random step. A fault that
kills the executor (the interchange) is followed by a fresh executor. Every wait has a
deadline; a job whose future does not resolve in time, or a shutdown that does not complete,
is a hang. Faults that need emulated hosts (``cut-link``) run on a second rig whose nodes are
the hosts of a network-namespace test bed (as ``bench multihost``; needs root and iproute2).

Per fault: *survived* means the job finished with exactly the right result (``total ==
steps``: no step lost or counted twice) or failed with the fault's expected error, and the
fault left nothing behind; *results_lost* counts jobs that should have finished and did not
return the right result; *recovery* is injection -> the job steps again on a new segment (or
finishes), or -> the future fails with the expected error.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import logging
import os
import random
import statistics
import subprocess
import tempfile
import threading
import time
from typing import Any

import typer

from malleparsl.executors.bench_rescale import _wait  # one wait helper for the benches
from malleparsl.executors.faults import FAULTS, Fault, get_fault

log = logging.getLogger(__name__)

STEPS, STEP_S, CKPT_EVERY = 120, 0.03, 5
JOB_DEADLINE_S = 180.0  # a job's future must resolve within this after injection
SHUTDOWN_DEADLINE_S = 120.0


class Rig:
    """The system under test: executor, node source, checkpoint folders, a small tmpfs. With
    ``bed`` (a started :class:`~malleparsl.testbed.NetnsTestbed`) the nodes are its emulated
    hosts, one pilot each (``pool`` is the number of hosts), configured as ``bench multihost``
    does (:func:`~malleparsl.executors.bench_multihost.netns_config`)."""

    def __init__(self, root: str, pool: int, *, gloo_timeout_s: float, bed: Any = None) -> None:
        from malleparsl.executors.bench_rescale import KeepAndFillPolicy

        self.root, self.gloo_timeout_s, self.bed = root, gloo_timeout_s, bed
        self.hosts = [h.name for h in bed.hosts] if bed is not None else []
        self.pool = len(self.hosts) if bed is not None else pool
        self.policy = KeepAndFillPolicy()
        self.names = 0
        self.tmpfs = os.path.join(root, "tmpfs")
        os.makedirs(self.tmpfs, exist_ok=True)
        self.has_tmpfs = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=512k", "tmpfs", self.tmpfs],
            capture_output=True).returncode == 0
        self.starts = 0
        self.dfk: Any = None
        self.start()

    def fresh_name(self) -> str:
        """A node name to lend: a new emulated node, or a host not lent now."""
        if self.bed is not None:
            return next(h for h in self.hosts if h not in self.lent)
        self.names += 1
        return f"node-f{self.names:03d}"

    def start(self) -> None:
        from parsl.dataflow.dflow import DataFlowKernel

        from malleparsl.executors.bench_multihost import netns_config
        from malleparsl.executors.bench_rescale import local_malleable_config
        from malleparsl.executors.manual_source import ManualNodeSource
        from malleparsl.executors.options import ControlOptions

        self.starts += 1
        self.lent = []
        for _ in range(self.pool):
            self.lent.append(self.fresh_name())
        self.src = ManualNodeSource(nodes=list(self.lent))
        control = ControlOptions(
            poll_period_s=0.1, release_grace_s=2.0, fail_grace_s=2 * self.gloo_timeout_s,
            stop_timeout_s=4 * self.gloo_timeout_s,
            socket_ifname=self.bed.ifname if self.bed is not None else None,
        )
        common = {"node_source": self.src, "run_dir": os.path.join(self.root, f"run{self.starts}"),
                  "ckpt_root": os.path.join(self.root, "ckpt"), "policy": self.policy,
                  "control": control}
        config = (netns_config(self.bed, **common) if self.bed is not None
                  else local_malleable_config(**common))
        self.dfk = DataFlowKernel(config)
        self.ex = self.dfk.executors["malleable"]
        self.top_up()
        import torch.distributed as dist

        snap = self.ex.snapshot()
        self.store = dist.TCPStore(snap.store_host or "127.0.0.1", snap.store_port, None, False,
                                   timeout=datetime.timedelta(seconds=30))

    def top_up(self, timeout_s: float = 900.0) -> None:
        """Lend fresh nodes until ``pool`` are alive; wait until 3 (a job's maximum) are ready
        and planned, so the next job need not wait for a replacement pilot to start. A host
        is lent again only once the executor has dropped its lost pilot."""
        ex = self.ex

        def pending(name: str) -> bool:  # lent and not gone (maybe not even started yet)
            rec = ex.node_table.get(name)
            return rec is None or rec.alive

        self.lent = [n for n in self.lent if pending(n)]
        for _ in range(self.pool - len(self.lent)):
            name = self.fresh_name()
            if self.bed is not None:
                _wait(lambda n=name: n not in ex.ready_nodes() and n not in ex.snapshot().nodes,
                      timeout_s, f"the lost host {name} to be dropped")
            self.lent.append(name)
            self.src.idle(name)
        _wait(lambda: len(ex.ready_nodes()) >= 3
              and len(set(ex.ready_nodes()) & set(ex.control.controller.nodes)) >= 3,
              timeout_s, "3 ready nodes")

    def shutdown(self) -> bool:
        """Shut the executor down within the deadline; ``False`` means it hung."""
        done = threading.Event()

        def run() -> None:
            with contextlib.suppress(Exception):
                self.dfk.cleanup()
            done.set()

        threading.Thread(target=run, daemon=True).start()
        return done.wait(SHUTDOWN_DEADLINE_S)

    def close(self) -> bool:
        ok = self.shutdown()
        if self.has_tmpfs:
            subprocess.run(["umount", "-l", self.tmpfs], capture_output=True)
        return ok


def _step(rig: Rig, job: Any) -> int:
    from malleparsl.executors.protocol import progress_key

    seg = job.segment
    if seg is None:
        return -1
    key = progress_key(job.job_id, seg.index, job.key_prefix)
    try:
        return int(json.loads(rig.store.get(key))["step"]) if rig.store.check([key]) else -1
    except Exception:
        return -1


def run_one(rig: Rig, fault: Fault, index: int, rng: random.Random) -> dict[str, Any] | None:
    """One job, one fault. ``None`` when the job ended before the fault could be injected."""
    from malleparsl.executors.synthetic import synthetic_entry

    ex = rig.ex
    job_id = f"f{index:04d}-{fault.name}"
    opts: dict[str, Any] = {"job_id": job_id, "min_nodes": 1, "max_nodes": 3, "max_restarts": 5}
    if fault.needs_tmpfs:
        opts["ckpt_dir"] = os.path.join(rig.tmpfs, job_id)
    fut = ex.submit(synthetic_entry, {"malleable": opts}, steps=STEPS, step_s=STEP_S,
                    ckpt_every=CKPT_EVERY, progress_every_s=0.02, timeout_s=rig.gloo_timeout_s)
    _wait(lambda: job_id in ex.control.jobs, 60, "admission")
    job = ex.control.jobs[job_id]
    at = rng.randint(3 * CKPT_EVERY, STEPS - 4 * CKPT_EVERY)  # a random moment of the job
    _wait(lambda: fut.done() or (len(job.nodes) >= 2 and _step(rig, job) >= at), 120,
          f"job {job_id} to reach step {at} on 2+ nodes")
    if fut.done():
        return None
    seg_before = job.next_index
    t0 = time.monotonic()
    what = fault.inject(rig, job, rng)
    recovered: float | None = None
    deadline = t0 + JOB_DEADLINE_S
    while time.monotonic() < deadline:
        if fut.done() or (job.next_index > seg_before and job.segment is not None
                          and job.segment.last_progress_time is not None):
            recovered = time.monotonic() - t0
            break
        time.sleep(0.02)
    hang = not _done_by(fut, deadline)
    rec: dict[str, Any] = {"fault": fault.name, "at_step": at, "what": what, "hang": hang,
                           "recovery_s": recovered, "survived": False, "result_lost": False}
    if hang:
        rec["result_lost"] = fault.expect_error is None
        rec["detail"] = "future not resolved within the deadline"
    elif fault.expect_error is None:
        exc = fut.exception()
        res = None if exc is not None else fut.result()
        right = res is not None and res["steps"] == STEPS and res["total"] == float(STEPS)
        rec["survived"], rec["result_lost"] = right, not right
        rec["detail"] = repr(exc) if exc is not None else f"sizes {res['sizes']}"
    else:
        exc = fut.exception()
        rec["survived"] = isinstance(exc, fault.expect_error) and fault.error_text in str(exc)
        rec["detail"] = repr(exc)[:300]
    if not fault.kills_executor:  # undone after a hang too (a cut link must come back up)
        problems = fault.cleanup(rig, job)
        if problems:
            rec["survived"] = False
            rec["detail"] = "; ".join(([rec["detail"]] if hang else []) + problems)
        if fault.note:
            rec["detail"] += f"; {fault.note}"
    return rec


def _done_by(fut: Any, deadline: float) -> bool:
    while time.monotonic() < deadline:
        if fut.done():
            return True
        time.sleep(0.02)
    return fut.done()


def _after_executor_fault(rig: Rig, rec: dict[str, Any]) -> None:
    """The interchange died: new work must be refused at once and shutdown must complete."""
    from malleparsl.executors.watchdog import InterchangeLostError

    try:
        rig.ex.submit(time.sleep, {}, 0)
        rec["survived"], rec["detail"] = False, "a new task was accepted after the loss"
    except InterchangeLostError:
        pass
    if not rig.shutdown():
        rec["hang"], rec["survived"] = True, False
        rec["detail"] = "shutdown did not complete"
    rig.start()


def make_plan(faults: int, names: list[str], rng: random.Random) -> list[str]:
    """``faults`` names, round robin, shuffled. A fault that kills the executor costs a fresh
    executor (minutes of pilot start-up on a loaded machine): it gets a third of a share."""
    killers = [n for n in names if FAULTS[n].kills_executor]
    others = [n for n in names if n not in killers] or killers
    k = min(faults, max(1, round(faults / len(names) / 3))) if killers else 0
    if not others or others == killers:
        k = faults
    plan = [killers[i % len(killers)] for i in range(k)]
    plan += [others[i % len(others)] for i in range(faults - k)]
    rng.shuffle(plan)
    return plan


def run_bench(*, faults: int, names: list[str], seed: int, pool: int = 4,
              gloo_timeout_s: float = 3.0, root: str | None = None) -> dict[str, Any]:
    """Inject ``faults`` faults (see :func:`make_plan`); return the summary. Each record is
    also appended to ``<root>/records.jsonl`` as it happens; Ctrl-C summarises those so far.

    Faults that need the network-namespace test bed run after the others, on a rig of
    ``pool`` emulated hosts; there the collective timeout is ``bench multihost``'s (longer
    than its heartbeat threshold, so a cut host is declared lost before the survivors give up).
    """
    from malleparsl.executors.bench_multihost import COLLECTIVE_TIMEOUT_S

    rng = random.Random(seed)
    plan = make_plan(faults, names, rng)
    root = root or tempfile.mkdtemp(prefix="malleparsl-faults-")
    local = [p for p in plan if not FAULTS[p].needs_netns]
    netns = [p for p in plan if FAULTS[p].needs_netns]
    if netns:
        from malleparsl.testbed.netns import TestbedError, require_tools

        try:
            require_tools()
        except TestbedError as exc:
            log.warning("no network-namespace test bed (%s): %s left out", exc, sorted(set(netns)))
            netns = []
    records: list[dict[str, Any]] = []
    t_start = time.monotonic()
    jsonl = os.path.join(root, "records.jsonl")
    log.warning("fault bench: %d faults, records in %s", len(local) + len(netns), jsonl)
    closed = True
    try:
        if local:
            closed &= _run_plan(Rig(os.path.join(root, "local"), pool,
                                    gloo_timeout_s=gloo_timeout_s), local, rng, records, jsonl)
        if netns:
            from malleparsl.testbed import NetnsTestbed

            with NetnsTestbed(pool) as bed:
                closed &= _run_plan(Rig(os.path.join(root, "netns"), pool, bed=bed,
                                        gloo_timeout_s=max(gloo_timeout_s, COLLECTIVE_TIMEOUT_S)),
                                    netns, rng, records, jsonl)
    except KeyboardInterrupt:
        log.warning("interrupted after %d faults; summarising those", len(records))
    return summarize(records, closed, time.monotonic() - t_start)


def _run_plan(rig: Rig, plan: list[str], rng: random.Random, records: list[dict[str, Any]],
              jsonl: str) -> bool:
    """Inject ``plan``'s faults on ``rig``, appending to ``records``; close the rig. Returns
    ``False`` when its shutdown hung."""
    if not rig.has_tmpfs and "disk-full" in plan:
        log.warning("cannot mount a tmpfs (not root?): disk-full faults are left out")
        plan = [p for p in plan if p != "disk-full"]
    try:
        i = attempt = 0
        while i < len(plan):
            fault = get_fault(plan[i])
            attempt += 1
            rec = run_one(rig, fault, attempt, rng)
            if rec is None:  # the job finished first: try again (not counted)
                continue
            if fault.kills_executor:
                _after_executor_fault(rig, rec)
            records.append(rec)
            with open(jsonl, "a") as fh:
                fh.write(json.dumps(rec) + "\n")
            log.info("fault %d/%d %s: %s", i + 1, len(plan), rec["fault"], rec)
            i += 1
            rig.top_up()
    finally:
        closed = rig.close()
    return closed


def summarize(records: list[dict[str, Any]], closed: bool, wall_s: float) -> dict[str, Any]:
    by: dict[str, list[dict[str, Any]]] = {}
    for r in records:
        by.setdefault(r["fault"], []).append(r)
    return {
        "injected": len(records),
        "survived": sum(r["survived"] for r in records),
        "results_lost": sum(r["result_lost"] for r in records),
        "hangs": sum(r["hang"] for r in records) + (0 if closed else 1),
        "recovery_median_s": {
            k: round(statistics.median(t), 2) if t else None
            for k, v in sorted(by.items())
            for t in [[r["recovery_s"] for r in v if r["recovery_s"] is not None]]
        },
        "per_fault": {k: {"injected": len(v), "survived": sum(r["survived"] for r in v),
                          "recovery_s": [None if r["recovery_s"] is None
                                         else round(r["recovery_s"], 2) for r in v]}
                      for k, v in sorted(by.items())},
        "failures": [r for r in records if not r["survived"]][:10],
        "wall_s": round(wall_s, 1),
    }


def bench_faults(
    json_out: bool = typer.Option(False, "--json", help="Print one JSON line."),
    faults: int = typer.Option(104, "--faults", help="Faults to inject (>= 1)."),
    quick: bool = typer.Option(False, "--quick", help="One of each fault only."),
    only: str = typer.Option("", help="Comma-separated fault names (default: all)."),
    seed: int = typer.Option(0, help="Seed of the fault order and moments."),
    pool: int = typer.Option(4, help="Emulated nodes kept ready (>= 3); for cut-link, the "
                             "test bed's hosts."),
) -> None:
    """Fault injection on real processes: killed, hung and cancelled nodes, a killed
    interchange, damaged checkpoints, a full disk, solver time limits, a cut host link
    (network namespaces: root)."""
    from malleparsl.errors import SpecError

    names = [n.strip() for n in only.split(",") if n.strip()] or sorted(FAULTS)
    for n in names:
        get_fault(n)  # unknown names: one clear error listing the valid ones
    if faults < 1:
        raise SpecError(f"--faults must be >= 1, got {faults!r}")
    if pool < 3:
        raise SpecError(f"--pool must be >= 3 (jobs run on up to 3 nodes), got {pool!r}")
    logging.getLogger("parsl").propagate = False
    out = run_bench(faults=len(names) if quick else faults, names=names, seed=seed, pool=pool)
    if json_out:
        print(json.dumps(out))
    else:
        print(json.dumps({k: v for k, v in out.items() if k != "failures"}, indent=2))
