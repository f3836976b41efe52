"""A two-file unit: main.py builds everything from absent token files, engine.py trains."""
import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from engine import train_one_epoch


def main():
    torch.manual_seed(0)
    tokens = torch.from_numpy(np.load("data/train.npy")[:2048].astype(np.int64)).view(-1, 8)
    loader = DataLoader(TensorDataset(tokens[:, :-1], tokens[:, 1:]), batch_size=16, shuffle=True)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = nn.Sequential(nn.Embedding(256, 16), nn.Linear(16, 256)).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for epoch in range(3):
        loss = train_one_epoch(model, loader, optimizer, device)
        print(f"epoch {epoch} loss {loss:.4f}")
        torch.save(model.state_dict(), "checkpoint.pt")


if __name__ == "__main__":
    main()
