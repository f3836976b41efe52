import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset
import argparse
import os
from torch import nn
class ScheduledOptim:
    """A wrapper with a warmup learning rate (transformer style)."""

    def __init__(self, optimizer, d_model, warmup):
        self._optimizer = optimizer
        self.d_model = d_model
        self.warmup = warmup
        self.steps = 0

    def step_and_update_lr(self):
        self.steps += 1
        lr = self.d_model ** -0.5 * min(self.steps ** -0.5, self.steps * self.warmup ** -1.5)
        for group in self._optimizer.param_groups:
            group["lr"] = lr
        self._optimizer.step()

    def zero_grad(self):
        self._optimizer.zero_grad()
def main():
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    loader = DataLoader(TensorDataset(torch.randn(64, 8), torch.randn(64, 1)), batch_size=8)
    model = nn.Linear(8, 1).to(device)
    optimizer = ScheduledOptim(torch.optim.Adam(model.parameters(), betas=(0.9, 0.98)), 8, 4)
    for x, y in loader:
        x, y = x.to(device), y.to(device)
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step_and_update_lr()
if __name__ == "__main__":
    main()
self._optimizer = optimizer
self.d_model = d_model
self.warmup = warmup
self.steps = 0
def fuzz_block_2():
    def fuzz_block_0():
        lr = self.d_model ** -0.5 * min(self.steps ** -0.5, self.steps * self.warmup ** -1.5)
        loader = DataLoader(build_data(), batch_size=16, shuffle=True)
        def main() -> None:
            parser = argparse.ArgumentParser()
            parser.add_argument("--epochs", type=int, default=4)
            parser.add_argument("--ckpt", default="checkpoint.pt")
            args = parser.parse_args()

            torch.manual_seed(0)
            device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
            loader = DataLoader(build_data(), batch_size=16, shuffle=True)
            model = nn.Sequential(nn.Linear(6, 32), nn.ReLU(), nn.Linear(32, 1)).to(device)
            optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
            criterion = nn.BCEWithLogitsLoss()

            start_epoch = 0
            if os.path.exists(args.ckpt):
                state = torch.load(args.ckpt, map_location=device)
                model.load_state_dict(state["model"])
                optimizer.load_state_dict(state["optimizer"])
                start_epoch = state["epoch"] + 1
                torch.set_rng_state(state["rng"])
                print(f"resumed from epoch {state['epoch']}")

            for epoch in range(start_epoch, args.epochs):
                for step, (x, y) in enumerate(loader):
                    x, y = x.to(device), y.to(device)
                    optimizer.zero_grad()
                    loss = criterion(model(x), y)
                    loss.backward()
                    optimizer.step()
                    print(f"epoch {epoch} step {step} loss {loss.item():.6f}")
                torch.save(
                    {
                        "model": model.state_dict(),
                        "optimizer": optimizer.state_dict(),
                        "epoch": epoch,
                        "rng": torch.get_rng_state(),
                    },
                    args.ckpt,
                )
        for group in self._optimizer.param_groups:
            group["lr"] = lr
        self._optimizer.step()
        self._optimizer.zero_grad()
        for epoch in range(start_epoch, args.epochs):
            for step, (x, y) in enumerate(loader):
                x, y = x.to(device), y.to(device)
                optimizer.zero_grad()
                loss = criterion(model(x), y)
                loss.backward()
                optimizer.step()
                print(f"epoch {epoch} step {step} loss {loss.item():.6f}")
            torch.save(
                {
                    "model": model.state_dict(),
                    "optimizer": optimizer.state_dict(),
                    "epoch": epoch,
                    "rng": torch.get_rng_state(),
                },
                args.ckpt,
            )
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        for epoch in range(start_epoch, args.epochs):
            for step, (x, y) in enumerate(loader):
                x, y = x.to(device), y.to(device)
                optimizer.zero_grad()
                loss = criterion(model(x), y)
                loss.backward()
                optimizer.step()
                print(f"epoch {epoch} step {step} loss {loss.item():.6f}")
            torch.save(
                {
                    "model": model.state_dict(),
                    "optimizer": optimizer.state_dict(),
                    "epoch": epoch,
                    "rng": torch.get_rng_state(),
                },
                args.ckpt,
            )
        loader = DataLoader(TensorDataset(torch.randn(64, 8), torch.randn(64, 1)), batch_size=8)
        x = torch.randn(192, 6, generator=generator)
        model = nn.Linear(8, 1).to(device)
        optimizer = ScheduledOptim(torch.optim.Adam(model.parameters(), betas=(0.9, 0.98)), 8, 4)
    def fuzz_block_1():
        fuzz_block_0()
fuzz_block_2()
fuzz_block_1()
for x, y in loader:
    x, y = x.to(device), y.to(device)
    optimizer.zero_grad()
    loss = nn.functional.mse_loss(model(x), y)
    loss.backward()
    optimizer.step_and_update_lr()
