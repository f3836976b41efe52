"""Two real gloo processes: reduce, pad_across_processes, nested gather, main_process_first,
on_main_process & co., free_memory. Reads the shared run of workers/data_ops_checks.py."""

from __future__ import annotations

import pytest
import torch

from rt_helpers import run_worker_once
from runtime import Accelerator


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    return run_worker_once("data_ops_checks", tmp_path_factory.getbasetemp())[0]


def test_reduce_sum_mean_scale_nested(ranks) -> None:
    for rank, r in enumerate(ranks):
        assert r["reduce_sum"] == [3.0, 6.0]  # [1, 2] * 1 + [1, 2] * 2
        assert r["reduce_mean"] == [1.5, 3.0]
        assert r["reduce_scale"] == [1.5, 3.0]
        assert r["reduce_nested"] == {"a": [1], "b": [4]}
        assert r["reduce_input_untouched"] == [1.0 * (rank + 1), 2.0 * (rank + 1)]
        assert "reduction='max'" in r["reduce_error"] and "fix:" in r["reduce_error"]


def test_pad_across_processes(ranks) -> None:
    r0, r1 = ranks
    assert r0["pad"] == [[1, 1], [0, 0]] and r1["pad"] == [[2, 2], [2, 2]]
    assert r0["pad_first"] == [[-1, -1], [1, 1]]
    for r in ranks:
        assert r["pad_dim1_gathered"] == [[0, 1, 2, 0, 0], [0, 1, 2, 3, 4]]
        assert r["pad_0d"] == 5


def test_gather_keeps_nested_structure(ranks) -> None:
    for r in ranks:
        assert r["gather_nested"] == {"x": [0, 1], "y": [[0, 0], [1, 1]], "s": [0, 1], "type": "Point"}


def test_main_process_first(ranks) -> None:
    # Rank 0 sleeps 1 s, then writes a marker inside the block; rank 1 sees it on entering.
    assert [r["main_first_marker_seen"] for r in ranks] == [True, True]


def test_process_decorators(ranks) -> None:
    r0, r1 = ranks
    assert r0["on_main_return"] == 42 and r1["on_main_return"] is None
    assert r0["decorator_calls"] == ["main", "local_main"]
    assert r1["decorator_calls"] == ["one", "last"]


def test_free_memory(ranks) -> None:
    for r in ranks:
        assert r["free_memory"] == {"before": 1, "after": 0, "returned": [None, None], "optimizers_after": 0}
        # the loader prepared before free_memory() still tells gather_for_metrics its last round
        assert r["free_memory_kept_loader"] == [0, 1, 2, 3, 4]


def test_single_process_ops_are_local() -> None:
    accelerator = Accelerator(cpu=True)
    t = torch.tensor([1.0, 2.0])
    reduced = accelerator.reduce(t, reduction="mean")
    assert torch.equal(reduced, t) and reduced is not t
    assert accelerator.pad_across_processes(t) is t
    assert accelerator.gather_for_metrics(["a", "b"]) == ["a", "b"]
    with accelerator.main_process_first():
        pass
    assert accelerator.on_main_process(lambda: 7)() == 7
