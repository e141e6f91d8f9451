"""Trace loading: the Summit facts, node slices, windows, corrupt files and data locations."""

import gzip

import numpy as np
import pytest

from malleparsl.data import data_dir
from malleparsl.errors import SpecError, TraceFormatError, UnknownNameError
from malleparsl.traces import load_trace, parse_node_slice, trace_from_fragments

SUMMIT = data_dir() / "summit-idle-2021"
needs_summit = pytest.mark.skipif(not SUMMIT.is_dir(), reason="reference data not present")


@pytest.fixture(scope="module")
def summit():
    return load_trace("summit")


@needs_summit
def test_summit_loader_reproduces_the_readme_facts(summit):
    f = summit.fragments
    length = f["end_s"] - f["start_s"]
    assert len(f) == 423_502
    assert len(summit.nodes) == 4_734
    assert summit.mean_idle_nodes() == pytest.approx(391.4, abs=0.05)
    assert 100 * summit.mean_idle_nodes() / len(summit.nodes) == pytest.approx(8.27, abs=0.005)
    assert length.median() == 475
    assert length.mean() == pytest.approx(1_192, abs=0.5)
    assert length.quantile(0.9) == pytest.approx(3_270, abs=5)
    assert length.min() == 50
    assert len(summit.event_times()) == 23_883
    assert summit.duration_s == pytest.approx(14 * 86400 + 22 * 3600 + 10 * 60 + 37)


@needs_summit
def test_node_slice_takes_the_first_names_of_nodes_csv(summit):
    import pandas as pd

    names = tuple(pd.read_csv(SUMMIT / "nodes.csv")["node"])
    t = summit.select_nodes("0:128")
    assert t.nodes == names[:128]
    assert set(t.fragments["node"]) <= set(names[:128])
    assert t.select_nodes("10:20").nodes == names[10:20]


@needs_summit
def test_window_clips_fragments_and_keeps_absolute_times(summit):
    t = load_trace("summit", nodes="0:64", start_s=72_743, hours=24)
    assert (t.start_s, t.end_s) == (72_743, 72_743 + 86_400)
    assert t.fragments["start_s"].min() >= t.start_s
    assert t.fragments["end_s"].max() <= t.end_s
    times, counts = t.idle_count()
    # the step function integrates to the idle node-seconds
    area = float((np.diff(np.r_[times, t.end_s]) * counts).sum())
    assert area == pytest.approx(t.idle_node_seconds())


@needs_summit
def test_data_dir_honours_env_var_and_user_paths(tmp_path, monkeypatch):
    p = tmp_path / "mine.csv"
    p.write_text("node,start_s,end_s\na,0,10\nb,5,20\n")
    t = load_trace(str(p))
    assert t.nodes == ("a", "b") and t.idle_node_seconds() == 25
    (tmp_path / "summit-idle-2021").mkdir()
    with gzip.open(tmp_path / "summit-idle-2021" / "idle_fragments.csv.gz", "wt") as fh:
        fh.write("node,start_s,end_s,open_at_start,open_at_end\nx,1,3,0,0\n")
    (tmp_path / "summit-idle-2021" / "nodes.csv").write_text("node\nx\ny\n")
    monkeypatch.setenv("MALLEPARSL_DATA", str(tmp_path))
    t = load_trace("summit")
    assert t.nodes == ("x", "y") and len(t.fragments) == 1


@pytest.mark.parametrize(
    ("body", "line", "rule"),
    [
        ("node,start_s,end_s\na,0,10\nb,x,20\n", 3, "finite number"),
        ("node,start_s,end_s\na,0,10\nb,30,20\n", 3, "greater than start_s"),
        ("node,start_s,end_s\na,0,10\n,1,2\n", 3, "empty"),
        ("node,start_s,end_s\na,0,10\nb,1,2\na,5,12\n", 4, "overlaps"),
    ],
)
def test_corrupt_trace_lines_name_file_and_line(tmp_path, body, line, rule):
    p = tmp_path / "bad.csv"
    p.write_text(body)
    with pytest.raises(TraceFormatError, match=rf"bad\.csv: line {line}:.*{rule}"):
        load_trace(str(p))


def test_missing_columns_and_unknown_names_are_explained(tmp_path):
    p = tmp_path / "cols.csv"
    p.write_text("host,begin,stop\na,0,1\n")
    with pytest.raises(TraceFormatError, match="node,start_s,end_s"):
        load_trace(str(p))
    with pytest.raises(UnknownNameError, match="summit"):
        load_trace("sumit")


@pytest.mark.parametrize(
    ("text", "expected"),
    [("0:128", slice(0, 128)), ("128:256", slice(128, 256)), ("64", slice(0, 64)),
     (":10", slice(None, 10)), ("5:", slice(5, None))],
)
def test_parse_node_slice(text, expected):
    assert parse_node_slice(text) == expected


@pytest.mark.parametrize("text", ["a:b", "10:5", "1:2:3"])
def test_bad_node_slice_is_rejected_with_the_fix(text):
    with pytest.raises(SpecError, match="START:END|END must be greater"):
        parse_node_slice(text)


def test_in_memory_trace_counts():
    t = trace_from_fragments([("a", 0, 10), ("b", 5, 15), ("a", 12, 20)])
    times, counts = t.idle_count()
    assert list(times) == [0, 5, 10, 12, 15, 20]
    assert list(counts) == [1, 2, 1, 2, 1, 0]
    assert t.mean_idle_nodes() == pytest.approx(28 / 20)
