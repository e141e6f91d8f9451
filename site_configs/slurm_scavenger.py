"""Scavenge idle nodes of any Slurm site: preemptible one-node pilots, a node cap, fast notice.

One function, :func:`slurm_scavenger_config`, returns a Parsl ``Config`` whose
:class:`~malleparsl.executors.executor.MalleableExecutor` gets its nodes from a
:class:`~malleparsl.scavenger.slurm.SlurmScavenger`: idle nodes of the partition become
pilots (one node each, pinned, preemptible partition or QOS only), a preempted pilot shrinks
the jobs on it from their last checkpoint, and nodes come back when the scheduler frees them.

Fill in the placeholders for your site: a partition or QOS the facility lets you preempt
(Perlmutter: ``qos="preempt"``; many campus clusters: ``partition="scavenger"``), your
account, and ``worker_init`` that activates the environment with malleparsl installed.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from parsl.config import Config
from parsl.launchers import SimpleLauncher

from malleparsl.errors import SpecError
from malleparsl.scavenger.shell import Runner
from malleparsl.scavenger.slurm import SlurmScavenger
from malleparsl.scavenger.slurm_provider import ScavengingSlurmProvider
from malleparsl.scavenger.values import walltime as check_walltime
from malleparsl.site_configs.common import (  # noqa: F401
    facility_config,
    jobs_demand,
    nodes_in_use,
    site_config,
)


@site_config()
def slurm_scavenger_config(
    *,
    partition: str | None = "scavenger",
    qos: str | None = None,
    account: str | None = None,  # "YOUR_ACCOUNT" at a facility
    node_cap: int = 8,
    walltime: str = "00:30:00",
    worker_init: str | None = None,
    query_period_s: float = 30.0,
    min_idle_s: float = 0.0,
    address: str | None = None,
    allow_nonpreemptible: bool = False,
    run_dir: str | None = None,
    run: Runner | None = None,
    scavenger_options: dict[str, Any] | None = None,
    **executor_options: Any,
) -> Config:
    """A Parsl ``Config`` that trains malleable jobs on a Slurm site's idle nodes.

    Parameters
    ----------
    partition, qos : where pilots go; must be preemptible (checked with ``scontrol`` /
        ``sacctmgr`` at the first submission), unless ``allow_nonpreemptible=True``.
    account : charged for the pilots (``--account``).
    node_cap : most nodes held at once; the scavenger never asks for more.
    walltime : per pilot; a pilot reaching it is just another lost node, and its node may be
        scavenged again. Short walltimes fit backfill windows better.
    worker_init : shell lines run on the node before the worker pool (default: put this
        Python's ``bin`` first on PATH, right when the compute nodes share the filesystem).
    query_period_s : least time between Slurm queries (``sinfo``/``squeue``): 30-60 s is polite
        at a facility; preemption is still noticed within a poll through the pilots' SIGTERM
        marker files. Use ~1 s on a private test cluster.
    min_idle_s : do not scavenge a node the scheduler wants back sooner than this.
    address : where workers reach the interchange (default: HTEX's own guess; 127.0.0.1 for
        a local Slurm).
    run : the shell runner for Slurm commands (tests point it at a private cluster).
    scavenger_options : more :class:`SlurmScavenger` arguments (``claim_timeout_s``,
        ``return_after_s``, ...). By default the scavenger holds only as many nodes as the
        unfinished jobs can use (their ``max_nodes`` summed, up to ``node_cap``) and returns
        unused surplus nodes after ``return_after_s`` (30 s).
    **executor_options : passed to :class:`MalleableExecutor` (``policy``, ``ckpt_root``,
        ``warm_modules``, heartbeats, ...).

    Examples
    --------
    >>> import parsl                                                       # doctest: +SKIP
    >>> from malleparsl.site_configs.slurm_scavenger import slurm_scavenger_config
    >>> parsl.load(slurm_scavenger_config(qos="preempt", partition=None,   # doctest: +SKIP
    ...            account="YOUR_ACCOUNT", node_cap=16,
    ...            worker_init="module load python; source ~/mp-env/bin/activate"))
    """
    if isinstance(node_cap, bool) or not isinstance(node_cap, int) or node_cap < 1:
        raise SpecError(f"node_cap must be an integer >= 1, got {node_cap!r}")
    check_walltime(walltime)  # e.g. "1h" is not one: say so before Slurm does, mid-run
    if worker_init is None:
        worker_init = f"export PATH={os.path.dirname(sys.executable)}:$PATH"
    provider = ScavengingSlurmProvider(
        partition=partition,
        qos=qos,
        account=account,
        node_cap=node_cap,
        walltime=walltime,
        worker_init=worker_init,
        allow_nonpreemptible=allow_nonpreemptible,
        exclusive=True,  # a pilot owns its whole node: ranks are one per node
        launcher=SimpleLauncher(),  # one worker pool per pilot; the pool starts the workers
        run=run,
    )
    source = SlurmScavenger(
        provider=provider,
        query_period_s=query_period_s,
        min_idle_s=min_idle_s,
        **(scavenger_options or {}),
    )
    if address is not None:
        executor_options.setdefault("address", address)
    return facility_config(
        provider=provider, node_source=source, run_dir=run_dir, **executor_options
    )
