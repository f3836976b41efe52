"""An optimizer resumed before ``prepare`` has its state moved with the parameters.

The migration removes ``model.cuda()``; a script that loads its optimizer's checkpoint before the
``prepare`` call then holds momentum buffers on the CPU while ``prepare`` puts the parameters on
the GPU. ``prepare`` re-places the state (as Accelerate's AcceleratedOptimizer does).
"""

from __future__ import annotations

import copy

import pytest
import torch

from runtime import Accelerator
from runtime.optim import follow_parameters


def _stepped(model: torch.nn.Module) -> torch.optim.Optimizer:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.ones(2, 3)).sum().backward()
    optimizer.step()
    return optimizer


def test_state_moves_to_the_parameters_device() -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    optimizer = _stepped(model)
    buffers = [optimizer.state[p]["momentum_buffer"].clone() for p in model.parameters()]
    for param in model.parameters():  # the parameters move (same objects), the state stays on the CPU
        torch.utils.swap_tensors(param, torch.nn.Parameter(param.detach().to("meta")))
    assert {optimizer.state[p]["momentum_buffer"].device.type for p in model.parameters()} == {"cpu"}
    follow_parameters(optimizer)
    for param, before in zip(model.parameters(), buffers):
        buffer = optimizer.state[param]["momentum_buffer"]
        assert buffer.device.type == "meta"
        assert buffer.shape == before.shape


def test_state_already_with_its_parameters_is_not_copied() -> None:
    model = torch.nn.Linear(3, 1)
    optimizer = _stepped(model)
    kept = {id(optimizer.state[p]["momentum_buffer"]) for p in model.parameters()}
    prepared_model, prepared = Accelerator(cpu=True).prepare(model, optimizer)
    assert {id(prepared.state[p]["momentum_buffer"]) for p in model.parameters()} == kept
    # and the resumed momentum is used as before: the same update as the unprepared optimizer
    twin = torch.nn.Linear(3, 1)
    twin.load_state_dict(model.state_dict())
    twin_opt = torch.optim.SGD(twin.parameters(), lr=0.1, momentum=0.9)
    twin_opt.load_state_dict(copy.deepcopy(optimizer.state_dict()))  # its own momentum buffers
    for m, o in ((prepared_model, prepared), (twin, twin_opt)):
        o.zero_grad()
        m(torch.ones(2, 3)).sum().backward()
        o.step()
    for a, b in zip(model.parameters(), twin.parameters()):
        assert torch.equal(a, b)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_resumed_before_prepare_steps_on_the_gpu() -> None:
    model = torch.nn.Linear(3, 1)
    optimizer = _stepped(model)  # the state is on the CPU, as after a resume before prepare
    accelerator = Accelerator()
    model, optimizer = accelerator.prepare(model, optimizer)
    for param in model.parameters():
        assert optimizer.state[param]["momentum_buffer"].device == param.device
    model(torch.ones(2, 3, device=accelerator.device)).sum().backward()
    optimizer.step()
