"""benchmarks/gpu_check.py (issue 29 item 6) on a machine without CUDA: it runs nothing, says so,
exits 2; and its steps are the ones the issue asks for. The CUDA run itself happens on a lent GPU
machine (benchmarks/README.md), never in this suite."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from benchmarks import gpu_check

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the behaviour without CUDA")
def test_without_cuda_it_runs_nothing_and_exits_2(tmp_path: Path) -> None:
    env = {"PATH": "/usr/bin:/bin", "OUT": str(tmp_path / "out"), "PYTHONPATH": str(ROOT)}
    result = subprocess.run([sys.executable, "-m", "benchmarks.gpu_check"], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "no CUDA GPU here: nothing was run" in result.stdout
    assert "PASS" not in result.stdout
    summary = json.loads((tmp_path / "out" / "gpu_check.json").read_text())
    assert summary["cuda"] is False and summary["steps"] == {}


def test_steps_are_the_ones_issue_29_asks_for() -> None:
    assert gpu_check.STEPS == ("cuda-tests", "nccl", "migrate", "launch-fp32", "launch-fp16", "launch-bf16",
                               "launch-fsdp", "estimate-memory")
    options = {name: opts for name, opts, _ in gpu_check.LAUNCHES}
    assert options["launch-fp32"] == ["--mixed-precision", "no"]
    assert options["launch-fp16"] == ["--mixed-precision", "fp16"]
    assert options["launch-bf16"] == ["--mixed-precision", "bf16"]
    assert options["launch-fsdp"][-2:] == ["--strategy", "fsdp"]
    expected = {name: want for name, _, want in gpu_check.LAUNCHES}
    assert expected["launch-fp16"]["scaler"] is True  # fp16 with the scaler
    assert (ROOT / gpu_check.SCRIPT).is_file()
    total = sum(gpu_check.TIMEOUT_S.values()) + gpu_check.LAUNCH_TIMEOUT_S * len(gpu_check.LAUNCHES)
    assert total < 8 * 60


def test_it_runs_every_test_that_skips_without_cuda() -> None:
    holding = {str(path.relative_to(ROOT)) for path in (ROOT / "tests").rglob("*.py")
               if "needs a CUDA GPU" in path.read_text() and path.name != "test_gpu_check.py"}
    assert holding == {node.split("::")[0] for node in gpu_check.CUDA_TESTS}
    for node in gpu_check.CUDA_TESTS:  # every node id names a test that exists
        path, name = node.split("::")
        assert re.search(rf"^def {name}\(", (ROOT / path).read_text(), re.M), node
