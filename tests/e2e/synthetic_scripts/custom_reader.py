"""Reads its data through its own reader: --synthetic cannot replace it."""
import torch
from torch import nn

with open("data/train.bin", "rb") as f:
    tokens = torch.frombuffer(bytearray(f.read()), dtype=torch.uint8).long()
model = nn.Embedding(256, 4)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(10):
    loss = model(tokens[step * 8:(step + 1) * 8]).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
