"""NERSC Perlmutter (Slurm, 4 NVIDIA A100 per GPU node): scavenge through the ``preempt`` QOS.

Facts used (NERSC documentation; check current limits): Slurm with ``-A <project>`` (GPU
allocations are charged to the project's GPU account, often ``<project>_g``), ``-C gpu`` for the
GPU nodes, and a ``preempt`` QOS whose jobs may be preempted after a guaranteed minimum run time
(two hours when this was written) — so a pilot there is not taken back instantly, and short
pilot walltimes waste less. Pilots are one exclusive node each.

One rank runs per node and sees all four GPUs; ``ctx.device`` is ``cuda:0``.
"""

from __future__ import annotations

from typing import Any

from parsl.config import Config

from malleparsl.scavenger.shell import Runner
from malleparsl.site_configs.common import check_positive, slurm_facility

DEFAULT_WORKER_INIT = (
    "module load pytorch; source ~/malleparsl-env/bin/activate  # YOUR environment"
)


def perlmutter_config(
    *,
    account: str,
    qos: str = "preempt",
    constraint: str = "gpu",
    node_cap: int = 16,
    walltime: str = "02:00:00",
    worker_init: str = DEFAULT_WORKER_INIT,
    gpus_per_node: int = 4,
    query_period_s: float = 60.0,
    allow_nonpreemptible: bool = False,
    run: Runner | None = None,
    run_dir: str | None = None,
    **executor_options: Any,
) -> Config:
    """A Parsl ``Config`` scavenging Perlmutter GPU nodes for malleable training.

    Parameters
    ----------
    account : the NERSC project to charge (``--account``), e.g. ``"m1234_g"``.
    qos : ``preempt`` to scavenge; checked with ``sacctmgr`` before the first pilot.
    constraint : node type (``gpu`` or ``cpu``).
    gpus_per_node : ``--gpus-per-node`` and the GPUs exposed to the rank.
    node_cap, walltime, worker_init, query_period_s, run, **executor_options : as for
        :func:`~malleparsl.site_configs.slurm_scavenger.slurm_scavenger_config`.
    """
    check_positive("gpus_per_node", gpus_per_node)
    return slurm_facility(
        account=account, partition=None, qos=qos, node_cap=node_cap, walltime=walltime,
        worker_init=worker_init, gpu_var="CUDA_VISIBLE_DEVICES", gpus=gpus_per_node,
        scheduler_options=f"#SBATCH --constraint={constraint}\n#SBATCH --gpus-per-node={gpus_per_node}",
        query_period_s=query_period_s, allow_nonpreemptible=allow_nonpreemptible, run=run,
        run_dir=run_dir, **executor_options,
    )
