"""Idle-node traces: which node is idle when, loaded from real data or derived from job logs.

An :class:`IdleTrace` is a table of *fragments* ``(node, start_s, end_s)``: the node is idle in
``[start_s, end_s)``. Sources:

- the Summit trace shipped with the package (``"summit"``) and any CSV of the same form
  (``node,start_s,end_s[,open_at_start,open_at_end][,known_end]``);
- a job log in the Standard Workload Format (SWF), re-scheduled by our own first-come
  first-served + EASY-backfill scheduler (:mod:`malleparsl.sim.backfill`) on a machine of a
  given size, so that any facility's log yields the gaps its scheduler would leave.

Times stay in the source's seconds (the Summit trace: seconds since 2021-02-10 00:08:52 UTC),
so job sets whose ``submit_s`` use the same origin line up. A corrupt line raises
:class:`~malleparsl.errors.TraceFormatError` naming the file and the line.
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from malleparsl.data import data_dir, missing_data
from malleparsl.errors import SpecError, TraceFormatError, unknown_name
from malleparsl.model import NodeId

log = logging.getLogger(__name__)

TRACES = {"summit": "summit-idle-2021/idle_fragments.csv.gz"}
"""Short names of the traces shipped with the package (:func:`malleparsl.data.data_dir`)."""

_NODE_FILES = {"summit": "summit-idle-2021/nodes.csv"}

JOB_LOGS = {"theta": "theta-2023-swf/theta_2023.swf"}
"""Short names of the facility job logs shipped with the package (re-scheduled into fragments)."""


@dataclass(frozen=True)
class IdleTrace:
    """Idle fragments of a set of nodes over ``[start_s, end_s)``.

    ``fragments`` has columns ``node`` (str), ``start_s``, ``end_s`` (float) and ``known_end``
    (bool: the source announced the end when the fragment began, as a batch scheduler's plan
    does; the simulator then tells the controller). ``nodes`` lists every node of the machine
    slice, including nodes that are never idle.
    """

    fragments: pd.DataFrame
    nodes: tuple[NodeId, ...]
    start_s: float
    end_s: float
    name: str = ""

    @property
    def duration_s(self) -> float:
        return self.end_s - self.start_s

    def idle_node_seconds(self) -> float:
        """Sum of fragment lengths: the node-seconds a perfect tenant could use."""
        return float((self.fragments["end_s"] - self.fragments["start_s"]).sum())

    def mean_idle_nodes(self) -> float:
        """Time-weighted mean number of idle nodes."""
        return self.idle_node_seconds() / self.duration_s if self.duration_s > 0 else 0.0

    def event_times(self) -> np.ndarray:
        """Distinct times at which some node becomes idle or busy (plus the window start)."""
        f = self.fragments
        return np.union1d(np.union1d(f["start_s"], f["end_s"]), [self.start_s])

    def idle_count(self) -> tuple[np.ndarray, np.ndarray]:
        """Step function ``(times, n_idle)``: ``n_idle[i]`` nodes idle from ``times[i]`` on."""
        f = self.fragments
        t = np.concatenate([f["start_s"].to_numpy(), f["end_s"].to_numpy()])
        d = np.concatenate([np.ones(len(f)), -np.ones(len(f))])
        order = np.argsort(t, kind="stable")
        times, idx = np.unique(t[order], return_index=True)
        counts = np.cumsum(d[order])
        last = np.r_[idx[1:], len(t)] - 1
        return times, counts[last].astype(int) if len(t) else counts.astype(int)

    def window(self, start_s: float | None = None, end_s: float | None = None) -> IdleTrace:
        """The trace clipped to ``[start_s, end_s)`` (fragments cut at the edges)."""
        lo = self.start_s if start_s is None else float(start_s)
        hi = self.end_s if end_s is None else float(end_s)
        if not hi > lo:
            raise SpecError(
                f"time window [{lo:g}, {hi:g}) s is empty: trace {self.name!r} spans "
                f"[{self.start_s:g}, {self.end_s:g}) s ({self.duration_s / 3600:.1f} h); "
                "give a start inside it and an end after the start"
            )
        f = self.fragments
        keep = (f["end_s"] > lo) & (f["start_s"] < hi)
        g = f.loc[keep].copy()
        g["start_s"] = g["start_s"].clip(lower=lo)
        g["end_s"] = g["end_s"].clip(upper=hi)
        g = g[g["end_s"] > g["start_s"]].reset_index(drop=True)
        return IdleTrace(g, self.nodes, lo, hi, self.name)

    def select_nodes(self, which: str | slice | None) -> IdleTrace:
        """Keep a slice of the machine's nodes (``"0:128"`` = the first 128 node names)."""
        if which is None:
            return self
        sl = parse_node_slice(which) if isinstance(which, str) else which
        if sl.stop is not None and sl.stop > len(self.nodes):  # never clamp silently
            raise SpecError(
                f"node slice {which!r} reaches past the trace's {len(self.nodes)} nodes; "
                f"give START:END with END <= {len(self.nodes)}"
            )
        nodes = self.nodes[sl]
        if not nodes:
            raise SpecError(
                f"node slice {which!r} selects no node of the {len(self.nodes)}; "
                f"give START:END within 0:{len(self.nodes)}"
            )
        f = self.fragments
        g = f[f["node"].isin(set(nodes))].reset_index(drop=True)
        return IdleTrace(g, tuple(nodes), self.start_s, self.end_s, self.name)


