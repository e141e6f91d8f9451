"""The result of a search: a table of trials with their metrics, and the best one's checkpoint.

Every unit of work a stage ran is one :class:`TrialRow` (a trial at one rung). The
:class:`TrialsTable` ranks them, finds the best configuration and its checkpoint, and saves
itself as ``trials.csv`` plus ``best.json`` so the sweep's outcome outlives the Python process.

>>> t = TrialsTable([TrialRow(stage="s", trial_id="a", rung=0, budget=1, config={"lr": 0.1},
...                           metrics={"accuracy": 0.9}, status="stopped"),
...                  TrialRow(stage="s", trial_id="b", rung=1, budget=3, config={"lr": 0.01},
...                           metrics={"accuracy": 0.8}, status="stopped")])
>>> t.best().trial_id     # the best at the largest budget reached
'b'
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from malleparsl.errors import SpecError


@dataclass
class TrialRow:
    """One trial at one rung: what it ran with, where it ran, how it did."""

    stage: str
    trial_id: str
    rung: int = 0
    budget: float = 1.0
    config: dict[str, Any] = field(default_factory=dict)
    parent: str | None = None
    metrics: dict[str, Any] = field(default_factory=dict)
    status: str = "running"  # running | promoted | paused | stopped | failed
    error: str | None = None
    job_id: str | None = None
    ckpt_dir: str | None = None
    started_s: float | None = None
    finished_s: float | None = None
    sizes: list[tuple[float, int]] = field(default_factory=list)  # (time, nodes) changes

    @property
    def ok(self) -> bool:
        return self.status != "failed" and bool(self.metrics)

    @property
    def checkpoint(self) -> str | None:
        """The newest checkpoint file of this trial, if one was written."""
        if not self.ckpt_dir or not os.path.isdir(self.ckpt_dir):
            return None
        files = [os.path.join(self.ckpt_dir, f) for f in os.listdir(self.ckpt_dir)]
        files = [f for f in files if os.path.isfile(f) and not f.endswith(".tmp")]
        return max(files, key=os.path.getmtime) if files else None

    def flat(self) -> dict[str, Any]:
        """A flat dict for a table row (config and metric keys prefixed)."""
        d = {k: v for k, v in asdict(self).items() if k not in ("config", "metrics", "sizes")}
        d.update({f"config.{k}": _cell(v) for k, v in self.config.items()})
        d.update({f"metric.{k}": _cell(v) for k, v in self.metrics.items()})
        d["max_nodes_used"] = max((n for _, n in self.sizes), default=0)
        d["rescales"] = max(0, len(self.sizes) - 1)
        d["wall_s"] = (self.finished_s - self.started_s) if self.finished_s and self.started_s else None
        return d


def _cell(v: Any) -> Any:
    return json.dumps(v) if isinstance(v, (list, dict, tuple)) else v


class TrialsTable:
    """All trials of a workflow; ``metric``/``mode`` say what "best" means."""

    def __init__(self, rows: Iterable[TrialRow], *, metric: str = "accuracy", mode: str = "max") -> None:
        if mode not in ("max", "min"):
            raise SpecError(f"mode must be 'max' or 'min', got {mode!r}")
        self.rows, self.metric, self.mode = list(rows), metric, mode

    def __len__(self) -> int:
        return len(self.rows)

    def _key(self, r: TrialRow) -> tuple[float, float, str]:
        v = float(r.metrics.get(self.metric, math.nan))
        if math.isnan(v):
            v = -math.inf if self.mode == "max" else math.inf
        return (-float(r.budget), -v if self.mode == "max" else v, f"{r.stage}/{r.trial_id}")

    def final_rows(self) -> list[TrialRow]:
        """Each trial's completed row at its highest rung, best first (largest budget first)."""
        last: dict[tuple[str, str], TrialRow] = {}
        for r in self.rows:
            if not r.ok:
                continue
            k = (r.stage, r.trial_id)
            if k not in last or r.rung > last[k].rung:
                last[k] = r
        return sorted(last.values(), key=self._key)

    def best(self, stage: str | None = None) -> TrialRow | None:
        """The best trial (of ``stage``, or of all) at the largest budget any trial reached."""
        rows = [r for r in self.final_rows() if stage is None or r.stage == stage]
        return rows[0] if rows else None

    def failed(self) -> list[TrialRow]:
        return [r for r in self.rows if r.status == "failed"]

    def to_frame(self):
        """The table as a pandas DataFrame, one row per trial and rung."""
        import pandas as pd

        return pd.DataFrame([r.flat() for r in self.rows])

    def save(self, folder: str | os.PathLike[str]) -> dict[str, Path]:
        """Write ``trials.csv`` and ``best.json`` (config, metrics, checkpoint path) to ``folder``."""
        out = Path(folder)
        out.mkdir(parents=True, exist_ok=True)
        paths = {"trials": out / "trials.csv", "best": out / "best.json"}
        self.to_frame().to_csv(paths["trials"], index=False)
        best = self.best()
        doc = None if best is None else {
            "stage": best.stage, "trial_id": best.trial_id, "rung": best.rung,
            "budget": best.budget, "config": best.config, "metrics": best.metrics,
            "checkpoint": best.checkpoint, "ckpt_dir": best.ckpt_dir,
        }
        paths["best"].write_text(json.dumps(doc, indent=2, default=str))
        return paths
