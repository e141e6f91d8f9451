"""What every facility config shares: argument checks and the executor they all build.

One source of truth: each facility module only states its facts (scheduler, queue or QOS,
GPUs, filesystems, launcher) and calls :func:`facility_config`.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import inspect
import re
from collections.abc import Callable
from typing import Any, TypeVar

from parsl.config import Config

from malleparsl.errors import SpecError
from malleparsl.executors.executor import MalleableExecutor
from malleparsl.executors.options import ControlOptions
from malleparsl.executors.parsl_compat import launch_command
from malleparsl.model import NodeId

F = TypeVar("F", bound=Callable[..., Any])

_WALLTIME = re.compile(r"^(\d{1,3}):([0-5]\d):([0-5]\d)$")


def check_walltime(walltime: str) -> str:
    """``HH:MM:SS`` (hours may exceed 24); anything else gets an error with an example."""
    if not isinstance(walltime, str) or not _WALLTIME.match(walltime) or walltime == "00:00:00":
        raise SpecError(
            f"walltime must be HH:MM:SS and longer than zero, got {walltime!r}; e.g. '01:00:00'"
        )
    return walltime


def check_positive(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise SpecError(f"{name} must be an integer >= 1, got {value!r}")
    return value


def check_account(account: Any) -> str:
    if not isinstance(account, str) or not account.strip():
        raise SpecError(f"account must name your allocation (project), got {account!r}")
    return account


def _keywords(fn: Callable[..., Any]) -> list[str]:
    return [
        name for name, p in inspect.signature(fn).parameters.items()
        if name != "self" and p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)
    ]


def executor_option_names() -> set[str]:
    """The keywords :class:`MalleableExecutor` takes, its own and Parsl's HTEX's."""
    from parsl.executors import HighThroughputExecutor

    return set(_keywords(MalleableExecutor.__init__)) | set(_keywords(HighThroughputExecutor.__init__))


def site_config(*, facility: bool = True) -> Callable[[F], F]:
    """Refuse a keyword that neither the site config nor the executor takes, naming the config.

    A site config passes unknown keywords on to the executor (``**executor_options``), so a
    typo (``local_config(node=4)``) used to fail deep inside as
    ``HighThroughputExecutor.__init__() got an unexpected keyword argument``.
    """

    def wrap(fn: F) -> F:
        own = _keywords(fn)

        @functools.wraps(fn)
        def checked(*args: Any, **kwargs: Any) -> Any:
            accepted = set(own) | executor_option_names()
            if facility:
                accepted |= set(_keywords(facility_config))
            unknown = sorted(k for k in kwargs if k not in accepted)
            if unknown:
                name = unknown[0]
                close = (difflib.get_close_matches(name, own, n=1)
                         or difflib.get_close_matches(name, sorted(accepted - set(own)), n=1))
                hint = f"; did you mean {close[0]!r}?" if close else ""
                if name in ("min_nodes", "max_nodes"):
                    hint = f"; {name} is an option of @malleable_app(...) (a job's sizes)"
                raise SpecError(
                    f"{fn.__name__}() got an unknown parameter {name!r}{hint} (its own: "
                    f"{', '.join(own)}; other keywords go to MalleableExecutor, see "
                    f"help(MalleableExecutor))"
                )
            return fn(*args, **kwargs)

        return checked  # type: ignore[return-value]

    return wrap


def gpu_env(var: str, gpus: int) -> str:
    """The shell line exposing all of a node's GPUs to its workers; each rank then narrows
    ``var`` to its own accelerator (see :class:`~malleparsl.executors.ControlOptions`)."""
    return f"export {var}={','.join(str(i) for i in range(gpus))}"


def rank_layout(gpus: int, ranks_per_node: int | None) -> dict[str, Any]:
    """One rank per accelerator by default; ``ranks_per_node=1`` gives one rank all of them."""
    ranks = gpus if ranks_per_node is None else check_positive("ranks_per_node", ranks_per_node)
    if ranks > gpus:
        raise SpecError(f"ranks_per_node={ranks} exceeds the {gpus} accelerators per node")
    accel = tuple(str(i) for i in range(ranks)) if ranks > 1 else ()
    return {"ranks_per_node": ranks, "accelerators": accel}


def facility_config(
    *,
    provider: Any,
    node_source: Any,
    run_dir: str | None = None,
    label: str = "malleable",
    ranks_per_node: int = 1,
    accelerators: tuple[str, ...] = (),
    device_env_var: str = "CUDA_VISIBLE_DEVICES",
    interface: str | None = None,
    address: str | None = None,
    control: ControlOptions | None = None,
    **executor_options: Any,
) -> Config:
    """A ``Config`` with one :class:`MalleableExecutor` fed by a scavenger.

    Defaults that matter at a facility: one worker per rank and ``ranks_per_node`` ranks per
    node, local rank ``i`` bound to ``accelerators[i]`` through ``device_env_var``; CurveZMQ
    encryption on (the interchange listens on the login node); the interchange and the
    rendezvous store on ``address`` (default: the login node's hostname address, which compute
    nodes usually reach — pass the high-speed network's address when they do not); gloo/NCCL on
    ``interface``; 2 s heartbeats with a 10 s threshold (a silently dead node is noticed in
    ~10 s); no Parsl block strategy (the controller decides the node count).
    """
    check_positive("ranks_per_node", ranks_per_node)
    base = control if control is not None else ControlOptions()
    control = dataclasses.replace(
        base, ranks_per_node=ranks_per_node, accelerators=tuple(accelerators),
        device_env_var=device_env_var, socket_ifname=interface or base.socket_ifname,
    )
    options: dict[str, Any] = {
        "label": label,
        "provider": provider,
        "node_source": node_source,
        "max_workers_per_node": ranks_per_node,
        "encrypted": True,
        "heartbeat_period": 2,
        "heartbeat_threshold": 10,
        "control": control,
    }
    if address is None and "address" not in executor_options:
        from parsl.addresses import address_by_hostname

        address = address_by_hostname()
    if address is not None:
        options["address"] = address
    options.update(executor_options)
    executor = MalleableExecutor(**options)
    # a pilot scavenger holds only as many nodes as the jobs can use, and gives the rest back
    if getattr(node_source, "demand", False) is None:
        node_source.demand = lambda: jobs_demand(executor)
    if getattr(node_source, "in_use", False) is None:
        node_source.in_use = lambda: nodes_in_use(executor)
    extra: dict[str, Any] = {"run_dir": run_dir} if run_dir is not None else {}
    return Config(executors=[executor], strategy="none", **extra)


def jobs_demand(executor: Any) -> int | None:
    """Nodes the executor's unfinished malleable jobs could use (their ``max_nodes`` summed);
    None (= up to the cap) before the control loop exists."""
    if getattr(executor, "control", None) is None:
        return None
    jobs = executor.snapshot().jobs.values()
    return sum(j.max_nodes for j in jobs if j.state != "done")


def nodes_in_use(executor: Any) -> set[str]:
    """Nodes the controller has given to jobs (never returned while in use)."""
    return set(executor.snapshot().used_nodes)



def pbs_facility(
    *,
    account: str,
    queue: str,
    node_cap: int,
    walltime: str,
    worker_init: str,
    cpus_per_node: int,
    gpu_var: str,
    gpus: int,
    filesystems: str,
    select_options: str = "",
    query_period_s: float,
    allow_nonpreemptible: bool,
    run: Any,
    run_dir: str | None,
    ranks_per_node: int | None = None,
    **executor_options: Any,
) -> Config:
    """A PBS Pro facility: checks, one-node pinned pilots through ``mpiexec``, a PBS scavenger.

    ``gpus`` accelerators per node, one rank each unless ``ranks_per_node`` says otherwise;
    each rank is bound to its accelerator through ``gpu_var``.
    """
    from parsl.launchers import MpiExecLauncher

    from malleparsl.scavenger.pbs import PBSScavenger, ScavengingPBSProProvider

    check_account(account)
    check_positive("node_cap", node_cap)
    check_walltime(walltime)
    provider = ScavengingPBSProProvider(
        queue=queue,
        account=account,
        node_cap=node_cap,
        walltime=walltime,
        cpus_per_node=cpus_per_node,
        select_options=select_options,
        scheduler_options=f"#PBS -l filesystems={filesystems}",
        worker_init=f"{worker_init}\n{gpu_env(gpu_var, gpus)}",
        # one manager per pilot node, bound to all of the node's cores
        launcher=MpiExecLauncher(bind_cmd="--cpu-bind", overrides=f"--depth={cpus_per_node} --ppn 1"),
        allow_nonpreemptible=allow_nonpreemptible,
        run=run,
    )
    source = PBSScavenger(provider=provider, query_period_s=query_period_s)
    return facility_config(provider=provider, node_source=source, run_dir=run_dir,
                           device_env_var=gpu_var, **rank_layout(gpus, ranks_per_node),
                           **executor_options)


def slurm_facility(
    *,
    account: str,
    partition: str | None,
    qos: str | None,
    node_cap: int,
    walltime: str,
    worker_init: str,
    gpu_var: str,
    gpus: int,
    scheduler_options: str,
    query_period_s: float,
    allow_nonpreemptible: bool,
    run: Any,
    run_dir: str | None,
    ranks_per_node: int | None = None,
    **executor_options: Any,
) -> Config:
    """A Slurm facility: checks, one-node pinned pilots through ``srun``, a Slurm scavenger;
    ranks and binding as for :func:`pbs_facility`."""
    from parsl.launchers import SrunLauncher

    from malleparsl.scavenger.slurm import SlurmScavenger
    from malleparsl.scavenger.slurm_provider import ScavengingSlurmProvider

    check_account(account)
    check_positive("node_cap", node_cap)
    check_walltime(walltime)
    provider = ScavengingSlurmProvider(
        partition=partition,
        qos=qos,
        account=account,
        node_cap=node_cap,
        walltime=walltime,
        scheduler_options=scheduler_options,
        worker_init=f"{worker_init}\n{gpu_env(gpu_var, gpus)}",
        allow_nonpreemptible=allow_nonpreemptible,
        launcher=SrunLauncher(overrides="--ntasks-per-node=1"),
        run=run,
    )
    source = SlurmScavenger(provider=provider, query_period_s=query_period_s)
    return facility_config(provider=provider, node_source=source, run_dir=run_dir,
                           device_env_var=gpu_var, **rank_layout(gpus, ranks_per_node),
                           **executor_options)


def render_pilot_script(config: Config, node: NodeId = "nid000001") -> str:
    """Submit one pilot through the config's provider and return the batch script it wrote.

    The launch command is composed exactly as HTEX composes it when it starts (with a
    placeholder worker port); the provider's scheduler commands go through its ``run``
    function, so with a recording fake (as in the tests) nothing reaches a scheduler.
    """
    import os
    import tempfile

    ex = config.executors[0]
    # a scratch run directory, removed after (one per call piled up in the temporary directory)
    with tempfile.TemporaryDirectory(prefix="malleparsl-render-") as run_dir:
        ex.run_dir = run_dir
        ex.provider.script_dir = os.path.join(run_dir, "submit_scripts")
        os.makedirs(ex.provider.script_dir, exist_ok=True)
        if ex.worker_port is None:
            ex.worker_port = 54000  # what the interchange would hand out when started
        if not hasattr(ex, "logconf_path"):
            ex.logconf_path = None  # set by HTEX's start(); no logging config is shipped here
        ex.initialize_scaling()
        job_name = "parsl.malleable.block-0"
        ex.provider.submit_to_node(launch_command(ex, "0"), 1, job_name, node=node)
        # providers append a timestamp to the job name; the script is the file without a suffix
        scripts = sorted(
            f for f in os.listdir(ex.provider.script_dir)
            if f.startswith(job_name) and not f.endswith((".stdout", ".stderr"))
        )
        if not scripts:
            raise FileNotFoundError(f"the provider wrote no batch script for {job_name!r}")
        with open(os.path.join(ex.provider.script_dir, scripts[-1])) as fh:
            return fh.read()
