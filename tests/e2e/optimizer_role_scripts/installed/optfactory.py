"""Stands in for an installed package's optimizer factory (timm's `create_optimizer(args, model)`)."""

import torch


def create_optimizer(args, model):
    if args.opt == "adamw":
        return torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    return torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
