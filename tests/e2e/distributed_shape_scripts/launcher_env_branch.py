"""A module-level torchrun script that takes its DDP branch when the launcher sets RANK.

No `main()`, no `__main__` guard: `ddp = int(os.environ.get("RANK", -1)) != -1` picks the branch
that asserts CUDA, joins an NCCL group and pins `f"cuda:{local_rank}"`, or the single-process
branch that autodetects the device as a string. The batches are sharded by hand (each rank reads
its own offsets), the gradient is accumulated over micro-steps with the DDP sync skipped but on
the last, and the accumulated loss is averaged over the ranks. Under torchrun the original needs
GPUs (the assert); as plain `python` it trains on one process. Each rank writes `rank<i>.json`
into the directory given as the first argument: rank, world size, per-step losses, the ids of the
samples it trained on and the final weights.
"""

import json
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed import destroy_process_group, init_process_group
from torch.nn.parallel import DistributedDataParallel as DDP


class ShardedBatches:
    """Batches of `size` samples; this process reads every `count`-th batch from `offset` on."""

    def __init__(self, size, offset, count):
        generator = torch.Generator().manual_seed(1)
        self.x = torch.randn(64, 4, generator=generator)
        self.y = self.x @ torch.tensor([[0.1], [-0.2], [0.05], [0.3]]) + 0.01
        self.size, self.offset, self.count = size, offset, count
        self.position = size * offset

    def next_batch(self):
        ids = torch.arange(self.position, self.position + self.size)
        self.position += self.size * self.count
        if self.position + self.size > len(self.x):
            self.position = self.size * self.offset
        return self.x[ids], self.y[ids], ids


out_dir = sys.argv[1]

ddp = int(os.environ.get("RANK", -1)) != -1
if ddp:
    # DDP over NCCL needs CUDA
    assert torch.cuda.is_available(), "this DDP run needs CUDA"
    init_process_group(backend="nccl")
    ddp_rank = int(os.environ["RANK"])
    ddp_local_rank = int(os.environ["LOCAL_RANK"])
    ddp_world_size = int(os.environ["WORLD_SIZE"])
    device = f"cuda:{ddp_local_rank}"
    torch.cuda.set_device(device)
    master_process = ddp_rank == 0
else:
    ddp_rank = 0
    ddp_local_rank = 0
    ddp_world_size = 1
    master_process = True
    device = "cpu"
    if torch.cuda.is_available():
        device = "cuda"
    print(f"using device: {device}")
device_type = "cuda" if device.startswith("cuda") else "cpu"

total_batch = 16
micro_batch = 4
assert total_batch % (micro_batch * ddp_world_size) == 0
grad_accum_steps = total_batch // (micro_batch * ddp_world_size)
if master_process:
    print(f"gradient accumulation steps: {grad_accum_steps} on {device_type}")

train_batches = ShardedBatches(micro_batch, ddp_rank, ddp_world_size)
torch.manual_seed(0)
model = nn.Linear(4, 1)
model.to(device)
if ddp:
    model = DDP(model, device_ids=[ddp_local_rank])
raw_model = model.module if ddp else model
optimizer = torch.optim.SGD(raw_model.parameters(), lr=0.05)

losses, seen = [], []
for step in range(8):
    optimizer.zero_grad()
    loss_accum = 0.0
    for micro_step in range(grad_accum_steps):
        x, y, ids = train_batches.next_batch()
        x, y = x.to(device), y.to(device)
        if ddp:
            model.require_backward_grad_sync = micro_step == grad_accum_steps - 1
        loss = nn.functional.mse_loss(model(x), y)
        loss = loss / grad_accum_steps
        loss_accum += loss.detach()
        loss.backward()
        seen.extend(ids.tolist())
    if ddp:
        dist.all_reduce(loss_accum, op=dist.ReduceOp.AVG)
    optimizer.step()
    losses.append(loss_accum.item())
    if master_process:
        print(f"step {step} loss {loss_accum.item():.6f}")

weights = [w for p in raw_model.parameters() for w in p.detach().flatten().tolist()]
record = {"rank": ddp_rank, "world_size": ddp_world_size, "losses": losses, "seen": seen, "weights": weights}
with open(os.path.join(out_dir, f"rank{ddp_rank}.json"), "w") as handle:
    json.dump(record, handle)

if ddp:
    dist.barrier()  # gloo aborts a rank whose peer closes its sockets first
    destroy_process_group()
