"""Worker for tests/runtime/test_frozen_buffers.py: a frozen encoder with BatchNorm (nothing to
train, so not wrapped in DDP) run in train mode before a trainable head, at N processes.

``frozen_buffers.py OUT_DIR`` under torchrun writes OUT_DIR/rank{r}.json: the encoder's running
statistics after training, an evaluation metric computed by every rank over the whole (unprepared)
validation set, whether the encoder came back as the user's own object, and whether it pickles.
"""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from runtime import Accelerator

out_dir = Path(sys.argv[1])
accelerator = Accelerator()
torch.manual_seed(0)

encoder = nn.Sequential(nn.Linear(6, 8), nn.BatchNorm1d(8), nn.ReLU())
for p in encoder.parameters():
    p.requires_grad_(False)
with torch.no_grad():  # frozen weights that differ per process (an unseeded init): rank 0's win
    encoder[0].weight.add_(accelerator.process_index)
head = nn.Linear(8, 1)
user_encoder = encoder
optimizer = torch.optim.SGD(head.parameters(), lr=0.1)
# rank-dependent shards of very different scale: unsynchronised statistics would differ a lot
data = torch.cat([torch.randn(32, 6), torch.randn(32, 6) * 5 + 3])
loader = DataLoader(TensorDataset(data, torch.randn(64, 1)), batch_size=8)
val = TensorDataset(torch.randn(20, 6), torch.randn(20, 1))
encoder, head, optimizer, loader = accelerator.prepare(encoder, head, optimizer, loader)

encoder.train()
for x, y in loader:
    loss = nn.functional.mse_loss(head(encoder(x)), y)
    optimizer.zero_grad()
    accelerator.backward(loss)
    optimizer.step()

bn = user_encoder[1]
after_training = bn.running_mean.tolist()

# evaluation on every rank over the whole set; rank 1 alone runs one more train-mode forward under
# no_grad, which must not wait for the others
encoder.eval()
with torch.no_grad():
    metric = nn.functional.mse_loss(head(encoder(val.tensors[0])), val.tensors[1]).item()
    if accelerator.process_index == 1:
        encoder.train()
        encoder(val.tensors[0])
        encoder.eval()

buffer = io.BytesIO()
torch.save(encoder, buffer)
buffer.seek(0)
reloaded = torch.load(buffer, weights_only=False)
result = {
    "same_object": encoder is user_encoder,
    "running_mean": after_training,
    "metric": metric,
    "batches_tracked": int(bn.num_batches_tracked),
    "pickled": type(reloaded).__name__,
    "hooks": len(user_encoder._forward_hooks) + len(user_encoder._forward_pre_hooks),
}
(out_dir / f"rank{accelerator.process_index}.json").write_text(json.dumps(result))
