"""Locating and loading the reference data: job sets with measured scaling curves.

The data ships inside the package (``malleparsl/datasets``, sources in its README), so a plain
``pip install`` finds it; ``MALLEPARSL_DATA`` names another folder of the same layout, and every
loader also takes any path a user gives it. Nothing here looks at a checkout's surroundings.
Idle-node traces and facility job logs are loaded by :mod:`malleparsl.traces`.
"""

from __future__ import annotations

import os
from pathlib import Path

import pandas as pd

from malleparsl.errors import SpecError, TraceFormatError, unknown_name
from malleparsl.model import JobSpec, ScalingCurve, node_count

JOBSETS = {
    "imagenet": "bftrainer-jobs/imagenet_1001.csv",
    "shufflenet-10": "bftrainer-jobs/shufflenet_hpo_10.csv",
    "shufflenet-1000": "bftrainer-jobs/shufflenet_hpo_1000.csv",
}


PACKAGED = Path(__file__).resolve().with_name("datasets")
"""The data installed with the package."""


def data_dir() -> Path:
    """The data folder: ``$MALLEPARSL_DATA`` when set, else the copy shipped in the package."""
    env = os.environ.get("MALLEPARSL_DATA")
    return Path(env) if env else PACKAGED


def missing_data(kind: str, path: Path) -> FileNotFoundError:
    """The error for a registered data file that is not where the data folder says."""
    env = os.environ.get("MALLEPARSL_DATA")
    where = (
        f"MALLEPARSL_DATA={env!r} lacks it; point MALLEPARSL_DATA at a folder holding "
        f"{path.relative_to(data_dir()) if path.is_relative_to(data_dir()) else path.name} "
        "or unset it to use the data shipped with malleparsl"
        if env
        else "the data shipped with malleparsl is missing; reinstall malleparsl"
    )
    return FileNotFoundError(f"{kind} file {str(path)!r} not found: {where}")


def resolve(name_or_path: str | os.PathLike[str], table: dict[str, str], kind: str) -> Path:
    """A registered short name (``imagenet``) or a path; errors list the names."""
    s = str(name_or_path)
    if s in table:
        p = data_dir() / table[s]
    else:
        p = Path(s)
        if not p.exists() and not any(c in s for c in "/\\."):
            raise unknown_name(kind, s, table)
    if not p.exists():
        if s in table:
            raise missing_data(kind, p)
        raise FileNotFoundError(f"{kind} file {str(p)!r} not found")
    return p


def _read_csv(path: str | os.PathLike[str], what: str) -> pd.DataFrame:
    """``pd.read_csv`` whose parse errors name the file and what it should hold."""
    try:
        return pd.read_csv(path)
    except (pd.errors.EmptyDataError, pd.errors.ParserError, UnicodeDecodeError) as exc:
        raise TraceFormatError(f"{path}: cannot read it as a {what} CSV: {exc}") from None


def _counts(path: object, line: int, **values: object) -> dict[str, int]:
    try:
        return {k: node_count(v, k) for k, v in values.items()}
    except SpecError as exc:
        raise TraceFormatError(f"{path}: line {line}: {exc}") from None


def load_curves(path: str | os.PathLike[str]) -> dict[str, ScalingCurve]:
    """``model -> ScalingCurve`` from a ``model,nodes,samples_per_s`` CSV."""
    df = _read_csv(path, "scaling curve")
    missing = {"model", "nodes", "samples_per_s"} - set(df.columns)
    if missing:
        raise TraceFormatError(f"{path}: curve file lacks column(s) {sorted(missing)}")
    out = {}
    for model, g in df.sort_values(["model", "nodes"]).groupby("model", sort=False):
        try:
            out[str(model)] = ScalingCurve(
                tuple(node_count(n, "nodes") for n in g["nodes"]),
                tuple(float(r) for r in g["samples_per_s"]),
                name=str(model),
            )
        except SpecError as exc:
            raise TraceFormatError(f"{path}: model {model!r}: {exc}") from exc
    return out


def load_jobset(
    name_or_path: str | os.PathLike[str], *, with_curves: bool = True, limit: int | None = None
) -> list[JobSpec]:
    """Jobs from a BFTrainer-style CSV (``job,model,min_nodes,...,submit_s``), in submit order.

    The matching ``<stem>_curves.csv`` beside it gives each job its true curve when
    ``with_curves`` (the oracle); without it, jobs carry no curve and must be profiled.
    """
    if limit is not None and (isinstance(limit, bool) or limit < 1):
        raise SpecError(f"limit {limit!r}: must be >= 1 jobs (None for all)")
    path = resolve(name_or_path, JOBSETS, "job set")
    df = _read_csv(path, "job set")
    need = {
        "job",
        "model",
        "min_nodes",
        "max_nodes",
        "total_samples",
        "rescale_up_s",
        "rescale_down_s",
        "submit_s",
    }
    missing = need - set(df.columns)
    if missing:
        raise TraceFormatError(f"{path}: job set lacks column(s) {sorted(missing)}")
    curves: dict[str, ScalingCurve] = {}
    if with_curves:
        cpath = path.with_name(path.stem + "_curves.csv")
        if not cpath.exists():
            raise FileNotFoundError(
                f"curve file {str(cpath)!r} for job set {str(path)!r} not found"
            )
        curves = load_curves(cpath)
    df = df.sort_values("submit_s", kind="stable")
    if limit is not None:
        df = df.head(limit)
    jobs = []
    for i, row in enumerate(df.itertuples(index=False)):
        model = str(row.model)
        if with_curves and model not in curves:
            raise TraceFormatError(f"{path}: line {i + 2}: model {model!r} has no curve")
        sizes = _counts(path, i + 2, min_nodes=row.min_nodes, max_nodes=row.max_nodes)
        jobs.append(
            JobSpec(
                job_id=str(row.job),
                **sizes,
                rescale_up_s=float(row.rescale_up_s),
                rescale_down_s=float(row.rescale_down_s),
                total_samples=float(row.total_samples),
                submit_s=float(row.submit_s),
                curve=curves.get(model),
                model=model,
            )
        )
    return jobs
