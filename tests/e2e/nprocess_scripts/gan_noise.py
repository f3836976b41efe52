"""A small GAN seeded once for every process: its noise is drawn in the training loop.

Records, per process, the train/validation split (drawn with the global RNG after the seed), the
samples each epoch's batches hold, and a checksum of the noise of each step.
"""

import json
import os
import sys

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, random_split

SEED = 7
LATENT = 3


class Points(Dataset):
    def __init__(self, n):
        self.points = torch.randn(n, 2) * 0.3 + 1.0

    def __len__(self):
        return len(self.points)

    def __getitem__(self, index):
        return self.points[index], index


def main():
    torch.manual_seed(SEED)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    train_set, val_set = random_split(Points(48), [40, 8])
    loader = DataLoader(train_set, batch_size=4, shuffle=True)
    generator = nn.Sequential(nn.Linear(LATENT, 8), nn.ReLU(), nn.Linear(8, 2)).to(device)
    critic = nn.Sequential(nn.Linear(2, 8), nn.ReLU(), nn.Linear(8, 1)).to(device)
    opt_g = torch.optim.SGD(generator.parameters(), lr=0.01)
    opt_c = torch.optim.SGD(critic.parameters(), lr=0.01)
    seen, noise_sums = [], []
    for epoch in range(2):
        for real, index in loader:
            real = real.to(device)
            noise = torch.randn(real.size(0), LATENT, device=device)
            fake = generator(noise)
            noise_sums.append(round(noise.sum().item(), 6))
            seen.extend(int(i) for i in index)
            opt_c.zero_grad()
            c_loss = critic(fake.detach()).mean() - critic(real).mean()
            c_loss.backward()
            opt_c.step()
            opt_g.zero_grad()
            g_loss = -critic(fake).mean()
            g_loss.backward()
            opt_g.step()
    rank = int(os.environ.get("RANK", "0"))
    with open(os.path.join(sys.argv[1], f"rank{rank}.json"), "w") as f:
        json.dump({"val": sorted(val_set.indices), "seen": seen, "noise": noise_sums}, f)


if __name__ == "__main__":
    main()
