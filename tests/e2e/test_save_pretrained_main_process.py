"""A model that saves itself (`model.save_pretrained(path)`, the transformers idiom, here a model
class of the script with such a method) and a second object saving into the same folder (a
tokenizer's `save_pretrained`): migrated with the CLI, both run on the main process only and the
model saves unwrapped (AM009). On 1 process the migrated script saves the original's weights;
on 2 gloo processes only rank 0 saves, with the user's keys (no `module.` prefix), and both ranks
train and finish. Before, every rank wrote the same files at once, through the prepared model.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))
from original_and_migrated import migrate_into, run_copy  # noqa: E402

TIMEOUT = 180

SCRIPT = '''
import json
import os

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def record(what):
    with open(f"saves_rank{os.environ.get('RANK', '0')}.txt", "a") as f:
        f.write(what + "\\n")


class TinyClassifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Linear(4, 8)
        self.head = nn.Linear(8, 2)

    def forward(self, x):
        return self.head(torch.relu(self.body(x)))

    def save_pretrained(self, path):
        os.makedirs(path, exist_ok=True)
        torch.save(self.state_dict(), os.path.join(path, "model.bin"))
        record(f"model {type(self).__name__} {path}")


class Vocab:
    def save_pretrained(self, path):
        os.makedirs(path, exist_ok=True)
        with open(os.path.join(path, "vocab.json"), "w") as f:
            json.dump({"size": 4}, f)
        record(f"vocab {path}")


def main():
    torch.manual_seed(0)
    vocab = Vocab()
    data = TensorDataset(torch.randn(32, 4), torch.randint(0, 2, (32,)))
    loader = DataLoader(data, batch_size=4, shuffle=True)
    model = TinyClassifier()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    for epoch in range(2):
        for x, y in loader:
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
        model.save_pretrained(f"out/epoch{epoch}")
    model.save_pretrained("out")
    vocab.save_pretrained("out")


if __name__ == "__main__":
    main()
'''

SAVES = ["model TinyClassifier out/epoch0", "model TinyClassifier out/epoch1", "model TinyClassifier out", "vocab out"]


def test_save_pretrained_runs_on_the_main_process_unwrapped(tmp_path: Path) -> None:
    folder = migrate_into(tmp_path, "train.py", SCRIPT, TIMEOUT)
    text = (folder / "migrated" / "train.py").read_text()
    assert "accelerator.unwrap_model(model).save_pretrained(\"out\")" in text, text
    _, original = run_copy(folder, "original", "train.py", 1, TIMEOUT)
    _, one = run_copy(folder, "migrated", "train.py", 1, TIMEOUT)
    assert (one / "saves_rank0.txt").read_text().splitlines() == SAVES
    expected = torch.load(original / "out" / "model.bin")
    got = torch.load(one / "out" / "model.bin")
    assert list(got) == list(expected) and all(torch.equal(got[k], expected[k]) for k in expected)

    _, two = run_copy(folder, "migrated", "train.py", 2, TIMEOUT)
    assert (two / "saves_rank0.txt").read_text().splitlines() == SAVES
    assert not (two / "saves_rank1.txt").exists()
    assert list(torch.load(two / "out" / "model.bin")) == list(expected)  # the user's keys
    assert (two / "out" / "vocab.json").exists()
