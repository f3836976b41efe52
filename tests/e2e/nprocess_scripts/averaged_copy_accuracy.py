"""An accuracy and a summed absolute error computed with a running average of the model's weights
(a copy made with `deepcopy` before training and updated after every step), which the migration
cannot tell is a model: its output is compared with (`==`) and subtracted from the batch's own
labels, so what is summed is one value per sample. 37 test samples, batches of 8: 2 processes
cannot split them evenly. Evaluated before training (the same weights everywhere) and after it."""

import json
import os
import sys
from copy import deepcopy

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset


class Averaged:
    def __init__(self, model, keep=0.9):
        self.copy = deepcopy(model)
        self.keep = keep

    @torch.no_grad()
    def update(self, model):
        for mine, theirs in zip(self.copy.parameters(), model.parameters()):
            mine.mul_(self.keep).add_(theirs.detach(), alpha=1 - self.keep)


def score(net, loader):
    hits = 0
    error = 0.0
    seen = 0
    with torch.no_grad():
        for inputs, labels in loader:
            hits += (net(inputs).argmax(1) == labels).sum().item()
            error += (net(inputs)[:, 1] - labels.float()).abs().sum().item()
            seen += labels.numel()
    return hits / seen, round(error, 4), seen


def main():
    torch.manual_seed(0)
    x_train, x_test = torch.randn(40, 3), torch.randn(37, 3)
    train_loader = DataLoader(TensorDataset(x_train, (x_train.sum(1) > 0).long()), batch_size=8, shuffle=True)
    test_loader = DataLoader(TensorDataset(x_test, (x_test.sum(1) > 0).long()), batch_size=8)
    model = torch.nn.Linear(3, 2)
    average = Averaged(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    results = {"before": score(average.copy, test_loader)}
    for epoch in range(2):
        for inputs, labels in train_loader:
            loss = F.cross_entropy(model(inputs), labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            average.update(model)
    results["after"] = score(average.copy, test_loader)
    results["rank"] = int(os.environ.get("RANK", "0"))
    with open(os.path.join(sys.argv[1], f"rank{results['rank']}.json"), "w") as f:
        json.dump(results, f)


if __name__ == "__main__":
    main()
