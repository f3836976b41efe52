"""Worker for tests/runtime/test_accumulation.py: run under torchrun with 2 gloo processes.

Writes OUT_DIR/rank{r}.json with everything the test asserts on: the sync_gradients pattern over
a prepared loader, per-micro-step gradients and all-reduce counts, optimizer/scheduler effects,
a hand-written DDP reference, and DDP + bf16 / fp16 checks.
"""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

import torch
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset

from runtime import Accelerator

N = 3  # gradient_accumulation_steps
out_dir = Path(sys.argv[1])
accelerator = Accelerator(gradient_accumulation_steps=N, cpu=True)
rank, world = accelerator.process_index, accelerator.num_processes
result: dict = {"gradient_accumulation_steps": accelerator.gradient_accumulation_steps}


def flat(tensors) -> list[float]:
    return torch.cat([t.detach().reshape(-1) for t in tensors]).tolist()


def grads(model: nn.Module) -> list[float]:
    return flat(p.grad for p in model.parameters())


def params(model: nn.Module) -> list[float]:
    return flat(model.parameters())


# -- 1. sync pattern over a loader whose per-rank length (5) is not a multiple of N ---------------
# 20 samples, batch 2: 10 global batches, 5 per rank. Expected per epoch: F F T F T.
torch.manual_seed(0)
model = nn.Linear(3, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
dataset = TensorDataset(torch.randn(20, 3), torch.randn(20, 1))
model, optimizer, loader = accelerator.prepare(model, optimizer, DataLoader(dataset, batch_size=2))
pattern, stepped = [], []
for _epoch in range(2):
    for x, y in loader:
        with accelerator.accumulate(model):
            before = params(model)
            accelerator.backward(nn.functional.mse_loss(model(x), y))
            optimizer.step()
            optimizer.zero_grad()
            pattern.append(accelerator.sync_gradients)
            stepped.append(params(model) != before)
result["loader_len"] = len(loader)
result["sync_pattern"] = pattern
result["params_changed"] = stepped

# -- 2. micro-steps under DDP: no all-reduce until the sync step; optimizer/scheduler no-ops ------
torch.manual_seed(1)
user_model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))
initial = copy.deepcopy(user_model)
optimizer = torch.optim.SGD(user_model.parameters(), lr=0.1)
scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
acc2 = Accelerator(gradient_accumulation_steps=N, cpu=True)
# The scheduler is listed first: prepare must still attach it to the prepared optimizer.
scheduler, model, optimizer = acc2.prepare(scheduler, user_model, optimizer)
allreduce_calls = [0]


def counting_hook(state, bucket):  # type: ignore[no-untyped-def]
    allreduce_calls[0] += 1
    return allreduce_hook(None, bucket)


model.register_comm_hook(None, counting_hook)
gen = torch.Generator().manual_seed(1000 + rank)  # different data on each rank
micro = [(torch.randn(5, 4, generator=gen), torch.randn(5, 2, generator=gen)) for _ in range(N)]
steps = []
for x, y in micro:
    with acc2.accumulate(model):
        calls_before = allreduce_calls[0]
        params_before = params(model)
        acc2.backward(nn.functional.mse_loss(model(x), y))
        record = {
            "sync": acc2.sync_gradients,
            "allreduce_calls": allreduce_calls[0] - calls_before,
            "grads": grads(model),
        }
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
        record["params_changed"] = params(model) != params_before
        record["grads_cleared"] = all(p.grad is None for p in model.parameters())
        record["scheduler_last_epoch"] = scheduler.last_epoch
        record["lr"] = scheduler.get_last_lr()[0]
        steps.append(record)
result["micro_steps"] = steps

# Hand-written plain-DDP reference: one big batch (the N micro-batches concatenated) per rank.
reference = DistributedDataParallel(initial)
big_x = torch.cat([x for x, _ in micro])
big_y = torch.cat([y for _, y in micro])
nn.functional.mse_loss(reference(big_x), big_y).backward()
result["reference_grads"] = grads(reference)

# -- 3. DDP + bf16: autocast forward, fp32 outputs, user module untouched ------------------------
acc_bf16 = Accelerator(mixed_precision="bf16", cpu=True)
torch.manual_seed(2)
user_model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))
inner_dtypes: list[str] = []
user_model[0].register_forward_hook(lambda m, i, o: inner_dtypes.append(str(o.dtype)))
optimizer = torch.optim.SGD(user_model.parameters(), lr=0.1)
model, optimizer = acc_bf16.prepare(user_model, optimizer)
x, y = micro[0]
out = model(x)
acc_bf16.backward(nn.functional.mse_loss(out, y))
optimizer.step()
unwrapped = acc_bf16.unwrap_model(model)
result["bf16"] = {
    "wrapped_type": type(model).__name__,
    "inner_dtype": inner_dtypes[0],
    "output_dtype": str(out.dtype),
    "unwrapped_is_user_module": unwrapped is user_model,
    "forward_is_original": unwrapped.forward.__func__ is nn.Sequential.forward
    and "forward" not in vars(user_model),
    "params_after_step": params(user_model),
}

# -- 4. DDP + fp16: an inf gradient on rank 1 only makes BOTH ranks skip the step ----------------
acc_fp16 = Accelerator(mixed_precision="fp16", cpu=True)
torch.manual_seed(3)
user_model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))
optimizer = torch.optim.SGD(user_model.parameters(), lr=0.1)
model, optimizer = acc_fp16.prepare(user_model, optimizer)
before = params(user_model)
loss = nn.functional.mse_loss(model(x), y)
if rank == 1:
    # Poison rank 1's gradient during backward, before DDP averages it.
    user_model[0].weight.register_hook(lambda g: torch.full_like(g, float("inf")))
acc_fp16.backward(loss)
optimizer.step()
optimizer.zero_grad()
skipped_first = acc_fp16.optimizer_step_was_skipped
unchanged_first = params(user_model) == before
scale_after_skip = acc_fp16.scaler.get_scale()
fresh = Accelerator(mixed_precision="fp16", cpu=True)  # healthy step on a fresh wrapper
torch.manual_seed(3)
user_model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))
optimizer = torch.optim.SGD(user_model.parameters(), lr=0.1)
model, optimizer = fresh.prepare(user_model, optimizer)
fresh.backward(nn.functional.mse_loss(model(x), y))
norm = fresh.clip_grad_norm_(model.parameters(), 1e9)
optimizer.step()
result["fp16"] = {
    "skipped_first": skipped_first,
    "unchanged_first": unchanged_first,
    "scale_after_skip": scale_after_skip,
    "skipped_healthy": fresh.optimizer_step_was_skipped,
    "params_after_healthy": params(user_model),
    "norm": norm.item(),
    "output_dtype": str(model(x).dtype),
}

(out_dir / f"rank{rank}.json").write_text(json.dumps(result))
