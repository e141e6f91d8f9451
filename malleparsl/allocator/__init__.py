"""Allocation policies: MILP formulations and heuristics behind one interface."""

from malleparsl.allocator.base import (
    AllocationPolicy,
    ClusterSnapshot,
    JobView,
    make_policy,
    policy_names,
    register_policy,
)

__all__ = [
    "AllocationPolicy",
    "ClusterSnapshot",
    "JobView",
    "make_policy",
    "policy_names",
    "register_policy",
]