def parse_node_slice(text: str) -> slice:
    """``"0:128"`` -> ``slice(0, 128)``; ``"512"`` -> the first 512 nodes."""
    m = re.fullmatch(r"\s*(\d*)\s*(?::\s*(\d*)\s*)?", str(text))
    if not m:
        raise SpecError(f"node slice {text!r} is not START:END; write e.g. 0:128, 128:256, "
                        "or 512 for the first 512")
    a, b = m.group(1), m.group(2)
    if m.group(0).count(":") == 0:
        return slice(0, int(a)) if a else slice(None)
    s = slice(int(a) if a else None, int(b) if b else None)
    if s.start is not None and s.stop is not None and s.stop <= s.start:
        raise SpecError(f"node slice {text!r} is empty; END must be greater than START")
    return s


def _resolve_trace(name_or_path: str | os.PathLike[str]) -> tuple[Path, Path | None]:
    s = str(name_or_path)
    if s in TRACES:
        base = data_dir()
        path, nodes = base / TRACES[s], base / _NODE_FILES[s]
    else:
        path = Path(s)
        if not path.exists() and not any(c in s for c in "/\\."):
            raise unknown_name("trace", s, {**TRACES, **JOB_LOGS})
        cand = path.with_name("nodes.csv")
        nodes = cand if cand.exists() else None
    if not path.exists():
        if s in TRACES:
            raise missing_data("trace", path)
        raise FileNotFoundError(f"trace file {str(path)!r} not found")
    return path, nodes


def _bad_line(path: Path, df: pd.DataFrame, mask: pd.Series, rule: str) -> TraceFormatError:
    i = int(np.flatnonzero(mask.to_numpy())[0])
    row = df.iloc[i].to_dict()
    return TraceFormatError(f"{path}: line {i + 2}: {row} — {rule}")


def read_fragments(path: str | os.PathLike[str]) -> pd.DataFrame:
    """Read and check a fragment CSV; returns columns node, start_s, end_s, known_end."""
    path = Path(path)
    fast = _read_fast(path)
    if fast is not None:
        return fast
    try:
        raw = pd.read_csv(path, dtype=str, keep_default_na=False)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError, EOFError,
            OSError) as exc:
        raise TraceFormatError(f"{path}: cannot parse as a fragment CSV: {exc}") from exc
    missing = {"node", "start_s", "end_s"} - set(raw.columns)
    if missing:
        raise TraceFormatError(
            f"{path}: lacks column(s) {sorted(missing)}; a trace CSV needs node,start_s,end_s"
        )
    bad = raw["node"].str.strip() == ""
    if bad.any():
        raise _bad_line(path, raw, bad, "node name is empty")
    out = pd.DataFrame({"node": raw["node"].astype(str)})
    for col in ("start_s", "end_s"):
        out[col] = pd.to_numeric(raw[col], errors="coerce").astype(float)
        bad = ~np.isfinite(out[col])
        if bad.any():
            raise _bad_line(path, raw, bad, f"{col} must be a finite number of seconds")
    bad = out["end_s"] <= out["start_s"]
    if bad.any():
        raise _bad_line(path, raw, bad, "end_s must be greater than start_s")
    if "known_end" in raw.columns:
        out["known_end"] = raw["known_end"].isin(["1", "True", "true"])
    else:
        out["known_end"] = False
    _check_overlaps(path, out)
    return out.sort_values(["start_s", "node"], kind="stable").reset_index(drop=True)


def _read_fast(path: Path) -> pd.DataFrame | None:
    """Numeric read of a clean file; ``None`` sends the caller to the line-checking path."""
    try:
        raw = pd.read_csv(path)
    except Exception:  # noqa: BLE001 - any trouble: let the careful path name the line
        return None
    if not {"node", "start_s", "end_s"} <= set(raw.columns):
        return None
    st, en = raw["start_s"], raw["end_s"]
    if not (pd.api.types.is_numeric_dtype(st) and pd.api.types.is_numeric_dtype(en)):
        return None
    if raw["node"].isna().any() or not (np.isfinite(st).all() and np.isfinite(en).all()):
        return None
    if (en <= st).any():
        return None
    if "known_end" in raw.columns and not pd.api.types.is_numeric_dtype(raw["known_end"]):
        return None
    out = pd.DataFrame({
        "node": raw["node"].astype(str),
        "start_s": st.astype(float),
        "end_s": en.astype(float),
        "known_end": raw["known_end"].astype(bool) if "known_end" in raw.columns else False,
    })
    _check_overlaps(path, out)
    return out.sort_values(["start_s", "node"], kind="stable").reset_index(drop=True)


