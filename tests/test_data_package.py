"""The data shipped in the package: same bytes as the reference copy, found without a checkout."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from malleparsl.data import PACKAGED, data_dir, load_jobset
from malleparsl.traces import JOB_LOGS, TRACES, load_trace

SHIPPED = ("summit-idle-2021", "bftrainer-jobs", "theta-2023-swf")


def _files(root: Path, folder: str) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in (root / folder).rglob("*") if p.is_file())


@pytest.mark.parametrize("folder", SHIPPED)
def test_shipped_files_have_the_reference_bytes(folder, reference_data):
    assert _files(PACKAGED, folder) == _files(reference_data, folder)
    for rel in _files(reference_data, folder):
        assert (PACKAGED / rel).read_bytes() == (reference_data / rel).read_bytes(), rel


def test_every_short_name_points_into_the_shipped_data():
    from malleparsl.data import JOBSETS

    for rel in (*TRACES.values(), *JOB_LOGS.values(), *JOBSETS.values()):
        assert (PACKAGED / rel).is_file(), rel
    text = (PACKAGED / "README.md").read_text()
    assert "arXiv:2106.12091" in text and "theta_2023.swf" in text


def test_data_dir_is_the_package_unless_the_env_var_says_otherwise(tmp_path, monkeypatch):
    monkeypatch.delenv("MALLEPARSL_DATA", raising=False)
    assert data_dir() == PACKAGED
    monkeypatch.setenv("MALLEPARSL_DATA", str(tmp_path))
    assert data_dir() == tmp_path
    with pytest.raises(FileNotFoundError, match=r"MALLEPARSL_DATA=.*lacks it.*unset it"):
        load_jobset("shufflenet-10")
    with pytest.raises(FileNotFoundError, match="MALLEPARSL_DATA"):
        load_trace("theta")


def test_loaders_work_from_an_unrelated_folder_without_the_checkout(tmp_path):
    """A fresh interpreter in an empty folder, with no repository or shared/ in reach."""
    code = (
        "from malleparsl.data import load_jobset, data_dir\n"
        "from malleparsl.traces import load_trace\n"
        "jobs = load_jobset('imagenet')\n"
        "t = load_trace('summit', nodes='0:16', hours=1, start_s=72743)\n"
        "print(len(jobs), len(t.nodes), data_dir().name)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "MALLEPARSL_DATA"}
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, check=True,
                         capture_output=True, text=True, timeout=300).stdout.split()
    assert out == ["1001", "16", "datasets"]
