"""The base install: what runs without extras, and the one-line error for what needs one."""

from __future__ import annotations

import subprocess
import sys

import pytest

from malleparsl.extras import (
    MissingExtraError,
    as_missing_extra,
    extra_of,
    missing_extra,
    needs_extra,
    require,
)

# Run code in a fresh interpreter that cannot import what the extras bring.
BLOCK = (
    "import sys\n"
    "for m in ('torch', 'sklearn', 'globus_compute_sdk', 'globus_compute_endpoint',"
    " 'globus_compute_common'):\n"
    "    sys.modules[m] = None\n"
)


def _run(code: str, *args: str, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", BLOCK + code, *args], capture_output=True,
                          text=True, timeout=300, cwd=cwd)


@pytest.mark.parametrize(("module", "extra"), [("torch", "torch"), ("torch.distributed", "torch"),
                                               ("sklearn.datasets", "torch"),
                                               ("globus_compute_sdk", "globus"), ("numpy", None)])
def test_extra_of_maps_modules_to_extras(module, extra):
    assert extra_of(module) == extra


def test_missing_extra_is_one_line_naming_the_extra():
    err = missing_extra("sklearn.datasets", "the demo")
    assert isinstance(err, ModuleNotFoundError) and err.name == "sklearn"
    assert str(err) == ("the demo needs scikit-learn, which is not installed: "
                        "pip install 'malleparsl[torch]'")
    assert "\n" not in str(err)
    with pytest.raises(ValueError, match="not provided by any malleparsl extra"):
        missing_extra("numpy", "x")
    assert as_missing_extra(ModuleNotFoundError("no", name="yaml"), "x") is None


def test_needs_extra_turns_only_extras_into_missing_extra_errors():
    with (pytest.raises(MissingExtraError, match=r"feature needs globus-compute-sdk.*\[globus\]"),
          needs_extra("feature")):
        raise ModuleNotFoundError("No module named 'globus_compute_sdk'", name="globus_compute_sdk")
    with pytest.raises(ModuleNotFoundError) as info, needs_extra("feature"):
        raise ModuleNotFoundError("No module named 'yaml'", name="yaml")
    assert not isinstance(info.value, MissingExtraError)
    require("numpy", feature="anything")  # installed: no error


def test_base_api_runs_without_any_extra(tmp_path):
    code = (
        "from malleparsl.allocator import make_policy\n"
        "from malleparsl.jpa import JobProfilingAdvisor\n"
        "from malleparsl.sim.engine import simulate\n"
        "import malleparsl.cli, malleparsl.allocator.bench, malleparsl.jpa.bench\n"
        "assert make_policy('milp') is not None and JobProfilingAdvisor() is not None\n"
        "from malleparsl.data import load_jobset\n"
        "from malleparsl.traces import load_trace\n"
        "tr = load_trace('summit', nodes='0:16', start_s=72743, hours=1)\n"
        "r = simulate(tr, load_jobset('shufflenet-10', limit=3),"
        " policy='milp+jpa')\n"
        "assert r.samples > 0, r\n"
        "bad = [m for m in sys.modules if m.split('.')[0] in ('torch', 'sklearn') and sys.modules[m]]\n"
        "assert not bad, bad\n"
        "print('ok')\n"
    )
    res = _run(code, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "ok"


def test_cli_without_torch_says_which_extra_in_one_line(tmp_path):
    code = "from malleparsl.cli import main\nsys.argv[0] = 'malleparsl'\nmain()\n"
    res = _run(code, "demo", "--quick", "--out", str(tmp_path / "r"), cwd=tmp_path)
    assert res.returncode == 1
    assert res.stderr.strip().splitlines() == [
        "error: the demo needs torch, which is not installed: pip install 'malleparsl[torch]'"
    ]
    assert not (tmp_path / "r").exists()
    res = _run("import malleparsl.apps.examples_digits", cwd=tmp_path)
    assert "MissingExtraError: malleparsl.apps.examples_digits needs torch" in res.stderr


def test_version_and_python_dash_m(tmp_path):
    import malleparsl

    for cmd in ([sys.executable, "-m", "malleparsl", "--version"],
                [str(__import__("pathlib").Path(sys.executable).with_name("malleparsl")),
                 "--version"]):
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=tmp_path)
        assert res.returncode == 0, res.stderr
        assert res.stdout.strip() == f"malleparsl {malleparsl.__version__}"
    res = subprocess.run([sys.executable, "-m", "malleparsl", "simulate", "--help"],
                         capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert res.returncode == 0 and "--policy" in res.stdout


def test_json_output_is_only_json(tmp_path):
    """Nothing but JSON on stdout with --json (HiGHS >= 1.16 prints a banner on its first
    instance unless malleparsl.allocator.highs swallowed it)."""
    import json

    code = "from malleparsl.cli import main\nsys.argv[0] = 'malleparsl'\nmain()\n"
    res = _run(code, "simulate", "--nodes", "0:16", "--hours", "1", "--jobs", "shufflenet-10",
               "--policy", "milp", "--no-bound", "--json", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    rows = [json.loads(line) for line in res.stdout.splitlines()]
    assert [r["policy"] for r in rows] == ["milp"]


def test_every_third_party_import_is_declared():
    """Each library the code imports is a declared dependency: the base's in ``dependencies``,
    torch / scikit-learn / Globus in the extras that ``malleparsl.extras`` names."""
    import ast
    import importlib.metadata as md
    import re
    from pathlib import Path

    tomllib = pytest.importorskip("tomllib")
    repo = Path(__file__).resolve().parents[1]
    project = tomllib.loads((repo / "pyproject.toml").read_text())["project"]

    def names(reqs):
        return {re.split(r"[<>=!~;\[ ]", r, maxsplit=1)[0].lower() for r in reqs}

    base = names(project["dependencies"])
    extras = {k: names(v) for k, v in project["optional-dependencies"].items()}
    dists = md.packages_distributions()
    tops = set()
    for folder in ("malleparsl", "executors", "apps", "workflows", "site_configs"):
        for f in (repo / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(f.read_text())):
                if isinstance(node, ast.Import):
                    tops |= {a.name.split(".")[0] for a in node.names}
                elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                    tops.add(node.module.split(".")[0])
    tops -= set(sys.stdlib_module_names) | {"malleparsl"}
    assert {"parsl", "pulp", "scipy", "torch"} <= tops
    for top in sorted(tops):
        provided = {d.lower() for d in dists.get(top, [])}
        extra = extra_of(top)
        declared = extras[extra] if extra else base
        assert provided & declared, f"{top} (from {provided}) is not declared in {extra or 'base'}"
