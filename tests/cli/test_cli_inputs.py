"""Every CLI input checked: exit status 2 and one line ``error: ...`` naming the value and the
rule, before any long work; never a traceback for a user's mistake."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from malleparsl.cli import app

SWF_LINE = "1 0 0 {run} 4 -1 -1 4 200 -1 1 1 1 1 1 1 1 1\n"


def _invoke(args: list[str]):
    res = CliRunner().invoke(app, args)
    return res, res.stderr.strip().splitlines()


def _user_error(args: list[str], *fragments: str) -> str:
    res, lines = _invoke(args)
    assert res.exit_code == 2, (res.exit_code, res.output, res.exception)
    assert "Traceback" not in res.output
    assert len(lines) == 1 and lines[0].startswith("error: "), res.output
    for f in fragments:
        assert f in lines[0], (f, lines[0])
    return lines[0]


@pytest.fixture()
def empty_csv(tmp_path):
    p = tmp_path / "empty.csv"
    p.write_text("")
    return p


@pytest.mark.parametrize(
    "args, fragments",
    [
        (["--hours", "-1"], ["--hours -1.0", ">= 0"]),
        (["--hours", "nan"], ["--hours nan", "finite"]),
        (["--hours", "inf"], ["--hours inf", "finite"]),
        (["--limit-jobs", "-1"], ["--limit-jobs -1", ">= 1"]),
        (["--start-h", "-5"], ["--start-h -5.0", ">= 0"]),
        (["--jobs", "poisson:3:60:junk"], ["poisson:3:60:junk", "poisson:N:MEAN_INTERARRIVAL_S"]),
        (["--jobs", "poisson:0"], ["poisson:0", "N >= 1"]),
        (["--policy", ","], ["--policy", "names no policy"]),
        (["--policy", "bogus"], ["bogus", "valid policies"]),
        (["--noise", "-0.1"], ["--noise -0.1"]),
        (["--reveal-ends", "2"], ["--reveal-ends 2.0", "[0, 1]"]),
    ],
)
def test_simulate_rejects_bad_options_before_loading_anything(args, fragments) -> None:
    _user_error(["simulate", "--trace", "/nonexistent/never-read.csv", *args], *fragments)


def test_simulate_node_slice_past_the_trace_is_an_error_not_clamped() -> None:
    _user_error(
        ["simulate", "--nodes", "0:999999", "--jobs", "poisson:2", "--hours", "1"],
        "0:999999",
        "4734 nodes",
    )


def test_unwritable_out_is_refused_before_the_run(tmp_path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    # a trace path that does not exist proves the check came first: it is never read
    _user_error(
        ["simulate", "--trace", "/nonexistent/never-read.csv", "--out", str(blocker / "report")],
        "--out",
        "not a writable folder",
    )


def test_empty_job_csv_names_the_file(empty_csv) -> None:
    _user_error(
        ["simulate", "--jobs", str(empty_csv), "--hours", "1", "--nodes", "0:8"],
        str(empty_csv),
        "No columns",
    )


def test_empty_trace_csv_names_the_file(empty_csv) -> None:
    _user_error(["simulate", "--trace", str(empty_csv)], str(empty_csv))


@pytest.mark.parametrize(
    "what, content, fragments",
    [
        (
            "fractional nodes",
            "job,model,min_nodes,max_nodes,total_samples,rescale_up_s,"
            "rescale_down_s,submit_s\nj1,m,1.5,4,1000,10,5,0\n",
            ["line 2", "min_nodes", "1.5", "whole number"],
        ),
    ],
)
def test_job_csv_with_fractional_nodes_is_an_error(tmp_path, what, content, fragments) -> None:
    (tmp_path / "jobs.csv").write_text(content)
    (tmp_path / "jobs_curves.csv").write_text("model,nodes,samples_per_s\nm,1,10\nm,2,19\n")
    _user_error(["simulate", "--jobs", str(tmp_path / "jobs.csv"), "--nodes", "0:8"], *fragments)


def test_curve_csv_with_fractional_nodes_is_an_error(tmp_path) -> None:
    (tmp_path / "jobs.csv").write_text(
        "job,model,min_nodes,max_nodes,total_samples,rescale_up_s,rescale_down_s,submit_s\n"
        "j1,m,1,4,1000,10,5,0\n"
    )
    (tmp_path / "jobs_curves.csv").write_text("model,nodes,samples_per_s\nm,1,10\nm,1.9,19\n")
    _user_error(
        ["simulate", "--jobs", str(tmp_path / "jobs.csv"), "--nodes", "0:8"],
        "jobs_curves.csv",
        "1.9",
        "whole number",
    )


def test_a_curve_option_with_fractional_nodes_is_an_error() -> None:
    from malleparsl.errors import SpecError
    from malleparsl.executors.planning import spec_from_options

    with pytest.raises(SpecError, match="whole number of nodes, got 1.5"):
        spec_from_options({"job_id": "j", "curve": [[1, 10.0], [1.5, 14.0]]})


@pytest.mark.parametrize(
    "header, run, fragments",
    [
        ("; MaxNodes: 8\n", "nan", ["line 2", "nan", "finite"]),
        ("; MaxNodes: 8\n", "inf", ["line 2", "inf", "finite"]),
        ("; MaxNodes: 1000000000\n", "100", ["MaxNodes", "1000000000", "1,000,000"]),
        ("; MaxNodes: 1e9\n", "100", ["MaxNodes", "1e9"]),
    ],
)
def test_swf_logs_with_non_finite_times_or_absurd_sizes_are_errors(
    tmp_path, header, run, fragments
) -> None:
    log = tmp_path / "log.swf"
    log.write_text(header + SWF_LINE.format(run=run))
    _user_error(
        ["simulate", "--trace", str(log), "--jobs", "poisson:2", "--hours", "1"],
        str(log),
        *fragments,
    )


def test_swf_nan_is_rejected_by_the_reader_so_the_scheduler_never_loops(tmp_path) -> None:
    from malleparsl.errors import TraceFormatError
    from malleparsl.sim.backfill import read_swf

    log = tmp_path / "log.swf"
    log.write_text("; MaxNodes: 8\n" + "1 nan 0 100 4 -1 -1 4 200 -1 1 1 1 1 1 1 1 1\n")
    with pytest.raises(TraceFormatError, match="field.*2.*finite"):
        read_swf(log)


@pytest.mark.parametrize(
    "args, fragments",
    [
        (["--sizes", "abc"], ["--sizes", "'abc'", "JOBSxNODES"]),
        (["--sizes", "2x0"], ["'2x0'"]),
        (["--repeats", "0"], ["--repeats 0", ">= 1"]),
        (["--cells", "bogus"], ["unknown policy 'bogus'", "milp"]),
        (["--cells", "milp:gurobi"], ["unknown solver 'gurobi'", "highs"]),
        (["--time-limit-s", "0"], ["--time-limit-s 0.0"]),
        (["--ends", "moon"], ["--ends 'moon'"]),
    ],
)
def test_bench_allocator_rejects_bad_options(args, fragments) -> None:
    _user_error(["bench", "allocator", *args], *fragments)


@pytest.mark.parametrize(
    "args, fragments",
    [
        (["--nodes", "0"], ["--nodes must be >= 1, got 0"]),
        (["--tasks", "0"], ["--tasks must be >= 1"]),
        (["--rescales", "-1"], ["--rescales must be >= 0"]),
        (["--timeout-s", "-1"], ["--timeout-s", "> 0"]),
    ],
)
def test_bench_executor_rejects_bad_options(args, fragments) -> None:
    _user_error(["bench", "executor", *args], *fragments)


@pytest.mark.parametrize(
    "args, fragments",
    [
        (["--hours", "-1"], ["--hours -1.0"]),
        (["--hours", "nan"], ["--hours nan"]),
        (["--setups", "bogus"], ["unknown setup 'bogus'"]),
        (["--setups", ","], ["--setups"]),
        (["--jobs", "shapes:x"], ["shapes:x"]),
        (["--nodes", "a:b"], ["node slice 'a:b'"]),
        (["--setups", "milp-perturbed:error"], ["'milp-perturbed:error'", "NAME:KEY=VALUE"]),
        (["--setups", "milp-perturbed:=1"], ["'milp-perturbed:=1'", "NAME:KEY=VALUE"]),
        (["--setups", "milp-perturbed:eror=0.1"], ["'milp-perturbed:eror=0.1'", "no such option"]),
        (["--setups", "milp-perturbed:error=-1"], ["error must be", ">= 0", "-1"]),
    ],
)
def test_bench_jpa_rejects_bad_options(args, fragments) -> None:
    _user_error(["bench", "jpa", *args], *fragments)


@pytest.mark.parametrize(
    "args, fragments",
    [
        (["--nodes", "2"], ["--nodes 2", ">= 4"]),
        (["--repeats", "0"], ["--repeats 0"]),
        (["--query-period-s", "0"], ["--query-period-s 0.0"]),
    ],
)
def test_bench_slurm_rejects_bad_options(args, fragments) -> None:
    _user_error(["bench", "slurm", *args], *fragments)


@pytest.mark.parametrize(
    "args, fragments",
    [
        (["--policy", "bogus"], ["unknown policy 'bogus'"]),
        (["--speed", "inf"], ["speed", "inf"]),
        (["--nodes", "-1"], ["nodes (-1)"]),
        (["--trials", "1"], ["trials must be >= 2"]),
        (["--step-delay", "-0.1"], ["step delay must be >= 0", "-0.1"]),
    ],
)
def test_demo_rejects_bad_options_before_starting(args, fragments, tmp_path) -> None:
    _user_error(["demo", "--quick", "--out", str(tmp_path / "r"), *args], *fragments)


def test_demo_unwritable_out_names_the_option(tmp_path) -> None:
    # before: "error: [Errno 20] Not a directory: ..." (the option unnamed)
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    _user_error(["demo", "--quick", "--out", str(blocker / "report")], "--out",
                "not a writable folder")


def test_demo_unknown_policy_suggests_the_close_one(tmp_path) -> None:
    _user_error(["demo", "--quick", "--out", str(tmp_path / "r"), "--policy", "milpp"],
                "unknown policy 'milpp' (did you mean 'milp'?)", "valid policies are")


def test_every_option_of_every_command_has_a_help_text() -> None:
    """A user reading `--help` sees what each option does (bench fused --global-batch and
    bench jpa --seed had none)."""
    import typer.core
    import typer.main

    def commands(cmd, path=()):
        yield path, cmd
        for name, sub in getattr(cmd, "commands", {}).items():
            yield from commands(sub, (*path, name))

    missing = [
        f"{' '.join(path)} {p.opts[0]}"
        for path, cmd in commands(typer.main.get_command(app))
        for p in cmd.params
        if isinstance(p, typer.core.TyperOption) and not p.hidden and not (p.help or "").strip()
    ]
    assert not missing, missing


def test_a_bad_node_slice_shows_every_accepted_form() -> None:
    # "512" (the first 512 nodes) is accepted, so the error and --help say so
    _user_error(["simulate", "--nodes", "-5"], "node slice '-5'", "or 512 for the first 512")
