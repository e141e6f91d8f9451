"""site_configs.slurm_scavenger builds a working Config without touching a scheduler."""

from __future__ import annotations

import pytest

from malleparsl.errors import SpecError
from malleparsl.scavenger.shell import CommandResult
from malleparsl.scavenger.slurm import SlurmScavenger
from malleparsl.scavenger.slurm_provider import ScavengingSlurmProvider
from malleparsl.site_configs.slurm_scavenger import slurm_scavenger_config


def _no_scheduler(argv: list[str]) -> CommandResult:
    assert isinstance(argv, list), f"commands are argument lists, got {argv!r}"
    cmd = " ".join(argv)
    if cmd.startswith("sacct"):  # SlurmProvider probes accounting when built
        return CommandResult(1, "", "Slurm accounting storage is disabled")
    raise AssertionError(f"building a config must not run {cmd!r}")


def test_config_wires_provider_scavenger_and_executor():
    cfg = slurm_scavenger_config(qos="preempt", partition=None, account="YOUR_ACCOUNT",
                                 node_cap=16, walltime="00:20:00", worker_init="source env",
                                 query_period_s=45, run=_no_scheduler, policy="greedy")
    (ex,) = cfg.executors
    prov, src = ex.provider, ex.node_source
    assert isinstance(prov, ScavengingSlurmProvider) and isinstance(src, SlurmScavenger)
    assert src.provider is prov and src.node_cap == 16 and src.query_period_s == 45
    assert prov.nodes_per_block == 1 and prov.node_cap == 16 and prov.max_blocks == 16
    assert "--qos=preempt" in prov.scheduler_options
    assert "--account=YOUR_ACCOUNT" in prov.scheduler_options
    assert "--partition" not in prov.scheduler_options
    assert prov.walltime == "00:20:00" and prov.worker_init.startswith("source env")
    assert cfg.strategy == "none" and ex.policy == "greedy" and ex.max_workers_per_node == 1


def test_bad_values_are_refused_with_the_fix():
    with pytest.raises(SpecError, match="node_cap must be an integer >= 1, got 0"):
        slurm_scavenger_config(node_cap=0, run=_no_scheduler)
    with pytest.raises(SpecError, match="partition= or qos="):
        slurm_scavenger_config(partition=None, run=_no_scheduler)
    with pytest.raises(SpecError, match="query_period_s must be >= 0"):
        slurm_scavenger_config(query_period_s=-1, run=_no_scheduler)
