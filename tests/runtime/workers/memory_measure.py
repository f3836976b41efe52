"""Worker for tests/runtime/test_memory_estimate.py: 2 gloo processes on CPU.

Builds a small model with a repeated block, trains one step with torch's own ZeroRedundancyOptimizer
(over DDP) and with FSDP2 ``fully_shard`` (each block, then the root), and writes what each rank
really holds (bytes of storage) to OUT_DIR/rank{r}.json, for comparison with the estimate.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel

sys.path.insert(0, str(Path(__file__).parent))
from memory_model import build  # noqa: E402

out_dir = Path(sys.argv[1])
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)


def state_bytes(optimizer: torch.optim.Optimizer) -> int:
    """Bytes of the optimizer's per-element state (step counters excluded, as in the estimate)."""
    total = 0
    for state in optimizer.state.values():
        for key, value in state.items():
            if key != "step" and isinstance(value, torch.Tensor):
                local = value.to_local() if hasattr(value, "to_local") else value
                total += local.untyped_storage().nbytes()
    return total


def step(model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    x = torch.randint(0, 50, (4, 3))
    model(x).sum().backward()
    optimizer.step()


ddp = DistributedDataParallel(build())
zero = ZeroRedundancyOptimizer(ddp.parameters(), optimizer_class=torch.optim.Adam, lr=1e-3)
step(ddp, zero)
result = {"zero1_optimizer": state_bytes(zero.optim)}  # this rank's partition

model = build()
for block in model.blocks:
    fully_shard(block)
fully_shard(model)
adam = torch.optim.Adam(model.parameters(), lr=1e-3)
step(model, adam)
# The padded shard each rank allocates (FSDP2 keeps the local tensor as a view of it).
result["fsdp_params"] = sum(p.to_local().untyped_storage().nbytes() for p in model.parameters())
result["fsdp_grads"] = sum(p.grad.to_local().numel() * p.grad.element_size() for p in model.parameters())
result["fsdp_optimizer"] = state_bytes(adam)
(out_dir / f"rank{rank}.json").write_text(json.dumps(result))
dist.destroy_process_group()
