"""ALCF Polaris (PBS Pro, 4 NVIDIA A100 per node): scavenge through the ``preemptable`` queue.

Facts used (ALCF user guide; check the current queue limits before large runs): PBS Pro with
``-A <project>``, a mandatory ``-l filesystems=...`` resource, 64 CPU cores and 4 A100 GPUs per
node, ``mpiexec`` (Cray PALS) as the launcher, and a ``preemptable`` queue whose jobs the
``demand`` queue may preempt. The per-job node limit of ``preemptable`` (10 nodes when this was
written) does not bind us — every pilot is one node — but the per-user job limit does: keep
``node_cap`` at or under it.

Ranks: one per accelerator by default (``ranks_per_node`` = the four A100s), local rank ``i``
bound to accelerator ``i`` through ``CUDA_VISIBLE_DEVICES`` (the backend is ``nccl`` on CUDA and ROCm,
``xccl`` on Intel GPUs, gloo on CPU); ``ranks_per_node=1`` gives one rank all of them.
Addressing: the interchange and the rendezvous store listen on ``address`` (default: the login
node's hostname address); ranks run gloo/NCCL over ``interface``, default ``hsn0`` (Slingshot; Polaris nodes have ``hsn0`` and ``hsn1``).
**Uncertain**: the interface name and whether compute nodes reach the login node's hostname
address are from public documentation, not tested there; check ``ip addr`` on a compute node
and pass ``interface=`` / ``address=`` (e.g. ``parsl.addresses.address_by_interface(...)``).
"""

from __future__ import annotations

from typing import Any

from parsl.config import Config

from malleparsl.scavenger.shell import Runner
from malleparsl.site_configs.common import check_positive, pbs_facility, site_config

DEFAULT_WORKER_INIT = (
    "module use /soft/modulefiles; module load conda; conda activate base; "
    "source ~/malleparsl-env/bin/activate  # YOUR environment with malleparsl installed"
)


@site_config()
def polaris_config(
    *,
    account: str,
    queue: str = "preemptable",
    node_cap: int = 10,
    walltime: str = "01:00:00",
    worker_init: str = DEFAULT_WORKER_INIT,
    gpus_per_node: int = 4,
    filesystems: str = "home:eagle",
    query_period_s: float = 60.0,
    allow_nonpreemptible: bool = False,
    run: Runner | None = None,
    run_dir: str | None = None,
    ranks_per_node: int | None = None,
    interface: str | None = "hsn0",
    **executor_options: Any,
) -> Config:
    """A Parsl ``Config`` scavenging Polaris nodes for malleable training.

    Parameters
    ----------
    account : your ALCF project (``#PBS -A``); ``"YOUR_PROJECT"`` in templates.
    queue : ``preemptable`` to scavenge; another queue needs ``allow_nonpreemptible=True``.
    node_cap : most one-node pilots held at once (stay within the queue's per-user job limit).
    walltime : per pilot, ``HH:MM:SS``; a pilot that ends is just a lost node.
    worker_init : shell lines that activate an environment with malleparsl installed.
    gpus_per_node : GPUs requested per node (``ngpus``) and exposed to the rank.
    filesystems : the mandatory ``-l filesystems=`` value (e.g. ``home:eagle:grand``).
    query_period_s : least time between ``pbsnodes``/``qstat`` queries (be polite: >= 30 s).
    run : runner for PBS commands (tests pass a recording fake).
    ranks_per_node : ranks per node, each bound to one accelerator (default: one per
        accelerator; 1: one rank sees them all).
    interface : the compute nodes' network interface for gloo/NCCL (see the module note).
    **executor_options : more :class:`MalleableExecutor` arguments (``policy``, ``ckpt_root`` on
        a shared filesystem, ...).
    """
    check_positive("gpus_per_node", gpus_per_node)
    return pbs_facility(
        account=account, queue=queue, node_cap=node_cap, walltime=walltime,
        worker_init=worker_init, cpus_per_node=64, gpu_var="CUDA_VISIBLE_DEVICES",
        gpus=gpus_per_node, select_options=f"ngpus={gpus_per_node}", filesystems=filesystems,
        query_period_s=query_period_s, allow_nonpreemptible=allow_nonpreemptible, run=run,
        run_dir=run_dir,
        ranks_per_node=ranks_per_node, interface=interface, **executor_options,
    )
