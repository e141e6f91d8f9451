"""Job Profiling Advisor: learns every job's scaling curve online, so users give no model.

>>> from malleparsl.jpa import JobProfilingAdvisor, ProbeFirst
>>> jpa = JobProfilingAdvisor()
>>> policy = ProbeFirst(advisor=jpa, inner="equal-share")

``Controller(policy=policy, advisor=jpa)`` then profiles unknown jobs and plans with what it
learned; see docs/jpa.md. Curve estimation itself is :func:`malleparsl.jpa.estimate.estimate`:
the package does not re-export that function, so ``malleparsl.jpa.estimate`` stays the module
(re-exported, it shadowed the module: ``import malleparsl.jpa.estimate as m`` gave the function).
"""

from malleparsl.jpa.advisor import JobProfilingAdvisor, profile_key
from malleparsl.jpa.estimate import CurveEstimate
from malleparsl.jpa.models import MODELS, Samples, ThroughputModel, fit, predict
from malleparsl.jpa.policy import ProbeFirst

__all__ = [
    "MODELS",
    "CurveEstimate",
    "JobProfilingAdvisor",
    "ProbeFirst",
    "Samples",
    "ThroughputModel",
    "fit",
    "predict",
    "profile_key",
]
