"""Worker for tests/runtime/test_prepared_container_model.py: a container model read through the
prepared wrapper (indexing, slicing, len, iteration, truth), run with 1 or 2 processes (torchrun)
or as a plain script; writes OUT_DIR/rank{r}.json."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from torch import nn

from runtime import Accelerator

out_dir = Path(sys.argv[1])
precision = sys.argv[2] if len(sys.argv) > 2 else "no"


class Heads(nn.ModuleDict):
    """A user's model built on ModuleDict: indexed by name."""

    def __init__(self) -> None:
        super().__init__({"body": nn.Linear(4, 3), "head": nn.Linear(3, 1)})

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self["head"](self["body"](x))


class Plain(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x)


def type_error(action) -> str | None:
    try:
        action()
    except TypeError as error:
        return type(error).__name__
    return None


accelerator = Accelerator(cpu=True, mixed_precision=precision)
torch.manual_seed(0)
net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
model, optimizer = accelerator.prepare(net, optimizer)
heads = accelerator.prepare(Heads())
plain = accelerator.prepare(Plain())
empty = accelerator.prepare(nn.Sequential())
result: dict = {"rank": accelerator.process_index, "wrapped": model is not net}
result["index_is_users"] = model[0] is net[0] and model[-1] is net[2]
result["slice_types"] = [type(m).__name__ for m in model[1:]]
result["len"] = len(model)
result["iterated"] = [type(m).__name__ for m in model]
result["reversed"] = [type(m).__name__ for m in reversed(model)]
result["truth"] = [bool(model), bool(heads), bool(plain), bool(empty)]
result["by_name"] = heads["head"] is accelerator.unwrap_model(heads)["head"] and "body" in heads
result["names"] = list(heads)
result["plain_errors"] = [type_error(lambda: plain[0]), type_error(lambda: len(plain))]
# a training step that reads the first layer through the prepared model, then its weights
torch.manual_seed(1 + accelerator.process_index)
x, y = torch.randn(6, 4), torch.randn(6, 1)
loss = nn.functional.mse_loss(model(x), y)
accelerator.backward(loss)
optimizer.step()
result["first_weight_sum"] = model[0].weight.sum().item()
(out_dir / f"rank{accelerator.process_index}.json").write_text(json.dumps(result))
