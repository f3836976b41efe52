"""Truncated backpropagation through time over a corpus batchified into one tensor of streams,
(batch_size, num_tokens), the recurrent state carried (detached) from one slice to the next:
AM004 shares the streams per process (`accelerator.share_streams`) and sizes the carried state
from the shared tensor. Two shapes: module-level code whose LSTM state `(h, c)` is built per epoch
from `batch_size` (the corpus read by a helper module from a small text file), and a `main()`
whose tensor is batchified after the optimizer from `args.batch_size` and whose GRU state comes
from the model's `init_hidden`; and the word language model's layout, (num_tokens, batch_size) sliced
along time by `get_batch(source, i)` in a `train()` called per epoch, whose columns are shared. Migrated, at one process each trains exactly as its original; at two
processes each rank holds its half of the streams, both end with the same weights, which follow
the one-process run (a mean loss over equal shares, averaged: the whole batch's mean), and the
loss falls."""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from original_and_migrated import migrate_into, run_copy  # noqa: E402

TIMEOUT = 240

CORPUS_MODULE = '''
import torch


class Corpus:
    def __init__(self):
        self.word2idx = {}

    def get_data(self, path, batch_size):
        ids = []
        with open(path) as f:
            for line in f:
                for word in line.split() + ["<eos>"]:
                    ids.append(self.word2idx.setdefault(word, len(self.word2idx)))
        ids = torch.tensor(ids)
        streams = ids.size(0) // batch_size
        return ids[: streams * batch_size].view(batch_size, -1)
'''

MODULE_LEVEL = '''
import json
import os

import torch
import torch.nn as nn
from torch.nn.utils import clip_grad_norm_

from textcorpus import Corpus

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
embed_size, hidden_size, num_layers = 16, 24, 1
num_epochs, batch_size, seq_length = 4, 6, 5
torch.manual_seed(0)

corpus = Corpus()
ids = corpus.get_data(os.path.join(os.path.dirname(os.path.abspath(__file__)), "train.txt"), batch_size)
vocab_size = len(corpus.word2idx)
num_batches = ids.size(1) // seq_length


class RNNLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, embed_size)
        self.lstm = nn.LSTM(embed_size, hidden_size, num_layers, batch_first=True)
        self.linear = nn.Linear(hidden_size, vocab_size)

    def forward(self, x, h):
        out, (h, c) = self.lstm(self.embed(x), h)
        out = out.reshape(out.size(0) * out.size(1), out.size(2))
        return self.linear(out), (h, c)


model = RNNLM().to(device)
criterion = nn.CrossEntropyLoss()
optimizer = torch.optim.SGD(model.parameters(), lr=0.5)


def detach(states):
    return [state.detach() for state in states]


losses = []
for epoch in range(num_epochs):
    states = (torch.zeros(num_layers, batch_size, hidden_size).to(device),
              torch.zeros(num_layers, batch_size, hidden_size).to(device))
    for i in range(0, ids.size(1) - seq_length, seq_length):
        inputs = ids[:, i:i + seq_length].to(device)
        targets = ids[:, (i + 1):(i + 1) + seq_length].to(device)
        states = detach(states)
        outputs, states = model(inputs, states)
        loss = criterion(outputs, targets.reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        clip_grad_norm_(model.parameters(), 0.5)
        optimizer.step()
        losses.append(loss.item())

rank = int(os.environ.get("RANK", "0"))
with open(f"rank{rank}.json", "w") as f:
    json.dump({"losses": losses, "streams": ids[:, 0].tolist(), "bias": model.linear.bias.tolist()}, f)
'''

IN_MAIN = '''
import argparse
import json
import os

import torch
import torch.nn as nn
import torch.nn.functional as F


def batchify(data, n):
    usable = data.numel() // n
    return data[: usable * n].view(n, usable)


class GRUModel(nn.Module):
    def __init__(self, ntoken, width):
        super().__init__()
        self.width = width
        self.embed = nn.Embedding(ntoken, width)
        self.gru = nn.GRU(width, width, batch_first=True)
        self.decode = nn.Linear(width, ntoken)

    def forward(self, x, h):
        y, h = self.gru(self.embed(x), h)
        return self.decode(y).flatten(0, 1), h

    def init_hidden(self, n):
        return torch.zeros(1, n, self.width)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--bptt", type=int, default=6)
    args = parser.parse_args()
    torch.manual_seed(0)
    model = GRUModel(12, 16)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    data = batchify(torch.arange(250) * 7 // 3 % 12, args.batch_size)
    losses = []
    for epoch in range(3):
        h = model.init_hidden(args.batch_size)
        for i in range(0, data.shape[1] - 1 - args.bptt, args.bptt):
            src = data[:, i:i + args.bptt]
            tgt = data[:, i + 1:i + 1 + args.bptt]
            h = h.detach()
            out, h = model(src, h)
            loss = F.cross_entropy(out, tgt.reshape(-1))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
    rank = int(os.environ.get("RANK", "0"))
    with open(f"rank{rank}.json", "w") as f:
        json.dump({"losses": losses, "streams": data[:, :4].tolist(), "bias": model.decode.bias.tolist()}, f)


if __name__ == "__main__":
    main()
'''

