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
import numbers
import os
from collections.abc import Callable, Iterable, Mapping
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


# -- a job's malleable options -----------------------------------------------------------------


def _number(name: str, v: Any, *, lo: float, strict: bool = False, integer: bool = False,
            none: bool = False, unit: str = "") -> None:
    if v is None and none:
        return
    kind = "an integer" if integer else "a number"
    ok = not isinstance(v, bool) and isinstance(v, numbers.Integral if integer else numbers.Real)
    if ok and not integer:
        ok = not math.isnan(v)
    if not ok or (v <= lo if strict else v < lo):
        rule = f"{kind} {'>' if strict else '>='} {lo:g}{unit}"
        raise SpecError(f"{name} must be {rule}{' or None' if none else ''}, got {v!r}")


def _flag(name: str, v: Any) -> None:
    if isinstance(v, bool):
        return
    import numpy as np  # a comparison of numpy values: np.True_, no bool

    if not isinstance(v, np.bool_):
        raise SpecError(f"{name} must be True or False, got {v!r}")


def _device(name: str, v: Any) -> None:
    if v not in ("auto", "cpu", "cuda"):
        raise SpecError(f"{name} must be 'auto', 'cpu' or 'cuda', got {v!r}")


def _path(name: str, v: Any) -> None:
    if v is None:  # the control loop's default, <ckpt_root>/<job_id>
        return
    if not isinstance(v, (str, os.PathLike)) or not str(v):
        raise SpecError(f"{name} must be a directory path, got {v!r}")


def _label(name: str, v: Any) -> None:
    if not isinstance(v, str) or not v.strip():
        raise SpecError(f"{name} must be a non-empty string, got {v!r}")


def _plans(name: str, v: Any) -> None:
    from malleparsl.plans import FAMILIES

    if v is None:  # every family, as when not given (plans.plan_options)
        return
    bad = [v] if isinstance(v, (str, bytes)) or not isinstance(v, Iterable) else [
        p for p in v if p not in FAMILIES]
    if bad or not v:
        raise SpecError(f"{name} must be a non-empty list of plan families from "
                        f"{list(FAMILIES)}, got {v!r}; e.g. plans=['dp', 'zero1']")


def _seconds(lo: float = 0.0, strict: bool = False) -> Callable[[str, Any], None]:
    return lambda name, v: _number(name, v, lo=lo, strict=strict, unit=" (seconds)")


def _timeout(name: str, v: Any) -> None:
    from datetime import timedelta

    _number(name, v, lo=0.0, strict=True, unit=" (seconds)")
    if not v < timedelta.max.total_seconds():  # torch takes it as a timedelta: inf overflows
        raise SpecError(f"{name} must be a finite number of seconds (a timedelta), got {v!r}")


def _count(lo: int, none: bool = False) -> Callable[[str, Any], None]:
    return lambda name, v: _number(name, v, lo=lo, integer=True, none=none)


#: Every option a malleable job reads (``@malleable_app(...)``, ``malleable_options={...}``,
#: ``resource_specification={"malleable": {...}}``), the one list its consumers share: name ->
#: (who reads it, a check of its value or None where another module checks it, see
#: :func:`malleparsl.apps.decorator.validate_options`). ``rehearsal`` is set by the warm-up.
JOB_OPTIONS: Mapping[str, tuple[str, Callable[[str, Any], None] | None]] = MappingProxyType({
    # sizes and planning (executors.planning, model.JobSpec)
    "job_id": ("executors.planning, executors.control", None),
    "min_nodes": ("model.JobSpec", None),
    "max_nodes": ("model.JobSpec", None),
    "total_samples": ("model.JobSpec, apps.context", None),
    "curve": ("executors.planning", None),
    "rescale_up_s": ("model.JobSpec", None),
    "rescale_down_s": ("model.JobSpec", None),
    # jobs with the same key share the JPA's measured curves (jpa.advisor.profile_key)
    "model": ("executors.planning -> model.JobSpec.model", _label),
    "profile_key": ("executors.planning -> JobSpec.meta['profile_key']", _label),
    # the control loop and driver
    "ckpt_dir": ("executors.control", _path),
    "max_restarts": ("executors.control", _count(0)),
    # execution plans (malleparsl.plans)
    "plan": ("plans.fixed_plan_option, executors.driver, apps.context", None),
    "plans": ("plans.plan_options", _plans),
    "global_batch": ("plans.global_batch_option, apps.context", None),
    "memory_profile": ("plans.plan_options", None),
    "node_memory_bytes": ("plans.node_budget", None),
    "rank_memory_bytes": ("plans.node_budget", None),
    # the training context, on every rank (apps.context)
    "seed": ("apps.context", _count(0)),
    "device": ("apps.context", _device),
    "local_rank": ("apps.context", _count(0)),
    "micro_batch": ("apps.context", _count(1, none=True)),
    "torch_threads": ("apps.context", _count(1, none=True)),
    "deterministic": ("apps.context", _flag),
    "resume": ("apps.context", _flag),
    "ckpt_interval_s": ("apps.context", _seconds()),
    "ckpt_every_steps": ("apps.context", _count(1, none=True)),
    "ckpt_keep": ("apps.context", _count(1)),
    "progress_interval_s": ("apps.context", _seconds()),
    "stop_check_interval_s": ("apps.context", _seconds()),
    "pg_timeout_s": ("apps.context", _timeout),
    "pace_s_per_sample": ("apps.context", _seconds()),
    "rehearsal": ("apps.fused (set by executors.warmup)", _flag),
    # malleparsl's own example workflows
    "step_delay_s": ("workflows.digits", _seconds()),
})


def check_job_options(options: Mapping[str, Any], *, job: str,
                      extra: Iterable[str] = (), names: bool = True) -> None:
    """Refuse a job's option whose name is none of :data:`JOB_OPTIONS` (nor ``extra``, the
    options the training function reads itself) or whose value breaks its rule.

    A misspelt name would otherwise be passed along and never read: the job runs without it.
    Raises :class:`SpecError` naming the job, the option, the closest valid name and the rule.
    ``names=False`` checks the values only: a job submitted with a plain
    ``resource_specification`` has no list of the options its function reads itself.
    """
    from malleparsl.errors import unknown_name

    valid = set(JOB_OPTIONS) | set(extra)
    for name, value in options.items():
        if name not in valid and not names:
            continue
        if name not in valid:
            raise SpecError(
                f"job {job!r}: {unknown_name('malleable option', name, valid)} (an option your "
                "training function reads itself from ctx.options: list it in "
                "@malleable_app(extra_options=[...]))")
        check = JOB_OPTIONS.get(name, (None, None))[1]
        if check is not None:
            try:
                check(name, value)
            except SpecError as exc:
                raise SpecError(f"job {job!r}: {exc}") from None
