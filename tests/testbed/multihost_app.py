"""A training function for the multi-host tests, importable on every emulated host's workers
(the tests put this folder on the pilots' PYTHONPATH)."""

from __future__ import annotations

import os
import socket
from typing import Any

from malleparsl.apps.examples_digits import train_digits


class BindingError(AssertionError):
    """A rank did not get the device binding or interface its site config asked for."""


def train_bound(ctx: Any, *, device_var: str, accelerators: list[str], ifname: str,
                **kwargs: Any) -> dict[str, Any]:
    """``train_digits``, after checking from inside the rank that it is bound as configured:
    its vendor variable names ``accelerators[local_rank]``, gloo and NCCL use ``ifname``, and
    the backend fits the device (gloo on CPU)."""
    want = accelerators[ctx.local_rank]
    got = os.environ.get(device_var)
    problems = []
    if got != want:
        problems.append(f"{device_var}={got!r}, expected {want!r}")
    for var in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):
        if os.environ.get(var) != ifname:
            problems.append(f"{var}={os.environ.get(var)!r}, expected {ifname!r}")
    if ctx.device.type != "cpu" or ctx.backend != "gloo":
        problems.append(f"device {ctx.device} with backend {ctx.backend}, expected cpu with gloo")
    if problems:
        raise BindingError(f"rank {ctx.rank} (local {ctx.local_rank}) on {ctx.node}: "
                           + "; ".join(problems))
    out = train_digits(ctx, **kwargs)
    out["rank0_binding"] = {"local_rank": ctx.local_rank, device_var: got,
                            "host": socket.gethostname(), "world_size": ctx.world_size}
    return out
