"""``ControlOptions``: every setting of the live control loop, in one frozen, typed object.

Site configs build one, :class:`~malleparsl.executors.MalleableExecutor` takes it as
``control=ControlOptions(...)`` and hands it to the
:class:`~malleparsl.executors.control.ControlLoop` unchanged. Nothing is set on a running loop
from outside: to run with other settings, build another executor. A misspelt field is a
``TypeError`` at construction, a bad value a :class:`~malleparsl.errors.SpecError` naming it.

>>> opts = ControlOptions(store_address="10.1.2.3", socket_ifname="hsn0", ranks_per_node=4)
>>> opts.fail_grace_s
30.0
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from types import MappingProxyType
from typing import Any

from malleparsl.errors import SpecError

#: vendor environment variables that name the accelerators a process may use
DEVICE_ENV_VARS = ("CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "ZE_AFFINITY_MASK")


@dataclass(frozen=True)
class ControlOptions:
    """Settings of the control loop and of how ranks are placed and reached.

    Addressing
        ``store_address``: the one address the rendezvous ``TCPStore`` listens on and every
        rank dials; ``None`` takes the executor's ``address`` (the interchange address the
        nodes already reach), else ``127.0.0.1``. ``socket_ifname``: the interface ranks talk
        over, exported to them as ``GLOO_SOCKET_IFNAME`` and ``NCCL_SOCKET_IFNAME`` (``None``:
        the libraries pick one from the hostname, which fails when the hostname resolves to an
        address on another network).
    Ranks
        ``ranks_per_node``: rank tasks per node in every segment (one per accelerator; the
        executor needs at least that many workers per node). ``accelerators``: the device ids a
        node's ranks bind to, local rank ``i`` gets ``accelerators[i]`` (empty: CPU).
        ``device_env_var``: which vendor variable carries it (:data:`DEVICE_ENV_VARS`).
        ``backend``: ``"auto"`` (gloo on CPU, nccl on CUDA/ROCm, xccl on Intel) or a name.
    Timing
        ``poll_period_s`` (control tick), ``release_grace_s`` (a taken node's pilot is released
        at the latest this long after it left the plan), ``fail_grace_s`` (after a rank failed
        or a node was lost, silent ranks are given up on after this), ``stop_timeout_s`` (a
        requested stop not honoured this long after is a hang: the silent ranks' nodes are
        killed and the job restarts without them; keep it above the ranks' collective timeout),
        ``max_restarts`` (node
        losses a job survives), ``observe_replan_s`` (rate measurements replan at most this
        often), ``tfwd_s`` (the allocator's horizon), ``max_active`` (jobs run at once).
    Warm-up
        ``warm_nodes``, ``warm_rehearse``, ``warm_timeout_s``: see
        :mod:`malleparsl.executors.warmup`.
    Policy
        ``policy_options``: keyword options for the allocation policy (read-only mapping).
    """

    store_address: str | None = None
    socket_ifname: str | None = None
    ranks_per_node: int = 1
    accelerators: tuple[str, ...] = ()
    device_env_var: str = "CUDA_VISIBLE_DEVICES"
    backend: str = "auto"
    poll_period_s: float = 0.5
    release_grace_s: float = 10.0
    fail_grace_s: float = 30.0
    stop_timeout_s: float = 120.0
    max_restarts: int = 10
    observe_replan_s: float = 5.0
    tfwd_s: float = 10.0
    max_active: int | None = 10
    warm_nodes: bool = True
    warm_rehearse: bool = True
    warm_timeout_s: float = 120.0
    policy_options: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("poll_period_s", "warm_timeout_s", "tfwd_s"):
            _positive(name, getattr(self, name))
        for name in ("release_grace_s", "fail_grace_s", "stop_timeout_s", "observe_replan_s"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not v >= 0 or math.isinf(v):
                raise SpecError(f"{name} must be a finite number >= 0 seconds, got {v!r}")
        for name, lo in (("ranks_per_node", 1), ("max_restarts", 0)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < lo:
                raise SpecError(f"{name} must be an integer >= {lo}, got {v!r}")
        if self.max_active is not None and (
            isinstance(self.max_active, bool) or not isinstance(self.max_active, int)
            or self.max_active < 1
        ):
            raise SpecError(f"max_active must be None or an integer >= 1, got {self.max_active!r}")
        if self.device_env_var not in DEVICE_ENV_VARS:
            raise SpecError(
                f"device_env_var must be one of {DEVICE_ENV_VARS}, got {self.device_env_var!r}"
            )
        object.__setattr__(self, "accelerators", tuple(str(a) for a in self.accelerators))
        if self.accelerators and len(self.accelerators) < self.ranks_per_node:
            raise SpecError(
                f"ranks_per_node={self.ranks_per_node} needs as many accelerators, got "
                f"{list(self.accelerators)}; list one id per rank (e.g. ['0', '1', '2', '3'])"
            )
        for name in ("store_address", "socket_ifname"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, str) or not v or "," in v or " " in v):
                raise SpecError(f"{name} must be one address or interface name, got {v!r}")
        object.__setattr__(self, "policy_options", MappingProxyType(dict(self.policy_options)))

    def rank_env(self, local_rank: int) -> dict[str, str]:
        """Environment a rank with ``local_rank`` applies before it touches a device or socket."""
        env: dict[str, str] = {}
        if self.socket_ifname:
            env["GLOO_SOCKET_IFNAME"] = env["NCCL_SOCKET_IFNAME"] = self.socket_ifname
        if self.accelerators:
            env[self.device_env_var] = self.accelerators[local_rank]
        return env

    def resolved_backend(self) -> str:
        """The collective backend ranks should use with this device binding."""
        if self.backend != "auto":
            return self.backend
        if not self.accelerators:
            return "gloo"
        return "xccl" if self.device_env_var == "ZE_AFFINITY_MASK" else "nccl"


def _positive(name: str, v: Any) -> None:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0 or math.isinf(v):
        raise SpecError(f"{name} must be > 0 (a finite number of seconds), got {v!r}")


FIELD_NAMES = frozenset(f.name for f in fields(ControlOptions))
