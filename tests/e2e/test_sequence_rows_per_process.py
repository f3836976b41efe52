"""Truncated backpropagation through time over one tensor (consecutive chunks of every row, the
recurrent state carried from one chunk to the next), with the advice of AM004's report applied
(fixtures/prepare_training_objects/leave_sequence_slices_state_carried and its twin
sequence_rows_split_per_process): the rows split per process right after the tensor is built, the
state sized to this process's rows. Migrated, at one process it trains exactly as the script
without the split; at two processes each rank trains on its own half of the rows, in order, and
both end with the same weights."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from original_and_migrated import migrate_into, run_copy  # noqa: E402

TIMEOUT = 180
SCRIPT = '''
import json
import os

import torch
import torch.nn as nn

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
rows, span, width = 8, 6, 8
torch.manual_seed(3)
stream = torch.randint(0, 20, (rows, 60))
stream = stream[accelerator.process_index::accelerator.num_processes]


class Recurrent(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(20, width)
        self.cell = nn.GRU(width, width, batch_first=True)
        self.head = nn.Linear(width, 20)

    def forward(self, tokens, hidden):
        out, hidden = self.cell(self.embed(tokens), hidden)
        return self.head(out).flatten(0, 1), hidden


net = Recurrent().to(device)
opt = torch.optim.SGD(net.parameters(), lr=0.5)
losses = []
for epoch in range(2):
    hidden = torch.zeros(1, stream.size(0), width, device=device)
    for t in range(0, stream.size(1) - span, span):
        chunk = stream[:, t:t + span].to(device)
        following = stream[:, t + 1:t + 1 + span].to(device)
        hidden = hidden.detach()
        logits, hidden = net(chunk, hidden)
        cost = nn.functional.cross_entropy(logits, following.reshape(-1))
        opt.zero_grad()
        cost.backward()
        opt.step()
        losses.append(cost.item())

rank = int(os.environ.get("RANK", "0"))
with open(f"rank{rank}.json", "w") as f:
    json.dump({"losses": losses, "rows": stream[:, 0].tolist(), "head": net.head.bias.tolist()}, f)
'''


def test_rows_split_per_process_train_like_the_script_and_apart(tmp_path: Path) -> None:
    folder = migrate_into(tmp_path, "bptt.py", SCRIPT, TIMEOUT)
    migrated = (folder / "migrated" / "bptt.py").read_text()
    assert "accelerator = Accelerator()" in migrated and "net, opt = accelerator.prepare(net, opt)" in migrated
    unsplit = tmp_path / "unsplit"
    unsplit.mkdir()
    (unsplit / "bptt.py").write_text(SCRIPT.replace(
        "stream = stream[accelerator.process_index::accelerator.num_processes]\n", ""))
    _, plain = run_copy(tmp_path, "unsplit", "bptt.py", 1, TIMEOUT)
    _, one = run_copy(folder, "migrated", "bptt.py", 1, TIMEOUT)
    expected = json.loads((plain / "rank0.json").read_text())
    assert json.loads((one / "rank0.json").read_text()) == expected

    _, two = run_copy(folder, "migrated", "bptt.py", 2, TIMEOUT)
    ranks = [json.loads((two / f"rank{r}.json").read_text()) for r in range(2)]
    assert ranks[0]["rows"] == expected["rows"][0::2] and ranks[1]["rows"] == expected["rows"][1::2]
    assert len(ranks[0]["losses"]) == len(ranks[1]["losses"]) == len(expected["losses"])
    assert ranks[0]["head"] == ranks[1]["head"]  # gradients averaged: one model
