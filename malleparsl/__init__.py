"""malleparsl: train deep neural networks on a supercomputer's idle nodes, from Parsl workflows.

The core package holds the domain model, the allocator, the controller, the Job Profiling
Advisor, the scavengers and the simulator. The executor, apps, workflows and site configs live
in the subpackages ``malleparsl.executors``, ``malleparsl.apps``, ``malleparsl.workflows`` and
``malleparsl.site_configs``.
"""

from malleparsl.errors import MalleparslError, SpecError
from malleparsl.model import Allocation, JobSpec, NodeId, RescalePlan, ScalingCurve

__version__ = "0.1.0"

__all__ = [
    "Allocation",
    "JobSpec",
    "MalleparslError",
    "NodeId",
    "RescalePlan",
    "ScalingCurve",
    "SpecError",
    "__version__",
]
