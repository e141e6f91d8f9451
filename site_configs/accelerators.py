"""Memory of one accelerator per facility: the budget a rank's execution plan must fit.

Pass it as the malleable option ``rank_memory_bytes`` so the driver picks plans that fit (see
docs/plans.md): a node runs one rank per accelerator (``ranks_per_node``, e.g. Polaris' four
A100s), so its budget is ``ranks_per_node x rank_memory_bytes`` and every rank's predicted peak
must fit its own accelerator. Not as ``node_memory_bytes``, which is the whole node's budget
and would give each of the four ranks a quarter of one A100. Locally, give the emulated node's
budget yourself (``node_memory_bytes``, or ``rank_memory_bytes`` with ``ranks_per_node``).

>>> from malleparsl.site_configs.accelerators import accelerator_memory_bytes
>>> accelerator_memory_bytes("polaris") // 2**30
40
>>> opts = {"rank_memory_bytes": accelerator_memory_bytes("polaris")}  # malleable options
"""

from __future__ import annotations

from malleparsl.errors import unknown_name

GIB = 2**30

ACCELERATOR_MEMORY: dict[str, int] = {
    "polaris": 40 * GIB,  # NVIDIA A100 40 GB (4 per node)
    "perlmutter": 40 * GIB,  # A100 40 GB (the 80 GB nodes are a separate constraint)
    "aurora": 64 * GIB,  # Intel Data Center GPU Max 1550: 128 GB per GPU, 2 tiles of 64 GB
    "frontier": 64 * GIB,  # AMD MI250X: 128 GB per module, 2 GCDs of 64 GB
    "summit": 16 * GIB,  # NVIDIA V100 16 GB (the trace the simulator replays)
}


def accelerator_memory_bytes(site: str) -> int:
    """Bytes of memory per accelerator (per rank) at ``site``."""
    if site not in ACCELERATOR_MEMORY:
        raise unknown_name("site", site, ACCELERATOR_MEMORY)
    return ACCELERATOR_MEMORY[site]
