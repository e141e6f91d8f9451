"""Trace-replay simulation: the one Controller on real idle-node traces, at machine scale.

>>> from malleparsl.sim import simulate, SimOptions  # doctest: +SKIP
>>> from malleparsl.traces import load_trace
>>> from malleparsl.data import load_jobset
>>> jobs = load_jobset("imagenet")  # doctest: +SKIP
>>> trace = load_trace("summit", nodes="0:128", start_s=jobs[0].submit_s, hours=24)  # doctest: +SKIP
>>> simulate(trace, jobs, policy="milp").summary()["samples"]  # doctest: +SKIP

Names are imported lazily: the allocator's registry imports ``malleparsl.sim.policies`` while
the controller may still be loading.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["SimOptions", "SimResult", "make_setup", "register_setup", "setup_names", "simulate"]

_WHERE = {
    "SimOptions": "malleparsl.sim.engine",
    "simulate": "malleparsl.sim.engine",
    "SimResult": "malleparsl.sim.result",
    "make_setup": "malleparsl.sim.setups",
    "register_setup": "malleparsl.sim.setups",
    "setup_names": "malleparsl.sim.setups",
}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(importlib.import_module(_WHERE[name]), name)
    raise AttributeError(f"module 'malleparsl.sim' has no attribute {name!r}")
