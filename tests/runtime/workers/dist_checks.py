"""Worker for tests/runtime/test_runtime_distributed.py: run under torchrun with 2 processes.

Writes OUT_DIR/rank{r}.json with everything the test asserts on.
"""

from __future__ import annotations

import copy
import json
import sys
import time
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from runtime import Accelerator

out_dir = Path(sys.argv[1])
accelerator = Accelerator()
rank = accelerator.process_index
# Different RNG per rank: only the runtime's seed broadcast can make the permutations agree.
torch.manual_seed(100 + rank)
result: dict = {
    "process_index": rank,
    "local_process_index": accelerator.local_process_index,
    "num_processes": accelerator.num_processes,
    "is_main_process": accelerator.is_main_process,
    "is_local_main_process": accelerator.is_local_main_process,
    "distributed_type": accelerator.distributed_type.value,
}

# -- data sharding ------------------------------------------------------------------------------
CONFIGS = {
    "divisible": dict(size=64, batch_size=8, shuffle=True, drop_last=False, even=True),
    "not_divisible": dict(size=70, batch_size=8, shuffle=True, drop_last=False, even=True),
    "sequential_uneven": dict(size=70, batch_size=8, shuffle=False, drop_last=False, even=False),
    "drop_last": dict(size=70, batch_size=8, shuffle=True, drop_last=True, even=True),
    "tiny": dict(size=5, batch_size=4, shuffle=True, drop_last=False, even=True),
    "per_sample": dict(size=7, batch_size=None, shuffle=True, drop_last=False, even=True),
}


def as_list(batch) -> list[int] | int:
    x = batch[0]
    return x.tolist()


data: dict = {}
for name, cfg in CONFIGS.items():
    dataset = TensorDataset(torch.arange(cfg["size"]))
    kwargs = dict(batch_size=cfg["batch_size"], shuffle=cfg["shuffle"], drop_last=cfg["drop_last"])
    acc = Accelerator(even_batches=cfg["even"])
    prepared = acc.prepare(DataLoader(dataset, **kwargs))
    epochs, references, rng_equal = [], [], []
    for _epoch in range(2):
        before = torch.get_rng_state()
        epochs.append([as_list(b) for b in prepared])
        after = torch.get_rng_state()
        # Replay the epoch with a plain DataLoader from the same RNG state: on rank 0 this is the
        # global batch sequence the shards must come from.
        torch.set_rng_state(before)
        references.append([as_list(b) for b in DataLoader(dataset, **kwargs)])
        rng_equal.append(bool(torch.equal(torch.get_rng_state(), after)))
    data[name] = {
        "len": len(prepared),
        "epochs": epochs,
        "reference": references,
        "rng_consumption_equal": rng_equal,
        "dataset_len": len(prepared.dataset),
    }
result["data"] = data

# -- DDP gradients --------------------------------------------------------------------------------
torch.manual_seed(rank)  # different initial weights per rank: DDP must broadcast rank 0's
model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
model, optimizer = accelerator.prepare(model, optimizer)
inner = accelerator.unwrap_model(model)
result["unwrapped_is_user_module"] = type(inner) is nn.Sequential
result["wrapped_type"] = type(model).__name__
x = torch.randn(16, 4, generator=torch.Generator().manual_seed(1000 + rank))
y = torch.randn(16, 2, generator=torch.Generator().manual_seed(2000 + rank))

local = copy.deepcopy(inner)
nn.functional.mse_loss(local(x), y).backward()
result["local_grads"] = [p.grad.flatten().tolist() for p in local.parameters()]
result["initial_params"] = [p.detach().flatten().tolist() for p in inner.parameters()]

with accelerator.no_sync(model):
    accelerator.backward(nn.functional.mse_loss(model(x), y))
result["no_sync_grads"] = [p.grad.flatten().tolist() for p in inner.parameters()]
optimizer.zero_grad()

loss = nn.functional.mse_loss(model(x), y)
accelerator.backward(loss)
result["grads"] = [p.grad.flatten().tolist() for p in inner.parameters()]
optimizer.step()
result["params_after_step"] = [p.detach().flatten().tolist() for p in inner.parameters()]

# -- gather ---------------------------------------------------------------------------------------
result["gather"] = accelerator.gather(torch.tensor([rank, 10 * rank])).tolist()
nested = accelerator.gather({"a": torch.tensor(rank), "b": [torch.ones(1, 2) * rank]})
result["gather_nested"] = {"a": nested["a"].tolist(), "b": nested["b"][0].tolist()}

# -- gather_for_metrics drops the even-batches padding ------------------------------------------
for name, size, bs in (("gfm_batched", 70, 8), ("gfm_per_sample", 7, None)):
    eval_loader = accelerator.prepare(DataLoader(TensorDataset(torch.arange(size)), batch_size=bs))
    seen = []
    for _ in range(2):  # twice: the second epoch must not inherit the first one's state
        seen.append(torch.cat([accelerator.gather_for_metrics(b[0]).reshape(-1) for b in eval_loader]).tolist())
    result[name] = seen
broken = accelerator.prepare(DataLoader(TensorDataset(torch.arange(70)), batch_size=8))
for i, (b,) in enumerate(broken):
    if i == 1:
        break  # an abandoned iterator must not confuse the next gather_for_metrics
result["gfm_after_break"] = torch.cat(
    [accelerator.gather_for_metrics(b) for (b,) in broken]
).tolist()

# -- print / save / barrier -----------------------------------------------------------------------
accelerator.print(f"PRINT-MARKER from rank {rank}")

save_calls = []
real_save = torch.save
torch.save = lambda obj, f, *a, **k: (save_calls.append(str(f)), real_save(obj, f, *a, **k))
accelerator.save({"rank": rank}, out_dir / "saved.pt")
torch.save = real_save
result["save_calls"] = len(save_calls)

marker = out_dir / "late_marker"
if rank == 1:
    time.sleep(1.0)
    marker.write_text("written by rank 1")
accelerator.wait_for_everyone()
result["marker_seen_after_barrier"] = marker.exists()

# -- a second Accelerator in the same process reuses the process group ----------------------------
second = Accelerator()
result["second_accelerator"] = {
    "process_index": second.process_index,
    "num_processes": second.num_processes,
    "gather": second.gather(torch.tensor([rank])).tolist(),
}

(out_dir / f"rank{rank}.json").write_text(json.dumps(result))
accelerator.end_training()
