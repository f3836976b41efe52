"""Sampling for N processes: a shared-seed shuffle, rank shards of batches, split batches,
iterable-dataset shards (the semantics are in runtime/data.py's docstring)."""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Iterable, Iterator, Sized
from typing import Any

import torch
from torch.utils.data import IterableDataset, RandomSampler, Sampler


class SharedSeedRandomSampler(RandomSampler):
    """A ``RandomSampler`` whose per-epoch seed is shared by all ranks.

    The seed is drawn at the same moment and from the same generator as ``RandomSampler`` draws it
    (first ``next()`` of the iterator, from the global generator), then ``share_seed`` replaces it
    by rank 0's value. With an identity ``share_seed`` the permutation equals the one
    ``RandomSampler`` would produce. With an explicit ``generator``, ``RandomSampler`` permutes with
    that generator directly: so does this sampler, after ``share_generator`` has given it rank 0's
    state (HF Accelerate synchronises the loader's generator the same way).
    """

    def __init__(
        self,
        data_source: Sized,
        share_seed: Callable[[int], int],
        replacement: bool = False,
        num_samples: int | None = None,
        generator: torch.Generator | None = None,
        share_generator: Callable[[torch.Generator], None] | None = None,
    ) -> None:
        super().__init__(data_source, replacement, num_samples, generator)
        self.share_seed = share_seed
        self.share_generator = share_generator

    def __iter__(self) -> Iterator[int]:
        if self.generator is not None:
            if self.share_generator is not None:
                self.share_generator(self.generator)
            yield from super().__iter__()
            return
        n = len(self.data_source)
        drawn = int(torch.empty((), dtype=torch.int64).random_().item())
        generator = torch.Generator()
        generator.manual_seed(self.share_seed(drawn))
        if self.replacement:
            for _ in range(self.num_samples // 32):
                yield from torch.randint(n, (32,), dtype=torch.int64, generator=generator).tolist()
            yield from torch.randint(
                n, (self.num_samples % 32,), dtype=torch.int64, generator=generator
            ).tolist()
        else:
            for _ in range(self.num_samples // n):
                yield from torch.randperm(n, generator=generator).tolist()
            yield from torch.randperm(n, generator=generator).tolist()[: self.num_samples % n]


class SameOnEveryRank(Sampler[Any]):
    """The user's sampler or batch sampler, yielding rank 0's order on every rank.

    A ``SubsetRandomSampler``, a ``WeightedRandomSampler`` or a custom sampler draws its order
    from the global RNGs (torch, python ``random``, numpy) or from its own ``generator``, which
    differ between ranks (seeded per rank, or consumed differently): sharding their batches by
    rank would then train some samples twice and others never. Each epoch this sampler takes
    rank 0's RNG states (one object broadcast), lists the whole epoch's order under them, and
    gives every rank that list; rank 0's own RNGs advance exactly as the unprepared sampler's
    would, the other ranks get their own global RNG states back (per-rank augmentation keeps its
    own stream) and the sampler's ``generator`` follows rank 0's. Listing up front (rather than
    drawing lazily) also makes a sampler that draws per item independent of what the training
    step draws in between.

    Every rank must start iterating the loader (the broadcast is a collective), as every rank
    does in a training loop; a loader iterated on the main process alone hangs.
    """

    def __init__(self, source: Any, share: Callable[[Any], Any], rank: int) -> None:
        self.source = source
        self.share = share
        self.rank = rank

    def __len__(self) -> int:
        return len(self.source)

    def __getattr__(self, name: str) -> Any:
        # Reached only for names this wrapper lacks: batch_size, drop_last, sampler, set_epoch...
        if name.startswith("__") or name in ("source", "share", "rank"):
            raise AttributeError(name)
        return getattr(self.source, name)

    def _generator(self) -> torch.Generator | None:
        for obj in (self.source, getattr(self.source, "sampler", None)):
            generator = getattr(obj, "generator", None)
            if isinstance(generator, torch.Generator):
                return generator
        return None

    def __iter__(self) -> Iterator[Any]:
        from .checkpoint import capture_rng_state, restore_rng_state

        generator = self._generator()
        own = capture_rng_state(include_cuda=False)
        ranks0 = self.share((own, None if generator is None else generator.get_state()))
        if self.rank != 0:
            restore_rng_state(ranks0[0])
            if generator is not None:
                generator.set_state(ranks0[1])
        try:
            order = list(self.source)
        finally:
            if self.rank != 0:
                restore_rng_state(own)
        yield from order


class ShardSampler(Sampler[Any]):
    """Rank ``rank``'s share of ``source``: items ``rank, rank+n, rank+2n, ...``.

    ``source`` yields batches of indices (a batch sampler) or single indices. With ``drop_last``
    an unfinished last round is dropped. Otherwise, with ``even_batches``, the last round is
    padded from the start of the epoch so every rank gets the same number of items: a short last
    batch is completed to ``batch_size`` and missing batches are cut from the epoch's first
    samples (as HF Accelerate does); without ``even_batches`` some ranks get one item fewer.
    """

    def __init__(
        self,
        source: Iterable[Any],
        num_replicas: int,
        rank: int,
        even_batches: bool = True,
        drop_last: bool = False,
        batch_size: int | None = None,
    ) -> None:
        if not 0 <= rank < num_replicas:
            raise ValueError(f"rank {rank} is outside 0..{num_replicas - 1}")
        self.source = source
        self.num_replicas = num_replicas
        self.rank = rank
        self.even_batches = even_batches
        self.drop_last = drop_last
        self.batch_size = batch_size

    def __len__(self) -> int:
        total = len(self.source)  # type: ignore[arg-type]
        n = self.num_replicas
        if self.drop_last:
            return total // n
        if self.even_batches:
            return math.ceil(total / n)
        return total // n + (1 if self.rank < total % n else 0)

    def set_epoch(self, epoch: int) -> None:
        """Forward the epoch to the wrapped sampler(s) that understand it (e.g. DistributedSampler)."""
        for obj in (self.source, getattr(self.source, "sampler", None)):
            if obj is not None and hasattr(obj, "set_epoch"):
                obj.set_epoch(epoch)

    def _is_full(self, item: Any) -> bool:
        return self.batch_size is None or len(item) == self.batch_size

    def __iter__(self) -> Iterator[Any]:
        n, rank = self.num_replicas, self.rank
        keep_head = self.even_batches and not self.drop_last
        head: list[Any] = []  # the epoch's first n items: material for padding
        mine: Any = None  # this rank's item of the round in progress
        seen = rounds = 0
        last: Any = None
        for i, item in enumerate(self.source):
            if keep_head and i < n:
                head.append(item)
            if i % n == rank:
                mine = item
            seen, last = i + 1, item
            if i % n == n - 1 and self._is_full(item):
                yield mine
                mine, rounds = None, rounds + 1
        tail = seen - rounds * n  # real items in the unfinished round
        if tail == 0 or self.drop_last:
            return
        if not self.even_batches:
            if rank < tail:
                yield mine
            return
        if self.batch_size is None:  # items cannot be completed: pad with whole items
            yield mine if rank < tail else head[(rank - tail) % len(head)]
            return
        flat = [index for batch in head for index in batch]
        while len(flat) < n * self.batch_size:
            flat += flat
        fill = self.batch_size - len(last)
        if rank < tail - 1:
            yield mine
        elif rank == tail - 1:
            yield list(mine) + flat[:fill]
        else:
            start = fill + (rank - tail) * self.batch_size
            yield flat[start : start + self.batch_size]


class RankShareView(Sampler[int]):
    """``loader.sampler`` of a prepared loader on N processes: this rank's share of the user's.

    ``len(loader.sampler)`` is the number of samples this process gets per epoch (as
    ``len(DistributedSampler)`` is in a hand-written DDP script, so ``total / len(loader.sampler)``
    averages over what this rank saw), padding of ``even_batches`` included; it is computed
    from the user's sampler's length by running the rank's batch sharding over placeholder
    batches (no RNG drawn, no collective). Iterating it gives this rank's indices (one epoch of
    the loader's sampling, a collective when the user's sampler is random). Every other
    attribute is the user's sampler's (``loader.sampler.indices``, ``.weights``,
    ``.set_epoch(e)``). ``len(loader.dataset)`` stays the whole dataset, as in HF Accelerate.
    """

    def __init__(self, user_sampler: Sized, rank_batches: Any, batch_size: int, drop_last: bool) -> None:
        self.user_sampler = user_sampler
        self.rank_batches = rank_batches  # ShardSampler or SplitBatchSampler of this rank
        self.batch_size = batch_size
        self.drop_last = drop_last
        self._length: tuple[int, int] | None = None  # (user sampler length, this rank's count)

    def __len__(self) -> int:
        total = len(self.user_sampler)
        if self._length is None or self._length[0] != total:
            size = self.batch_size
            count = total // size if self.drop_last else math.ceil(total / size)
            placeholders = [range(i * size, min((i + 1) * size, total)) for i in range(count)]
            simulated = copy.copy(self.rank_batches)
            simulated.source = placeholders
            self._length = (total, sum(len(batch) for batch in simulated))
        return self._length[1]

    def __iter__(self) -> Iterator[int]:
        for batch in self.rank_batches:
            yield from batch

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in ("user_sampler", "rank_batches", "_length"):
            raise AttributeError(name)
        return getattr(self.user_sampler, name)


def _split_slice(length: int, num_replicas: int, rank: int) -> slice:
    """Rank ``rank``'s part of ``length`` items cut into ``num_replicas`` near-equal runs."""
    return slice(rank * length // num_replicas, (rank + 1) * length // num_replicas)


class SplitBatchSampler(Sampler[list[Any]]):
    """Rank ``rank``'s slice of every batch of ``source`` (``split_batches=True``).

    Full batches are cut into ``num_replicas`` equal slices. A short last batch is completed to
    ``batch_size`` by cycling the epoch's first samples when ``even_batches`` (so the slices stay
    equal and ``gather_for_metrics`` can drop the padding again); otherwise it is cut into
    near-equal slices, and a rank whose slice would be empty gets no last batch.
    """

    def __init__(
        self,
        source: Iterable[list[Any]],
        num_replicas: int,
        rank: int,
        batch_size: int | None,
        even_batches: bool = True,
    ) -> None:
        if not 0 <= rank < num_replicas:
            raise ValueError(f"rank {rank} is outside 0..{num_replicas - 1}")
        self.source = source
        self.num_replicas = num_replicas
        self.rank = rank
        self.batch_size = batch_size
        self.even_batches = even_batches

    def __len__(self) -> int:
        total = len(self.source)  # type: ignore[arg-type]
        if self.even_batches or self.batch_size is None:
            return total
        sampler = getattr(self.source, "sampler", None)
        if total and isinstance(sampler, Sized) and not getattr(self.source, "drop_last", False):
            last = len(sampler) % self.batch_size
            part = _split_slice(last, self.num_replicas, self.rank)
            if last and part.stop == part.start:
                return total - 1
        return total

    def set_epoch(self, epoch: int) -> None:
        """Forward the epoch to the wrapped sampler(s) that understand it."""
        for obj in (self.source, getattr(self.source, "sampler", None)):
            if obj is not None and hasattr(obj, "set_epoch"):
                obj.set_epoch(epoch)

    def __iter__(self) -> Iterator[list[Any]]:
        n, rank, size = self.num_replicas, self.rank, self.batch_size
        head: list[Any] = []  # the epoch's first samples: material for padding
        for batch in self.source:
            batch = list(batch)
            if size is not None and len(head) < size:
                head += batch[: size - len(head)]
            if size is not None and len(batch) < size and self.even_batches:
                filler = head * (size // max(len(head), 1) + 1)
                batch = batch + filler[: size - len(batch)]
            part = batch[_split_slice(len(batch), n, rank)]
            if part:
                yield part


class IterableDatasetShard(IterableDataset):
    """Rank ``process_index``'s share of an IterableDataset (HF Accelerate's IterableDatasetShard).

    Every rank iterates the whole ``dataset``. Samples are grouped into buffers of
    ``batch_size * num_processes`` (``batch_size`` with ``split_batches``); this rank yields its
    slice of each buffer (``batch_size``, resp. ``batch_size / num_processes`` samples), so with
    DataLoader batching rank i's k-th batch is the i-th part of the k-th buffer. An unfinished last
    buffer is completed by cycling the first buffer, unless ``drop_last``. ``remainder`` is the
    number of real samples in the last buffer (0: no padding), known once the dataset is exhausted.
    """

    def __init__(
        self,
        dataset: IterableDataset,
        batch_size: int,
        num_processes: int,
        process_index: int,
        split_batches: bool = False,
        drop_last: bool = False,
    ) -> None:
        self.dataset = dataset
        self.batch_size = batch_size
        self.num_processes = num_processes
        self.process_index = process_index
        self.split_batches = split_batches
        self.drop_last = drop_last
        self.remainder = 0

    @property
    def buffer_size(self) -> int:
        return self.batch_size if self.split_batches else self.batch_size * self.num_processes

    @property
    def process_batch_size(self) -> int:
        return self.batch_size // self.num_processes if self.split_batches else self.batch_size

    def set_epoch(self, epoch: int) -> None:
        if hasattr(self.dataset, "set_epoch"):
            self.dataset.set_epoch(epoch)

    def __len__(self) -> int:
        total = len(self.dataset)  # type: ignore[arg-type]  # TypeError when unsized
        buffers = total // self.buffer_size if self.drop_last else math.ceil(total / self.buffer_size)
        return buffers * self.process_batch_size

    def __iter__(self) -> Iterator[Any]:
        start = self.process_index * self.process_batch_size
        mine = slice(start, start + self.process_batch_size)
        first: list[Any] | None = None
        buffer: list[Any] = []
        self.remainder = 0
        for element in self.dataset:
            buffer.append(element)
            if len(buffer) == self.buffer_size:
                yield from buffer[mine]
                if first is None:
                    first = buffer
                buffer = []
        if buffer and not self.drop_last:
            self.remainder = len(buffer)
            filler = first if first is not None else list(buffer)
            while len(buffer) < self.buffer_size:
                buffer += filler
            yield from buffer[: self.buffer_size][mine]
