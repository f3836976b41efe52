"""Worker for tests/runtime/test_prepared_model_is_users.py: the prepared model seen from outside.

Run under torchrun with 2 processes: ``user_module_view.py OUT_DIR CKPT_DIR``. CKPT_DIR holds
``plain.pt`` (a single-device script's ``model.state_dict()``) and ``ddp.pt`` (a hand-written
DDP script's, ``module.`` keys), written by the test. Writes OUT_DIR/rank{r}.json, and on the main
process ``migrated_state.pt`` / ``migrated_model.pt`` (what a migrated script saves) for the
test to load in a fresh process without the runtime.
"""

from __future__ import annotations

import copy
import io
import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.tensorboard import SummaryWriter

from runtime import Accelerator
from user_net import Net

out_dir, ckpt_dir = Path(sys.argv[1]), Path(sys.argv[2])


def flat(module: nn.Module) -> torch.Tensor:
    return torch.cat([t.detach().flatten().float() for t in module.state_dict().values()])


accelerator = Accelerator()
rank = accelerator.process_index
torch.manual_seed(0)
net = Net()
model = accelerator.prepare(net)
result: dict = {"rank": rank, "is_ddp": isinstance(model, DistributedDataParallel)}

# -- names and objects ---------------------------------------------------------------------------
result["state_dict_keys"] = sorted(model.state_dict())
result["parameter_names"] = [name for name, _ in model.named_parameters()]
result["same_parameters"] = [id(p) for p in model.parameters()] == [id(p) for p in net.parameters()]
result["module_names"] = [name for name, _ in model.named_modules()]
result["children"] = [type(child).__name__ for child in model.children()]
result["module_is_users"] = model.module is net
state = model.state_dict()
result["module_key_lookup"] = state["module.encoder.weight"] is state["encoder.weight"]
result["module_key_listed"] = "module.encoder.weight" in state
buffer = io.BytesIO()
torch.save(state, buffer)
buffer.seek(0)
result["state_dict_pickles_plain"] = type(torch.load(buffer, weights_only=True)).__name__ == "OrderedDict"
model.eval()
result["eval_reaches_user"] = not net.training and not net.norm.training
model.train()
result["train_reaches_user"] = net.training and net.norm.training

# -- the original script's checkpoints load with strict=True -------------------------------------
for name in ("plain", "ddp"):
    saved = torch.load(ckpt_dir / f"{name}.pt")
    outcome = model.load_state_dict(saved, strict=True)
    values = saved.values()
    result[f"load_{name}"] = (
        not outcome.missing_keys and not outcome.unexpected_keys
        and torch.equal(flat(net), torch.cat([t.flatten().float() for t in values]))
    )

# -- tracing -------------------------------------------------------------------------------------
x = torch.randn(6, 4)
model.eval()
with torch.no_grad():
    traced = torch.jit.trace(model, x)
    result["trace_equal"] = torch.equal(traced(x), model(x))
writer = SummaryWriter(str(out_dir / f"tb{rank}"))
writer.add_graph(model, x)
writer.close()
result["add_graph"] = True
model.train()

# -- pickling and deepcopy give the user's module ------------------------------------------------
copied = copy.deepcopy(model)
result["deepcopy_type"] = type(copied).__name__
result["deepcopy_separate"] = copied.encoder.weight is not net.encoder.weight
buffer = io.BytesIO()
torch.save({"model": model, "inner": net}, buffer)
buffer.seek(0)
loaded = torch.load(buffer, weights_only=False)
result["pickle_type"] = type(loaded["model"]).__name__
result["pickle_shares_inner"] = loaded["model"] is loaded["inner"]

# -- training stays bit-identical to plain DDP ---------------------------------------------------
torch.manual_seed(0)
reference = DistributedDataParallel(Net())
reference_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
torch.manual_seed(0)
prepared = accelerator.prepare(Net())
opt = accelerator.prepare(torch.optim.SGD(prepared.parameters(), lr=0.1))
torch.manual_seed(100 + rank)
for step in range(4):
    batch = torch.randn(8, 4)
    for m, o in ((reference, reference_opt), (prepared, opt)):
        o.zero_grad()
        loss = m(batch).pow(2).mean()
        if m is prepared:
            accelerator.backward(loss)
        else:
            loss.backward()
        o.step()
result["bit_identical_to_ddp"] = torch.equal(flat(reference.module), flat(prepared.module))
with accelerator.no_sync(prepared):
    prepared.zero_grad()
    accelerator.backward(prepared(torch.randn(8, 4) * (rank + 1)).pow(2).mean())
local = prepared.module.encoder.weight.grad.flatten()
parts = [torch.empty_like(local) for _ in range(2)]
dist.all_gather(parts, local)
result["no_sync_left_local"] = not torch.equal(parts[0], parts[1])

# -- what a migrated script saves ----------------------------------------------------------------
if accelerator.is_main_process:
    torch.save(model.state_dict(), out_dir / "migrated_state.pt")
    torch.save(model, out_dir / "migrated_model.pt")
result["saved_flat"] = flat(net).tolist()

# -- zero1 and fsdp keep the user's keys ---------------------------------------------------------
zero = Accelerator(strategy="zero1")
zero_model = zero.prepare(Net())
result["zero1_keys"] = sorted(zero_model.state_dict())
fsdp = Accelerator(strategy="fsdp")
fsdp_model = fsdp.prepare(Net())
full = fsdp.get_state_dict(fsdp_model)  # every rank gathers; the main process gets the dict
result["fsdp_full_keys"] = sorted(full) if rank == 0 else None

(out_dir / f"rank{rank}.json").write_text(json.dumps(result))
accelerator.end_training()
