"""A container model (nn.Sequential, a ModuleDict subclass) prepared on 1 and 2 processes is indexed,
sliced, measured and iterated as the user's module (runtime/user_module.py): on 2 processes the DDP
wrapper used to answer `model[0]` with "'PreparedDDP' object is not subscriptable"."""

from __future__ import annotations

import sys

import pytest

from rt_helpers import WORKERS, read_ranks, run_cmd, torchrun


def check(rank: dict) -> None:
    assert rank["index_is_users"]
    assert rank["slice_types"] == ["ReLU", "Linear"]
    assert rank["len"] == 3
    assert rank["iterated"] == ["Linear", "ReLU", "Linear"]
    assert rank["reversed"] == ["Linear", "ReLU", "Linear"]
    assert rank["truth"] == [True, True, True, False]
    assert rank["by_name"] and rank["names"] == ["body", "head"]
    assert rank["plain_errors"] == ["TypeError", "TypeError"]


@pytest.mark.parametrize("precision", ["no", "bf16"])
def test_one_process(tmp_path, precision: str) -> None:
    proc = run_cmd([sys.executable, str(WORKERS / "container_model.py"), str(tmp_path), precision], cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    [rank] = read_ranks(tmp_path, nproc=1)
    assert rank["wrapped"] == (precision == "bf16")  # bf16: AutocastModule around the module
    check(rank)


def test_two_processes(tmp_path) -> None:
    proc = torchrun(WORKERS / "container_model.py", str(tmp_path), cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ranks = read_ranks(tmp_path)
    for rank in ranks:
        assert rank["wrapped"]  # a PreparedDDP
        check(rank)
    # the step through the wrapper averaged the gradients: the ranks' weights agree
    assert ranks[0]["first_weight_sum"] == ranks[1]["first_weight_sum"]
