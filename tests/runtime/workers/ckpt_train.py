"""Worker for tests/runtime/test_checkpoint.py: train, save, resume in new processes.

Usage: ckpt_train.py OUT_DIR MODE, MODE one of
- ``first``: for each case, train 10 steps straight (reference), then re-seed, train 5 steps,
  ``save_state`` and record RNG draws made right after saving;
- ``resume``: for each case (new processes), prepare the same objects, ``load_state``, record the
  RNG draws again (then put the RNG back), train the remaining 5 steps.

Runs on 1 process (plain python) or under torchrun. Writes OUT_DIR/<mode>_rank<r>.pt.
The model has dropout, the dataset adds python/numpy/torch noise in __getitem__, the loader
shuffles with the global RNG, the optimizer is Adam and a scheduler decays the LR: every RNG and
every piece of state matters for the final weights.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from runtime import Accelerator

TOTAL_STEPS, SAVE_AT = 10, 5
# case -> per-rank batches per epoch; 5: the save falls on an epoch end, 3: mid-epoch (2 of 3).
CASES = {"epoch_end": 5, "mid_epoch": 3}
BATCH = 4


class NoisyDataset(Dataset):
    """Sample i: features from a fixed table plus noise from python, numpy and torch RNGs."""

    def __init__(self, size: int) -> None:
        gen = torch.Generator().manual_seed(11)
        self.x = torch.randn(size, 6, generator=gen)
        self.y = torch.randn(size, 1, generator=gen)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        noise = random.random() + float(np.random.rand()) + float(torch.rand(()))
        return self.x[i] + 0.01 * noise, self.y[i], i


class Counter:
    """A registered object: the global step."""

    def __init__(self) -> None:
        self.step = 0

    def state_dict(self) -> dict:
        return {"step": self.step}

    def load_state_dict(self, state: dict) -> None:
        self.step = state["step"]


def seed_all(rank: int) -> None:
    # Different streams per rank: each rank's RNG file must restore its own.
    random.seed(100 + rank)
    np.random.seed(200 + rank)
    torch.manual_seed(300 + rank)


def build(accelerator: Accelerator, batches_per_rank: int):
    size = BATCH * batches_per_rank * accelerator.num_processes
    model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Dropout(0.3), nn.Linear(16, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.8)
    loader = DataLoader(NoisyDataset(size), batch_size=BATCH, shuffle=True)
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
    counter = Counter()
    accelerator.register_for_checkpointing(counter)
    return model, optimizer, loader, scheduler, counter


def train(accelerator, model, optimizer, loader, scheduler, counter, until: int) -> list[list[int]]:
    """Train until counter.step == until; return the sample indices of every step."""
    seen: list[list[int]] = []
    model.train()
    while counter.step < until:
        for x, y, idx in loader:
            loss = nn.functional.mse_loss(model(x), y)
            optimizer.zero_grad()
            accelerator.backward(loss)
            optimizer.step()
            scheduler.step()
            counter.step += 1
            seen.append(idx.tolist())
            if counter.step == until:
                return seen  # leaves the epoch unfinished: the loader must remember where it was
    return seen


def draws() -> list[float]:
    return [random.random(), float(np.random.rand()), float(torch.rand(()))]


def weights(accelerator: Accelerator, model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in accelerator.unwrap_model(model).state_dict().items()}


def main() -> None:
    out, mode = Path(sys.argv[1]), sys.argv[2]
    rank = Accelerator().process_index
    result: dict = {}
    for case, batches in CASES.items():
        ckpt = out / f"ckpt_{case}"
        if mode == "first":
            seed_all(rank)
            acc = Accelerator()
            objs = build(acc, batches)
            seen = train(acc, *objs, until=TOTAL_STEPS)
            straight = weights(acc, objs[0])

            seed_all(rank)
            acc = Accelerator()  # fresh objects, same seeds
            objs = build(acc, batches)
            train(acc, *objs, until=SAVE_AT)
            acc.save_state(ckpt)
            loader_state = objs[2].state_dict()
            result[case] = {
                "straight": straight,
                "straight_seen": seen,
                "draws_after_save": draws(),
                "position": loader_state["position"],
                "epoch": loader_state["epoch"],
                "in_progress": loader_state["in_progress"],
            }
        else:
            seed_all(rank + 50)  # a different RNG: only load_state can bring the right one back
            acc = Accelerator()
            objs = build(acc, batches)
            acc.load_state(ckpt)
            states = (random.getstate(), np.random.get_state(), torch.get_rng_state())
            after_load = draws()
            random.setstate(states[0])
            np.random.set_state(states[1])
            torch.set_rng_state(states[2])
            step_after_load = objs[4].step
            seen = train(acc, *objs, until=TOTAL_STEPS)
            result[case] = {
                "resumed": weights(acc, objs[0]),
                "resumed_seen": seen,
                "draws_after_load": after_load,
                "step_after_load": step_after_load,
            }
    if mode == "first" and Accelerator().num_processes > 1:
        # Rank 1 fails while overwriting a good checkpoint: every rank must raise (no hang), and
        # the resume run then proves the previous checkpoint survived.
        from runtime import checkpoint

        real_write = checkpoint.write_file

        def broken_write(obj, path) -> None:
            raise OSError("disk full (simulated on rank 1)")

        if rank == 1:
            checkpoint.write_file = broken_write
        acc = Accelerator()
        objs = build(acc, CASES["mid_epoch"])
        try:
            acc.save_state(out / "ckpt_mid_epoch")
            result["failed_save"] = "no error"
        except Exception as error:  # noqa: BLE001 - recorded for the test
            result["failed_save"] = f"{type(error).__name__}: {str(error).splitlines()[0]}"
        checkpoint.write_file = real_write
    torch.save(result, out / f"{mode}_rank{rank}.pt")


if __name__ == "__main__":
    main()
