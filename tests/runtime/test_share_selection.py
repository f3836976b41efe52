"""`Accelerator.share_selection`: one process keeps the selection as it is; on 2 real gloo
processes each takes every other selected position, padded by wrapping as DistributedSampler pads
(reads one run of workers/share_selection_checks.py)."""

from __future__ import annotations

import pytest
import torch

from rt_helpers import run_worker_once
from runtime import Accelerator


def test_one_process_returns_the_selection_itself() -> None:
    accelerator = Accelerator(cpu=True)
    index = torch.tensor([4, 0, 2])
    mask = torch.tensor([True, False, True])
    assert accelerator.share_selection(index) is index
    assert accelerator.share_selection(mask) is mask


def test_rejects_what_is_no_selection() -> None:
    accelerator = Accelerator(cpu=True)
    with pytest.raises(ValueError, match="1-D index tensor or boolean mask"):
        accelerator.share_selection(torch.zeros(2, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match="list"):
        accelerator.share_selection([1, 2])  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    return run_worker_once("share_selection_checks", tmp_path_factory.getbasetemp())[0]


def test_two_processes_share_an_index_and_a_mask(ranks) -> None:
    first, second = ranks
    # [5, 3, 9, 1, 7] padded to [5, 3, 9, 1, 7, 5]: positions 0, 2, 4 and 1, 3, 5
    assert first["index"] == [5, 9, 7] and second["index"] == [3, 1, 5]
    # the mask's positions [0, 2, 3, 5, 6], padded with 0, as an index tensor
    assert first["mask"] == [0, 3, 6] and second["mask"] == [2, 5, 0]
    assert first["even"] == [10, 12, 14, 16] and second["even"] == [11, 13, 15, 17]
    assert first["empty"] == [] and second["empty"] == []


def test_two_processes_refuse_different_selections(ranks) -> None:
    for r in ranks:
        assert r["differing"] is not None and "different selections" in r["differing"], r


def test_one_process_takes_every_row_of_a_count() -> None:
    accelerator = Accelerator(cpu=True)
    assert accelerator.share_selection(5).tolist() == [0, 1, 2, 3, 4]
    with pytest.raises(ValueError, match="their count"):
        accelerator.share_selection(True)  # type: ignore[arg-type]
