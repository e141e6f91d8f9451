"""The pilots' environment for the multihost tests (a module of its own: ``conftest`` is not a
unique name to import from when the whole suite runs)."""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def worker_init() -> str:
    """Pilots find this interpreter and the tests' helper modules."""
    return (f"export PATH={Path(sys.executable).parent}:$PATH; "
            f"export PYTHONPATH={HERE}:${{PYTHONPATH:-}}")
