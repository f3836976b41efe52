"""A variational autoencoder's shape: the test loss is a sum over samples (reduction="sum" of a
reconstruction term plus a KL term over mu and logvar) accumulated per batch and divided by the
dataset size, over a test set (37 samples, batches of 8) that 2 processes cannot split evenly;
the first batch is also previewed by this process (`recon.view(BATCH, ...)`). The training loss
is summed the same way and divided by the dataset size after each epoch."""

import json
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

BATCH = 8


class TinyVAE(nn.Module):
    def __init__(self):
        super().__init__()
        self.enc = nn.Linear(6, 8)
        self.mu = nn.Linear(8, 2)
        self.logvar = nn.Linear(8, 2)
        self.dec = nn.Linear(2, 6)

    def forward(self, x):
        h = torch.relu(self.enc(x.view(-1, 6)))
        mu, logvar = self.mu(h), self.logvar(h)
        z = mu  # deterministic: the same value on every process
        return torch.sigmoid(self.dec(z)), mu, logvar


def vae_loss(recon, x, mu, logvar):
    bce = F.binary_cross_entropy(recon, x.view(-1, 6), reduction="sum")
    kld = -0.5 * torch.sum(1 + logvar - mu.pow(2) - logvar.exp())
    return bce + kld


def evaluate(model, loader):
    model.eval()
    test_loss = 0
    preview = None
    with torch.no_grad():
        for i, (x, _) in enumerate(loader):
            recon, mu, logvar = model(x)
            test_loss += vae_loss(recon, x, mu, logvar).item()
            if i == 0:
                n = min(x.size(0), 4)
                preview = list(torch.cat([x[:n], recon.view(BATCH, 6)[:n]]).shape)
    test_loss /= len(loader.dataset)
    return test_loss, preview


def main():
    torch.manual_seed(0)
    train_set = TensorDataset(torch.rand(37, 6), torch.zeros(37))
    test_set = TensorDataset(torch.rand(37, 6), torch.zeros(37))
    train_loader = DataLoader(train_set, batch_size=BATCH, shuffle=True)
    test_loader = DataLoader(test_set, batch_size=BATCH, shuffle=False)
    model = TinyVAE()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    results = {"before": evaluate(model, test_loader), "train": [], "after": []}
    for epoch in range(2):
        model.train()
        train_loss = 0
        for x, _ in train_loader:
            optimizer.zero_grad()
            recon, mu, logvar = model(x)
            loss = vae_loss(recon, x, mu, logvar)
            loss.backward()
            train_loss += loss.item()
            optimizer.step()
        print("epoch {} average loss {:.4f}".format(epoch, train_loss / len(train_loader.dataset)))
        results["train"].append(train_loss / len(train_loader.dataset))
        results["after"].append(evaluate(model, test_loader))
    results["rank"] = int(os.environ.get("RANK", "0"))
    with open(os.path.join(sys.argv[1], f"rank{results['rank']}.json"), "w") as f:
        json.dump(results, f)


if __name__ == "__main__":
    main()
