"""NERSC Perlmutter (Slurm, 4 NVIDIA A100 per GPU node): scavenge through the ``preempt`` QOS.

Facts used (NERSC documentation; check current limits): Slurm with ``-A <project>`` (GPU
allocations are charged to the project's GPU account, often ``<project>_g``), ``-C gpu`` for the
GPU nodes, and a ``preempt`` QOS whose jobs may be preempted after a guaranteed minimum run time
(two hours when this was written) — so a pilot there is not taken back instantly, and short
pilot walltimes waste less. Pilots are one exclusive node each.

Ranks: one per accelerator by default (``ranks_per_node`` = the four A100s), local rank ``i``
bound to accelerator ``i`` through ``CUDA_VISIBLE_DEVICES`` (the backend is ``nccl`` on CUDA and ROCm,
``xccl`` on Intel GPUs, gloo on CPU); ``ranks_per_node=1`` gives one rank all of them.
Addressing: the interchange and the rendezvous store listen on ``address`` (default: the login
node's hostname address); ranks run gloo/NCCL over ``interface``, default ``hsn0`` (Slingshot 11; GPU nodes have ``hsn0``..``hsn3``).
**Uncertain**: the interface name and whether compute nodes reach the login node's hostname
address are from public documentation, not tested there; check ``ip addr`` on a compute node
and pass ``interface=`` / ``address=`` (e.g. ``parsl.addresses.address_by_interface(...)``).
"""

from __future__ import annotations

from typing import Any

from parsl.config import Config

from malleparsl.scavenger.shell import Runner
from malleparsl.site_configs.common import check_positive, site_config, slurm_facility

DEFAULT_WORKER_INIT = (
    "module load pytorch; source ~/malleparsl-env/bin/activate  # YOUR environment"
)


@site_config()
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
    ranks_per_node: int | None = None,
    interface: str | None = "hsn0",
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
        run_dir=run_dir,
        ranks_per_node=ranks_per_node, interface=interface, **executor_options,
    )
