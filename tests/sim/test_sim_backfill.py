"""Our FCFS + EASY-backfill scheduler on small hand-made SWF logs: exact idle fragments."""

import pytest

from malleparsl.errors import TraceFormatError
from malleparsl.sim.backfill import SwfJob, easy_backfill, read_swf, swf_to_trace
from malleparsl.traces import load_trace


def swf_line(job, submit, run, nodes, req):
    return f"{job} {submit} -1 {run} {nodes} -1 -1 {nodes} {req} -1 1 1 -1 -1 -1 -1 -1 0"


def write_swf(tmp_path, rows, max_nodes=4, name="log.swf"):
    p = tmp_path / name
    p.write_text(
        f"; UnixStartTime: 0\n; MaxNodes: {max_nodes}\n"
        + "\n".join(swf_line(*r) for r in rows) + "\n"
    )
    return p


def frags(trace):
    f = trace.fragments
    return sorted(zip(f["node"], f["start_s"], f["end_s"]))


def test_backfill_a_short_job_before_the_head_reservation(tmp_path):
    # J1 3 nodes 0-100; J2 (4 nodes) must wait for 100; J3 (1 node, 30 s) fits before 100;
    # J4 (1 node, 100 s) would delay J2, so it waits until J2 ends at 150.
    p = write_swf(tmp_path, [
        (1, 0, 100, 3, 100), (2, 10, 50, 4, 50), (3, 20, 30, 1, 30), (4, 30, 100, 1, 100),
    ])
    t = load_trace(str(p))
    assert t.nodes == ("n0", "n1", "n2", "n3")
    assert (t.start_s, t.end_s) == (0, 250)
    assert frags(t) == [
        ("n1", 150, 250), ("n2", 150, 250), ("n3", 0, 20), ("n3", 50, 100), ("n3", 150, 250),
    ]


def test_backfill_onto_the_extra_nodes_of_the_reservation(tmp_path):
    # J2 needs 3 of 4 at t=100 -> one extra node: a long 1-node job may take it (J3), a second
    # (J4) may not.
    p = write_swf(tmp_path, [
        (1, 0, 100, 2, 100), (2, 1, 50, 3, 50), (3, 2, 500, 1, 500), (4, 3, 500, 1, 500),
    ])
    t = load_trace(str(p))
    assert t.end_s == 650
    assert frags(t) == [
        ("n1", 150, 650), ("n2", 0, 2), ("n2", 502, 650), ("n3", 0, 100), ("n3", 150, 650),
    ]


def test_fcfs_order_follows_submit_time_not_file_order_and_runtime_is_capped(tmp_path):
    # lines out of order; job 2 ran 999 s but asked for 40 s: it is killed at 40
    p = write_swf(tmp_path, [(2, 5, 999, 4, 40), (1, 0, 10, 4, 60)], max_nodes=4)
    jobs, header = read_swf(p)
    assert [j.job_id for j in jobs] == [1, 2] and jobs[1].run_s == 40
    assert header["MaxNodes"] == "4"
    frags_, t0, t1, starts = easy_backfill(jobs, 4)
    assert starts == {1: 0, 2: 10} and (t0, t1) == (0, 50)
    assert frags_ == []


def test_oversized_jobs_are_clamped_and_cancelled_jobs_skipped(tmp_path):
    p = write_swf(tmp_path, [(1, 0, 10, 9, 10), (2, 0, -1, 2, 10), (3, 0, 10, 1, 10)], max_nodes=2)
    jobs, _ = read_swf(p)
    assert [j.job_id for j in jobs] == [1, 3]
    t = swf_to_trace(p)
    # job 1 takes both nodes 0-10, job 3 then runs on n0 10-20 while n1 idles
    assert frags(t) == [("n1", 10, 20)]


def test_machine_size_can_be_given(tmp_path):
    p = write_swf(tmp_path, [(1, 0, 10, 1, 10)], max_nodes=1)
    t = load_trace(str(p), machine_nodes=3)
    assert t.nodes == ("n0", "n1", "n2")
    assert frags(t) == [("n1", 0, 10), ("n2", 0, 10)]


@pytest.mark.parametrize(
    ("line", "rule"),
    [("1 0 -1 10 1", "18 whitespace-separated"), (swf_line(1, 0, 10, 1, 10).replace("10", "x", 1),
                                                  "non-numeric")],
)
def test_corrupt_swf_line_names_file_and_line(tmp_path, line, rule):
    p = tmp_path / "bad.swf"
    p.write_text("; MaxNodes: 4\n" + swf_line(1, 0, 10, 1, 10) + "\n" + line + "\n")
    with pytest.raises(TraceFormatError, match=rf"bad\.swf: line 3: .*{rule}"):
        read_swf(p)


def test_random_log_conserves_node_seconds_and_never_double_books():
    # every job starts after it is submitted; idle + busy node-seconds fill the machine exactly
    import random

    rng = random.Random(3)
    jobs = [
        SwfJob(i, float(rng.randint(0, 400)), float(rng.randint(1, 80)), rng.randint(1, 6),
               float(rng.randint(80, 120)))
        for i in range(60)
    ]
    jobs.sort(key=lambda j: (j.submit_s, j.job_id))
    fr, t0, t1, starts = easy_backfill(jobs, 8)
    assert all(starts[j.job_id] >= j.submit_s for j in jobs)
    idle = sum(e - s for _, s, e in fr)
    work = sum(j.run_s * j.nodes for j in jobs)
    assert idle + work == pytest.approx(8 * (t1 - t0))
    # no node is double-booked: per node, fragments are disjoint and within the span
    by_node = {}
    for n, s, e in fr:
        by_node.setdefault(n, []).append((s, e))
    for spans in by_node.values():
        spans.sort()
        assert all(b[0] >= a[1] for a, b in zip(spans, spans[1:]))


THETA = __import__("malleparsl.data", fromlist=["data_dir"]).data_dir() / "theta-2023-swf"


@pytest.mark.skipif(not THETA.is_dir(), reason="reference data not present")
def test_theta_log_reschedules_with_its_wrinkles(caplog):
    jobs, header = read_swf(THETA / "theta_2023.swf")
    assert header["MaxNodes"] == "4360"
    assert max(j.nodes for j in jobs) > 4360  # the log's oversized jobs are still read
    with caplog.at_level("WARNING"):
        t = load_trace(str(THETA / "theta_2023.swf"))
    assert "clamped" in caplog.text
    assert len(t.nodes) == 4360
    busy = sum(min(j.nodes, 4360) * j.run_s for j in jobs)
    assert t.idle_node_seconds() + busy == pytest.approx(4360 * t.duration_s)
    assert 0 < t.mean_idle_nodes() < 4360
