"""The live-Slurm fixture: a real Slurm 22.05 with 8 emulated nodes, one per test session.

``slurm`` hands each test the session's cluster with no jobs left and every node idle. Without
Slurm installed the tests skip locally but FAIL in CI (``CI=true``): CI must run them
(``scripts/setup-system.sh`` installs the packages).
"""

from __future__ import annotations

import os

import pytest

from malleparsl.scavenger.localslurm import LocalSlurm, slurm_installed


@pytest.fixture(scope="session")
def slurm_cluster():
    if not slurm_installed():
        msg = ("Slurm is not installed: run scripts/setup-system.sh "
               "(apt-get install -y slurmctld slurmd slurm-client)")
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(msg)
        pytest.skip(msg)
    cluster = LocalSlurm(nodes=8, kill_wait_s=2)
    cluster.start()
    old = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = cluster.env["SLURM_CONF"]  # for pilots launched by Parsl
    try:
        yield cluster
    finally:
        if old is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = old
        cluster.cleanup()


@pytest.fixture
def slurm(slurm_cluster):
    """The session's Slurm, emptied: no jobs, no reservations, every node idle."""
    slurm_cluster.cancel_all()
    for line in slurm_cluster.run("scontrol show reservation -o", check=False).stdout.splitlines():
        if line.startswith("ReservationName="):
            name = line.split()[0].split("=", 1)[1]
            slurm_cluster.run(f"scontrol delete reservationname={name}", check=False)
    slurm_cluster.wait_idle(slurm_cluster.node_names, timeout_s=20)
    yield slurm_cluster
    slurm_cluster.cancel_all()
