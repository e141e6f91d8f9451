"""Named simulator setups: an allocation policy plus the curve advisor that feeds it.

A "policy" on the ``malleparsl simulate`` command line names a *setup*: every registered
allocation policy is one (planning with the jobs' true curves, :class:`KnownCurves`), and
extra setups pair a policy with an advisor — e.g. the Job Profiling Advisor's ``milp+jpa``,
which hides the curves and learns them from the noisy rates the simulator measures. A setup
factory takes keyword options and returns ``(policy, advisor or None, hide_curves)``.

>>> policy, advisor, hide = make_setup("static")
>>> type(policy).__name__, advisor, hide
('StaticPolicy', None, False)
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

from malleparsl.allocator.base import AllocationPolicy, make_policy, policy_names
from malleparsl.controller import CurveAdvisor
from malleparsl.errors import SpecError, unknown_name

Setup = tuple[AllocationPolicy, "CurveAdvisor | None", bool]
SetupFactory = Callable[..., Setup]

_SETUPS: dict[str, SetupFactory] = {}

_LAZY_MODULES: list[str] = [
    "malleparsl.sim.policies",
    "malleparsl.jpa.sim_setups",
]
"""Modules that register setups when imported (a module not written yet is skipped)."""


def register_setup(name: str, factory: SetupFactory) -> None:
    """Make ``name`` usable as a simulator policy: ``factory(**opts) -> (policy, advisor, hide)``."""
    _SETUPS[name] = factory


def _load() -> None:
    for mod in _LAZY_MODULES:
        try:
            importlib.import_module(mod)
        except ModuleNotFoundError as exc:
            if exc.name != mod:
                raise


def setup_names() -> list[str]:
    """Every name ``make_setup`` accepts: registered setups and allocation policies."""
    _load()
    return sorted(set(_SETUPS) | set(policy_names()))


def make_setup(name: str, **options: object) -> Setup:
    """Build a setup by name; unknown names get an error listing the valid ones."""
    _load()
    if name in _SETUPS:
        return _SETUPS[name](**options)
    if name in policy_names():
        try:
            return make_policy(name, **options), None, False
        except TypeError as exc:  # a building block that needs options, not a standalone policy
            raise SpecError(
                f"policy {name!r} cannot be built from options {sorted(options)} ({exc}); "
                f"use a setup that supplies them, one of: {', '.join(sorted(_SETUPS))}"
            ) from exc
    raise unknown_name("policy", name, setup_names())
