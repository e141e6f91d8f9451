"""No shell built from user strings: argument lists, validated and quoted script values."""

from __future__ import annotations

import subprocess

import pytest

from malleparsl.errors import SpecError
from malleparsl.scavenger.pbs import ScavengingPBSProProvider
from malleparsl.scavenger.shell import CommandResult, run_command
from malleparsl.scavenger.slurm_provider import ScavengingSlurmProvider

EVIL = [
    "x; touch {m}",
    "x$(touch {m})",
    "x`touch {m}`",
    "x\n#SBATCH --exclusive",
    "a b",
    "x|touch {m}",
    "x&&touch {m}",
]


def _never(argv) -> CommandResult:
    raise AssertionError(f"no command may run: {argv!r}")


def test_run_command_takes_argument_lists_and_never_a_shell(tmp_path) -> None:
    marker = tmp_path / "pwned"
    res = run_command(["echo", f"x; touch {marker}"])
    assert res.returncode == 0 and res.stdout.strip() == f"x; touch {marker}"
    assert not marker.exists()
    with pytest.raises(TypeError, match="argument lists, not strings"):
        run_command(f"echo hi; touch {marker}")
    assert not marker.exists()
    assert run_command(["no-such-program-malleparsl"]).returncode == 127


@pytest.mark.parametrize("field", ["partition", "qos", "account"])
@pytest.mark.parametrize("evil", EVIL)
def test_slurm_names_with_shell_characters_or_newlines_are_rejected(tmp_path, field, evil):
    value = evil.format(m=tmp_path / "pwned")
    kw = {"partition": "scavenger", field: value}
    with pytest.raises(SpecError, match=f"{field} .* is not a valid scheduler name"):
        ScavengingSlurmProvider(**kw, run=_never)
    assert not (tmp_path / "pwned").exists()


@pytest.mark.parametrize("field", ["queue", "account"])
@pytest.mark.parametrize("evil", EVIL)
def test_pbs_values_with_newlines_or_shell_characters_are_rejected(tmp_path, field, evil):
    kw = {"queue": "preemptable", field: evil.format(m=tmp_path / "pwned")}
    with pytest.raises(SpecError, match="not a valid scheduler name"):
        ScavengingPBSProProvider(**kw, allow_nonpreemptible=True, run=_never)


def test_pbs_select_options_with_a_newline_are_rejected() -> None:
    with pytest.raises(SpecError, match="select_options"):
        ScavengingPBSProProvider(
            queue="preemptable", select_options="ngpus=4\n#PBS -q prod", run=_never
        )


@pytest.mark.parametrize("bad", ["1h", "30", "00:30", "1:00:00\n#SBATCH -p main", ""])
def test_walltimes_must_be_hh_mm_ss(bad) -> None:
    from malleparsl.site_configs.slurm_scavenger import slurm_scavenger_config

    with pytest.raises(SpecError, match="is not a walltime: write HH:MM:SS"):
        slurm_scavenger_config(walltime=bad, run=_never)
    with pytest.raises(SpecError, match="is not a walltime"):
        ScavengingPBSProProvider(queue="preemptable", walltime=bad, run=_never)


def test_the_preempt_marker_folder_is_quoted_in_the_pilot_script(tmp_path) -> None:
    odd = tmp_path / "sig dir; touch pwned $(id)"
    prov = ScavengingSlurmProvider(
        partition="scavenger",
        signal_dir=str(odd),
        run=lambda argv: CommandResult(1, "", "no scheduler"),
    )
    line = prov.trap_line("SLURM_JOB_ID")
    script = tmp_path / "pilot.sh"
    script.write_text(line + "kill -TERM $$\n")
    subprocess.run(
        ["bash", str(script)],
        cwd=tmp_path,
        env={"SLURM_JOB_ID": "77", "PATH": "/usr/bin:/bin"},
        timeout=30,
        check=False,
    )
    assert (odd / "77.term").exists()
    assert not (tmp_path / "pwned").exists()
