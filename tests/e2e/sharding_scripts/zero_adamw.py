"""Hand-written ZeRO-1 training (for tests/e2e/test_hand_sharding.py): DDP and a
ZeroRedundancyOptimizer over AdamW, gloo on CPU.

Writes OUT/rank{r}.json: the loss of each step on this rank, the final weights and the number of
optimizer-state elements this rank holds.
"""

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

BATCH = 4
LR, WEIGHT_DECAY = 0.05, 0.01


def build():
    return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 1))


def dataset():
    generator = torch.Generator().manual_seed(1)
    return TensorDataset(torch.randn(32, 6, generator=generator), torch.randn(32, 1, generator=generator))


def state_elements(optimizer):
    """Optimizer-state elements on this rank (a ZeroRedundancyOptimizer keeps its shard's in `.optim`)."""
    optimizer = getattr(optimizer, "optimizer", optimizer)  # a prepared optimizer wraps the one it steps
    optimizer = getattr(optimizer, "optim", optimizer)
    return sum(v.numel() for s in optimizer.state.values() for k, v in s.items() if k != "step")


def main(out_dir):
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = DistributedDataParallel(build())
    optimizer = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.AdamW, lr=LR,
                                        weight_decay=WEIGHT_DECAY)
    data = dataset()
    loader = DataLoader(data, batch_size=BATCH, sampler=DistributedSampler(data, shuffle=False))
    losses = []
    for x, y in loader:
        loss = nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    weights = {name: p.detach().reshape(-1).tolist() for name, p in model.named_parameters()}
    result = {"losses": losses, "weights": weights, "state": state_elements(optimizer),
              "world": dist.get_world_size()}
    Path(out_dir, f"rank{dist.get_rank()}.json").write_text(json.dumps(result))
    dist.barrier()  # gloo aborts a rank whose peer closes its sockets first
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
