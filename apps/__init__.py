"""malleparsl.apps: malleable training apps.

``@malleable_app`` turns a training function taking a :class:`TrainContext` into a Parsl app
that :class:`~malleparsl.executors.MalleableExecutor` runs on a changing number of nodes.
Examples: :mod:`malleparsl.apps.examples_digits` (MLP, CNN) and
:mod:`malleparsl.apps.examples_lm` (a small transformer language model).
"""

from malleparsl.apps.checkpoint import CheckpointStore, CorruptCheckpointWarning
from malleparsl.apps.context import GroupBrokenError, RescaleRequested, TrainContext
from malleparsl.apps.decorator import MalleableApp, malleable_app
from malleparsl.apps.entry import RankEntry, run_rank
from malleparsl.apps.sharding import GlobalBatchSampler
from malleparsl.apps.step import Step

__all__ = [
    "CheckpointStore",
    "CorruptCheckpointWarning",
    "GlobalBatchSampler",
    "GroupBrokenError",
    "MalleableApp",
    "RankEntry",
    "RescaleRequested",
    "Step",
    "TrainContext",
    "malleable_app",
    "run_rank",
]
