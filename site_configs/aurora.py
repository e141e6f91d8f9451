"""ALCF Aurora (PBS Pro, 6 Intel Data Center GPU Max per node = 12 tiles).

Facts used (ALCF user guide): PBS Pro with ``-A <project>`` and a mandatory
``-l filesystems=...`` (``home:flare``), ``mpiexec`` as the launcher, the ``frameworks`` module
for PyTorch with Intel GPU support, and Level Zero's ``ZE_AFFINITY_MASK`` to expose GPUs or
tiles. **Uncertain**: we know of no documented preemptable queue on Aurora at the time of
writing, so ``queue`` has no default: name a preemptable queue if the facility offers one,
or a queue you may use with ``allow_nonpreemptible=True`` (then pilots are ordinary jobs and
are not taken back by the scheduler).

Ranks: one per accelerator by default (``ranks_per_node`` = the twelve tiles), local rank ``i``
bound to accelerator ``i`` through ``ZE_AFFINITY_MASK`` (the backend is ``nccl`` on CUDA and ROCm,
``xccl`` on Intel GPUs, gloo on CPU); ``ranks_per_node=1`` gives one rank all of them.
Addressing: the interchange and the rendezvous store listen on ``address`` (default: the login
node's hostname address); ranks run gloo/NCCL over ``interface``, default ``hsn0`` (Slingshot 11; nodes have ``hsn0``..``hsn7``).
**Uncertain**: the interface name and whether compute nodes reach the login node's hostname
address are from public documentation, not tested there; check ``ip addr`` on a compute node
and pass ``interface=`` / ``address=`` (e.g. ``parsl.addresses.address_by_interface(...)``).
"""

from __future__ import annotations

from typing import Any

from parsl.config import Config

from malleparsl.errors import SpecError
from malleparsl.scavenger.shell import Runner
from malleparsl.site_configs.common import check_positive, pbs_facility, site_config

DEFAULT_WORKER_INIT = (
    "module load frameworks; source ~/malleparsl-env/bin/activate  # YOUR environment"
)
TILES_PER_NODE = 12


@site_config()
def aurora_config(
    *,
    account: str,
    queue: str,
    node_cap: int = 8,
    walltime: str = "01:00:00",
    worker_init: str = DEFAULT_WORKER_INIT,
    tiles_per_node: int = TILES_PER_NODE,
    filesystems: str = "home:flare",
    query_period_s: float = 60.0,
    allow_nonpreemptible: bool = False,
    run: Runner | None = None,
    run_dir: str | None = None,
    ranks_per_node: int | None = None,
    interface: str | None = "hsn0",
    **executor_options: Any,
) -> Config:
    """A Parsl ``Config`` for malleable training on Aurora nodes.

    Parameters
    ----------
    account : your ALCF project (``#PBS -A``).
    queue : where pilots go; see the module note on preemptable queues.
    node_cap, walltime, worker_init, filesystems, query_period_s, run, **executor_options :
        as for :func:`~malleparsl.site_configs.polaris.polaris_config`.
    tiles_per_node : GPU tiles exposed to the node's rank (``ZE_AFFINITY_MASK=0,...,11``).
    """
    if not isinstance(queue, str) or not queue:
        raise SpecError(f"queue must name a PBS queue, got {queue!r}")
    check_positive("tiles_per_node", tiles_per_node)
    return pbs_facility(
        account=account, queue=queue, node_cap=node_cap, walltime=walltime,
        worker_init=worker_init, cpus_per_node=208, gpu_var="ZE_AFFINITY_MASK",
        gpus=tiles_per_node, filesystems=filesystems, query_period_s=query_period_s,
        allow_nonpreemptible=allow_nonpreemptible, run=run, run_dir=run_dir,
        ranks_per_node=ranks_per_node, interface=interface, **executor_options,
    )
