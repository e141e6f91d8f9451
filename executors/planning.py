"""How the control loop plans: job options to specs, the curve advisor, the policy.

Kept apart from the control thread so the choices are easy to read and test: a malleable
app's options dict becomes the controller's :class:`~malleparsl.model.JobSpec`; a job without
a curve is planned with :class:`LinearPlaceholderAdvisor` unless the Job Profiling Advisor is
asked for (``policy="jpa"``).
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from malleparsl.allocator.base import AllocationPolicy, ClusterSnapshot, JobView, make_policy
from malleparsl.controller import CurveAdvisor, JobState
from malleparsl.errors import SpecError
from malleparsl.executors.options import check_job_options
from malleparsl.model import Allocation, JobSpec, ScalingCurve, node_count

_SPEC_KEYS = ("min_nodes", "max_nodes", "rescale_up_s", "rescale_down_s", "total_samples")


class LinearPlaceholderAdvisor(CurveAdvisor):
    """Plans with the job's own curve, or -- for a job without one -- ``rate(n) = n``.

    A placeholder until the Job Profiling Advisor (:mod:`malleparsl.jpa`) learns curves online:
    "linear from one node" gives every uncurved job the same, optimistic scaling, so the policy
    spreads nodes evenly between such jobs and grows each to its maximum. Pass
    ``advisor=JobProfilingAdvisor()`` to the executor to plan with measured rates instead.
    """

    def __init__(self) -> None:
        # one placeholder per job, kept: a new curve object at every replan would defeat the
        # caches keyed on the curve's identity (the plan profiler's scaled curves)
        self._placeholders: dict[str, ScalingCurve] = {}

    def forget(self, job_id: str) -> None:
        self._placeholders.pop(job_id, None)

    def views(
        self, snapshot: ClusterSnapshot, jobs: Sequence[JobState], allocation: Allocation
    ) -> list[JobView]:
        out = []
        for js in jobs:
            spec = js.spec
            curve = spec.curve or self._placeholder(spec.job_id, spec.max_nodes)
            out.append(JobView(spec, curve, allocation.nodes_of(spec.job_id)))
        return out

    def _placeholder(self, job_id: str, max_nodes: int) -> ScalingCurve:
        curve = self._placeholders.get(job_id)
        if curve is None or curve.max_measured != max_nodes:
            curve = self._placeholders[job_id] = ScalingCurve(
                tuple(range(1, max_nodes + 1)),
                tuple(float(n) for n in range(1, max_nodes + 1)),
                name=f"{job_id}-linear-placeholder",
            )
        return curve


def spec_from_options(options: Mapping[str, Any], *, now_s: float = 0.0,
                      ranks_per_node: int = 1) -> JobSpec:
    """Build the controller's :class:`JobSpec` from a job's malleable options dict.

    ``job_id`` is generated when absent; ``curve`` is a list of ``[nodes, samples_per_s]``.
    A job with automatic plans (:func:`malleparsl.plans.plan_options`) gets its minimum size
    from the memory model and its :class:`~malleparsl.plans.PlanOptions` in
    ``meta["plan_options"]`` (for the controller's plan profiler). A job that names its
    ``global_batch``, with automatic plans or not, is never sized past the point where every
    one of its ``ranks_per_node`` ranks per node gets a sample
    (:func:`malleparsl.plans.cap_to_batch`): without it the controller cannot know the batch.
    With a fixed ``plan`` of the FSDP2 family it also gets only the node counts whose ranks
    split the batch evenly (:func:`malleparsl.plans.fixed_plan_sizes`): its bounds narrowed to
    them and, where some count in between does not, the list in ``meta["sizes"]``, which the
    controller puts in the job's views (``JobView.sizes``).
    """
    if not isinstance(options, Mapping):
        raise SpecError(
            f"malleable options must be a dict, got {type(options).__name__}; pass "
            'resource_specification={"malleable": {"min_nodes": 1, "max_nodes": 4}}'
        )
    job_id = options.get("job_id") or f"job-{uuid.uuid4().hex[:10]}"
    # the values @malleable_app checks at decoration, here for every submit (a plain
    # resource_specification too): torch_threads=-1 was torch's RuntimeError on the ranks
    check_job_options(options, job=str(job_id), names=False)
    kw: dict[str, Any] = {k: options[k] for k in _SPEC_KEYS if options.get(k) is not None}
    if "max_nodes" not in kw:  # min_nodes as given: JobSpec checks it (no int() of 'x' or 2.7)
        low = kw.get("min_nodes", 1)
        kw["max_nodes"] = max(1, low) if isinstance(low, int) and not isinstance(low, bool) else low
    curve = options.get("curve")
    if curve is not None and not isinstance(curve, ScalingCurve):
        try:
            points = {node_count(n, f"job {job_id!r}: curve nodes"): float(r) for n, r in curve}
        except SpecError:
            raise
        except (TypeError, ValueError):
            raise SpecError(
                f"job {job_id!r}: curve must be a list of [nodes, samples_per_s] pairs, got "
                f"{curve!r}; e.g. curve=[[1, 100.0], [2, 180.0]]"
            ) from None
        curve = ScalingCurve.from_points(points, name=str(job_id))
    from malleparsl.plans import (
        cap_to_batch,
        fixed_plan_option,
        fixed_plan_sizes,
        global_batch_option,
        node_budget,
    )

    # a misspelt plan is refused here, at submit, with or without global_batch: the ranks
    # would refuse it only once the job holds its nodes
    fixed = fixed_plan_option(options)
    # a budget that is no number of bytes, or two that disagree, is refused here, at submit,
    # as with automatic plans; not by every rank's prepare() once the job holds its nodes
    node_budget(options, ranks_per_node=ranks_per_node)
    # bounds narrowed from the ones JobSpec has checked (not int() of raw options: 0 divided
    # by zero, 2.7 or '2' or True passed as 2 or 1)
    spec = JobSpec(job_id=str(job_id), curve=curve, submit_s=now_s, **kw)
    # what the JPA shares measured curves by (a model seen before starts from its prior):
    # the options' profile_key, else their model; @malleable_app names the function by default
    # (check_job_options above checked both are non-empty strings)
    label = {k: options[k] for k in ("model", "profile_key") if options.get(k) is not None}
    if label:
        spec = dataclasses.replace(
            spec, model=label.get("model", spec.model),
            meta={**spec.meta, "profile_key": label["profile_key"]} if "profile_key" in label
            else spec.meta)
    if options.get("memory_profile") is not None:  # execution plans: smallest size any fits
        from malleparsl.plans import min_nodes_for, plan_options

        popts = plan_options(options, ranks_per_node=ranks_per_node)
        spec = dataclasses.replace(
            spec, min_nodes=min_nodes_for(popts, spec.min_nodes, spec.max_nodes),
            meta=spec.meta if popts is None else {**spec.meta, "plan_options": popts})
    gb = global_batch_option(options)
    if gb is not None:  # every rank needs a sample, with automatic plans or not
        spec = dataclasses.replace(spec, max_nodes=cap_to_batch(
            spec.min_nodes, spec.max_nodes, global_batch=gb, ranks_per_node=ranks_per_node))
    if gb is not None and fixed is not None:  # a fixed plan: the sizes where its ranks
        # split the batch
        sizes = fixed_plan_sizes(fixed, spec.min_nodes, spec.max_nodes,
                                 global_batch=gb, ranks_per_node=ranks_per_node)
        holes = len(sizes) != sizes[-1] - sizes[0] + 1  # the views list the sizes
        spec = dataclasses.replace(spec, min_nodes=sizes[0], max_nodes=sizes[-1],
                                   meta={**spec.meta, "sizes": sizes} if holes else spec.meta)
    return spec


def build_policy(
    policy: str | AllocationPolicy, options: dict[str, Any], advisor: CurveAdvisor | None
) -> tuple[AllocationPolicy, CurveAdvisor]:
    """The policy and advisor to plan with; ``"jpa"`` pairs the probe-first policy with a JPA."""
    if policy == "jpa":
        from malleparsl.jpa import JobProfilingAdvisor

        if not isinstance(advisor, JobProfilingAdvisor):
            advisor = JobProfilingAdvisor()
        return make_policy("jpa", advisor=advisor, **options), advisor
    pol = make_policy(policy, **options) if isinstance(policy, str) else policy
    return pol, advisor if advisor is not None else LinearPlaceholderAdvisor()
