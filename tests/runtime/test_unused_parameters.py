"""Parameters that require grad but get no gradient (a part under torch.no_grad(), a detached
embedding) train at 2 processes: runtime/unused_parameters.py leaves them out of DDP's
synchronisation with one warning, and refuses a later gradient for them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

from runtime import Accelerator

from rt_helpers import WORKERS, torchrun

CASES = ("frozen_encoder", "detached_embedding")
FROZEN = {"frozen_encoder": ["encoder.0.weight", "encoder.0.bias", "encoder.2.weight", "encoder.2.bias"],
          "detached_embedding": ["emb.weight"]}


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list[dict]:
    out = tmp_path_factory.mktemp("unused")
    proc = torchrun(WORKERS / "unused_params.py", str(out), cwd=out, nproc=2, timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]


@pytest.mark.parametrize("case", CASES)
def test_trains_like_one_process_and_replicas_stay_equal(ranks, case: str) -> None:
    for r in ranks:
        result = r[case]
        assert result["weights_by_rank"][0] == result["weights_by_rank"][1]
        # split_batches: the same samples as one process, so the same weights up to summation
        # order; the first step (which plain DDP left local) is averaged too.
        assert result["max_diff_to_one_process"] < 1e-5
        assert result["unchanged"] == FROZEN[case]  # never updated, as on one process
    for step, reference in enumerate(ranks[0][case]["reference_losses"]):
        mean = (ranks[0][case]["losses"][step] + ranks[1][case]["losses"][step]) / 2
        assert mean == pytest.approx(reference, rel=1e-5)


@pytest.mark.parametrize("case", CASES)
def test_one_warning_on_the_main_process_names_them(ranks, case: str) -> None:
    [message] = ranks[0][case]["warnings"]
    assert ", ".join(FROZEN[case]) in message
    assert "requires_grad_(False)" in message and "find_unused_parameters=True" in message
    assert ranks[1][case]["warnings"] == []


def test_a_left_out_parameter_that_gets_a_gradient_later_is_refused(ranks) -> None:
    for r in ranks:
        message = r["used_later_error"]
        assert message is not None and "UsedLater.encoder." in message
        assert "find_unused_parameters=True" in message


def test_explicit_find_unused_parameters_is_ddps_own(ranks) -> None:
    for r in ranks:
        assert r["explicit"]["warnings"] == []
        assert r["explicit"]["weights_by_rank"][0] == r["explicit"]["weights_by_rank"][1]


class FrozenByNoGrad(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Linear(6, 5)
        self.head = nn.Linear(5, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            features = self.encoder(x)
        return self.head(features)


def test_one_process_losses_equal_the_originals() -> None:
    def run(accelerator: Accelerator | None) -> list[float]:
        torch.manual_seed(0)
        model = FrozenByNoGrad()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        if accelerator is not None:
            model, optimizer = accelerator.prepare(model, optimizer)
        losses = []
        g = torch.Generator().manual_seed(1)
        for _ in range(5):
            x, y = torch.randn(8, 6, generator=g), torch.randn(8, 1, generator=g)
            loss = nn.functional.mse_loss(model(x), y)
            accelerator.backward(loss) if accelerator is not None else loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            losses.append(loss.item())
        return losses

    assert run(Accelerator(cpu=True)) == run(None)
