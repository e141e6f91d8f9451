"""Live progress of a workflow run: nodes idle and used, trials running with their sizes, best
accuracy so far.

Built from what the :class:`~malleparsl.workflows.timeline.Recorder` samples and the trial
events the runner logs, so the display never asks the executor anything itself. On a terminal
it is a ``rich`` live panel; otherwise (CI logs, pipes) a status line every few seconds.
"""

from __future__ import annotations

import math
import threading
import time
from typing import Any

from .runner import TrialRunner
from .timeline import Recorder


class ProgressView:
    """Renders the state of a run; ``with view:`` keeps it on screen while the run goes."""

    def __init__(self, *, recorder: Recorder, runner: TrialRunner, n_trials: int | None = None,
                 metric: str = "accuracy", title: str = "malleparsl", console: Any = None,
                 refresh_s: float = 0.5, line_every_s: float = 5.0) -> None:
        from rich.console import Console

        self.recorder, self.runner, self.n_trials = recorder, runner, n_trials
        self.metric, self.title = metric, title
        self.console = console if console is not None else Console()
        self.refresh_s, self.line_every_s = refresh_s, line_every_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._live: Any = None

    # ---- state --------------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        """Counts and bests as plain values (what both renderings show)."""
        events = list(self.runner.events)
        submitted = {(e.stage, e.trial_id, e.rung): e for e in events if e.kind == "submitted"}
        ended = {(e.stage, e.trial_id, e.rung): e for e in events if e.kind != "submitted"}
        best, best_id = -math.inf, None
        for e in ended.values():
            v = e.metrics.get(self.metric)
            if isinstance(v, (int, float)) and v > best:
                best, best_id = float(v), f"{e.stage}/{e.trial_id}@r{e.rung}"
        s = self.recorder.latest()
        trials = {(e.stage, e.trial_id) for e in events}
        return {
            "t": s.t if s else 0.0,
            "ready": len(s.ready) if s else 0,
            "usable": len(s.usable) if s else 0,
            "used": len(s.used) if s else 0,
            "idle": len(s.idle) if s else 0,
            "running": {j: len(n) for j, n in (s.running.items() if s else [])},
            "rates": dict(s.rates) if s else {},
            "pending": sorted(k for k in submitted if k not in ended),
            "trials": len(trials),
            "finished": sum(1 for e in ended.values() if e.kind == "finished"),
            "failed": sum(1 for e in ended.values() if e.kind == "failed"),
            "best": None if best_id is None else best,
            "best_id": best_id,
        }

    def line(self) -> str:
        st = self.state()
        best = "-" if st["best"] is None else f"{st['best']:.4f} ({st['best_id']})"
        sizes = " ".join(f"{j}:{n}" for j, n in sorted(st["running"].items())) or "-"
        return (f"[{st['t']:6.1f}s] nodes ready {st['ready']} used {st['used']} idle "
                f"{st['idle']} | runs done {st['finished']} failed {st['failed']} waiting/"
                f"running {len(st['pending'])} | sizes {sizes} | best {self.metric} {best}")

    def render(self) -> Any:
        from rich.console import Group
        from rich.table import Table
        from rich.text import Text

        st = self.state()
        head = Text.assemble(
            (f"{self.title}  ", "bold"), f"t={st['t']:.0f}s   ",
            ("nodes ", "bold"), f"ready {st['ready']}  used {st['used']}  idle {st['idle']}   ",
            ("trials ", "bold"), f"{st['trials']}"
            + (f"/{self.n_trials}" if self.n_trials else "")
            + f"  runs done {st['finished']}  failed {st['failed']}   ",
            (f"best {self.metric} ", "bold"),
            ("-" if st["best"] is None else f"{st['best']:.4f}", "green"),
            f"  {st['best_id'] or ''}",
        )
        table = Table(show_header=True, header_style="bold", expand=False)
        for col in ("job (stage-trial-rung)", "nodes", "samples/s"):
            table.add_column(col)
        for job, n in sorted(st["running"].items()):
            rate = st["rates"].get(job)
            table.add_row(job, "#" * n + f" {n}", "-" if rate is None else f"{rate:,.0f}")
        waiting = [f"{s}-{t}-r{r}" for s, t, r in st["pending"]]
        waiting = [w for w in waiting if w not in st["running"]]
        foot = Text(f"waiting for nodes: {', '.join(waiting[:8])}" + (" ..." if len(waiting) > 8 else "")
                    if waiting else "")
        return Group(head, table, foot)

    # ---- display ------------------------------------------------------------------------
    def __enter__(self) -> ProgressView:
        if self.console.is_terminal:
            from rich.live import Live

            self._live = Live(self.render(), console=self.console, refresh_per_second=4,
                              transient=False)
            self._live.__enter__()
        self._thread = threading.Thread(target=self._loop, name="progress", daemon=True)
        self._thread.start()
        return self

    def _loop(self) -> None:
        last_line = 0.0
        while not self._stop.wait(self.refresh_s):
            try:
                if self._live is not None:
                    self._live.update(self.render())
                elif time.monotonic() - last_line >= self.line_every_s:
                    last_line = time.monotonic()
                    self.console.print(self.line(), highlight=False, soft_wrap=True)
            except Exception:  # a display glitch must not stop the run
                pass

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
        if self._live is not None:
            self._live.update(self.render())
            self._live.__exit__(*exc)
        else:
            self.console.print(self.line(), highlight=False, soft_wrap=True)
