"""Torch's generator is made alike across processes between `Accelerator()` and the first
`prepare` when the script did not seed it, and apart again after (runtime/rng.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from runtime import Accelerator

from rt_helpers import WORKERS, read_ranks, torchrun


def test_one_process_draws_as_without_the_accelerator() -> None:
    torch.manual_seed(3)
    expected = [torch.randn(4), nn.Linear(2, 1).weight.detach().clone(), torch.randn(4)]
    torch.manual_seed(3)
    drawn = [torch.randn(4)]
    accelerator = Accelerator(cpu=True)
    model = nn.Linear(2, 1)
    drawn.append(model.weight.detach().clone())
    accelerator.prepare(model)
    drawn.append(torch.randn(4))
    assert all(torch.equal(a, b) for a, b in zip(drawn, expected))


@pytest.mark.parametrize("mode", ["unseeded", "seeded"])
def test_two_processes(tmp_path: Path, mode: str) -> None:
    proc = torchrun(WORKERS / "rng_alignment.py", str(tmp_path), mode, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    first, second = read_ranks(tmp_path)
    # what is drawn between Accelerator() and prepare (a task, initial weights) is alike
    assert first["task"] == second["task"]
    assert first["initial"] == second["initial"]
    if mode == "unseeded":
        assert first["before"] != second["before"]  # drawn before the Accelerator: each its own
        assert first["after"] != second["after"]  # seeded apart at the first prepare
    else:
        # a script that seeds alike is left as it is: every draw alike, as without the runtime
        assert first["before"] == second["before"]
        assert first["after"] == second["after"]
