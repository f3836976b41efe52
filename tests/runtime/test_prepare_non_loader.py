"""prepare() given a batch source that is not a torch DataLoader: returned as it is on one process,
a PrepareError naming its type and the fix on 2 gloo processes; a DataLoader subclass is sharded.
(HF Accelerate returns such objects silently on every number of processes: docs/runtime.md.)"""

from __future__ import annotations

from pathlib import Path

from rt_helpers import WORKERS, read_ranks, torchrun


def _run(tmp_path: Path, nproc: int) -> list[dict]:
    proc = torchrun(WORKERS / "non_loader_iterables.py", str(tmp_path), cwd=tmp_path, nproc=nproc)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return read_ranks(tmp_path, nproc)


def test_one_process_returns_non_loaders_unchanged(tmp_path: Path) -> None:
    (rank0,) = _run(tmp_path, 1)
    assert rank0["results"] == {
        "batch_list": "unchanged", "python_list": "unchanged", "dataset": "unchanged", "none": "unchanged"}
    for epoch in rank0["epochs"]:
        assert sorted(epoch) == list(range(12))


def test_two_processes_refuse_non_loaders_and_shard_a_subclass(tmp_path: Path) -> None:
    ranks = _run(tmp_path, 2)
    for rank in ranks:
        batch_list = rank["results"]["batch_list"]
        assert "BatchList" in batch_list and "not a torch.utils.data.DataLoader" in batch_list
        assert "on 2 processes it cannot be sharded" in batch_list
        assert "fix: build the training batches with torch.utils.data.DataLoader" in batch_list
        assert "builtins.list" in rank["results"]["python_list"]
        assert "torch.utils.data.dataset.TensorDataset" in rank["results"]["dataset"]
        assert rank["results"]["none"] == "unchanged"
    for epoch in range(2):
        first, second = (r["epochs"][epoch] for r in ranks)
        assert len(first) == len(second) == 6
        assert sorted(first + second) == list(range(12)), "each sample reaches exactly one rank"
