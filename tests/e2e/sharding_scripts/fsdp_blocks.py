"""Hand-written FSDP2 training (for tests/e2e/test_hand_sharding.py): a block per layer, gloo on CPU.

Every rank builds the same model (seed 0), shards each block and then the model with
`fully_shard`, and trains on its DistributedSampler share. Writes OUT/rank{r}.json: the loss of
each step on this rank, the final weights (gathered) and the parameter elements this rank holds.
"""

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

BATCH = 4
SAMPLES = 32
LR = 0.05


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ff = nn.Linear(8, 8)

    def forward(self, x):
        return x + torch.tanh(self.ff(x))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(3, 8)
        self.blocks = nn.ModuleList(Block() for _ in range(3))
        self.out = nn.Linear(8, 1)

    def forward(self, x):
        x = self.inp(x)
        for block in self.blocks:
            x = block(x)
        return self.out(x)


def dataset():
    generator = torch.Generator().manual_seed(1)
    return TensorDataset(torch.randn(SAMPLES, 3, generator=generator), torch.randn(SAMPLES, 1, generator=generator))


def full(tensor):
    return tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor


def local_numel(tensor):
    return tensor.to_local().numel() if hasattr(tensor, "to_local") else tensor.numel()


def main(out_dir):
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = Net()
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    optimizer = torch.optim.Adam(model.parameters(), lr=LR)
    data = dataset()
    loader = DataLoader(data, batch_size=BATCH, sampler=DistributedSampler(data, shuffle=False))
    losses = []
    for x, y in loader:
        loss = nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    weights = {name: full(p).detach().reshape(-1).tolist() for name, p in model.named_parameters()}
    held = sum(local_numel(p) for p in model.parameters())
    result = {"losses": losses, "weights": weights, "held": held, "world": dist.get_world_size()}
    Path(out_dir, f"rank{dist.get_rank()}.json").write_text(json.dumps(result))
    dist.barrier()  # gloo aborts a rank whose peer closes its sockets first
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
