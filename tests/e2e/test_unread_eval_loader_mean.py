"""End to end: the validation loader comes from another module the migration is not given
(`train_dl, valid_dl = get_loaders(...)` of `shard_data`, written beside the script only after it
is migrated), and the mean validation loss over it picks the best model. Such a loader may give
each process a share of the validation set (a DistributedSampler inside the factory; torch shards
a DataLoader over a datapipe by itself once a process group exists) or all of it; AM011 reduces
the mean with "mean" right after it is computed, which is right either way.

The evaluation runs with autograd on, over a model with a buffer: the prepared model's
forward there would broadcast them, a collective; AM010 runs it through
`accelerator.unwrap_model(model)`, so a loader that gives the processes shares of different
lengths cannot leave one process waiting in it.

Checked, migrated with the CLI and run on 1 and 2 gloo processes, for three kinds of factory (a
DistributedSampler inside, a plain DataLoader, an iterable dataset that takes every N-th of 9
samples by itself, 5 and 4):
- one process: the migrated script prints the original's lines;
- two processes: every process ends with the same validation losses and the same best epoch; with
  equal shares of full batches (or the whole set on each) each loss is the loss of that epoch's
  model over the whole validation set (computed in the script over all of it at once). Without the
  reduction, a sharding factory would give the main process the mean over its own half only;
  without the unwrapped forward, the uneven shares hang the run;
- the same evaluation written in the training function (`val_loss /= len(valid_dl)` after its
  loop) is reduced after the division, with the same results at 1 and 2 processes.
"""

from __future__ import annotations

import ast
import re
import textwrap
from pathlib import Path

import pytest

import sys

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))  # the shared torchrun helpers
from original_and_migrated import migrate_into, run_copy  # noqa: E402

TIMEOUT = 180
EPOCHS = 3
LINE = re.compile(r"^epoch (\d+) val ([0-9.]+)$", re.M)

SCRIPT = '''
    """Keeps the model with the lowest validation loss."""
    import os

    import torch
    import torch.nn.functional as F

    from shard_data import get_loaders, whole_validation


    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.body = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
            self.register_buffer("scale", torch.ones(3))  # DDP's forward broadcasts it

        def forward(self, x):
            return self.body(x) * self.scale


    def validate(model, valid_dl):
        losses, batches = 0.0, 0
        model.eval()
        for x, y in valid_dl:
            losses += F.cross_entropy(model(x), y).item()
            batches += 1
        return losses / batches


    def main():
        torch.manual_seed(0)
        train_dl, valid_dl = get_loaders(batch_size=4)
        model = Net()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.2)
        vx, vy = whole_validation()
        best, best_epoch, seen = float("inf"), -1, []
        for epoch in range(3):
            model.train()
            for x, y in train_dl:
                loss = F.cross_entropy(model(x), y)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
            val_loss = validate(model, valid_dl)
            if val_loss < best:
                best, best_epoch = val_loss, epoch
            with torch.no_grad():
                whole = F.cross_entropy(model(vx), vy).item()
            seen.append((val_loss, whole))
            print(f"epoch {epoch} val {val_loss:.6f}")
        with open(f"val-{os.environ.get('RANK', '0')}.txt", "w") as f:
            f.write(repr((seen, best_epoch)))


    if __name__ == "__main__":
        main()
'''

_DATA = '''
    import torch
    from torch.utils.data import DataLoader, IterableDataset, TensorDataset
    from torch.utils.data.distributed import DistributedSampler


    def _data(n, seed):
        g = torch.Generator().manual_seed(seed)
        x = torch.randn(n, 6, generator=g)
        return x, (x[:, 0] + x[:, 1] > 0).long() + (x[:, 2] > 1).long()


    def whole_validation():
        return _data({valid}, 2)


    class EveryNth(IterableDataset):
        """Takes this process's every N-th sample itself, as a sharding datapipe does."""

        def __init__(self, x, y):
            self.x, self.y = x, y

        def __iter__(self):
            on = torch.distributed.is_initialized()
            rank, size = (torch.distributed.get_rank(), torch.distributed.get_world_size()) if on else (0, 1)
            for i in range(rank, len(self.x), size):
                yield self.x[i], self.y[i]


    def get_loaders(batch_size):
        train = DataLoader(TensorDataset(*_data(64, 1)), batch_size=batch_size, shuffle=True)
        {valid_loader}
        return train, valid
'''

# the factory shares the validation set out by rank (each process 16 of the 32 samples, 4 full
# batches), hands every process all of it, or takes every N-th of 9 samples (5 and 4: 2 batches
# and 1)
SHARDING = _DATA.replace("{valid}", "32").replace("{valid_loader}", '''data = TensorDataset(*whole_validation())
        sampler = DistributedSampler(data, shuffle=False) if torch.distributed.is_initialized() else None
        valid = DataLoader(data, batch_size=batch_size, sampler=sampler)''')
