"""malleparsl.scavenger: where the nodes come from.

- ``base``: the :class:`~malleparsl.scavenger.base.NodeSource` interface (idle/taken events).
- ``trace``: replay of recorded idle-node traces.
- ``slurm`` / ``slurm_provider`` / ``slurm_parse``: Slurm scavenging (``SlurmScavenger``,
  ``ScavengingSlurmProvider``).
- ``pbs`` / ``pbs_parse``: PBS Pro scavenging (``PBSScavenger``, ``ScavengingPBSProProvider``).
- ``pilots``: what both share (pinned one-node pilots under a cap, the poll loop).
- ``shell``: the one function every scheduler command goes through.
- ``localslurm``: a real local Slurm for tests and ``malleparsl bench slurm`` (``bench``).

Submodules import Parsl; this package module imports nothing, so ``import
malleparsl.scavenger.base`` stays light.
"""
