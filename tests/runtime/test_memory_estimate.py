"""``accel estimate-memory``: bytes computed by hand, sharding rounding, the meta device, errors,
and the estimate against what torch's ZeroRedundancyOptimizer and FSDP2 really hold on 2 ranks."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from rt_helpers import WORKERS, read_ranks, torchrun
from runtime.cli import main

MIB = 2**20


@pytest.fixture(autouse=True)
def _restore_import_state(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The command puts the model's folder on sys.path and its module in sys.modules: undo it."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    yield
    for name in ("est_models", "memory_model"):
        sys.modules.pop(name, None)


def _models(tmp_path: Path) -> Path:
    (tmp_path / "est_models.py").write_text(
        "import torch\n"
        "from torch import nn\n"
        "def linear():\n"
        "    return nn.Linear(1000, 1000)\n"
        "def huge():\n"
        "    assert torch.empty(1).device.type == 'meta', 'not built on the meta device'\n"
        "    return nn.Linear(50_000, 50_000)  # 10 GB of fp32 weights if it were allocated\n"
        "def uneven():\n"
        "    # whole parameters of 7, 3, 3 and 3 elements: ZeroRedundancyOptimizer gives rank 0 the 7\n"
        "    # and rank 1 the three 3s (9 elements), not 8 each\n"
        "    return nn.ParameterList([nn.Parameter(torch.zeros(n)) for n in (7, 3, 3, 3)])\n"
        "def three_layers():\n"
        "    # no repeated block: fsdp shards each child on its own, and gathers two at a time\n"
        "    return nn.Sequential(nn.Linear(10, 1000), nn.ReLU(), nn.Linear(1000, 1000), nn.Linear(1000, 10))\n"
        "def frozen():\n"
        "    model = nn.Sequential(nn.Linear(10, 10), nn.BatchNorm1d(10))\n"
        "    model[0].requires_grad_(False)\n"
        "    return model\n"
        "built = nn.Linear(2, 2)\n"
        "def not_a_model():\n"
        "    return 3\n"
        "def raises():\n"
        "    return nn.Linear(2, 2).cuda(7)\n"
    )
    return tmp_path / "est_models.py"


def _json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[tuple[int, str, str], dict]:
    assert main(["estimate-memory", *argv, "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    return {(r["nproc"], r["strategy"], r["precision"]): r for r in rows}


def test_linear_bytes_by_hand(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    models = _models(tmp_path)
    rows = _json(capsys, f"{models}:linear", "--nproc", "2", "--nproc", "3", "--precision", "fp32",
                 "--precision", "bf16")
    full = 1_001_000 * 4  # weight 1000x1000 + bias 1000, fp32
    ddp = rows[(2, "ddp", "fp32")]
    assert (ddp["params"], ddp["grads"], ddp["optimizer"]) == (full, full, 2 * full)  # Adam: 2 states
    assert ddp["in_step"] == full  # DDP's gradient buckets: a second copy of the gradients
    assert ddp["total"] == 5 * full
    # bf16 mixed: params, grads and state stay fp32; autocast adds a 2-byte copy of the weights
    assert rows[(2, "ddp", "bf16")]["params"] == full
    assert rows[(2, "ddp", "bf16")]["in_step"] == full + 1_001_000 * 2
    # zero1: whole parameters per rank; rank 0 gets the weight, rank 1 the bias
    assert rows[(2, "zero1", "fp32")]["optimizer"] == 2 * 1_000_000 * 4
    assert rows[(3, "zero1", "fp32")]["optimizer"] == 2 * 1_000_000 * 4
    # fsdp at 2 ranks: 500 rows of the weight and 500 bias elements each
    zero3 = rows[(2, "fsdp-zero3", "fp32")]
    assert (zero3["params"], zero3["grads"], zero3["optimizer"]) == (500_500 * 4, 500_500 * 4, 2 * 500_500 * 4)
    # at 3 ranks 1000 rows do not divide: rank 0 holds ceil(1000/3) = 334 rows and 334 bias elements
    assert rows[(3, "fsdp-zero3", "fp32")]["params"] == (334 * 1000 + 334) * 4
    # zero2 keeps every parameter unsharded from forward to backward: 2 bytes each in bf16
    assert rows[(2, "fsdp-zero2", "fp32")]["in_step"] == full
    assert rows[(2, "fsdp-zero2", "bf16")]["in_step"] == 1_001_000 * 2


def test_zero3_gathers_the_root_and_two_blocks(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rows = _json(capsys, f"{_models(tmp_path)}:three_layers", "--precision", "fp32", "--precision", "bf16")
    largest_two = (1000 * 1000 + 1000) + (10 * 1000 + 1000)  # Linear(1000, 1000) and Linear(10, 1000)
    assert rows[(2, "fsdp-zero3", "fp32")]["in_step"] == largest_two * 4
    assert rows[(2, "fsdp-zero3", "bf16")]["in_step"] == largest_two * 2  # gathered in bf16
    assert rows[(2, "fsdp-zero2", "fp32")]["in_step"] == (largest_two + 1000 * 10 + 10) * 4  # all of them


def test_one_process_has_no_buckets_or_shards(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rows = _json(capsys, f"{_models(tmp_path)}:linear", "--nproc", "1", "--precision", "fp32")
    assert rows[(1, "ddp", "fp32")]["in_step"] == 0
    assert rows[(1, "fsdp-zero3", "fp32")]["params"] == 1_001_000 * 4


def test_zero1_partition_is_greedy_not_one_over_n(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rows = _json(capsys, f"{_models(tmp_path)}:uneven", "--precision", "fp32", "--optimizer", "sgd-momentum")
    assert rows[(2, "zero1", "fp32")]["optimizer"] == 9 * 4  # one momentum buffer per element
    assert rows[(2, "ddp", "fp32")]["optimizer"] == 16 * 4


def test_frozen_parameters_and_buffers(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rows = _json(capsys, f"{_models(tmp_path)}:frozen", "--precision", "fp32")
    ddp = rows[(2, "ddp", "fp32")]
    assert ddp["params"] == (110 + 20) * 4
    assert ddp["grads"] == 20 * 4 and ddp["optimizer"] == 40 * 4  # only the BatchNorm is trained
    assert ddp["buffers"] == (10 + 10) * 4 + 8  # running mean and var, int64 batch counter
    assert ddp["total"] == ddp["params"] + ddp["grads"] + ddp["optimizer"] + ddp["in_step"] + ddp["buffers"]


def test_built_on_the_meta_device(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rows = _json(capsys, f"{_models(tmp_path)}:huge", "--precision", "fp32", "--nproc", "8")
    assert rows[(8, "ddp", "fp32")]["params"] == 2_500_050_000 * 4


def test_table_says_what_fits(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["estimate-memory", f"{_models(tmp_path)}:linear", "--gpu-memory", "15MB",
                 "--precision", "fp32"]) == 0
    lines = capsys.readouterr().out.splitlines()
    table = {line.split()[1]: line.split() for line in lines if line.startswith("2 ")}
    assert table["ddp"][-1] == "no"  # 5 x 4,004,000 bytes = 20 MB
    assert table["fsdp-zero3"][-1] == "yes"  # 4 x 2,002,000 + 4,004,000 = 12 MB
    assert "keeps params, grads and optimizer state in fp32" in " ".join(lines)


def test_module_name_from_the_current_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    _models(tmp_path)
    monkeypatch.chdir(tmp_path)
    rows = _json(capsys, "est_models:linear", "--precision", "fp32")
    assert rows[(2, "ddp", "fp32")]["params"] == 1_001_000 * 4


@pytest.mark.parametrize(("spec", "message"), [
    ("est_models", "is not MODULE:CALLABLE"),
    ("no_such_module_xyz:build", "no module named 'no_such_module_xyz'"),
    ("{models}:missing", "has no attribute 'missing'"),
    ("{models}:built", "is a model instance"),
    ("{models}:not_a_model", "returned int, not a torch.nn.Module"),
    ("{models}:raises", "raised"),
    ("{dir}/absent.py:build", "no such file"),
])
def test_bad_model_is_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                          spec: str, message: str) -> None:
    models = _models(tmp_path)
    assert main(["estimate-memory", spec.format(models=models, dir=tmp_path)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("accel estimate-memory: error: ") and message in captured.err
    assert captured.err.count("\n") == 1


def test_bad_gpu_memory_is_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["estimate-memory", f"{_models(tmp_path)}:linear", "--gpu-memory", "lots"]) == 2
    assert "--gpu-memory 'lots'" in capsys.readouterr().err


def test_estimate_matches_torch_on_two_ranks(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """What ZeroRedundancyOptimizer and fully_shard really allocate on the fullest rank is the estimate."""
    out = tmp_path / "out"
    out.mkdir()
    proc = torchrun(WORKERS / "memory_measure.py", str(out), cwd=out)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    measured = read_ranks(out)
    rows = _json(capsys, f"{WORKERS / 'memory_model.py'}:build", "--precision", "fp32")
    assert max(r["zero1_optimizer"] for r in measured) == rows[(2, "zero1", "fp32")]["optimizer"]
    zero3 = rows[(2, "fsdp-zero3", "fp32")]
    assert max(r["fsdp_params"] for r in measured) == zero3["params"]
    assert max(r["fsdp_grads"] for r in measured) == zero3["grads"]
    assert max(r["fsdp_optimizer"] for r in measured) == zero3["optimizer"]
    # the rounding is visible: rank 1 holds less than rank 0 (33 rows do not split evenly)
    assert measured[1]["fsdp_grads"] < measured[0]["fsdp_grads"]
