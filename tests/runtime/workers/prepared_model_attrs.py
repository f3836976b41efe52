"""Worker for tests/runtime/test_nprocess_safety.py: the prepared model answers for the user's.

Run under torchrun with 2 processes; writes OUT_DIR/rank{r}.json. Reads, writes and calls through
the prepared (DDP-wrapped) model; gradients of a step that mixes model(x) with model.encoder(x)
against hand-averaged local gradients; a step whose only forward bypasses DDP's forward; a
backbone run under no_grad whose parameters still require grad.
"""

from __future__ import annotations

import copy
import io
import json
import pickle
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from runtime import Accelerator
from runtime.errors import GradientSyncError

out_dir = Path(sys.argv[1])


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Linear(4, 3)
        self.head = nn.Linear(3, 1)
        self.output_shape = (1,)
        self.temperature = 1.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(x)) / self.temperature

    def embed(self, x: torch.Tensor) -> torch.Tensor:
        return self.encoder(x)

    def compute_loss(self, x: torch.Tensor) -> torch.Tensor:
        return self(x).pow(2).mean()


def local_grads(module: nn.Module) -> torch.Tensor:
    return torch.cat([torch.zeros(p.numel()) if p.grad is None else p.grad.flatten() for p in module.parameters()])


def gather_rows(t: torch.Tensor) -> list[list[float]]:
    parts = [torch.empty_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, t.contiguous())
    return [p.tolist() for p in parts]


accelerator = Accelerator()
rank = accelerator.process_index
torch.manual_seed(0)
model = accelerator.prepare(Net())
inner = accelerator.unwrap_model(model)
torch.manual_seed(10 + rank)  # different data on each rank
x = torch.randn(8, 4)
result: dict = {"rank": rank}

# -- reads ---------------------------------------------------------------------------------------
result["is_ddp"] = isinstance(model, DistributedDataParallel)
result["output_shape"] = list(model.output_shape)
result["encoder_is_inner"] = model.encoder is inner.encoder
result["embed_equal"] = torch.equal(model.embed(x), inner.encoder(x))
result["state_dict_keys"] = sorted(model.state_dict())
try:
    model.no_such_attribute
    result["missing_error"] = None
except AttributeError as error:
    result["missing_error"] = str(error)

# -- writes --------------------------------------------------------------------------------------
model.temperature = 2.0
result["write_reaches_inner"] = inner.temperature == 2.0 and "temperature" not in model.__dict__
with torch.no_grad():
    result["forward_sees_write"] = torch.allclose(model(x), inner.head(inner.encoder(x)) / 2.0)
model.temperature = 1.0
model.new_flag = True
result["new_name_on_wrapper"] = model.new_flag is True and not hasattr(inner, "new_flag")

# -- pickling, deepcopy, compile -----------------------------------------------------------------
buffer = io.BytesIO()
torch.save(model, buffer)
buffer.seek(0)
restored = torch.load(buffer, weights_only=False)
result["pickle_roundtrip"] = type(restored) is Net and restored.output_shape == (1,)
copied = copy.deepcopy(model)
result["deepcopy"] = type(copied) is Net and copied.encoder is not model.encoder
compiled = torch.compile(model, backend="eager")
with torch.no_grad():
    result["compile_equal"] = torch.allclose(compiled(x), model(x))
result["compile_attr"] = list(compiled.output_shape)

# -- gradients: model(x) and model.encoder(x) in one step ----------------------------------------
reference = copy.deepcopy(inner)
model.zero_grad()
loss = model(x).sum() + model.encoder(x).pow(2).sum()
accelerator.backward(loss)
(reference(x).sum() + reference.encoder(x).pow(2).sum()).backward()
expected = local_grads(reference)
dist.all_reduce(expected)
expected /= dist.get_world_size()
result["mixed_grads_match_average"] = torch.allclose(local_grads(inner), expected, atol=1e-6)
result["mixed_grads_by_rank"] = gather_rows(local_grads(inner))

# -- a step whose only forward bypasses DDP's forward --------------------------------------------
for label, call in {"method": "compute_loss", "submodule": "encoder"}.items():
    acc = Accelerator()
    torch.manual_seed(0)
    other = acc.prepare(Net())
    out = getattr(other, call)(x)
    try:
        acc.backward(out.pow(2).mean())
        result[f"bypass_{label}_error"] = None
    except GradientSyncError as error:
        result[f"bypass_{label}_error"] = str(error)
    result[f"bypass_{label}_grads_by_rank"] = gather_rows(local_grads(acc.unwrap_model(other)))

# -- a backbone run under no_grad while its parameters still require grad -----------------------
import warnings  # noqa: E402

class FrozenByNoGrad(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.backbone = nn.Linear(4, 3)
        self.head = nn.Linear(3, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            features = self.backbone(x)
        return self.head(features)


acc = Accelerator()
torch.manual_seed(0)
frozen = acc.prepare(FrozenByNoGrad())
try:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the runtime names the parameters it leaves out
        acc.backward(frozen(x * (rank + 1)).pow(2).mean())
    result["no_grad_backbone_error"] = None
except GradientSyncError as error:
    result["no_grad_backbone_error"] = str(error)
result["no_grad_backbone_head_grads_by_rank"] = gather_rows(
    torch.cat([p.grad.reshape(-1) for p in acc.unwrap_model(frozen).head.parameters()]))

# -- bf16: the autocast forward is set on the wrapper, reads still fall through ------------------
bf16 = Accelerator(mixed_precision="bf16")
torch.manual_seed(0)
half = bf16.prepare(Net())
result["bf16_output_shape"] = list(half.output_shape)
result["bf16_embed"] = list(half.embed(x).shape)

# -- replacing a submodule after prepare: forwarded, with a warning --------------------------------
import warnings  # noqa: E402

with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    new_head = nn.Linear(3, 1)
    model.head = new_head
result["replace_warning"] = [str(w.message) for w in caught if w.category is RuntimeWarning]
result["replace_reaches_inner"] = inner.head is new_head

(out_dir / f"rank{rank}.json").write_text(json.dumps(result))
accelerator.end_training()
