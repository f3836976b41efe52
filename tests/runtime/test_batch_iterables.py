"""PreparedIterable (runtime/batch_iterables.py): a batch source that is not a DataLoader, shared
out by position between N processes. Here each rank's view is computed in one process (the
ranks' digest exchange replaced by a stand-in); tests/runtime/test_prepare_non_loader.py runs it
on 2 real gloo processes."""

from __future__ import annotations

import itertools

import pytest
import torch

from runtime import batch_iterables
from runtime.batch_iterables import PreparedIterable, batch_digest
from runtime.errors import PrepareError
from runtime.state import ProcessState


class Buckets:
    """A hand-written bucket iterator: batches of `size` ids, with an epoch counter and a length."""

    def __init__(self, n_items: int, size: int) -> None:
        self.n_items, self.size, self.epoch, self.repeat = n_items, size, 0, False

    def __len__(self) -> int:
        return -(-self.n_items // self.size)

    def init_epoch(self) -> None:
        self.epoch += 1

    def __iter__(self):
        while True:
            for start in range(0, self.n_items, self.size):
                yield torch.arange(start, min(start + self.size, self.n_items))
            if not self.repeat:
                return


@pytest.fixture
def same_everywhere(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """Every rank reports the digest this rank computed (the ranks agree)."""
    calls: list[list[str]] = []

    def gather(digest: str, state: ProcessState) -> list[str]:
        calls.append([digest] * state.world_size)
        return calls[-1]

    monkeypatch.setattr(batch_iterables, "gather_object", gather)
    monkeypatch.setattr(batch_iterables, "broadcast_object", lambda obj, state: obj)
    return calls


def shares(source, n: int, even: bool = True) -> list[list[list[int]]]:
    return [[b.tolist() for b in PreparedIterable(source, ProcessState(rank=r, world_size=n), even)]
            for r in range(n)]


@pytest.mark.parametrize("n_batches,n", [(7, 2), (6, 2), (7, 3), (8, 3), (1, 2), (2, 4)])
def test_shares_are_disjoint_complete_and_even(same_everywhere, n_batches: int, n: int) -> None:
    source = Buckets(n_batches * 2, 2)
    ranks = shares(source, n)
    steps = -(-n_batches // n)
    assert [len(r) for r in ranks] == [steps] * n, "every rank takes the same number of steps"
    for rank, got in enumerate(ranks):
        assert len(PreparedIterable(source, ProcessState(rank=rank, world_size=n))) == steps
        # round k: global batch k*n + rank, or (past the end) the epoch's first batches again
        expected = [list(range(2 * i, 2 * i + 2)) for i in range(rank, n_batches, n)]
        assert got[: len(expected)] == expected
    seen = sorted(i for r in ranks for b in r for i in b)
    assert set(seen) == set(range(n_batches * 2)), "every batch reaches a rank"
    padded = steps * n - n_batches
    assert len(seen) == 2 * (n_batches + padded), "only the last round is completed"
    extra = [tuple(r[-1]) for rank, r in enumerate(ranks) if rank >= n_batches % n and n_batches % n]
    first = [tuple(range(2 * i, 2 * i + 2)) for i in range(n)]
    assert all(b in first for b in extra), "the last round is completed from the epoch's first batches"


def test_uneven_without_even_batches(same_everywhere) -> None:
    ranks = shares(Buckets(14, 2), 2, even=False)  # 7 batches
    assert [len(r) for r in ranks] == [4, 3]
    assert sorted(i for r in ranks for b in r for i in b) == list(range(14))
    assert [len(PreparedIterable(Buckets(14, 2), ProcessState(rank=r, world_size=2), False))
            for r in range(2)] == [4, 3]


def test_endless_source_is_shared_without_buffering(same_everywhere) -> None:
    source = Buckets(6, 2)
    source.repeat = True  # a torchtext iterator with repeat=True: endless
    taken = []

    def counting():
        for batch in source:
            taken.append(batch)
            yield batch

    class Endless:
        def __iter__(self):
            return counting()

    first = list(itertools.islice(iter(PreparedIterable(Endless(), ProcessState(rank=1, world_size=2))), 5))
    assert [b.tolist() for b in first] == [[2, 3], [0, 1], [4, 5], [2, 3], [0, 1]]
    assert len(taken) == 10, "each step reads one round from the source, no more"


def test_attributes_are_the_sources(same_everywhere) -> None:
    source = Buckets(10, 2)
    prepared = PreparedIterable(source, ProcessState(rank=0, world_size=2))
    prepared.init_epoch()
    assert source.epoch == 1 and prepared.epoch == 1
    prepared.repeat = True
    assert source.repeat is True
    assert prepared.size == 2
    with pytest.raises(AttributeError):
        prepared.missing  # noqa: B018
    unsized = PreparedIterable(iter([1, 2]), ProcessState(rank=0, world_size=2))
    with pytest.raises(TypeError):
        len(unsized)
    assert unsized, "truthy as the source is"


def test_ranks_with_other_batches_all_stop(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(batch_iterables, "gather_object", lambda digest, state: [digest, "other"])
    monkeypatch.setattr(batch_iterables, "broadcast_object", lambda obj, state: obj)
    prepared = PreparedIterable(Buckets(8, 2), ProcessState(rank=0, world_size=2))
    with pytest.raises(PrepareError, match=r"(?s)other batches on process\(es\) \[1\].*random.seed"):
        next(iter(prepared))


def test_digest_reads_tensors_lists_and_attributes() -> None:
    class Batch:
        def __init__(self, src: torch.Tensor, label: torch.Tensor) -> None:
            self.src, self.label, self.batch_size = src, label, len(label)

    a = Batch(torch.tensor([[1, 2], [3, 4]]), torch.tensor([0, 1]))
    same = Batch(torch.tensor([[1, 2], [3, 4]]), torch.tensor([0, 1]))
    swapped = Batch(torch.tensor([[3, 4], [1, 2]]), torch.tensor([0, 1]))
    assert batch_digest([a]) == batch_digest([same])
    assert batch_digest([a]) != batch_digest([swapped]), "the order of the rows counts"
    assert batch_digest([a]) != batch_digest([a, same])
    assert batch_digest({"x": torch.ones(3)}) != batch_digest({"x": torch.zeros(3)})
    same.device, same.dataset = "cuda:1", object()  # not data: may differ per process
    assert batch_digest([a]) == batch_digest([same])


def test_own_generators_take_rank0_states(monkeypatch: pytest.MonkeyPatch) -> None:
    import random

    import numpy as np

    class Shuffler:
        def __init__(self) -> None:
            self._random_state = random.getstate()

    class Iterator:
        def __init__(self, seed: int) -> None:
            random.seed(seed)
            self.random_shuffler = Shuffler()
            self.generator = torch.Generator().manual_seed(seed)
            self.rng = random.Random(seed)
            self.np_rng = np.random.default_rng(seed)
            self.dataset = [1, 2, 3]

    rank0, rank1 = Iterator(1), Iterator(2)
    sent: list = []
    monkeypatch.setattr(batch_iterables, "broadcast_object", lambda obj, state: sent.append(obj) or obj)
    batch_iterables.share_own_generators(rank0, ProcessState(rank=0, world_size=2))
    assert [path for path, _, _ in sent[0]] == [
        ("generator",), ("np_rng",), ("random_shuffler", "_random_state"), ("rng",)]
    monkeypatch.setattr(batch_iterables, "broadcast_object", lambda obj, state: sent[0])
    batch_iterables.share_own_generators(rank1, ProcessState(rank=1, world_size=2))
    assert rank1.random_shuffler._random_state == rank0.random_shuffler._random_state
    assert torch.equal(torch.randn(3, generator=rank1.generator), torch.randn(3, generator=rank0.generator))
    assert rank1.rng.random() == rank0.rng.random()
    assert rank1.np_rng.random() == rank0.np_rng.random()
