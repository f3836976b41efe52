"""A d2l-style script whose model is an `nn.Sequential` read by index after `prepare`
(`net[0].weight` each epoch, `net[-1]`, `len(net)`, `for layer in net`), with an early stop on the
validation accuracy: migrated with the CLI it prints the same lines on 1 process, and on 2 gloo
processes it runs to the end, where the DDP wrapper used to stop at `net[0]` ("'PreparedDDP' object
is not subscriptable"; runtime/user_module.py)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))
from original_and_migrated import migrate_into, run_copy  # noqa: E402

TIMEOUT = 180

SCRIPT = '''
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def init_weights(m):
    if type(m) == nn.Linear:
        nn.init.normal_(m.weight, std=0.1)


def main():
    torch.manual_seed(0)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    features = torch.randn(72, 6)
    labels = (features[:, 0] + features[:, 1] > 0).long()
    train_iter = DataLoader(TensorDataset(features[:48], labels[:48]), batch_size=6, shuffle=True)
    valid_iter = DataLoader(TensorDataset(features[48:], labels[48:]), batch_size=8)
    net = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 2))
    net.apply(init_weights)
    net.to(device)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.2)
    best, bad = -1.0, 0
    for epoch in range(12):
        net.train()
        for X, y in train_iter:
            X, y = X.to(device), y.to(device)
            loss = nn.functional.cross_entropy(net(X), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        net.eval()
        correct = 0
        with torch.no_grad():
            for X, y in valid_iter:
                X, y = X.to(device), y.to(device)
                correct += (net(X).argmax(1) == y).sum().item()
        accuracy = correct / 24
        first = net[0].weight.norm().item()
        print(f"epoch {epoch} accuracy {accuracy:.4f} first layer {first:.6f}")
        if accuracy <= best:
            bad += 1
            if bad >= 2:
                break
        else:
            best, bad = accuracy, 0
    layers = [type(layer).__name__ for layer in net]
    last = net[-1].weight.sum().item()
    print(f"{len(net)} layers {layers} last {last:.6f}")


if __name__ == "__main__":
    main()
'''


def test_sequential_read_by_index_trains_migrated_at_1_and_2_processes(tmp_path: Path) -> None:
    folder = migrate_into(tmp_path, "train.py", SCRIPT, TIMEOUT)
    migrated_text = (folder / "migrated" / "train.py").read_text()
    assert "accelerator.prepare(" in migrated_text and "net[0].weight" in migrated_text
    original, _ = run_copy(folder, "original", "train.py", 1, TIMEOUT)
    migrated, _ = run_copy(folder, "migrated", "train.py", 1, TIMEOUT)
    assert original.stdout == migrated.stdout and "epoch 1 accuracy" in original.stdout
    two, _ = run_copy(folder, "migrated", "train.py", 2, TIMEOUT)
    lines = two.stdout.splitlines()
    assert lines[0].startswith("epoch 0 accuracy") and " first layer " in lines[0]
    assert lines[-1].startswith("3 layers ['Linear', 'ReLU', 'Linear'] last ")
    assert len([line for line in lines if line.startswith("3 layers")]) == 1  # the main process only
