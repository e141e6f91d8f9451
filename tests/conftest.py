"""Session-wide test setup."""

from __future__ import annotations

import os
import sys

# Parsl starts its interchange and worker pools by command name (``interchange.py``,
# ``process_worker_pool.py``): put this interpreter's bin directory first on PATH so the tests
# also run from an un-activated venv (``.venv/bin/python -m pytest``).
_BIN = os.path.dirname(sys.executable)
if _BIN not in os.environ.get("PATH", "").split(os.pathsep):
    os.environ["PATH"] = _BIN + os.pathsep + os.environ.get("PATH", "")
