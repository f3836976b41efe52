"""Prepared loaders keep the user's sampler or batch sampler and shard its batches.

2 processes (workers/user_samplers.py): every rank walks rank 0's order of the user's sampler,
even when the ranks' RNGs differ; rank i gets global batches i, i+2, ...; together the ranks see
exactly the 1-process batches in the 1-process order. ``len(loader)`` and ``len(loader.sampler)``
are per rank, ``loader.dataset`` is the user's.
"""

from __future__ import annotations

import torch
import pytest
from torch.utils.data import DataLoader, SubsetRandomSampler, TensorDataset

from runtime import Accelerator

from rt_helpers import run_worker_once


def interleave(first: list, second: list) -> list:
    return [batch for pair in zip(first, second) for batch in pair] + first[len(second):]


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    result, _ = run_worker_once("user_samplers", tmp_path_factory.mktemp("samplers"))
    return result


CASES = ["subset", "weighted", "custom", "sequential", "batch_sampler"]


@pytest.mark.parametrize("name", CASES)
def test_ranks_together_walk_the_one_process_order(ranks, name: str) -> None:
    zero, one = ranks[0][name], ranks[1][name]
    for epoch in range(2):
        together = interleave(zero["epochs"][epoch], one["epochs"][epoch])
        assert together == zero["reference"][epoch]  # every batch once, in the 1-process order


def test_subset_split_trains_each_sample_once_and_never_a_validation_one(ranks) -> None:
    zero, one = ranks[0]["subset"], ranks[1]["subset"]
    orders = []
    for epoch in range(2):
        seen = [i for batch in zero["epochs"][epoch] + one["epochs"][epoch] for i in batch]
        assert sorted(seen) == list(range(40))  # no index of the validation split (40..49)
        orders.append(seen)
    assert orders[0] != orders[1]  # a new permutation each epoch


@pytest.mark.parametrize("name", ["subset", "weighted", "custom", "sequential"])
def test_lengths_are_per_rank_and_the_dataset_is_the_users(ranks, name: str) -> None:
    for r in ranks:
        case = r[name]
        assert case["len_loader"] == len(case["epochs"][0]) and case["dataset_is_users"]
        assert case["sampler_len_matches_iteration"]  # this rank's samples per epoch
    assert ranks[0]["subset"]["len_sampler"] == 20 and ranks[0]["subset"]["indices_read_through"]


def test_a_custom_batch_samplers_loader_keeps_the_dataloaders_sampler(ranks) -> None:
    for r in ranks:
        assert r["batch_sampler"]["len_sampler"] == 50  # as DataLoader(batch_sampler=...) has
        assert r["batch_sampler"]["len_loader"] == 12


def test_batch_size_stays_readable_per_rank(ranks) -> None:
    # rebuilt around a batch sampler, the prepared loader's DataLoader.batch_size would be None
    sizes = {"subset": 4, "weighted": 4, "custom": 4, "sequential": 5, "batch_sampler": None}
    for r in ranks:
        assert {name: r[name]["batch_size"] for name in sizes} == sizes


def test_one_process_batch_size_stays_readable() -> None:
    """`total_num += loader.batch_size` in a training loop (a MoCo demo's shape): a TypeError on
    None once the loader is prepared, unless the prepared loader keeps it."""
    user = DataLoader(TensorDataset(torch.arange(10)), batch_size=4, shuffle=True, drop_last=True)
    loader = Accelerator(cpu=True).prepare(user)
    assert loader.batch_size == 4 and len(loader) == 2
    assert [len(batch[0]) for batch in loader] == [4, 4]
    custom = DataLoader(TensorDataset(torch.arange(10)), batch_sampler=[[0, 1], [2, 3, 4]])
    assert Accelerator(cpu=True).prepare(custom).batch_size is None  # as the user's loader has


def test_one_process_keeps_the_users_sampler() -> None:
    sampler = SubsetRandomSampler(list(range(40)))
    loader = Accelerator(cpu=True).prepare(DataLoader(TensorDataset(torch.arange(50)), batch_size=4, sampler=sampler))
    assert loader.sampler is sampler and len(loader.sampler) == 40 and len(loader) == 10


class _CountsEpochs(torch.utils.data.Sampler):
    """A user's sampler with set_epoch that the unprepared loader never calls."""

    def __init__(self) -> None:
        self.epochs: list[int] = []

    def set_epoch(self, epoch: int) -> None:
        self.epochs.append(epoch)

    def __iter__(self):
        return iter(range(8))

    def __len__(self) -> int:
        return 8


def test_one_process_shows_the_users_sampler_without_driving_its_epoch() -> None:
    sampler = _CountsEpochs()
    loader = Accelerator(cpu=True).prepare(DataLoader(TensorDataset(torch.arange(8)), batch_size=4, sampler=sampler))
    for _ in range(2):
        assert [b[0].tolist() for b in loader] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert loader.sampler is sampler and sampler.epochs == []  # as with the unprepared loader
