"""Global-batch-constant sharding: the same samples per step at every size."""

from __future__ import annotations

import pytest
import torch

from malleparsl.apps.sharding import GlobalBatchSampler
from malleparsl.errors import SpecError


def _sampler(k: int, r: int, **kw) -> GlobalBatchSampler:
    args = {"dataset_size": 50, "global_batch": 16, "seed": 3, **kw}
    return GlobalBatchSampler(world_size=k, rank=r, **args)


@pytest.mark.parametrize("k", [1, 2, 3, 5, 16, 20])
@pytest.mark.parametrize("step", [0, 2, 3, 7])
def test_ranks_partition_the_global_batch_at_every_size(k: int, step: int) -> None:
    whole = _sampler(1, 0).global_indices(step)
    parts = [_sampler(k, r).local_indices(step) for r in range(k)]
    assert torch.equal(torch.cat(parts), whole)
    sizes = [len(p) for p in parts]
    assert max(sizes) - min(sizes) <= 1


def test_global_batches_walk_through_epochs_without_repeats() -> None:
    s = _sampler(1, 0, dataset_size=48, global_batch=16)
    first_epoch = torch.cat([s.global_indices(t) for t in range(3)])
    assert sorted(first_epoch.tolist()) == list(range(48))
    second = torch.cat([s.global_indices(t) for t in range(3, 6)])
    assert sorted(second.tolist()) == list(range(48))
    assert not torch.equal(first_epoch, second)  # reshuffled with seed + epoch


def test_batch_spanning_an_epoch_boundary() -> None:
    s = _sampler(1, 0, dataset_size=10, global_batch=4)
    stream = torch.cat([s.global_indices(t) for t in range(5)])  # 20 positions = 2 epochs
    assert sorted(stream[:10].tolist()) == list(range(10))
    assert sorted(stream[10:].tolist()) == list(range(10))


def test_micro_batches_cover_the_local_slice() -> None:
    s = _sampler(2, 1, global_batch=15, micro_batch=3)
    assert s.plan.local_batch == 7 and s.plan.accumulation == 3
    mb = s.micro_batches(4)
    assert [len(m) for m in mb] == [3, 3, 1]
    assert torch.equal(torch.cat(mb), s.local_indices(4))


def test_more_ranks_than_samples_leaves_some_ranks_empty() -> None:
    s = _sampler(20, 19)
    assert s.plan.local_batch == 0 and s.micro_batches(0) == []


@pytest.mark.parametrize(
    "kw, match",
    [
        ({"dataset_size": 0}, "dataset_size"),
        ({"global_batch": -2}, "global_batch"),
        ({"micro_batch": 0}, "micro_batch"),
        ({"world_size": 2, "rank": 2}, "rank"),
    ],
)
def test_bad_arguments_raise_spec_error(kw: dict, match: str) -> None:
    args = {"dataset_size": 10, "global_batch": 4, "world_size": 1, "rank": 0, **kw}
    with pytest.raises(SpecError, match=match):
        GlobalBatchSampler(**args)
