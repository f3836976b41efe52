"""A REINFORCE step whose returns are normalised from themselves (`returns = (returns -
returns.mean()) / returns.std()`), with no DataLoader: the migration used to fail on it (endless
recursion in migrate/roles/full_batch.py). Migrated with the CLI, it prints the same lines as the
original on 1 process, and runs on 2 gloo processes, where every process plays the same episodes
(seeded alike; AM004 reports it) and so prints what 1 process prints."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))
from original_and_migrated import migrate_into, run_copy  # noqa: E402

TIMEOUT = 180

SCRIPT = '''
import torch
from torch import nn
from torch.distributions import Categorical


def episode_states(episode):
    g = torch.Generator().manual_seed(episode)
    return torch.randn(12, 4, generator=g)


def main():
    torch.manual_seed(0)
    policy = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 2), nn.Softmax(dim=1))
    optimizer = torch.optim.Adam(policy.parameters(), lr=1e-2)
    gamma = 0.9
    for episode in range(6):
        log_probs, rewards = [], []
        for state in episode_states(episode):
            dist = Categorical(policy(state.unsqueeze(0)))
            action = dist.sample()
            log_probs.append(dist.log_prob(action))
            rewards.append(float(action.item() == int(state[0] > 0)))
        returns, R = [], 0.0
        for r in rewards[::-1]:
            R = r + gamma * R
            returns.insert(0, R)
        returns = torch.tensor(returns)
        returns = (returns - returns.mean()) / (returns.std() + 1e-8)
        loss = -(torch.cat(log_probs) * returns).sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        print(f"episode {episode} reward {sum(rewards):.1f} loss {loss.item():.6f}")
    print(f"weights {policy[2].weight.sum().item():.6f}")


if __name__ == "__main__":
    main()
'''


def test_policy_gradient_returns_normalised_migrates_and_runs_at_1_and_2_processes(tmp_path: Path) -> None:
    folder = migrate_into(tmp_path, "train.py", SCRIPT, TIMEOUT)
    migrated_text = (folder / "migrated" / "train.py").read_text()
    assert "accelerator.backward(loss)" in migrated_text
    assert "accelerator.prepare(policy, optimizer)" in migrated_text
    original, _ = run_copy(folder, "original", "train.py", 1, TIMEOUT)
    migrated, _ = run_copy(folder, "migrated", "train.py", 1, TIMEOUT)
    assert original.stdout == migrated.stdout and "episode 5 reward" in original.stdout
    two, _ = run_copy(folder, "migrated", "train.py", 2, TIMEOUT)
    assert two.stdout == original.stdout  # the same episodes on each process, printed once