WHOLE = _DATA.replace("{valid}", "32").replace(
    "{valid_loader}", "valid = DataLoader(TensorDataset(*whole_validation()), batch_size=batch_size)")
UNEVEN = _DATA.replace("{valid}", "9").replace(
    "{valid_loader}", "valid = DataLoader(EveryNth(*whole_validation()), batch_size=batch_size)")
FACTORIES = {"sharding": SHARDING, "whole": WHOLE, "uneven": UNEVEN}


# the same evaluation written in the training function, the sum made a mean in place after its loop
INLINE = SCRIPT.replace('''            val_loss = validate(model, valid_dl)
''', '''            model.eval()
            val_loss = 0.0
            for x, y in valid_dl:
                val_loss += F.cross_entropy(model(x), y).item()
            val_loss /= len(valid_dl)
''')
assert INLINE != SCRIPT


def _prepare(root: Path, data_module: str, script: str = SCRIPT) -> Path:
    folder = migrate_into(root, "train.py", script, TIMEOUT)
    for which in ("original", "migrated"):  # beside each copy, after the migration: never read by it
        (folder / which / "shard_data.py").write_text(textwrap.dedent(data_module).lstrip())
    return folder


@pytest.fixture(scope="module", params=sorted(FACTORIES))
def folder(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _prepare(tmp_path_factory.mktemp(f"unread_eval_{request.param}"), FACTORIES[request.param])


def _seen(run_dir: Path, rank: int) -> tuple[list[tuple[float, float]], int]:
    return ast.literal_eval((run_dir / f"val-{rank}.txt").read_text())


def test_the_mean_is_reduced_before_it_picks_the_best(folder: Path) -> None:
    migrated = (folder / "migrated" / "train.py").read_text()
    code = " ".join(migrated.split())
    assert ('val_loss = validate(model, valid_dl, accelerator) val_loss = accelerator.reduce( '
            'torch.tensor(val_loss, dtype=torch.float64, device=accelerator.device), "mean" ).item()') in code
    assert "accelerator.prepare(model, optimizer, train_dl)" in migrated  # the validation loader is not prepared
    assert "losses += F.cross_entropy(accelerator.unwrap_model(model)(x), y).item()" in migrated


def test_one_process_prints_the_original_lines(folder: Path) -> None:
    original, _ = run_copy(folder, "original", "train.py", 1, TIMEOUT)
    migrated, _ = run_copy(folder, "migrated", "train.py", 1, TIMEOUT)
    assert len(LINE.findall(original.stdout)) == EPOCHS
    assert LINE.findall(migrated.stdout) == LINE.findall(original.stdout)


def test_two_processes_agree_on_the_whole_validation_set(folder: Path) -> None:
    proc, run_dir = run_copy(folder, "migrated", "train.py", 2, TIMEOUT)
    assert [int(e) for e, _ in LINE.findall(proc.stdout)] == list(range(EPOCHS))  # the main process only
    (seen0, best0), (seen1, best1) = _seen(run_dir, 0), _seen(run_dir, 1)
    assert [v for v, _ in seen0] == [v for v, _ in seen1]
    assert best0 == best1
    if folder.name.startswith("unread_eval_uneven"):
        return  # 5 samples and 4: the mean of the two means is not the whole set's
    for val_loss, whole in seen0:
        assert val_loss == pytest.approx(whole, rel=1e-5)


@pytest.fixture(scope="module")
def inline_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _prepare(tmp_path_factory.mktemp("unread_eval_inline"), SHARDING, INLINE)


def test_a_mean_made_in_place_is_reduced_after_the_division(inline_folder: Path) -> None:
    code = " ".join((inline_folder / "migrated" / "train.py").read_text().split())
    assert ('val_loss /= len(valid_dl) val_loss = accelerator.reduce( '
            'torch.tensor(val_loss, dtype=torch.float64, device=accelerator.device), "mean" ).item()') in code
    original, _ = run_copy(inline_folder, "original", "train.py", 1, TIMEOUT)
    migrated, _ = run_copy(inline_folder, "migrated", "train.py", 1, TIMEOUT)
    assert LINE.findall(migrated.stdout) == LINE.findall(original.stdout)
    proc, run_dir = run_copy(inline_folder, "migrated", "train.py", 2, TIMEOUT)
    (seen0, best0), (seen1, best1) = _seen(run_dir, 0), _seen(run_dir, 1)
    assert [v for v, _ in seen0] == [v for v, _ in seen1] and best0 == best1
    for val_loss, whole in seen0:
        assert val_loss == pytest.approx(whole, rel=1e-5)
