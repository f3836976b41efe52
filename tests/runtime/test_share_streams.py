"""`Accelerator.share_streams`: one process keeps the batchified tensor as it is; on 2 real gloo
processes each takes every other stream, whole and in order, padded by wrapping as
DistributedSampler pads (reads one run of workers/share_streams_checks.py)."""

from __future__ import annotations

import pytest
import torch

from rt_helpers import run_worker_once
from runtime import Accelerator


def test_one_process_returns_the_tensor_itself() -> None:
    accelerator = Accelerator(cpu=True)
    ids = torch.arange(12).view(3, 4)
    assert accelerator.share_streams(ids) is ids
    assert accelerator.share_streams(ids, dim=1) is ids


def test_rejects_what_is_no_batchified_tensor() -> None:
    accelerator = Accelerator(cpu=True)
    with pytest.raises(ValueError, match="at least 2 dimensions"):
        accelerator.share_streams(torch.arange(4))
    with pytest.raises(ValueError, match="dim=2"):
        accelerator.share_streams(torch.zeros(2, 3), dim=2)
    with pytest.raises(ValueError, match="list"):
        accelerator.share_streams([[1, 2]])  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    return run_worker_once("share_streams_checks", tmp_path_factory.getbasetemp())[0]


def test_two_processes_share_rows_and_columns(ranks) -> None:
    first, second = ranks
    rows = torch.arange(20).view(5, 4).tolist()
    # 5 streams padded to 6 by wrapping: rows 0, 2, 4 and 1, 3, 0
    assert first["rows"] == [rows[0], rows[2], rows[4]]
    assert second["rows"] == [rows[1], rows[3], rows[0]]
    columns = torch.arange(24).view(4, 6)
    assert first["columns"] == columns[:, 0::2].tolist()
    assert second["columns"] == columns[:, 1::2].tolist()


def test_two_processes_refuse_different_shapes(ranks) -> None:
    for r in ranks:
        assert r["differing"] is not None and "different shapes" in r["differing"], r
