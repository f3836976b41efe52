"""One rank of benchmarks/memory.py: every strategy on the same model, in the same 2 processes.

For each round and strategy (the order rotates every round): build the model (seeded), prepare it
with AdamW, run one warm-up step, then time STEPS optimizer steps; after the last step (gradients
still held) count this rank's bytes of parameters, gradients and optimizer state (a DTensor
counts its local shard; ZeroRedundancyOptimizer its own partition). Rank 0 prints one JSON line.

With a fifth argument STRATEGY, only that strategy runs, once, and rank 0 prints every rank's
peak resident memory growth (``ru_maxrss`` after the steps minus the resident size before the
model was built): the real peak of the step, including what the counted parts leave out
(blocks FSDP gathers while they run, DDP's gradient buckets, activations, the whole model as
built before it is sharded).

Usage: python -m torch.distributed.run --standalone --nproc-per-node 2 \
    benchmarks/memory_worker.py WIDTH LAYERS STEPS ROUNDS [STRATEGY]
"""

from __future__ import annotations

import gc
import json
import resource
import sys
import time

import torch
from torch import nn

from runtime import Accelerator

STRATEGIES = ("ddp", "zero1", "fsdp-zero2", "fsdp-zero3")


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.up = nn.Linear(width, 2 * width)
        self.down = nn.Linear(2 * width, width)
        self.norm = nn.LayerNorm(width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.relu(self.up(self.norm(x))))


def _bytes(tensor: torch.Tensor | None) -> int:
    if tensor is None:
        return 0
    local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
    return local.numel() * local.element_size()


def held_bytes(model: nn.Module, optimizer) -> dict[str, int]:
    inner = optimizer.optimizer  # AcceleratedOptimizer -> the strategy's optimizer
    states = inner.optim.state if hasattr(inner, "optim") else inner.state
    return {
        "params": sum(_bytes(p) for p in model.parameters()),
        "grads": sum(_bytes(p.grad) for p in model.parameters()),
        "optimizer": sum(_bytes(v) for s in states.values() for v in s.values()
                         if isinstance(v, torch.Tensor) and v.ndim > 0),
    }


def run(strategy: str, width: int, layers: int, steps: int) -> tuple[float, dict[str, int]]:
    accelerator = Accelerator(strategy=strategy)
    torch.manual_seed(0)
    model = nn.Sequential(*[Block(width) for _ in range(layers)])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model, optimizer = accelerator.prepare(model, optimizer)
    x = torch.randn(4, width)

    def step() -> None:
        optimizer.zero_grad()
        accelerator.backward(model(x).square().mean())
        optimizer.step()

    step()  # warm-up: optimizer state allocated, FSDP's buffers sized
    accelerator.wait_for_everyone()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    accelerator.wait_for_everyone()
    seconds = (time.perf_counter() - start) / steps
    held = held_bytes(model, optimizer)
    del model, optimizer
    accelerator.free_memory()
    gc.collect()
    return seconds, held


def resident_bytes() -> int:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * resource.getpagesize()


def peak(strategy: str, width: int, layers: int, steps: int) -> None:
    Accelerator(strategy=strategy)  # the process group and the strategy's modules: not the step's
    before = resident_bytes()
    run(strategy, width, layers, steps)
    grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - before  # KiB on Linux
    gathered: list = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(gathered, grown)
    if torch.distributed.get_rank() == 0:
        print(json.dumps({"peak": gathered}))


def main() -> None:
    width, layers, steps, rounds = (int(a) for a in sys.argv[1:5])
    if len(sys.argv) > 5:
        peak(sys.argv[5], width, layers, steps)
        return
    times: dict[str, list[float]] = {s: [] for s in STRATEGIES}
    held: dict[str, dict[str, int]] = {}
    for index in range(rounds):
        order = STRATEGIES[index % len(STRATEGIES):] + STRATEGIES[: index % len(STRATEGIES)]
        for strategy in order:
            seconds, held[strategy] = run(strategy, width, layers, steps)
            times[strategy].append(seconds)
    # Every rank's bytes: the table reports the largest rank (the one that must fit).
    gathered: list = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(gathered, held)
    if torch.distributed.get_rank() == 0:
        params = layers * (4 * width * width + 5 * width)  # up, down, their biases, the norm
        print(json.dumps({"times": times, "held": gathered, "parameters": params}))


if __name__ == "__main__":
    main()
