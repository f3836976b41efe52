"""Two real gloo processes: split_batches, even_batches=False, IterableDataset, gather_for_metrics.

All checks read one run of workers/data_ops_checks.py (shared with test_ops.py).
"""

from __future__ import annotations

import pytest

from rt_helpers import run_worker_once

N = 2


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    return run_worker_once("data_ops_checks", tmp_path_factory.getbasetemp())[0]


def _padded(batch: list[int], head: list[int], size: int = 8) -> list[int]:
    filler = head * (size // len(head) + 1)
    return batch + filler[: size - len(batch)]


@pytest.mark.parametrize("size", ["64", "70", "67"])
def test_split_batches_gives_rank_r_slice_r_of_each_one_process_batch(ranks, size: str) -> None:
    r0, r1 = (r["split"][size] for r in ranks)
    for epoch in range(2):
        reference = r0["reference"][epoch]  # a plain one-process DataLoader from rank 0's RNG
        assert len(r0["epochs"][epoch]) == len(r1["epochs"][epoch]) == len(reference)
        for k, global_batch in enumerate(reference):
            full = _padded(global_batch, reference[0])  # even_batches completes a short batch
            assert r0["epochs"][epoch][k] + r1["epochs"][epoch][k] == full
    if size != "67":  # shuffled: one permutation per epoch, re-drawn each epoch
        assert r0["reference"][0] != r0["reference"][1]


@pytest.mark.parametrize("size", ["64", "70", "67"])
def test_split_batches_gather_for_metrics_returns_exactly_the_dataset(ranks, size: str) -> None:
    for r in ranks:
        for epoch in range(2):
            # rank 0's one-process order (the shared seed is rank 0's draw)
            flat = [i for b in ranks[0]["split"][size]["reference"][epoch] for i in b]
            tensors, strings = r["split"][size]["gathered"][epoch]
            assert tensors == flat  # exactly len(dataset) items, in the one-process order
            assert strings == [f"s{i}" for i in flat]  # non-tensor objects too


def test_split_batches_needs_a_divisible_batch_size(ranks) -> None:
    message = ranks[0]["split_error"]
    assert "batch_size=7" in message and "2 processes" in message
    assert "expected:" in message and "fix:" in message


def test_even_batches_false_lets_ranks_have_different_counts(ranks) -> None:
    r0, r1 = (r["uneven"] for r in ranks)
    assert (r0["len"], r1["len"]) == (5, 4)
    assert [len(r0["epoch"]), len(r1["epoch"])] == [5, 4]
    assert r0["epoch"][-1] == [64, 65, 66, 67]  # the short last batch, not padded
    seen = sorted(i for r in (r0, r1) for b in r["epoch"] for i in b)
    assert seen == list(range(68))


def test_even_batches_false_with_split_batches(ranks) -> None:
    r0, r1 = (r["uneven_split"] for r in ranks)
    assert r0["epoch"][-1] == [64] and r1["epoch"][-1] == [65, 66]  # 3 samples cut 1 / 2
    for r in (r0, r1):
        assert r["gathered"] == list(range(67))


def _iterable_expected(size: int, batch_size: int, split: bool, drop_last: bool) -> list[list[list[int]]]:
    """Accelerate's IterableDatasetShard: buffers of batch_size*N (batch_size with split)."""
    data = list(range(size))
    buffer = batch_size if split else batch_size * N
    per_rank = buffer // N
    buffers = [data[i : i + buffer] for i in range(0, size, buffer)]
    if buffers and len(buffers[-1]) < buffer:
        if drop_last:
            buffers.pop()
        else:
            filler = buffers[0] if len(buffers) > 1 else list(buffers[-1])
            while len(buffers[-1]) < buffer:
                buffers[-1] = buffers[-1] + filler
            buffers[-1] = buffers[-1][:buffer]
    return [[b[r * per_rank : (r + 1) * per_rank] for b in buffers] for r in range(N)]


@pytest.mark.parametrize(
    "name, split, drop_last",
    [("unsized", False, False), ("sized", False, False), ("split", True, False), ("drop_last", False, True)],
)
def test_iterable_dataset_shards_like_accelerate(ranks, name: str, split: bool, drop_last: bool) -> None:
    expected = _iterable_expected(70, 8, split, drop_last)
    for rank, r in enumerate(ranks):
        assert r["iterable"][name]["batches"] == expected[rank]
    # Every sample reaches exactly one rank (before padding).
    seen = [i for rank in range(N) for b in expected[rank] for i in b]
    if not drop_last:
        assert set(seen) == set(range(70))


@pytest.mark.parametrize("name", ["unsized", "sized", "split"])
def test_iterable_dataset_gather_for_metrics_returns_exactly_the_dataset(ranks, name: str) -> None:
    for r in ranks:
        assert r["iterable"][name]["gathered"] == list(range(70))


def test_gather_for_metrics_objects_and_nested_tensors_without_split(ranks) -> None:
    for r in ranks:
        g = r["gfm"]
        assert len(g["tensors"]) == 70 and sorted(g["tensors"]) == list(range(70))
        assert g["strings"] == [f"x{i}" for i in g["tensors"]]
        assert g["nested"] == [[i, i * i] for i in g["tensors"]]
    assert ranks[0]["gfm"] == ranks[1]["gfm"]


def test_split_batches_matches_one_process(tmp_path) -> None:
    """1 vs 2 processes with split_batches=True: same global sample order, same weights.

    SGD, 10 steps: within 1e-5 relative (only the float summation order differs: two half-batch
    means averaged by DDP vs one full-batch mean); measured 9.6e-8. AdamW over a longer run
    (200 steps, 17 epochs): the bound that holds is 1e-5 relative as well; measured 3.7e-7
    (Adam's division by sqrt(v) amplifies last-bit gradient differences, so the gap grows with
    the run: about 4x SGD's 10-step gap after 200 steps).
    """
    import json
    import sys

    import torch

    from rt_helpers import WORKERS, run_cmd, torchrun

    worker = WORKERS / "equivalence.py"
    single = run_cmd([sys.executable, str(worker), str(tmp_path)], tmp_path)
    assert single.returncode == 0, single.stderr
    double = torchrun(worker, str(tmp_path), cwd=tmp_path)
    assert double.returncode == 0, double.stdout + double.stderr
    one, two = (json.loads((tmp_path / f"world{n}.json").read_text()) for n in (1, 2))
    for name, rtol in (("sgd", 1e-5), ("adamw", 1e-5)):
        assert one[name]["seen"] == two[name]["seen"], f"{name}: global sample order differs"
        w1, w2 = torch.tensor(one[name]["weights"]), torch.tensor(two[name]["weights"])
        rel = ((w1 - w2).abs().max() / w1.abs().max()).item()
        print(f"{name}: max relative weight difference 1 vs 2 processes = {rel:.2e}")
        assert rel <= rtol, f"{name}: {rel:.2e} > {rtol}"
