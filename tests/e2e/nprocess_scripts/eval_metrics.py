"""Evaluation shapes whose values only N processes can get wrong: a summed loss, accuracy counts,
a loss computed before the metric line, and predictions collected from a model call."""

import json
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset


def evaluate(model, loader, criterion):
    model.eval()
    test_loss, correct, weighted = 0.0, 0, 0.0
    preds = []
    with torch.no_grad():
        for x, y in loader:
            output = model(x)
            loss = criterion(output, y)
            test_loss += loss.item()
            weighted += F.cross_entropy(output, y).item() * y.size(0)
            pred = output.argmax(dim=1)
            correct += pred.eq(y).sum().item()
            preds.append(model(x).argmax(-1))
    n = len(loader.dataset)
    return test_loss / n, correct / n, weighted / n, torch.cat(preds).tolist()


def main():
    torch.manual_seed(0)
    train_set = TensorDataset(torch.randn(48, 5), torch.randint(0, 3, (48,)))
    test_set = TensorDataset(torch.randn(37, 5), torch.randint(0, 3, (37,)))
    train_loader = DataLoader(train_set, batch_size=8, shuffle=True)
    test_loader = DataLoader(test_set, batch_size=5)
    model = nn.Linear(5, 3)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    criterion = nn.CrossEntropyLoss(reduction="sum")
    results = {"before": evaluate(model, test_loader, criterion)}
    for x, y in train_loader:
        loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    results["rank"] = int(os.environ.get("RANK", "0"))
    with open(os.path.join(sys.argv[1], f"rank{results['rank']}.json"), "w") as f:
        json.dump(results, f)


if __name__ == "__main__":
    main()
