"""The private Parsl names malleparsl relies on exist in the installed Parsl.

A failure here names the piece a new Parsl release changed; fix
``malleparsl/executors/parsl_compat.py`` (and the interchange subclass) before raising the
upper bound on ``parsl`` in pyproject.toml.
"""

from __future__ import annotations

import re
from importlib.metadata import version
from pathlib import Path

import pytest

pytest.importorskip("parsl")

from malleparsl.executors import parsl_compat  # noqa: E402


def test_every_private_parsl_name_we_use_exists():
    missing = parsl_compat.missing_names()
    assert not missing, (
        f"parsl {version('parsl')} lacks private names malleparsl relies on:\n  "
        + "\n  ".join(missing)
        + "\nadapt malleparsl/executors/parsl_compat.py to the new Parsl"
    )


def test_a_missing_name_is_reported_by_name(monkeypatch):
    fake = parsl_compat.PrivateName("parsl.jobs.error_handlers", "_no_such_name", "attr", "test")
    monkeypatch.setattr(parsl_compat, "REQUIRED", (*parsl_compat.REQUIRED, fake))
    assert parsl_compat.missing_names() == [
        "parsl.jobs.error_handlers._no_such_name (attr; used to test)"
    ]


def test_pyproject_caps_parsl_at_the_version_checked():
    text = (Path(__file__).resolve().parents[2] / "pyproject.toml").read_text()
    cap = re.search(r'"parsl>=[^,"]+,<=([^"]+)"', text)
    assert cap, "pyproject.toml must cap parsl (<=newest tested)"
    assert cap.group(1) == parsl_compat.TESTED_PARSL
    assert version("parsl") == parsl_compat.TESTED_PARSL or version("parsl") < cap.group(1)


def test_no_private_parsl_name_outside_the_compat_module():
    """Executor-side code reaches Parsl internals only through parsl_compat."""
    root = Path(__file__).resolve().parents[2]
    pattern = re.compile(r"\b(_launch_block|_get_launch_command|_block_id_counter|_simulated_status"
                         r"|_get_error)\b|self\._status\b")
    offenders = []
    for folder in ("executors", "site_configs", "apps", "workflows", "malleparsl"):
        for path in (root / folder).rglob("*.py"):
            if path.name == "parsl_compat.py":
                continue
            for i, line in enumerate(path.read_text().splitlines(), 1):
                if pattern.search(line):
                    offenders.append(f"{path.relative_to(root)}:{i}: {line.strip()}")
    assert not offenders, "private Parsl names outside parsl_compat:\n" + "\n".join(offenders)
