"""Session-wide test setup."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from hypothesis import settings

# Property tests draw new examples on every run, which is how they find failures; CI runs them
# derandomized (``HYPOTHESIS_PROFILE=ci``, set by .ci/run) so that a landing is judged on the
# same examples every time, and a failure found locally is printed with its reproduction blob.
settings.register_profile("ci", derandomize=True, print_blob=True)
settings.register_profile("dev", print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))

# Parsl starts its interchange and worker pools by command name (``interchange.py``,
# ``process_worker_pool.py``): put this interpreter's bin directory first on PATH so the tests
# also run from an un-activated venv (``.venv/bin/python -m pytest``).
_BIN = os.path.dirname(sys.executable)
if _BIN not in os.environ.get("PATH", "").split(os.pathsep):
    os.environ["PATH"] = _BIN + os.pathsep + os.environ.get("PATH", "")


# The reference copy of the real data (``shared/data`` beside the clone, or
# $MALLEPARSL_REFERENCE_DATA): the package ships most of it (malleparsl/datasets); tests that
# compare against the reference, or need a file not shipped (bftrainer-reference/), use this.
REFERENCE_DATA = Path(
    os.environ.get(
        "MALLEPARSL_REFERENCE_DATA", Path(__file__).resolve().parents[1].parent / "shared" / "data"
    )
)


@pytest.fixture(scope="session")
def reference_data() -> Path:
    """``shared/data``; skips where it is absent, except in CI (``CI=true``), where it fails."""
    if not REFERENCE_DATA.is_dir():
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(f"reference data {REFERENCE_DATA} missing in CI (shared/ beside the clone)")
        pytest.skip(f"reference data {REFERENCE_DATA} not present")
    return REFERENCE_DATA
