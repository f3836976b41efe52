"""K-fold cross-validation: every fold builds its loaders, model, optimizer and scheduler inside
`for fold in range(K)`, trains, evaluates and saves its own checkpoint."""

import json
import os
import sys

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, Subset, TensorDataset

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
torch.manual_seed(0)
X = torch.randn(96, 8)
y = (X[:, :4].sum(1) > X[:, 4:].sum(1)).long()
dataset = TensorDataset(X, y)
K = 3
folds = [list(range(i, 96, K)) for i in range(K)]
out = sys.argv[1]
results = {"weights": [], "acc": []}

for fold in range(K):
    train_idx = [i for f in range(K) if f != fold for i in folds[f]]
    valid_idx = folds[fold]
    train_loader = DataLoader(Subset(dataset, train_idx), batch_size=8, shuffle=True)
    valid_loader = DataLoader(Subset(dataset, valid_idx), batch_size=8)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    criterion = nn.CrossEntropyLoss()
    for epoch in range(2):
        model.train()
        for xb, yb in train_loader:
            xb, yb = xb.to(device), yb.to(device)
            optimizer.zero_grad()
            loss = criterion(model(xb), yb)
            loss.backward()
            optimizer.step()
        scheduler.step()
        model.eval()
        correct = 0
        with torch.no_grad():
            for xb, yb in valid_loader:
                xb, yb = xb.to(device), yb.to(device)
                correct += (model(xb).argmax(1) == yb).sum().item()
        acc = correct / len(valid_idx)
        print(f"fold {fold} epoch {epoch} acc {acc:.4f}")
    torch.save(model.state_dict(), os.path.join(out, f"fold{fold}.pt"))
    results["acc"].append(acc)
    results["weights"].append([p.detach().flatten().tolist() for p in model.parameters()])

rank = int(os.environ.get("RANK", "0"))
with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
    json.dump(results, f)
