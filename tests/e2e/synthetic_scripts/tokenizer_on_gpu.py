"""A GPT-style script: a tiktoken encoding (downloaded on first use) and tensors created on CUDA."""
import tiktoken
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
device = torch.device("cuda")
enc = tiktoken.get_encoding("gpt2")
text = "the quick brown fox jumps over the lazy dog. " * 40
tokens = torch.tensor(enc.encode(text), dtype=torch.long, device=device)
assert enc.n_vocab == 50257 and tiktoken.encoding_for_model("gpt2") is enc
windows = tokens[: (len(tokens) - 1) // 9 * 9 + 1]
inputs, targets = windows[:-1].view(-1, 9)[:, :8], windows[1:].view(-1, 9)[:, :8]
loader = DataLoader(TensorDataset(inputs.cpu(), targets.cpu()), batch_size=8, shuffle=True)
model = nn.Sequential(nn.Embedding(256, 16), nn.Linear(16, 256)).to(device)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
steps = torch.zeros((), dtype=torch.long, device="cuda")
for epoch in range(3):
    for x, y in loader:
        x, y = x.to(device), y.to(device)
        loss = nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        steps += 1
    print(f"epoch {epoch} loss {loss.item():.4f} steps {int(steps)}")
