"""Facility configs: each builds, rejects bad arguments clearly, and renders the batch script its
provider would submit — checked as text, with a recording fake instead of a scheduler."""

from __future__ import annotations

import re

import pytest

from malleparsl.errors import SpecError
from malleparsl.executors import MalleableExecutor
from malleparsl.scavenger.shell import CommandResult
from malleparsl.site_configs.aurora import aurora_config
from malleparsl.site_configs.common import render_pilot_script
from malleparsl.site_configs.frontier import frontier_config
from malleparsl.site_configs.local import local_config
from malleparsl.site_configs.perlmutter import perlmutter_config
from malleparsl.site_configs.polaris import polaris_config
from malleparsl.site_configs.slurm_scavenger import slurm_scavenger_config


class FakeScheduler:
    """Answers scheduler commands like a facility would; records every command."""

    def __init__(self) -> None:
        self.commands: list[str] = []

    def __call__(self, argv: list[str]) -> CommandResult:
        assert isinstance(argv, list), f"commands are argument lists, got {argv!r}"
        cmd = " ".join(argv)
        self.commands.append(cmd)
        if cmd.startswith("qsub"):
            return CommandResult(0, "4242.polaris-pbs-01\n", "")
        if cmd.startswith("sbatch"):
            return CommandResult(0, "Submitted batch job 4242\n", "")
        if cmd.startswith("scontrol show partition"):
            return CommandResult(0, "PartitionName=batch PreemptMode=REQUEUE State=UP\n", "")
        if cmd.startswith("sacctmgr"):
            return CommandResult(0, "preempt|requeue\n", "")
        return CommandResult(0, "", "")


def _build(fn, **kw):
    fake = FakeScheduler()
    cfg = fn(run=fake, **kw)
    return cfg, fake


def test_rendering_a_script_leaves_no_run_directory_behind(tmp_path, monkeypatch):
    """Every render made a scratch run directory and kept it (five per test run piled up)."""
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    cfg, _ = _build(polaris_config, account="MyProject", node_cap=4, run_dir=str(tmp_path / "r"))
    assert "#PBS" in render_pilot_script(cfg, node="x3005c0s7b0n0")
    assert not list(tmp_path.glob("malleparsl-render-*"))


def test_polaris_script_has_pbs_directives_gpu_binding_and_worker_launch(tmp_path):
    cfg, fake = _build(polaris_config, account="MyProject", node_cap=4, run_dir=str(tmp_path))
    ex = cfg.executors[0]
    assert isinstance(ex, MalleableExecutor) and ex.max_workers_per_node == 4 and ex.encrypted
    ctl = ex.control_options  # one rank per A100, each bound through CUDA_VISIBLE_DEVICES
    assert ctl.ranks_per_node == 4 and ctl.accelerators == ("0", "1", "2", "3")
    assert ctl.device_env_var == "CUDA_VISIBLE_DEVICES" and ctl.socket_ifname == "hsn0"
    assert ctl.rank_env(2) == {"CUDA_VISIBLE_DEVICES": "2", "GLOO_SOCKET_IFNAME": "hsn0",
                               "NCCL_SOCKET_IFNAME": "hsn0"}
    assert ex.address  # the interchange and store address nodes dial, never "all interfaces"
    script = render_pilot_script(cfg, node="x3005c0s7b0n0")
    qsub = [c for c in fake.commands if c.startswith("qsub")]
    assert len(qsub) == 1 and "-A MyProject" in qsub[0] and "-q preemptable" in qsub[0]
    assert "#PBS -l filesystems=home:eagle" in script
    assert re.search(r"#PBS -l select=1:ncpus=64:ngpus=4:host=x3005c0s7b0n0", script), script
    assert "#PBS -l walltime=01:00:00" in script
    assert "export CUDA_VISIBLE_DEVICES=0,1,2,3" in script
    assert "mpiexec" in script and "--ppn 1" in script
    assert "process_worker_pool.py" in script and "--max_workers_per_node=4" in script


def test_aurora_script_exposes_twelve_tiles(tmp_path):
    cfg, _ = _build(
        aurora_config, account="MyProject", queue="preemptable", run_dir=str(tmp_path)
    )
    script = render_pilot_script(cfg, node="x4102c5s2b0n0")
    assert "#PBS -l filesystems=home:flare" in script
    assert "export ZE_AFFINITY_MASK=0,1,2,3,4,5,6,7,8,9,10,11" in script
    assert "host=x4102c5s2b0n0" in script


def test_perlmutter_script_uses_preempt_qos_and_gpu_constraint(tmp_path):
    cfg, fake = _build(perlmutter_config, account="m1234_g", run_dir=str(tmp_path))
    script = render_pilot_script(cfg, node="nid001234")
    assert "#SBATCH --qos=preempt" in script or "--qos=preempt" in " ".join(fake.commands)
    assert "#SBATCH --account=m1234_g" in script
    assert "#SBATCH --constraint=gpu" in script and "#SBATCH --gpus-per-node=4" in script
    assert "--nodelist=nid001234" in script or "nid001234" in " ".join(fake.commands)
    assert "export CUDA_VISIBLE_DEVICES=0,1,2,3" in script
    assert "srun" in script and "process_worker_pool.py" in script


