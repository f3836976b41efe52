"""A graph network trained full-batch at the module level, PyG style: a data object holds the
node features, a sparse normalised adjacency and boolean train/test masks, and the loss is
`F.cross_entropy(out[data.train_mask], data.y[data.train_mask])`. Records, per process, the losses,
the rows each step's loss covered, the final weights and the accuracy over both masks."""

import json
import os
import sys
from types import SimpleNamespace

import torch
import torch.nn.functional as F
from torch import nn


class Propagate(nn.Module):
    def __init__(self, features, hidden, classes):
        super().__init__()
        self.inner = nn.Linear(features, hidden)
        self.outer = nn.Linear(hidden, classes)

    def forward(self, x, adjacency):
        h = torch.tanh(torch.sparse.mm(adjacency, self.inner(x)))
        return torch.sparse.mm(adjacency, self.outer(h))


torch.manual_seed(1)
nodes, features, classes = 75, 5, 4
y = torch.randint(0, classes, (nodes,))
x = torch.randn(classes, features)[y] * 2 + torch.randn(nodes, features)
dense = (y[:, None] == y[None, :]).float() * (torch.rand(nodes, nodes) < 0.15).float() + torch.eye(nodes)
dense = dense / dense.sum(dim=1, keepdim=True)
train_mask = torch.rand(nodes) < 0.6
data = SimpleNamespace(x=x, adjacency=dense.to_sparse(), y=y, train_mask=train_mask, test_mask=~train_mask)
model = Propagate(features, 12, classes)
optimizer = torch.optim.Adam(model.parameters(), lr=0.05)
losses, rows = [], []
for epoch in range(25):
    model.train()
    optimizer.zero_grad()
    out = model(data.x, data.adjacency)
    chosen = out[data.train_mask]
    loss = F.cross_entropy(chosen, data.y[data.train_mask])
    loss.backward()
    optimizer.step()
    losses.append(loss.item())
    rows.append(chosen.shape[0])
model.eval()
with torch.no_grad():
    pred = model(data.x, data.adjacency).argmax(dim=1)
accs = [(pred[m] == data.y[m]).float().mean().item() for m in (data.train_mask, data.test_mask)]
rank = int(os.environ.get("RANK", "0"))
results = {
    "rank": rank,
    "selected": int(data.train_mask.sum()),
    "rows": rows,
    "losses": losses,
    "weights": [float(w) for p in model.parameters() for w in p.detach().flatten()],
    "accuracies": accs,
}
with open(os.path.join(sys.argv[1], f"rank{rank}.json"), "w") as f:
    json.dump(results, f)
