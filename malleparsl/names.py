"""Safe names: values that become a path component, a store key or a scheduler field.

A job id ends up as ``<ckpt_root>/<job_id>``; ``../..``, an absolute path or a newline there
would write outside the checkpoint root or into another job's folder. Names are therefore
limited to one path component of letters, digits and ``._+-`` that does not start with a dot.
"""

from __future__ import annotations

import re

from malleparsl.errors import SpecError

_SAFE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+-]{0,199}")


def check_safe_name(value: object, *, what: str = "job_id") -> str:
    """Return ``value`` if it is a safe name; raise :class:`SpecError` naming it otherwise.

    >>> check_safe_name("hpo-trial-3")
    'hpo-trial-3'
    """
    if not isinstance(value, str) or not _SAFE.fullmatch(value):
        raise SpecError(
            f"{what} {value!r} is not a safe name: use 1-200 letters, digits and '._+-', "
            "not starting with '.' (no '/', '..' or spaces), e.g. 'trial-3'"
        )
    return value
