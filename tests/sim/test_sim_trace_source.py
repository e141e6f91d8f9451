"""The live trace-replay node source: time compression, renaming, ends, ordering."""

import pytest

from malleparsl.errors import SpecError
from malleparsl.scavenger.trace import TraceNodeSource
from malleparsl.traces import trace_from_fragments

TR = trace_from_fragments(
    [("x1", 0, 600), ("x2", 60, 120), ("x2", 120, 300)], start_s=0, end_s=600
)


def test_replays_compressed_on_the_callers_clock_and_renames():
    src = TraceNodeSource(trace=TR, speedup=60, node_names=["node-0", "node-1"])
    first = src.poll(50.0)  # the first poll fixes the origin
    assert [(e.kind, e.node, e.time_s) for e in first] == [("idle", "node-0", 50.0)]
    assert src.next_event_s() == pytest.approx(51.0)
    ev = src.poll(53.0)
    # x2's first fragment ends at 120 and its next starts at 120: taken before idle
    assert [(e.kind, e.node, e.time_s) for e in ev] == [
        ("idle", "node-1", 51.0), ("taken", "node-1", 52.0), ("idle", "node-1", 52.0),
    ]
    assert all(e.end_s is None for e in ev if e.kind == "idle")
    assert [(e.kind, e.node) for e in src.poll(100.0)] == [("taken", "node-1")]
    assert src.exhausted  # x1 is clipped at the window end: never "taken"


def test_announced_ends_are_on_the_callers_clock():
    src = TraceNodeSource(trace=TR, speedup=10, origin_s=0.0, announce_ends=True)
    ev = src.poll(20.0)
    assert [(e.node, e.time_s, e.end_s) for e in ev if e.kind == "idle"] == [
        ("x1", 0.0, 60.0), ("x2", 6.0, 12.0), ("x2", 12.0, 30.0),
    ]


def test_bad_arguments_say_how_to_fix():
    with pytest.raises(SpecError, match="speedup"):
        TraceNodeSource(trace=TR, speedup=0)
    with pytest.raises(SpecError, match="slice the trace"):
        TraceNodeSource(trace=TR, node_names=["only-one"])
    with pytest.raises(SpecError, match="origin"):
        TraceNodeSource(trace=TR).to_caller(5.0)