TIME_FIRST = """
import argparse
import json
import os

import torch
import torch.nn as nn

parser = argparse.ArgumentParser()
parser.add_argument("--batch_size", type=int, default=6)
parser.add_argument("--bptt", type=int, default=7)
args = parser.parse_args()
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
torch.manual_seed(0)


def batchify(data, bsz):
    nbatch = data.size(0) // bsz
    data = data.narrow(0, 0, nbatch * bsz)
    return data.view(bsz, -1).t().contiguous().to(device)


train_data = batchify(torch.arange(400) * 5 // 3 % 14, args.batch_size)


class RNNModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = nn.Embedding(14, 16)
        self.rnn = nn.LSTM(16, 16)
        self.decoder = nn.Linear(16, 14)

    def forward(self, x, hidden):
        out, hidden = self.rnn(self.encoder(x), hidden)
        return self.decoder(out).view(-1, 14), hidden

    def init_hidden(self, bsz):
        weight = next(self.parameters())
        return (weight.new_zeros(1, bsz, 16), weight.new_zeros(1, bsz, 16))


model = RNNModel().to(device)
criterion = nn.NLLLoss()
optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
losses = []


def repackage_hidden(h):
    if isinstance(h, torch.Tensor):
        return h.detach()
    return tuple(repackage_hidden(v) for v in h)


def get_batch(source, i):
    seq_len = min(args.bptt, len(source) - 1 - i)
    data = source[i:i + seq_len]
    target = source[i + 1:i + 1 + seq_len].view(-1)
    return data, target


def train():
    model.train()
    hidden = model.init_hidden(args.batch_size)
    for batch, i in enumerate(range(0, train_data.size(0) - 1, args.bptt)):
        data, targets = get_batch(train_data, i)
        optimizer.zero_grad()
        hidden = repackage_hidden(hidden)
        output, hidden = model(data, hidden)
        loss = criterion(torch.log_softmax(output, -1), targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.25)
        optimizer.step()
        losses.append(loss.item())


for epoch in range(3):
    train()

rank = int(os.environ.get("RANK", "0"))
first = get_batch(train_data, 0)[0]
with open(f"rank{rank}.json", "w") as f:
    json.dump({"losses": losses, "streams": first.t().tolist(), "bias": model.decoder.bias.tolist()}, f)
"""


def _text() -> str:
    rng = random.Random(7)
    words = ["the", "cat", "sat", "on", "a", "mat", "dog", "ran", "far", "away"]
    lines = []
    for _ in range(40):
        start = rng.randrange(len(words))
        lines.append(" ".join(words[(start + k) % len(words)] for k in range(rng.randint(3, 7))))
    return "\n".join(lines) + "\n"


def _check(tmp_path: Path, script: str, shared: str, sized: str, beside: dict[str, str]) -> None:
    """Migrates `script` (with the files `beside` it), checks the two edits, and runs the original
    and the migrated copy at one process and the migrated copy at two."""
    folder = migrate_into(tmp_path, "lm.py", script, TIMEOUT)
    migrated = (folder / "migrated" / "lm.py").read_text()
    assert shared in migrated and sized in migrated, migrated
    for which in ("original", "migrated"):
        for name, text in beside.items():
            (folder / which / name).write_text(text)
    _, original = run_copy(folder, "original", "lm.py", 1, TIMEOUT)
    _, one = run_copy(folder, "migrated", "lm.py", 1, TIMEOUT)
    expected = json.loads((original / "rank0.json").read_text())
    assert json.loads((one / "rank0.json").read_text()) == expected  # bit-identical at one process

    _, two = run_copy(folder, "migrated", "lm.py", 2, TIMEOUT)
    ranks = [json.loads((two / f"rank{r}.json").read_text()) for r in range(2)]
    streams = expected["streams"]
    assert len(streams) % 2 == 0 and len({str(s) for s in streams}) > 2  # distinct streams
    assert ranks[0]["streams"] == streams[0::2] and ranks[1]["streams"] == streams[1::2]
    assert len(ranks[0]["losses"]) == len(ranks[1]["losses"]) == len(expected["losses"])
    assert ranks[0]["bias"] == ranks[1]["bias"]  # gradients averaged: one model
    # equal shares of a mean loss, averaged: the one-process gradient at every step
    assert torch.allclose(torch.tensor(ranks[0]["bias"]), torch.tensor(expected["bias"]), atol=1e-4), (
        ranks[0]["bias"], expected["bias"])
    for rank in ranks:
        assert sum(rank["losses"][-3:]) < sum(rank["losses"][:3])  # it learns


def test_module_level_state_from_batch_size(tmp_path: Path) -> None:
    _check(tmp_path, MODULE_LEVEL, "ids = accelerator.share_streams(ids)",
           "torch.zeros(num_layers, ids.size(0), hidden_size)",
           {"textcorpus.py": CORPUS_MODULE.lstrip(), "train.txt": _text()})


def test_main_state_from_init_hidden(tmp_path: Path) -> None:
    _check(tmp_path, IN_MAIN, "data = accelerator.share_streams(data)", "h = model.init_hidden(data.size(0))", {})


def test_time_first_columns_shared(tmp_path: Path) -> None:
    """The word language model's (num_tokens, batch_size) layout: the columns are shared (`dim=1`)."""
    _check(tmp_path, TIME_FIRST, "train_data = accelerator.share_streams(train_data, dim=1)",
           "hidden = model.init_hidden(train_data.size(1))", {})
