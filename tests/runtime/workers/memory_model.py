"""A small model with a repeated block and dim-0 sizes that do not divide by 2 or 3 (for the
memory estimate's sharding arithmetic): used by the estimate tests and measured by
memory_measure.py."""

from __future__ import annotations

from torch import nn


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(16, 33)
        self.down = nn.Linear(33, 16)

    def forward(self, x):
        return x + self.down(self.up(x).relu())


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(51, 16)
        self.blocks = nn.ModuleList(Block() for _ in range(3))
        self.head = nn.Linear(16, 5)

    def forward(self, x):
        h = self.embed(x)
        for block in self.blocks:
            h = block(h)
        return self.head(h)


def build() -> Net:
    return Net()
