"""A laptop-sized malleparsl: N emulated nodes on this machine.

Each emulated node is one Parsl block started through ``LocalProvider`` — a separate process
group holding one HTEX manager and its workers — so nodes start, die and are released
independently, exactly as pilot jobs do at a facility. Everything binds to 127.0.0.1.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from parsl.config import Config
from parsl.launchers import SimpleLauncher
from parsl.providers import LocalProvider

from malleparsl.errors import SpecError
from malleparsl.executors.executor import MalleableExecutor
from malleparsl.site_configs.common import site_config


@site_config(facility=False)
def local_config(*, nodes: int = 4, run_dir: str | None = None, **executor_options: Any) -> Config:
    """A Parsl ``Config`` with one :class:`MalleableExecutor` over ``nodes`` emulated nodes.

    Parameters
    ----------
    nodes : emulated nodes (``node-00`` ...) started with the executor. ``0`` starts none: add
        them later with ``executor.add_node(name)`` or through a ``node_source``.
    run_dir : Parsl's run directory (logs, submit scripts); Parsl's default ``runinfo`` if None.
    **executor_options : passed to :class:`MalleableExecutor` (``policy``, ``ckpt_root``,
        ``warm_modules``, ``max_workers_per_node``, heartbeats, ...).

    Examples
    --------
    >>> import parsl                                            # doctest: +SKIP
    >>> from malleparsl.site_configs.local import local_config  # doctest: +SKIP
    >>> parsl.load(local_config(nodes=4))                       # doctest: +SKIP
    """
    if isinstance(nodes, bool) or not isinstance(nodes, int) or nodes < 0:
        raise SpecError(f"nodes must be an integer >= 0, got {nodes!r}; e.g. local_config(nodes=4)")
    options: dict[str, Any] = {
        "label": "malleable",
        "address": "127.0.0.1",  # loopback only: nothing listens on the network
        "max_workers_per_node": 1,  # one emulated node runs one rank at a time
        "heartbeat_period": 1,  # a killed node is noticed within ~heartbeat_threshold s
        "heartbeat_threshold": 5,
        "poll_period": 10,  # ms; HTEX's default
        "encrypted": True,
        "provider": LocalProvider(
            init_blocks=0,  # the executor starts nodes by name, not Parsl's strategy
            min_blocks=0,
            max_blocks=max(nodes, 1) * 64,
            nodes_per_block=1,
            launcher=SimpleLauncher(),
            worker_init=f"export PATH={os.path.dirname(sys.executable)}:$PATH",
        ),
        "nodes": nodes,
    }
    options.update(executor_options)
    extra: dict[str, Any] = {"run_dir": run_dir} if run_dir is not None else {}
    return Config(executors=[MalleableExecutor(**options)], strategy="none", **extra)