def _check_overlaps(path: Path, f: pd.DataFrame) -> None:
    g = f.sort_values(["node", "start_s"], kind="stable")
    same = g["node"].to_numpy()[1:] == g["node"].to_numpy()[:-1]
    over = g["start_s"].to_numpy()[1:] < g["end_s"].to_numpy()[:-1]
    hit = np.flatnonzero(same & over)
    if len(hit):
        r = g.iloc[hit[0] + 1]
        raise TraceFormatError(
            f"{path}: line {int(r.name) + 2}: fragment of node {r['node']!r} starting at "
            f"{r['start_s']} overlaps the previous one of that node; fragments must not overlap"
        )


def load_trace(
    name_or_path: str | os.PathLike[str] = "summit",
    *,
    nodes: str | slice | None = None,
    start_s: float | None = None,
    end_s: float | None = None,
    hours: float | None = None,
    machine_nodes: int | None = None,
) -> IdleTrace:
    """Load an idle-node trace by short name or path; a ``.swf`` file goes through the scheduler.

    Short names: ``"summit"`` (idle fragments) and ``"theta"`` (a job log), both shipped with
    the package.

    ``nodes`` is a node slice (``"0:128"``); ``start_s``/``end_s`` or ``start_s``/``hours`` set
    the time window (default: the whole trace). ``machine_nodes`` sizes the machine an SWF log is
    re-scheduled on (default: the log's ``MaxNodes`` header).

    >>> t = load_trace("summit", nodes="0:64", hours=24)  # doctest: +SKIP
    >>> round(t.mean_idle_nodes(), 1)  # doctest: +SKIP
    """
    s = str(name_or_path)
    if s in JOB_LOGS:
        log_path = data_dir() / JOB_LOGS[s]
        if not log_path.exists():
            raise missing_data("job log", log_path)
        s = str(log_path)
    if s.lower().endswith((".swf", ".swf.gz")):
        from malleparsl.sim.backfill import swf_to_trace

        trace = swf_to_trace(s, machine_nodes=machine_nodes)
    else:
        path, nodes_file = _resolve_trace(name_or_path)
        frags = read_fragments(path)
        if nodes_file is not None:
            names = tuple(pd.read_csv(nodes_file)["node"].astype(str))
            extra = set(frags["node"]) - set(names)
            if extra:
                raise TraceFormatError(
                    f"{path}: node(s) {sorted(extra)[:3]} are missing from {nodes_file}"
                )
        else:
            names = tuple(dict.fromkeys(frags.sort_values("node", kind="stable")["node"]))
        t0 = 0.0 if s in TRACES else float(frags["start_s"].min()) if len(frags) else 0.0
        t1 = float(frags["end_s"].max()) if len(frags) else t0 + 1.0
        trace = IdleTrace(frags, names, t0, t1, name=s if s in TRACES else Path(s).stem)
    trace = trace.select_nodes(nodes)
    if hours is not None:
        if not hours > 0:
            raise SpecError(f"hours must be > 0, got {hours!r}")
        lo = trace.start_s if start_s is None else float(start_s)
        end_s = lo + 3600.0 * float(hours) if end_s is None else min(end_s, lo + 3600 * hours)
    if start_s is not None or end_s is not None:
        trace = trace.window(start_s, end_s)
    log.info(
        "trace %s: %d nodes, %d fragments, %.0f s, mean idle %.1f",
        trace.name, len(trace.nodes), len(trace.fragments), trace.duration_s,
        trace.mean_idle_nodes(),
    )
    return trace


def trace_from_fragments(
    rows: list[tuple[NodeId, float, float]] | pd.DataFrame,
    *,
    nodes: tuple[NodeId, ...] | None = None,
    start_s: float | None = None,
    end_s: float | None = None,
    known_end: bool = False,
    name: str = "fragments",
) -> IdleTrace:
    """Build a trace from in-memory ``(node, start_s, end_s)`` rows (tests, generators)."""
    f = rows.copy() if isinstance(rows, pd.DataFrame) else pd.DataFrame(
        rows, columns=["node", "start_s", "end_s"]
    )
    f["node"] = f["node"].astype(str)
    f["start_s"] = f["start_s"].astype(float)
    f["end_s"] = f["end_s"].astype(float)
    if "known_end" not in f.columns:
        f["known_end"] = known_end
    if (f["end_s"] <= f["start_s"]).any():
        raise SpecError("every fragment needs end_s > start_s")
    f = f.sort_values(["start_s", "node"], kind="stable").reset_index(drop=True)
    _check_overlaps(Path(name), f)
    names = nodes or tuple(sorted(set(f["node"])))
    t0 = float(f["start_s"].min()) if start_s is None and len(f) else float(start_s or 0.0)
    t1 = float(f["end_s"].max()) if end_s is None and len(f) else float(end_s or t0 + 1.0)
    tr = IdleTrace(f, tuple(names), t0, t1, name)
    return tr.window(t0, t1)
