"""A torchrun trainer class handed the model by `main` (the DDP tutorial's shape), on CPU with gloo:
it resumes from `resume.pt` into the bare model, wraps it in DDP, and saves `.module`'s weights.

Arguments: the output directory (holding `resume.pt`, if any). Each rank writes `rank<i>.json`:
rank, world size, the epoch it resumed from, per-step losses, the ids of its samples, final weights.
"""

import json
import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


class Trainer:
    def __init__(self, model, train_data, optimizer, snapshot_path):
        self.gpu_id = int(os.environ["LOCAL_RANK"])
        self.model = model
        self.train_data = train_data
        self.optimizer = optimizer
        self.epochs_run = 0
        self.snapshot_path = snapshot_path
        self.losses, self.seen = [], []
        if os.path.exists(snapshot_path):
            self._load_snapshot(snapshot_path)
        self.model = DDP(self.model)

    def _load_snapshot(self, snapshot_path):
        snapshot = torch.load(snapshot_path)
        self.model.load_state_dict(snapshot["MODEL_STATE"])
        self.epochs_run = snapshot["EPOCHS_RUN"]

    def _run_batch(self, source, targets):
        self.optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(self.model(source), targets)
        loss.backward()
        self.optimizer.step()
        self.losses.append(loss.item())

    def _run_epoch(self, epoch):
        self.train_data.sampler.set_epoch(epoch)
        for source, targets, ids in self.train_data:
            self._run_batch(source, targets)
            self.seen.extend(ids.tolist())

    def train(self, max_epochs):
        for epoch in range(self.epochs_run, max_epochs):
            self._run_epoch(epoch)
        weights = [w for p in self.model.module.parameters() for w in p.detach().flatten().tolist()]
        return {"start": self.epochs_run, "losses": self.losses, "seen": self.seen, "weights": weights}


def load_train_objs():
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(64, 4, generator=generator)
    y = x @ torch.tensor([[0.1], [-0.2], [0.05], [0.3]]) + 0.01
    dataset = TensorDataset(x, y, torch.arange(64))
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    return dataset, model, optimizer


def main(out_dir):
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    dataset, model, optimizer = load_train_objs()
    train_data = DataLoader(dataset, batch_size=8, shuffle=False, sampler=DistributedSampler(dataset, shuffle=False))
    trainer = Trainer(model, train_data, optimizer, os.path.join(out_dir, "resume.pt"))
    record = trainer.train(4)
    rank = dist.get_rank()
    record.update(rank=rank, world_size=dist.get_world_size())
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as handle:
        json.dump(record, handle)
    dist.barrier()  # gloo aborts a rank whose peer closes its sockets first
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
