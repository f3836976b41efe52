"""datasets.load_dataset of a hub dataset (not reachable here)."""
import torch
from datasets import load_dataset
from torch import nn

torch.manual_seed(0)
data = load_dataset("someone/reviews")
vocabulary = {f"w{i}": i for i in range(50)}


def collate(rows):
    ids = torch.tensor([[vocabulary[w] for w in row["text"].split()] for row in rows])
    return ids, torch.tensor([row["label"] for row in rows])


loader = torch.utils.data.DataLoader(data["train"], batch_size=16, shuffle=True, collate_fn=collate)
model = nn.EmbeddingBag(50, 2)
optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
for epoch in range(3):
    for ids, labels in loader:
        loss = nn.functional.cross_entropy(model(ids), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    print(f"epoch {epoch} loss {loss.item():.4f}")
