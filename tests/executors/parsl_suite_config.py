"""Config module for running Parsl's own test suite against MalleableExecutor.

``pytest <site-packages>/parsl/tests --config tests/executors/parsl_suite_config.py``: the same
shape as Parsl's ``htex_local`` test config (one node, as many workers as cores, encrypted ZMQ,
``strategy='none'``), with the executor swapped for MalleableExecutor, control loop included.
"""

from __future__ import annotations

from parsl.config import Config

from malleparsl.site_configs.local import local_config


def fresh_config() -> Config:
    return local_config(
        nodes=1,
        label="htex_local",
        max_workers_per_node=None,  # as many workers as cores, like Parsl's htex_local config
        cores_per_worker=1,
        worker_debug=True,
    )
