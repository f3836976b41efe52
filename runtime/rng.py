"""Torch's default generator made to agree across processes when the script did not seed it.

Unseeded, torch's CPU generator takes its seed from the operating system when each process starts,
so a script that draws something before training without a seed (a regression target
`W_target = torch.randn(4, 1)`, a `random_split`, initial weights) would draw it differently on
every process: each would train on a different task or split. A seeded script draws it alike.

``align_unseeded`` runs once per process, when the ``Accelerator`` creates the process group on more
than one process: one all-gather of every process's ``torch.initial_seed()``. When they all agree
(the script seeded torch alike before creating the Accelerator, or nothing differs) nothing
changes. When they differ (the processes were never seeded, or seeded apart before the
Accelerator), rank 0's generator state is broadcast and every process takes it: anything drawn
between ``Accelerator()`` and the first ``prepare`` call is the same on every process, as in a
seeded script. The first ``prepare`` call then seeds the processes other than rank 0 apart again
(``torch.manual_seed(torch.initial_seed() + rank)``), so that from the training loop on each
process draws its own values (dropout, noise, random batches), as the unseeded script's processes
did; rank 0 keeps its stream, and a seed the script sets after ``Accelerator()`` and before that
call (``torch.initial_seed()`` changed) is left as it is. One process, and a group the script
created itself (it runs distributed already and seeds as it means to), are left untouched. CUDA
generators start from a fixed seed on every process and are not touched; neither are numpy's and
Python's generators.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

_aligned = False  # this process's generator has been considered once (aligned or found alike)
_synced_seed: int | None = None  # rank 0's initial seed, while the first prepare has not seeded apart


def align_unseeded(rank: int, device: torch.device) -> None:
    """Give every process rank 0's torch generator state when their initial seeds differ (see
    the module docstring). Collective: every process of the group calls it, once."""
    global _aligned, _synced_seed
    if _aligned or not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
        return
    _aligned = True
    # nccl moves only device tensors; gloo takes CPU tensors
    where = device if dist.get_backend() == "nccl" else torch.device("cpu")
    seed = torch.tensor([torch.initial_seed() & ((1 << 63) - 1)], dtype=torch.int64, device=where)
    seeds = [torch.empty_like(seed) for _ in range(dist.get_world_size())]
    dist.all_gather(seeds, seed)
    if all(int(s.item()) == int(seeds[0].item()) for s in seeds):
        return
    state = torch.get_rng_state().to(where)
    dist.broadcast(state, src=0)
    torch.set_rng_state(state.cpu())
    _synced_seed = torch.initial_seed()


def seed_apart_after_prepare(rank: int) -> None:
    """At the first ``prepare`` call after ``align_unseeded`` aligned the generators: the processes
    other than rank 0 seed torch's generator apart, unless the script seeded it since."""
    global _synced_seed
    if _synced_seed is None:
        return
    synced, _synced_seed = _synced_seed, None
    if rank and torch.initial_seed() == synced:
        torch.manual_seed((synced + rank) % (1 << 64))
