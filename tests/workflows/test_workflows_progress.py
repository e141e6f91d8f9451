"""The live view's numbers come from the recorder's last sample and the runner's events."""

import io
import time

from rich.console import Console

from malleparsl.workflows.progress import ProgressView
from malleparsl.workflows.runner import ThreadTrialRunner, TrialEvent
from malleparsl.workflows.timeline import Recorder, Sample


def test_state_counts_nodes_trials_and_best_and_renders_without_a_terminal():
    rec = Recorder()
    abc = frozenset({"a", "b", "c"})
    rec.samples = [Sample(12.0, abc, abc, {"s-t1-r0": ("a", "b")}, {}, {"s-t1-r0": 250.0})]
    runner = ThreadTrialRunner(lambda c, b: {})
    runner.events += [
        TrialEvent(0, "submitted", "s", "t0", 0, "s-t0-r0"),
        TrialEvent(1, "finished", "s", "t0", 0, "s-t0-r0", {"accuracy": 0.91}),
        TrialEvent(1, "submitted", "s", "t1", 0, "s-t1-r0"),
        TrialEvent(2, "submitted", "s", "t2", 0, "s-t2-r0"),
        TrialEvent(3, "failed", "s", "t2", 0, "s-t2-r0"),
        TrialEvent(3, "submitted", "s", "t0", 1, "s-t0-r1"),
    ]
    buf = io.StringIO()
    view = ProgressView(recorder=rec, runner=runner, n_trials=5,
                        console=Console(file=buf, force_terminal=False, width=200))
    st = view.state()
    assert (st["ready"], st["used"], st["idle"]) == (3, 2, 1)
    assert st["running"] == {"s-t1-r0": 2} and st["trials"] == 3
    assert (st["finished"], st["failed"], st["best"]) == (1, 1, 0.91)
    assert st["pending"] == [("s", "t0", 1), ("s", "t1", 0)]
    with view:
        pass
    text = buf.getvalue()
    assert "nodes ready 3 used 2 idle 1" in text and "0.9100" in text and "s-t1-r0:2" in text
    live = io.StringIO()
    term = ProgressView(recorder=rec, runner=runner, refresh_s=0.05,
                        console=Console(file=live, force_terminal=True, width=120))
    with term:  # the rich live panel on a terminal
        time.sleep(0.3)
    assert "s-t1-r0" in live.getvalue() and "## 2" in live.getvalue()
    runner.close()
