"""In-process checks of the shard and shared-seed samplers for many sizes and fake ranks."""

from __future__ import annotations

import math

import pytest
import torch
from torch.utils.data import BatchSampler, RandomSampler, SequentialSampler

from runtime.data import ShardSampler, SharedSeedRandomSampler


@pytest.mark.parametrize("n", [2, 3])
@pytest.mark.parametrize("size", [1, 5, 12, 13, 24, 31])
@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("even", [True, False])
def test_shards_cover_the_epoch(n: int, size: int, drop_last: bool, even: bool) -> None:
    bs = 4
    global_batches = list(BatchSampler(SequentialSampler(range(size)), bs, drop_last))
    shards = [
        list(ShardSampler(global_batches, n, r, even, drop_last=drop_last, batch_size=bs))
        for r in range(n)
    ]
    for r, shard in enumerate(shards):
        assert len(shard) == len(ShardSampler(global_batches, n, r, even, drop_last, bs))
    m = len(global_batches)
    real_rounds = m // n if drop_last else math.ceil(m / n)
    for r, shard in enumerate(shards):
        # rank r gets global batch r + k*n wherever such a batch exists (completed if short)
        for k, batch in enumerate(shard):
            if r + k * n < m:
                src = global_batches[r + k * n]
                assert batch[: len(src)] == src
    seen = [i for shard in shards for b in shard for i in b]
    if drop_last:
        assert len(seen) == len(set(seen)) == (m // n) * n * bs
    else:
        assert set(seen) == set(range(size))
    if even or drop_last:
        assert {len(s) for s in shards} == {real_rounds}
    if even and not drop_last:
        assert all(len(b) == bs for s in shards for b in s)
        pad = len(seen) - size
        assert 0 <= pad < n * bs


def test_shared_seed_sampler_equals_random_sampler_with_identity_share() -> None:
    data = range(50)
    torch.manual_seed(3)
    expected = [list(RandomSampler(data)) for _ in range(2)]
    state = torch.get_rng_state()
    torch.manual_seed(3)
    sampler = SharedSeedRandomSampler(data, share_seed=lambda s: s)
    assert [list(sampler) for _ in range(2)] == expected
    assert torch.equal(torch.get_rng_state(), state)


def test_shared_seed_sampler_uses_the_shared_seed() -> None:
    data = range(20)
    torch.manual_seed(1)
    a = list(SharedSeedRandomSampler(data, share_seed=lambda s: 1234))
    torch.manual_seed(2)
    b = list(SharedSeedRandomSampler(data, share_seed=lambda s: 1234))
    assert a == b and sorted(a) == list(range(20)) and a != list(range(20))
