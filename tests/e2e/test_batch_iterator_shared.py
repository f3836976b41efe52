"""End to end: a training loop over a bucket iterator of the script's own (a class that sorts rows
by length into batches, shuffles the buckets with a torchtext-style shuffler that keeps python
`random`'s state taken when it is built, and places them with `device=`), not a DataLoader.
The migration prepares it (issue 31: what the training loop iterates is the loader) and keeps the
loop's batch moves; the evaluation iterator of the same kind stays whole.

Migrated with the CLI and run:
- 1 process, python `random` seeded: prints and records exactly what the original does (the same
  batches in the same order, the same weights);
- 2 gloo processes, python `random` left unseeded (each process's shuffler starts elsewhere: the
  runtime gives the prepared iterator rank 0's state): 11 batches per epoch, rank i takes batches
  i, i+2, ... and the last round is completed from the epoch's first batch, so both take 6 steps;
  the real batches are disjoint and cover every row; the weights equal a replay of SGD on the
  average of the two ranks' gradients at each step; both ranks evaluate every test row.

Before: AM004 "training loop iterates `train_batches`, an instance of `BucketBatches`, a class of
this file, which is not a torch DataLoader", left unprepared: every process trained on every batch.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))  # the shared torchrun helpers
from original_and_migrated import migrate_into  # noqa: E402
from rt_helpers import run_cmd, torchrun  # noqa: E402

TIMEOUT = 180
ROWS, BATCH, EPOCHS, LR = 42, 4, 2, 0.5  # 11 batches per epoch: odd on 2 processes

SCRIPT = '''
    """Trains a classifier on batches of similar lengths, made by a bucket iterator of its own."""
    import json
    import os
    import random
    import sys

    import torch


    def make_rows(n, seed):
        g = torch.Generator().manual_seed(seed)
        x = torch.randn(n, 4, generator=g)
        y = (x[:, 0] + 0.5 * x[:, 1] > 0).long()
        lengths = torch.randint(1, 9, (n,), generator=g)
        return [(i, x[i], y[i], int(lengths[i])) for i in range(n)]


    class Shuffler:
        """Shuffles with python random's state taken when it is built (torchtext's RandomShuffler)."""

        def __init__(self):
            self._random_state = random.getstate()

        def __call__(self, items):
            outside = random.getstate()
            random.setstate(self._random_state)
            items = random.sample(items, len(items))
            self._random_state = random.getstate()
            random.setstate(outside)
            return items


    class BucketBatches:
        def __init__(self, rows, batch_size, device, train=False):
            self.rows, self.batch_size, self.device, self.train = rows, batch_size, device, train
            self.shuffler = Shuffler()
            self.epoch = 0

        def __len__(self):
            return -(-len(self.rows) // self.batch_size)

        def init_epoch(self):
            self.epoch += 1

        def __iter__(self):
            order = sorted(range(len(self.rows)), key=lambda i: (self.rows[i][3], i))
            buckets = [order[i:i + self.batch_size] for i in range(0, len(order), self.batch_size)]
            if self.train:
                buckets = self.shuffler(buckets)
            for bucket in buckets:
                ids = torch.tensor([self.rows[i][0] for i in bucket])
                x = torch.stack([self.rows[i][1] for i in bucket]).to(self.device)
                y = torch.stack([self.rows[i][2] for i in bucket])
                yield ids, x, y


    def main():
        if len(sys.argv) > 1:
            random.seed(int(sys.argv[1]))
        torch.manual_seed(0)
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        train_batches = BucketBatches(make_rows(42, 1), 4, device=device, train=True)
        test_batches = BucketBatches(make_rows(20, 2), 8, device=device)
        model = torch.nn.Linear(4, 2).to(device)
        initial = [p.detach().cpu().tolist() for p in model.parameters()]
        optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
        steps = []
        for epoch in range(2):
            train_batches.init_epoch()
            for ids, x, y in train_batches:
                y = y.to(device)
                loss = torch.nn.functional.cross_entropy(model(x), y)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                steps.append(ids.tolist())
            print(f"epoch {epoch} steps {len(train_batches)} loss {loss.item():.6f}")
        correct = total = 0
        with torch.no_grad():
            for ids, x, y in test_batches:
                correct += (model(x).argmax(1).cpu() == y).sum().item()
                total += len(ids)
        record = {"steps": steps, "initial": initial, "epoch": train_batches.epoch, "total": total,
                  "final": [p.detach().cpu().tolist() for p in model.parameters()]}
        with open(f"record-{os.environ.get('RANK', '0')}.json", "w") as f:
            json.dump(record, f)


    if __name__ == "__main__":
        main()
'''


def make_rows(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The script's training rows (the same generator calls)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 4, generator=g)
    return x, (x[:, 0] + 0.5 * x[:, 1] > 0).long()


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return migrate_into(tmp_path_factory.mktemp("bucket_iterator"), "train.py", SCRIPT, TIMEOUT)


def _run(folder: Path, which: str, nproc: int, *args: str) -> tuple[str, list[dict]]:
    run_dir = folder / f"{which}-{nproc}"
    run_dir.mkdir()
    script = folder / which / "train.py"
    if nproc == 1:
        proc = run_cmd([sys.executable, str(script), *args], cwd=run_dir, timeout=TIMEOUT)
    else:
        proc = torchrun(script, *args, cwd=run_dir, nproc=nproc, timeout=TIMEOUT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout, [json.loads((run_dir / f"record-{r}.json").read_text()) for r in range(nproc)]


def test_the_iterator_is_prepared_and_its_moves_kept(folder: Path) -> None:
    migrated = (folder / "migrated" / "train.py").read_text()
    assert "model, optimizer, train_batches = accelerator.prepare(" in migrated
    assert "test_batches" not in migrated.split("accelerator.prepare(", 1)[1].split(")", 1)[0]
    assert "device = accelerator.device" in migrated
    assert "BucketBatches(make_rows(42, 1), 4, device=device, train=True)" in migrated
    assert "y = y.to(device)" in migrated and ".to(self.device)" in migrated


def test_one_process_trains_like_the_original(folder: Path) -> None:
    original, (expected,) = _run(folder, "original", 1, "0")
    migrated, (got,) = _run(folder, "migrated", 1, "0")
    assert original.count("epoch ") == EPOCHS and "steps 11 " in original
    assert migrated == original
    assert got == expected
    assert len(got["steps"]) == EPOCHS * 11


def test_two_processes_share_the_batches_and_average_gradients(folder: Path) -> None:
    stdout, (rank0, rank1) = _run(folder, "migrated", 2)
    assert stdout.count("epoch ") == EPOCHS and "steps 6 " in stdout  # printed once; len() per process
    assert len(rank0["steps"]) == len(rank1["steps"]) == EPOCHS * 6, "equal step counts"
    for epoch in range(EPOCHS):
        first = rank0["steps"][epoch * 6:(epoch + 1) * 6]
        second = rank1["steps"][epoch * 6:(epoch + 1) * 6]
        real = first + second[:5]  # rank 1's 6th batch completes the last round
        assert sorted(i for b in real for i in b) == list(range(ROWS)), "disjoint and complete"
        assert second[5] == first[0], "completed from the epoch's first batch"
    assert rank0["epoch"] == rank1["epoch"] == EPOCHS
    assert rank0["total"] == rank1["total"] == 20, "the evaluation iterator stays whole"
    assert rank0["final"] == rank1["final"]
    # replay: one SGD step per round on the mean of the two ranks' gradients
    x, y = make_rows(ROWS, 1)
    model = torch.nn.Linear(4, 2)
    with torch.no_grad():
        for p, value in zip(model.parameters(), rank0["initial"]):
            p.copy_(torch.tensor(value))
    for ids0, ids1 in zip(rank0["steps"], rank1["steps"]):
        grads = []
        for ids in (ids0, ids1):
            model.zero_grad()
            torch.nn.functional.cross_entropy(model(x[ids]), y[ids]).backward()
            grads.append([p.grad.clone() for p in model.parameters()])
        with torch.no_grad():
            for p, g0, g1 in zip(model.parameters(), *grads):
                p -= LR * (g0 + g1) / 2
    for p, value in zip(model.parameters(), rank0["final"]):
        assert torch.allclose(p.detach(), torch.tensor(value), rtol=1e-5, atol=1e-6)
