"""The README's "Use it" example runs as written, as a script in a folder without a checkout.

A user copies it into a file and runs it; it must not depend on anything the block does not
show (before 2026-11-26 it imported ``F`` nowhere and used module-level names the nodes never
see, so the copied script failed on the nodes with a ``NameError``).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

README = Path(__file__).resolve().parents[2] / "README.md"


def use_it_block() -> str:
    text = README.read_text()
    section = text[text.index("## Use it"):]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match, "README's 'Use it' section has no python block"
    return match.group(1)


def test_use_it_block_is_complete() -> None:
    code = use_it_block()
    compile(code, "README-use-it", "exec")
    assert "..." not in code, "the example must run as written, with nothing left to fill"


@pytest.mark.slow
def test_use_it_block_runs_as_a_script(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(use_it_block())
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    last = proc.stdout.strip().splitlines()[-1]
    loss = float(re.search(r"'loss': (?:tensor\()?([0-9.e-]+)", last).group(1))
    assert loss < 0.5, last  # a separable problem: 300 SGD steps learn it
