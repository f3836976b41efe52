"""Worker for tests/runtime/test_unused_parameters.py: parameters that require grad but get no
gradient (a part run under torch.no_grad(), a detached embedding) at 2 processes.

``unused_params.py OUT_DIR`` under torchrun writes OUT_DIR/rank{r}.json. Each case trains with
``split_batches=True`` over 8-sample batches and compares the final weights with a one-process
run of the original model over the whole batches, computed on every rank.
"""

from __future__ import annotations

import copy
import json
import sys
import warnings
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from runtime import Accelerator, DistributedDataParallelKwargs
from runtime.errors import GradientSyncError

out_dir = Path(sys.argv[1])


class FrozenEncoder(nn.Module):
    """A pretrained encoder used as a feature extractor under no_grad, never frozen."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 5))
        self.head = nn.Linear(5, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            features = self.encoder(x)
        return self.head(features)


class DetachedEmbedding(nn.Module):
    """A ``fix_emb`` model: the embedding's output is detached, its weight still requires grad."""

    def __init__(self, fix_emb: bool = True) -> None:
        super().__init__()
        self.fix_emb = fix_emb
        self.emb = nn.Embedding(10, 4)
        self.rnn = nn.GRU(4, 4, batch_first=True)
        self.out = nn.Linear(4, 1)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        e = self.emb(tokens)
        if self.fix_emb:
            e = e.detach()
        h, _ = self.rnn(e)
        return self.out(h[:, -1])


def data(kind: str) -> TensorDataset:
    g = torch.Generator().manual_seed(3)
    if kind == "tokens":
        x = torch.randint(0, 10, (32, 5), generator=g)
    else:
        x = torch.randn(32, 6, generator=g)
    return TensorDataset(x, torch.randn(32, 1, generator=g))


def train(make, kind: str, accelerator: Accelerator | None, steps_per_epoch_check: bool = True):
    torch.manual_seed(0)
    model = make()
    original = copy.deepcopy(model.state_dict())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-3)
    loader = DataLoader(data(kind), batch_size=8, shuffle=False)
    if accelerator is not None:
        model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    losses = []
    for _ in range(2):
        for x, y in loader:
            loss = nn.functional.mse_loss(model(x), y)
            if accelerator is None:
                loss.backward()
            else:
                accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            losses.append(loss.item())
    inner = accelerator.unwrap_model(model) if accelerator is not None else model
    return inner, losses, original


def weights(module: nn.Module) -> list[float]:
    return torch.cat([p.detach().reshape(-1) for p in module.parameters()]).tolist()


def gather_rows(values: list[float]) -> list[list[float]]:
    rows = [None] * dist.get_world_size()
    dist.all_gather_object(rows, values)
    return rows


result: dict = {}
for label, make, kind in (("frozen_encoder", FrozenEncoder, "features"),
                          ("detached_embedding", DetachedEmbedding, "tokens")):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        accelerator = Accelerator(split_batches=True)
        trained, losses, original = train(make, kind, accelerator)
    reference, reference_losses, _ = train(make, kind, None)  # one process, the original model
    messages = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)
                and "got no gradient" in str(w.message)]
    frozen_part = [n for n, p in trained.named_parameters()
                   if torch.equal(p.detach(), original[n])]
    result[label] = {
        "weights_by_rank": gather_rows(weights(trained)),
        "max_diff_to_one_process": max(abs(a - b) for a, b in zip(weights(trained), weights(reference))),
        "unchanged": frozen_part,
        "warnings": messages,
        "losses": losses,
        "reference_losses": reference_losses,
    }

# -- a left-out parameter that gets a gradient later: refused, never silently local -------------
class UsedLater(FrozenEncoder):
    use_encoder = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.use_encoder:
            return self.head(self.encoder(x))
        return super().forward(x)


accelerator = Accelerator()
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    model = accelerator.prepare(UsedLater())
    accelerator.backward(model(torch.randn(4, 6)).sum())
model.use_encoder = True
try:
    accelerator.backward(model(torch.randn(4, 6)).sum())
    result["used_later_error"] = None
except GradientSyncError as error:
    result["used_later_error"] = str(error)

# -- find_unused_parameters=True, given explicitly: DDP's own handling, no warning, no hooks ----
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    accelerator = Accelerator(
        split_batches=True, kwargs_handlers=[DistributedDataParallelKwargs(find_unused_parameters=True)])
    trained, _, _ = train(FrozenEncoder, "features", accelerator)
result["explicit"] = {
    "weights_by_rank": gather_rows(weights(trained)),
    "warnings": [str(w.message) for w in caught if "got no gradient" in str(w.message)],
}

(out_dir / f"rank{dist.get_rank()}.json").write_text(json.dumps(result))
