"""The Globus Compute endpoint templates load the way the endpoint loads a config.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from globus_compute_endpoint.endpoint.config import UserEndpointConfig
from globus_compute_endpoint.endpoint.config.utils import _load_config_py

from malleparsl.executors import MalleableExecutor
from malleparsl.executors.globus_engine import MalleableEngine

TEMPLATES = sorted((Path(__file__).parents[2] / "examples" / "globus_endpoints").glob("*_config.py"))


def test_there_is_a_template_per_site():
    names = {p.name.removesuffix("_config.py") for p in TEMPLATES}
    assert names == {"polaris", "aurora", "perlmutter", "frontier", "local"}


@pytest.mark.parametrize("path", TEMPLATES, ids=lambda p: p.stem)
def test_template_loads_as_an_endpoint_config_with_the_malleable_engine(path):
    config = _load_config_py(path)
    assert isinstance(config, UserEndpointConfig)
    assert isinstance(config.engine, MalleableEngine)
    assert isinstance(config.engine.executor, MalleableExecutor)
    assert "malleparsl.executors.interchange" in " ".join(config.engine.executor.interchange_launch_cmd)
