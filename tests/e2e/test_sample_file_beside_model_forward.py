"""A file written inside a block that runs the prepared model (sampling after training): AM009
cannot put the block on the main process alone, so every process runs it and the others write to
the null device (`open(path if accelerator.is_main_process else os.devnull, "w")`).

Checked: at 1 process the migrated script writes the same sample as the original (same seed); at
2 processes (torchrun) both ranks finish, and the file holds one process's sample, written once
(50 tokens, not interleaved lines of two writers).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from original_and_migrated import migrate_into, run_copy  # noqa: E402

TIMEOUT = 180

SCRIPT = '''
    import torch
    import torch.nn as nn
    from torch.utils.data import DataLoader, TensorDataset

    torch.manual_seed(0)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    vocab = 20
    tokens = torch.randint(0, vocab, (64, 9))
    loader = DataLoader(TensorDataset(tokens[:, :-1], tokens[:, 1:]), batch_size=16)


    class TinyLM(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(vocab, 16)
            self.head = nn.Linear(16, vocab)

        def forward(self, x):
            return self.head(self.embed(x))


    model = TinyLM().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in loader:
        x, y = x.to(device), y.to(device)
        loss = nn.functional.cross_entropy(model(x).reshape(-1, vocab), y.reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    torch.manual_seed(1)
    with torch.no_grad():
        with open("sample.txt", "w") as f:
            word = torch.zeros(1, 1, dtype=torch.long, device=device)
            for _ in range(50):
                word = torch.multinomial(model(word).softmax(-1).squeeze(), 1).view(1, 1)
                f.write(f"{word.item()} ")
'''


def test_sample_written_once_by_the_main_process(tmp_path: Path) -> None:
    folder = migrate_into(tmp_path, "sample.py", SCRIPT, TIMEOUT)
    migrated = (folder / "migrated" / "sample.py").read_text()
    assert 'open("sample.txt" if accelerator.is_main_process else devnull, "w")' in migrated, migrated
    _, original_dir = run_copy(folder, "original", "sample.py", 1, TIMEOUT)
    _, one_dir = run_copy(folder, "migrated", "sample.py", 1, TIMEOUT)
    expected = (original_dir / "sample.txt").read_text()
    assert (one_dir / "sample.txt").read_text() == expected
    _, two_dir = run_copy(folder, "migrated", "sample.py", 2, TIMEOUT)
    written = (two_dir / "sample.txt").read_text().split()
    assert len(written) == 50 and all(0 <= int(t) < 20 for t in written)
