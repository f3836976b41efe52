"""Torch's generator across processes around `Accelerator()` and the first `prepare` (runtime/rng.py).

argv: OUT MODE; MODE "unseeded" (never seeded) or "seeded" (`torch.manual_seed(7)` first). Each
rank writes what it drew before the Accelerator, between it and `prepare`, and after `prepare`.
"""

import json
import sys
from pathlib import Path

import torch
from torch import nn

from runtime import Accelerator

out, mode = Path(sys.argv[1]), sys.argv[2]
if mode == "seeded":
    torch.manual_seed(7)
before = torch.randn(3).tolist()
accelerator = Accelerator(cpu=True)
task = torch.randn(4).tolist()
model = nn.Linear(2, 1)
initial = [p.detach().clone().tolist() for p in model.parameters()]
model = accelerator.prepare(model)
after = torch.randn(3).tolist()
(out / f"rank{accelerator.process_index}.json").write_text(json.dumps(
    {"before": before, "task": task, "initial": initial, "after": after}))
