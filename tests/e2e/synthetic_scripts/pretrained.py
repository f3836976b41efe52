"""Pretrained weights: a torchvision builder, timm and from_pretrained (none reachable here)."""
import timm
import torch
import torchvision
from torch import nn
from transformers import TinyModel

torch.manual_seed(0)
backbone = torchvision.models.small_cnn(weights="DEFAULT")
head = timm.create_model("tiny", pretrained=True, num_classes=4)
language = TinyModel.from_pretrained("someone/tiny")
images, labels = torch.randn(96, 3, 32, 32), torch.randint(0, 4, (96,))
ids = torch.randint(0, 64, (96, 6))
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(images, labels, ids), batch_size=8, shuffle=True)
params = [*backbone.parameters(), *head.parameters(), *language.parameters()]
optimizer = torch.optim.SGD(params, lr=0.01)
for epoch in range(3):
    for x, y, t in loader:
        loss = nn.functional.cross_entropy(head(x), y) + backbone(x).mean() + language(t).logsumexp(-1).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    print(f"epoch {epoch} loss {loss.item():.4f}")
