"""prepare() given a batch source that is not a torch DataLoader: returned as it is on one process;
on 2 gloo processes an iterable of batches is shared out (batch i to rank i % 2, the last round
completed, equal step counts), also one shuffling with a generator of its own seeded apart (it takes
rank 0's state at prepare), a source whose batches still differ between the processes (shuffled with
the global RNG seeded apart) stops both with PrepareError, and a map-style Dataset raises PrepareError naming its type and the fix; a DataLoader
subclass is sharded. (HF Accelerate returns such objects as they are: docs/runtime.md.)"""

from __future__ import annotations

import json
from pathlib import Path

from rt_helpers import WORKERS, read_ranks, torchrun


def _run(tmp_path: Path, nproc: int) -> list[dict]:
    proc = torchrun(WORKERS / "non_loader_iterables.py", str(tmp_path), cwd=tmp_path, nproc=nproc)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return read_ranks(tmp_path, nproc)


def test_one_process_returns_non_loaders_unchanged(tmp_path: Path) -> None:
    (rank0,) = _run(tmp_path, 1)
    assert set(rank0["results"].values()) == {"unchanged"}
    for epoch in rank0["epochs"]:
        assert sorted(epoch) == list(range(12))
    iterable = rank0["iterable"]
    assert iterable["same_object"] is True and iterable["len"] == 7
    assert iterable["epochs"] == [[[2 * i, 2 * i + 1] for i in range(7)]] * 2, "the original batches, in order"


def test_two_processes_share_iterables_and_shard_a_subclass(tmp_path: Path) -> None:
    ranks = _run(tmp_path, 2)
    for rank in ranks:
        results = rank["results"]
        assert results["none"] == "unchanged"
        dataset = results["dataset"]
        assert "torch.utils.data.dataset.TensorDataset" in dataset and "neither a torch.utils.data.DataLoader" in dataset
        assert "fix: wrap the dataset in a torch.utils.data.DataLoader" in dataset
        shuffle = results["global_shuffle"]
        assert "GlobalShuffle gave other batches on process(es) [1] than on process 0" in shuffle
        assert "random.seed(s)" in shuffle
        split = results["split_batches"]
        assert "with split_batches=True" in split and "fix: run without split_batches" in split
    lists = [json.loads(rank["results"]["python_list"]) for rank in ranks]
    assert lists == [[[0, 1], [4, 5]], [[2, 3], [0, 1]]]
    for name in ("own_generator_shuffle", "kept_state_shuffle"):
        first, second = (json.loads(rank["results"][name]) for rank in ranks)
        assert len(first) == len(second) == 3
        assert sorted(i for b in first + second for i in b) == list(range(12)), name + ": disjoint and complete"
    for epoch in range(2):
        first, second = (r["epochs"][epoch] for r in ranks)
        assert len(first) == len(second) == 6
        assert sorted(first + second) == list(range(12)), "each sample reaches exactly one rank"
    own = [rank["iterable"] for rank in ranks]
    for iterable in own:
        assert iterable["same_object"] is False
        assert iterable["len"] == 4, "7 batches on 2 processes: 4 steps each"
        assert iterable["epoch_seen_by_source"] == 2, "init_epoch() reached the source"
    for epoch in range(2):
        first, second = (r["epochs"][epoch] for r in own)
        assert len(first) == len(second) == 4, "equal step counts"
        assert first == [[0, 1], [4, 5], [8, 9], [12, 13]]
        assert second[:3] == [[2, 3], [6, 7], [10, 11]]
        assert second[3] == [0, 1], "the last round is completed from the epoch's first batch"
        real = sorted(i for batch in first + second[:3] for i in batch)
        assert real == list(range(14)), "disjoint and complete"
