"""A two-layer graph network trained full-batch on a synthetic graph (dense normalised adjacency):
each step runs the model over every node and takes the loss over the training nodes, selected by
an index tensor bound once before the loop and handed to the step function. Records, per process,
the losses, how many rows each step's loss covered, the final weights and the evaluation accuracy
over the held-out nodes."""

import json
import os
import sys

import torch
import torch.nn.functional as F
from torch import nn


class GraphNet(nn.Module):
    def __init__(self, features, hidden, classes):
        super().__init__()
        self.inner = nn.Linear(features, hidden)
        self.outer = nn.Linear(hidden, classes)

    def forward(self, x, adjacency):
        h = torch.relu(adjacency @ self.inner(x))
        return F.log_softmax(adjacency @ self.outer(h), dim=1)


def train_step(model, optimizer, x, adjacency, labels, train_idx):
    model.train()
    optimizer.zero_grad()
    out = model(x, adjacency)
    picked = out[train_idx]
    loss = F.nll_loss(picked, labels[train_idx])
    loss.backward()
    optimizer.step()
    return loss.item(), picked.shape[0]


def accuracy(model, x, adjacency, labels, idx):
    model.eval()
    with torch.no_grad():
        pred = model(x, adjacency).argmax(dim=1)
    return (pred[idx] == labels[idx]).float().mean().item()


def main():
    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    nodes, features, classes = 90, 6, 3
    centers = torch.randn(classes, features) * 2
    labels = torch.randint(0, classes, (nodes,))
    x = centers[labels] + torch.randn(nodes, features)
    same = (labels[:, None] == labels[None, :]).float()
    adjacency = same * (torch.rand(nodes, nodes) < 0.2).float() + torch.eye(nodes)
    adjacency = adjacency / adjacency.sum(dim=1, keepdim=True)
    x, adjacency, labels = x.to(device), adjacency.to(device), labels.to(device)
    order = torch.randperm(nodes).to(device)
    train_idx, test_idx = order[:60], order[60:]
    model = GraphNet(features, 16, classes).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    losses, rows = [], []
    for epoch in range(30):
        loss, covered = train_step(model, optimizer, x, adjacency, labels, train_idx)
        losses.append(loss)
        rows.append(covered)
    rank = int(os.environ.get("RANK", "0"))
    results = {
        "rank": rank,
        "selected": int(train_idx.numel()),
        "rows": rows,
        "losses": losses,
        "weights": [float(w) for p in model.parameters() for w in p.detach().flatten().cpu()],
        "test_accuracy": accuracy(model, x, adjacency, labels, test_idx),
    }
    with open(os.path.join(sys.argv[1], f"rank{rank}.json"), "w") as f:
        json.dump(results, f)


if __name__ == "__main__":
    main()
