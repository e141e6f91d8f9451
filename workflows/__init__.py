"""HPO and NAS sweeps as DAGs of stages whose trials are malleable Parsl apps.

>>> from malleparsl.workflows import ASHA, Budget, Choice, SearchSpace, TrialStage, Workflow
>>> wf = Workflow()
>>> _ = wf.add(TrialStage("search", lambda _: ASHA(space=SearchSpace({"w": Choice([1, 2])}),
...                                                n_trials=2, budget=Budget(max_budget=1))))

Names are imported lazily (``malleparsl demo --help`` must not pay for networkx); see
docs/workflows.md.
"""

from __future__ import annotations

import importlib
from typing import Any

_WHERE = {
    "Workflow": "dag", "TrialStage": "dag", "FunctionStage": "dag", "FixedTrials": "dag",
    "top_k": "dag", "WorkflowError": "dag",
    "ASHA": "hpo", "successive_halving": "hpo",
    "RegularizedEvolution": "nas", "ArchSpace": "nas",
    "SearchSpace": "space", "Choice": "space", "IntRange": "space", "LogUniform": "space",
    "Uniform": "space",
    "Budget": "scheduler", "Decision": "scheduler", "TrialScheduler": "scheduler",
    "AppTrialRunner": "apprunner", "ThreadTrialRunner": "runner",
    "TrialsTable": "results",
}

__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'malleparsl.workflows' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_WHERE))
