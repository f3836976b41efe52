"""Stands in for a module outside the migrated run (a project's utils.py, not given to the tool):
parameter groups built from a model, and an optimizer class the migration cannot read."""

import torch


def decay_groups(model, weight_decay):
    decay, no_decay = [], []
    for _, p in model.named_parameters():
        (no_decay if p.ndim < 2 else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


class Lars(torch.optim.SGD):
    """A momentum SGD under another name: an optimizer the migration only sees being stepped."""

    def __init__(self, params, lr):
        super().__init__(params, lr=lr, momentum=0.9)
