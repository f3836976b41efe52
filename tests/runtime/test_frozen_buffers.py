"""A prepared module with nothing to train (a frozen encoder with BatchNorm, run in train mode)
keeps rank 0's parameters and buffers on every process, as DDP keeps those of the modules it wraps
(runtime/frozen_buffers.py): at 2 processes both ranks hold rank 0's running statistics and
compute the same evaluation metric after training; a forward under no_grad on one rank alone does
not wait for the other; the module is still the user's object, with no hook of the runtime, so that
`torch.save(module)` writes what the user's script wrote."""

from __future__ import annotations

import json

import pytest

from rt_helpers import WORKERS, torchrun


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list[dict]:
    out = tmp_path_factory.mktemp("frozen")
    proc = torchrun(WORKERS / "frozen_buffers.py", str(out), cwd=out, nproc=2, timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]


def test_running_statistics_and_metric_agree_across_ranks(ranks) -> None:
    assert ranks[0]["running_mean"] == ranks[1]["running_mean"]
    assert any(abs(v) > 1e-6 for v in ranks[0]["running_mean"])  # they did move from zero
    assert ranks[0]["metric"] == ranks[1]["metric"]


def test_the_frozen_module_is_the_users_own_and_pickles(ranks) -> None:
    for r in ranks:
        assert r["same_object"] is True
        assert r["pickled"] == "Sequential"
        assert r["hooks"] == 0  # nothing of the runtime travels with `torch.save(module)`


def test_one_process_is_unchanged(tmp_path) -> None:
    proc = torchrun(WORKERS / "frozen_buffers.py", str(tmp_path), cwd=tmp_path, nproc=1, timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads((tmp_path / "rank0.json").read_text())
    assert result["batches_tracked"] == 8 and result["same_object"] is True
