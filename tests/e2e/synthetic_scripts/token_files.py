"""Token files that are absent here: np.load, np.memmap and torch.load."""
import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
train = np.memmap("data/train.bin", dtype=np.uint16, mode="r")
val = np.load("data/val.npy")
extra = torch.load("data/extra.pt")
tokens = torch.from_numpy(np.concatenate([train[:2048], val[:1024]]).astype(np.int64)).view(-1, 8)
assert extra.shape == (65536,)
loader = DataLoader(TensorDataset(tokens[:, :-1], tokens[:, 1:]), batch_size=16, shuffle=True)
device = "cuda" if torch.cuda.is_available() else "cpu"
model = nn.Sequential(nn.Embedding(256, 16), nn.Linear(16, 256)).to(device)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
for epoch in range(3):
    for inputs, targets in loader:
        inputs, targets = inputs.to(device), targets.to(device)
        loss = nn.functional.cross_entropy(model(inputs).flatten(0, 1), targets.flatten())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    print(f"epoch {epoch} loss {loss.item():.4f}")
    torch.save(model.state_dict(), "model.pt")
