"""One training run for the step-overhead benchmarks; prints one JSON line per rank.

    python benchmarks/step_script.py IMPL MODEL STEPS [GA]

IMPL: plain (single process, no wrapper), ddp (hand-written DistributedSampler + DDP, no_sync on
accumulation micro-steps), runtime / accelerate (the same Accelerator script; only the import line
differs: the bundled runtime or HF Accelerate). MODEL: tiny (Linear(16, 1), batch 8: measures the
fixed cost per step), mlp, transformer (a small nn.TransformerEncoder). STEPS micro-batches per rank
are timed after a warm-up; GA is gradient_accumulation_steps (loss / GA, an optimizer step every GA
micro-batches). Output: {"rank", "world", "seconds", "steps", "maxrss_kb"}.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

WARMUP = 20


def build(model_name: str, n: int):
    g = torch.Generator().manual_seed(0)
    if model_name == "tiny":
        data = TensorDataset(torch.randn(n * 8, 16, generator=g), torch.randn(n * 8, 1, generator=g))
        return nn.Linear(16, 1), data, 8, nn.functional.mse_loss
    if model_name == "mlp":
        model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10))
        data = TensorDataset(torch.randn(n * 32, 256, generator=g), torch.randint(0, 10, (n * 32,), generator=g))
        return model, data, 32, nn.functional.cross_entropy
    if model_name == "transformer":
        layer = nn.TransformerEncoderLayer(d_model=64, nhead=4, dim_feedforward=128, dropout=0.0, batch_first=True)
        model = nn.Sequential(nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False), nn.Flatten(),
                              nn.Linear(64 * 16, 10))
        data = TensorDataset(torch.randn(n * 8, 16, 64, generator=g), torch.randint(0, 10, (n * 8,), generator=g))
        return model, data, 8, nn.functional.cross_entropy
    raise SystemExit(f"unknown model {model_name}")


def main() -> None:
    impl, model_name, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
    ga = int(sys.argv[4]) if len(sys.argv) > 4 else 1
    torch.manual_seed(0)
    torch.set_num_threads(1)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    total = WARMUP + steps
    model, data, batch, loss_fn = build(model_name, total * world)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

    if impl == "plain":
        loader = DataLoader(data, batch_size=batch, shuffle=True)
        rank = 0

        def train_step(i, x, y):
            loss = loss_fn(model(x), y) / ga
            loss.backward()
            if (i + 1) % ga == 0:
                optimizer.step()
                optimizer.zero_grad()

    elif impl == "ddp":
        import contextlib

        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel
        from torch.utils.data.distributed import DistributedSampler

        dist.init_process_group("gloo")
        rank = dist.get_rank()
        sampler = DistributedSampler(data, shuffle=True, seed=0)
        loader = DataLoader(data, batch_size=batch, sampler=sampler)
        sampler.set_epoch(0)
        model = DistributedDataParallel(model)

        def train_step(i, x, y):
            boundary = (i + 1) % ga == 0
            with contextlib.nullcontext() if boundary else model.no_sync():
                loss = loss_fn(model(x), y) / ga
                loss.backward()
            if boundary:
                optimizer.step()
                optimizer.zero_grad()

    elif impl in ("runtime", "accelerate"):
        if impl == "runtime":
            from runtime import Accelerator
        else:
            from accelerate import Accelerator
        accelerator = Accelerator(cpu=True, gradient_accumulation_steps=ga)
        rank = accelerator.process_index
        loader = DataLoader(data, batch_size=batch, shuffle=True)
        model, optimizer, loader = accelerator.prepare(model, optimizer, loader)

        def train_step(i, x, y):
            with accelerator.accumulate(model):
                loss = loss_fn(model(x), y)
                accelerator.backward(loss)
                optimizer.step()
                optimizer.zero_grad()

    else:
        raise SystemExit(f"unknown impl {impl}")

    model.train()
    start = None
    done = 0
    for i, (x, y) in enumerate(loader):
        if i == WARMUP:
            start = time.perf_counter()
        train_step(i, x, y)
        done = i + 1
    seconds = time.perf_counter() - start
    line = json.dumps({
        "impl": impl, "model": model_name, "ga": ga, "rank": rank, "world": world, "seconds": seconds,
        "steps": done - WARMUP, "maxrss_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
    })
    os.write(1, (line + "\n").encode())  # one write: ranks sharing a pipe do not interleave
    if world > 1 and torch.distributed.is_initialized():
        torch.distributed.barrier()  # nobody tears gloo down while a peer still talks to it
        torch.distributed.destroy_process_group()
    # The measurement is out. Skip interpreter teardown: torch 2.13 can deadlock there when a DDP
    # Reducer holds the last reference to a gloo group (its destructor joins a worker thread that
    # waits for the GIL; seen with the hand-written DDP baseline and with HF Accelerate), and a hang
    # here would only cost the suite a timeout.
    os._exit(0)


if __name__ == "__main__":
    main()
