"""The Slurm preemption end-to-end test across emulated hosts: every ``slurmd`` runs on its own
network namespace (NodeAddr = the host's address), ``slurmctld``, the interchange and the store
on the bridge address; pilots, workers and ranks live on the hosts."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from malleparsl.scavenger.localslurm import LocalSlurm, slurm_installed
from malleparsl.testbed import NetnsTestbed

pytestmark = [pytest.mark.multihost, pytest.mark.slurm, pytest.mark.slow,
              pytest.mark.timeout(1200)]

SCAVENGER_TESTS = Path(__file__).resolve().parents[1] / "scavenger"


@pytest.fixture
def slurm_on_hosts():
    if os.geteuid() != 0 and not os.environ.get("CI"):
        pytest.skip("network namespaces need root (CI runs these as root)")
    if not slurm_installed():
        msg = "Slurm is not installed: run scripts/setup-system.sh"
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(msg)
        pytest.skip(msg)
    with NetnsTestbed(8) as bed:
        cluster = LocalSlurm(nodes=8, kill_wait_s=2, hosts=tuple(bed.hosts),
                             ctld_address=bed.bridge_address)
        cluster.start()
        old = os.environ.get("SLURM_CONF")
        os.environ["SLURM_CONF"] = cluster.env["SLURM_CONF"]  # for pilots launched by Parsl
        try:
            yield cluster, bed
        finally:
            if old is None:
                os.environ.pop("SLURM_CONF", None)
            else:
                os.environ["SLURM_CONF"] = old
            cluster.cleanup()


def test_slurm_nodes_are_separate_hosts(slurm_on_hosts):
    slurm, bed = slurm_on_hosts
    out = slurm.run("srun -N8 -p scavenger ip -4 -o addr show eth0", timeout_s=60).stdout
    seen = {line.split()[3].split("/")[0] for line in out.splitlines() if "inet" in line}
    assert seen == {h.address for h in bed.hosts}


def test_preemption_end_to_end_across_hosts(slurm_on_hosts, tmp_path):
    slurm, bed = slurm_on_hosts
    sys.path.insert(0, str(SCAVENGER_TESTS))  # the e2e test and its training app live there
    try:
        from test_scavenger_slurm_e2e import run_preemption_e2e

        # 8 slurmds, 5 pilots and their ranks: on a loaded 2-core machine steps slow down,
        # so the job gets longer to finish than on loopback
        run_preemption_e2e(slurm, tmp_path, address=bed.bridge_address,
                           socket_ifname=bed.ifname, stall_s=300)
    finally:
        sys.path.remove(str(SCAVENGER_TESTS))
