"""One way for the apps' live tests to run Parsl on emulated idle nodes.

Each live test loads a :class:`MalleableExecutor` on a :class:`ManualNodeSource` whose named
nodes come up as real pilot processes, waits for them, and must clean Parsl up whatever happens
(a left-over DFK breaks every later ``parsl.load``).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import parsl

from malleparsl.executors.manual_source import ManualNodeSource
from malleparsl.site_configs.local import local_config

NODE_TIMEOUT_S = 300


@contextmanager
def live_executor(tmp: Path, nodes: Sequence[str], *, warm: Sequence[str],
                  **config: Any) -> Iterator[tuple[Any, ManualNodeSource]]:
    """The executor and its node source, once every node in ``nodes`` is up; Parsl cleared
    on exit. ``config`` goes to :func:`local_config` (e.g. ``policy=``, ``control=``)."""
    src = ManualNodeSource(nodes=list(nodes))
    dfk = parsl.load(local_config(
        nodes=0, node_source=src, run_dir=str(tmp / "runinfo"), ckpt_root=str(tmp / "ckpt"),
        warm_modules=tuple(warm), poll_period_s=0.1, **config,
    ))
    try:
        ex = dfk.executors["malleable"]
        ex.wait_for_nodes(len(nodes), NODE_TIMEOUT_S)
        yield ex, src
    finally:
        dfk.cleanup()
        parsl.clear()
