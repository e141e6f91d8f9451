"""OLCF Frontier (Slurm, 4 AMD MI250X per node = 8 GCDs).

Facts used (OLCF user guide): Slurm with ``-A <project>``, the ``batch`` partition, 8 GCDs per
node exposed through ``ROCR_VISIBLE_DEVICES``, ``srun`` as the launcher, PyTorch on ROCm (RCCL
behind the ``nccl`` backend). **Uncertain**: we know of no documented preemptible partition or
QOS open to all Frontier users at the time of writing; pass one with ``qos=`` if your
allocation has it. Otherwise pilots in ``batch`` are ordinary jobs: that needs
``allow_nonpreemptible=True`` and the jobs are not taken back by the scheduler.

Ranks: one per accelerator by default (``ranks_per_node`` = the eight GCDs), local rank ``i``
bound to accelerator ``i`` through ``ROCR_VISIBLE_DEVICES`` (the backend is ``nccl`` on CUDA and ROCm,
``xccl`` on Intel GPUs, gloo on CPU); ``ranks_per_node=1`` gives one rank all of them.
Addressing: the interchange and the rendezvous store listen on ``address`` (default: the login
node's hostname address); ranks run gloo/NCCL over ``interface``, default ``hsn0`` (Slingshot 11; nodes have ``hsn0``..``hsn3``).
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
    "module load PrgEnv-gnu rocm; source ~/malleparsl-env/bin/activate  # YOUR environment"
)
GCDS_PER_NODE = 8


@site_config()
def frontier_config(
    *,
    account: str,
    partition: str | None = "batch",
    qos: str | None = None,
    node_cap: int = 16,
    walltime: str = "01:00:00",
    worker_init: str = DEFAULT_WORKER_INIT,
    gcds_per_node: int = GCDS_PER_NODE,
    query_period_s: float = 60.0,
    allow_nonpreemptible: bool = False,
    run: Runner | None = None,
    run_dir: str | None = None,
    ranks_per_node: int | None = None,
    interface: str | None = "hsn0",
    **executor_options: Any,
) -> Config:
    """A Parsl ``Config`` for malleable training on Frontier nodes.

    Parameters
    ----------
    account : the OLCF project (``--account``), e.g. ``"abc123"``.
    partition, qos : where pilots go; see the module note on preemption.
    gcds_per_node : GCDs exposed to the node's rank (``ROCR_VISIBLE_DEVICES``).
    node_cap, walltime, worker_init, query_period_s, run, **executor_options : as for
        :func:`~malleparsl.site_configs.slurm_scavenger.slurm_scavenger_config`.
    """
    check_positive("gcds_per_node", gcds_per_node)
    return slurm_facility(
        account=account, partition=partition, qos=qos, node_cap=node_cap, walltime=walltime,
        worker_init=worker_init, gpu_var="ROCR_VISIBLE_DEVICES", gpus=gcds_per_node,
        scheduler_options=f"#SBATCH --gpus-per-node={gcds_per_node}",
        query_period_s=query_period_s, allow_nonpreemptible=allow_nonpreemptible, run=run,
        run_dir=run_dir,
        ranks_per_node=ranks_per_node, interface=interface, **executor_options,
    )
