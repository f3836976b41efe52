"""An accuracy function that rebinds its model (`model = model.eval()`) and turns autograd off only
around the forward, called with the training loader and with a test loader (37 samples each,
batches of 8: 2 processes cannot split them evenly). Evaluated before training (the same weights
everywhere) and after it."""

import json
import os
import sys

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset


def accuracy(model, loader):
    model = model.eval()
    hits = 0.0
    seen = 0
    for inputs, labels in loader:
        with torch.no_grad():
            scores = model(inputs)
        guesses = torch.argmax(scores, dim=1)
        matches = labels == guesses
        hits += torch.sum(matches)
        seen += len(matches)
    return (hits / seen).item(), seen


def main():
    torch.manual_seed(0)
    x_train, x_test = torch.randn(37, 3), torch.randn(37, 3)
    train_set = TensorDataset(x_train, (x_train.sum(1) > 0).long())
    test_set = TensorDataset(x_test, (x_test.sum(1) > 0).long())
    train_loader = DataLoader(train_set, batch_size=8, shuffle=True)
    test_loader = DataLoader(test_set, batch_size=8)
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    results = {"before": [accuracy(model, train_loader), accuracy(model, test_loader)]}
    for epoch in range(2):
        model.train()
        for inputs, labels in train_loader:
            loss = F.cross_entropy(model(inputs), labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    results["after"] = [accuracy(model, train_loader), accuracy(model, test_loader)]
    results["rank"] = int(os.environ.get("RANK", "0"))
    with open(os.path.join(sys.argv[1], f"rank{results['rank']}.json"), "w") as f:
        json.dump(results, f)


if __name__ == "__main__":
    main()
