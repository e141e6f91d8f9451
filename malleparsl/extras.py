"""Optional dependencies: which extra brings which module, and the one-line error when it is missing.

The base install (``pip install malleparsl``) runs the simulator, the allocator, the JPA and
their benchmarks. Training needs torch and scikit-learn (``malleparsl[torch]``); the Globus
Compute engine needs the Globus Compute packages (``malleparsl[globus]``). Code that needs an
extra says so where it first needs it, with :func:`require` or :func:`needs_extra`, and the
command line turns any :class:`MissingExtraError` into one ``error:`` line.

>>> from malleparsl.extras import extra_of
>>> extra_of("sklearn")
'torch'
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from contextlib import contextmanager

from malleparsl.errors import MalleparslError

EXTRAS: dict[str, dict[str, str]] = {
    "torch": {"torch": "torch", "sklearn": "scikit-learn"},
    "globus": {
        "globus_compute_sdk": "globus-compute-sdk",
        "globus_compute_endpoint": "globus-compute-endpoint",
        "globus_compute_common": "globus-compute-common",
    },
}
"""extra -> {top-level module -> the distribution that provides it}."""


class MissingExtraError(MalleparslError, ModuleNotFoundError):
    """A feature needs a module that only one of malleparsl's extras installs."""


def extra_of(module: str) -> str | None:
    """The extra whose packages provide ``module`` (any dotted name under it), or None."""
    top = module.split(".", 1)[0]
    return next((extra for extra, mods in EXTRAS.items() if top in mods), None)


def missing_extra(module: str, feature: str) -> MissingExtraError:
    """The error for ``feature`` lacking ``module``: names the extra and the command to get it."""
    top = module.split(".", 1)[0]
    extra = extra_of(top)
    if extra is None:
        raise ValueError(f"module {module!r} is not provided by any malleparsl extra")
    dist = EXTRAS[extra][top]
    err = MissingExtraError(
        f"{feature} needs {dist}, which is not installed: pip install 'malleparsl[{extra}]'"
    )
    err.name = top
    return err


def as_missing_extra(exc: BaseException, feature: str) -> MissingExtraError | None:
    """``exc`` as a :class:`MissingExtraError` when it is a missing module an extra provides."""
    if isinstance(exc, MissingExtraError):
        return exc
    if isinstance(exc, ModuleNotFoundError) and exc.name and extra_of(exc.name):
        return missing_extra(exc.name, feature)
    return None


def require(*modules: str, feature: str) -> None:
    """Raise :class:`MissingExtraError` unless every module in ``modules`` can be imported."""
    for module in modules:
        if importlib.util.find_spec(module.split(".", 1)[0]) is None:
            raise missing_extra(module, feature)


@contextmanager
def needs_extra(feature: str) -> Iterator[None]:
    """Wrap imports of an extra's modules: a missing one becomes a :class:`MissingExtraError`."""
    try:
        yield
    except ModuleNotFoundError as exc:
        err = as_missing_extra(exc, feature)
        if err is None:
            raise
        raise err from None
