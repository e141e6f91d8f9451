"""MalleableExecutor's API without starting processes: validation and the malleable hand-off."""

from __future__ import annotations

import pytest
from parsl.executors.errors import InvalidResourceSpecification
from parsl.providers import LocalProvider

from malleparsl.errors import SpecError
from malleparsl.executors import MalleableExecutor
from malleparsl.executors.interchange import AFFINITY_KEY
from malleparsl.site_configs.local import local_config


class FakeControl:
    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def submit_job(self, entry, options, args, kwargs):
        self.calls.append((entry, options, args, kwargs))
        return "future"


def entry(*a, **k):
    return a, k


def test_malleable_resource_spec_goes_to_the_control_loop():
    ex = MalleableExecutor(nodes=0)
    ex.control = FakeControl()
    opts = {"min_nodes": 1, "max_nodes": 3, "job_id": "j"}
    assert ex.submit(entry, {"malleable": opts}, 1, 2, lr=0.1) == "future"
    (got, got_opts, args, kwargs), = ex.control.calls
    # a plain training function (e.g. from a plain @python_app) is wrapped as a rank entry
    from malleparsl.apps.entry import RankEntry

    assert isinstance(got, RankEntry) and got.user_fn is entry
    assert (got_opts, args, kwargs) == (opts, (1, 2), {"lr": 0.1})


def test_an_entry_is_handed_to_the_control_loop_unchanged():
    from malleparsl.executors.synthetic import synthetic_entry

    ex = MalleableExecutor(nodes=0)
    ex.control = FakeControl()
    ex.submit(synthetic_entry, {"malleable": {"max_nodes": 2}})
    assert ex.control.calls[0][0] is synthetic_entry


def test_malleable_spec_without_control_loop_is_an_error():
    ex = MalleableExecutor(nodes=0)
    with pytest.raises(SpecError, match="no control loop"):
        ex.submit(entry, {"malleable": {"min_nodes": 1}})


def test_resource_spec_validation_keeps_htex_rules():
    ex = MalleableExecutor()
    ex.validate_resource_spec({"priority": 3, "malleable": {}, "node": "n"})
    with pytest.raises(InvalidResourceSpecification):
        ex.validate_resource_spec({"cores": 2})
    with pytest.raises(InvalidResourceSpecification):  # users cannot pin by block id
        ex.validate_resource_spec({AFFINITY_KEY: "0"})


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"nodes": -1}, "nodes must be an integer >= 0"),
        ({"nodes": True}, "nodes must be an integer >= 0"),
        ({"poll_period_s": 0}, "poll_period_s must be > 0"),
        ({"provider": LocalProvider(nodes_per_block=2)}, "nodes_per_block=2"),
    ],
)
def test_constructor_rejects_bad_values(kwargs, match):
    with pytest.raises(SpecError, match=match):
        MalleableExecutor(**kwargs)


def test_defaults_notice_lost_nodes_fast_and_use_the_affinity_interchange():
    ex = MalleableExecutor()
    assert ex.heartbeat_threshold <= 10 and ex.heartbeat_period <= 2
    assert list(ex.interchange_launch_cmd)[-2:] == ["-m", "malleparsl.executors.interchange"]
    assert ex.provider.init_blocks == 0  # nodes are started by name, not by Parsl's strategy
    assert repr(ex).startswith("MalleableExecutor(")


def test_repr_shows_the_control_options_not_the_loop():
    """``control`` is the live loop once started (None before): the repr shows the options the
    executor was given, so a printed config says what it runs with."""
    from malleparsl.executors import ControlOptions

    ex = MalleableExecutor(control=ControlOptions(ranks_per_node=1, max_active=3), label="m")
    text = repr(ex)
    assert "control=None" not in text and "control=ControlOptions(" in text
    assert "max_active=3" in text and "label='m'" in text


def test_local_config_builds_n_emulated_nodes():
    cfg = local_config(nodes=3, run_dir="/tmp/x", policy="equal-share")
    (ex,) = cfg.executors
    assert isinstance(ex, MalleableExecutor)
    assert ex.nodes == 3 and ex.policy == "equal-share" and ex.address == "127.0.0.1"
    assert cfg.strategy == "none" and cfg.run_dir == "/tmp/x"
    assert ex.provider.nodes_per_block == 1 and ex.provider.init_blocks == 0
    with pytest.raises(SpecError, match="nodes must be an integer >= 0"):
        local_config(nodes=-2)
