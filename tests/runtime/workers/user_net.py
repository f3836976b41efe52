"""The user's model class shared by tests/runtime/test_prepared_model_is_users.py and its worker.

A module of its own, so that a fresh process can import the class and load a checkpoint or a
pickled model into it. It has a parameter of the root itself (``scale``) besides submodules, and
a BatchNorm (buffers, and state-dict metadata with a version).
"""

from __future__ import annotations

import torch
from torch import nn


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Linear(4, 3)
        self.norm = nn.BatchNorm1d(3)
        self.head = nn.Linear(3, 1)
        self.scale = nn.Parameter(torch.ones(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(self.encoder(x))) * self.scale


USER_KEYS = [
    "encoder.bias", "encoder.weight", "head.bias", "head.weight", "norm.bias",
    "norm.num_batches_tracked", "norm.running_mean", "norm.running_var", "norm.weight", "scale",
]