def test_frontier_script_exposes_eight_gcds(tmp_path):
    cfg, _ = _build(
        frontier_config, account="abc123", allow_nonpreemptible=True, run_dir=str(tmp_path)
    )
    script = render_pilot_script(cfg, node="frontier00042")
    assert "#SBATCH --partition=batch" in script
    assert "#SBATCH --gpus-per-node=8" in script
    assert "export ROCR_VISIBLE_DEVICES=0,1,2,3,4,5,6,7" in script
    ctl = cfg.executors[0].control_options
    assert ctl.ranks_per_node == 8 and ctl.resolved_backend() == "nccl"


@pytest.mark.parametrize(
    ("fn", "kw", "var", "backend"),
    [
        (polaris_config, {"account": "P"}, "CUDA_VISIBLE_DEVICES", "nccl"),
        (aurora_config, {"account": "P", "queue": "preemptable"}, "ZE_AFFINITY_MASK", "xccl"),
        (perlmutter_config, {"account": "P"}, "CUDA_VISIBLE_DEVICES", "nccl"),
    ],
)
def test_one_rank_per_node_and_site_address_and_interface(fn, kw, var, backend):
    cfg, _ = _build(fn, ranks_per_node=1, interface="ib0", address="10.0.0.7", **kw)
    ex = cfg.executors[0]
    ctl = ex.control_options
    assert ex.max_workers_per_node == 1 and ctl.ranks_per_node == 1 and ctl.accelerators == ()
    assert ex.address == "10.0.0.7" and ctl.socket_ifname == "ib0" and ctl.device_env_var == var
    cfg, _ = _build(fn, **kw)
    assert cfg.executors[0].control_options.resolved_backend() == backend


def test_more_ranks_than_accelerators_is_refused():
    with pytest.raises(SpecError, match="ranks_per_node=5 exceeds the 4 accelerators"):
        _build(polaris_config, account="P", ranks_per_node=5)


@pytest.mark.parametrize(
    ("fn", "kw", "fragment"),
    [
        (polaris_config, {"account": "P", "walltime": "1h"}, "walltime must be HH:MM:SS"),
        (polaris_config, {"account": "P", "walltime": "00:00:00"}, "longer than zero"),
        (polaris_config, {"account": "P", "node_cap": 0}, "node_cap must be an integer >= 1"),
        (polaris_config, {"account": "P", "queue": "prod"}, "not known to be preemptable"),
        (polaris_config, {"account": ""}, "account must name"),
        (aurora_config, {"account": "P", "queue": "debug"}, "not known to be preemptable"),
        (perlmutter_config, {"account": "m1", "gpus_per_node": 0}, "gpus_per_node"),
        (frontier_config, {"account": "a", "gcds_per_node": -8}, "gcds_per_node"),
    ],
)
def test_bad_arguments_get_clear_errors(fn, kw, fragment):
    with pytest.raises(SpecError, match=fragment):
        fn(run=FakeScheduler(), **kw)


def test_frontier_batch_partition_without_consent_is_refused_before_any_pilot(tmp_path):
    fake = FakeScheduler()
    fake_nonpreempt = lambda cmd: (  # noqa: E731
        CommandResult(0, "PartitionName=batch PreemptMode=OFF State=UP\n", "")
        if cmd[0] == "scontrol" else fake(cmd)
    )
    cfg = frontier_config(account="abc123", run=fake_nonpreempt, run_dir=str(tmp_path))
    with pytest.raises(SpecError, match="preempt"):
        render_pilot_script(cfg, node="frontier00042")
    assert not any(c.startswith("sbatch") for c in fake.commands)


@pytest.mark.parametrize(
    ("fn", "kw", "fragment"),
    [
        (local_config, {"node": 4}, r"local_config\(\) got an unknown parameter 'node'; did you mean 'nodes'\?"),
        (polaris_config, {"account": "P", "nodes_max": 3}, r"polaris_config\(\) .* 'nodes_max'; did you mean 'node_cap'\?"),
        (perlmutter_config, {"account": "m1", "max_nodes": 3}, r"perlmutter_config\(\) .* 'max_nodes'; max_nodes is an option of @malleable_app"),
        (slurm_scavenger_config, {"partition": "p", "nodecap": 3}, r"slurm_scavenger_config\(\) .* did you mean 'node_cap'\?"),
    ],
)
def test_a_mistyped_parameter_names_the_config_not_htex(fn, kw, fragment):
    # before: TypeError from deep inside, "HighThroughputExecutor.__init__() got an unexpected
    # keyword argument 'node'", which names neither the config nor what was meant
    with pytest.raises(SpecError, match=fragment):
        fn(**kw)


def test_executor_keywords_still_pass_through(tmp_path):
    cfg = local_config(nodes=0, policy="hold", run_dir=str(tmp_path))
    assert cfg.executors[0].policy == "hold"
