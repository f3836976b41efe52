import torch
from torch import nn


class TinyLM(nn.Module):
    def __init__(self, vocab, width):
        super().__init__()
        self.emb = nn.Embedding(vocab, width)
        self.head = nn.Linear(width, vocab)

    def forward(self, idx, targets=None):
        logits = self.head(self.emb(idx))
        loss = None
        if targets is not None:
            loss = nn.functional.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
        return logits, loss

    def configure_optimizers(self, config):
        decay = [p for p in self.parameters() if p.ndim >= 2]
        other = [p for p in self.parameters() if p.ndim < 2]
        groups = [{"params": decay, "weight_decay": config.weight_decay}, {"params": other, "weight_decay": 0.0}]
        return torch.optim.AdamW(groups, lr=config.learning_rate)
