"""Prepared data loaders: per-rank sharding, per-epoch shared shuffling, device placement.

One process: the prepared loader reuses the original sampler / batch sampler unchanged, so it
yields the same batches in the same order and draws from the global RNG exactly like the original
(a migrated script's losses stay bit-identical).

N processes: rank ``i`` gets global batches ``i, i+n, i+2n, ...`` of the original batch sampler
(HF Accelerate's assignment). A shuffling ``RandomSampler`` is replaced by ``SharedSeedRandomSampler``,
which draws its seed where ``RandomSampler`` does and takes rank 0's value (one broadcast per epoch),
so every rank walks the same permutation and it changes every epoch.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Sized
from functools import partial
from typing import Any, TypeVar

import torch
from torch.utils.data import BatchSampler, DataLoader, IterableDataset, RandomSampler, Sampler

from .errors import PrepareError
from .ops import apply_to_tensors, broadcast_int
from .state import ProcessState

T = TypeVar("T")


def send_to_device(batch: T, device: torch.device, non_blocking: bool = False) -> T:
    """Move every tensor in a (nested) batch to ``device``; tensors already there are not copied."""
    return apply_to_tensors(batch, lambda t: t.to(device, non_blocking=non_blocking))


class SharedSeedRandomSampler(RandomSampler):
    """A ``RandomSampler`` whose per-epoch seed is shared by all ranks.

    The seed is drawn at the same moment and from the same generator as ``RandomSampler`` draws it
    (first ``next()`` of the iterator; the sampler's generator, else the global one), then
    ``share_seed`` replaces it by rank 0's value. With an identity ``share_seed`` the permutation
    equals the one ``RandomSampler`` would produce.
    """

    def __init__(
        self,
        data_source: Sized,
        share_seed: Callable[[int], int],
        replacement: bool = False,
        num_samples: int | None = None,
        generator: torch.Generator | None = None,
    ) -> None:
        super().__init__(data_source, replacement, num_samples, generator)
        self.share_seed = share_seed

    def __iter__(self) -> Iterator[int]:
        n = len(self.data_source)
        drawn = int(torch.empty((), dtype=torch.int64).random_(generator=self.generator).item())
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


class ActiveLoaders:
    """The prepared loaders' iterators in progress, innermost last (owned by an Accelerator).

    ``gather_for_metrics`` asks the innermost one whether it is on its last batch, to drop the
    samples ``even_batches`` padding added.
    """

    def __init__(self) -> None:
        self._stack: list[_DeviceIterator] = []

    def push(self, iterator: _DeviceIterator) -> None:
        # An iterator abandoned by a `break` is replaced by its loader's next one.
        self._stack = [it for it in self._stack if it.loader is not iterator.loader]
        self._stack.append(iterator)

    def remove(self, iterator: _DeviceIterator) -> None:
        if iterator in self._stack:
            self._stack.remove(iterator)

    @property
    def current(self) -> _DeviceIterator | None:
        return self._stack[-1] if self._stack else None


class _DeviceIterator:
    """Wraps a DataLoader iterator, places each batch on the device and counts batches."""

    def __init__(self, loader: PreparedDataLoader, iterator: Iterator[Any], non_blocking: bool) -> None:
        self.loader = loader
        self._iterator = iterator
        self._device = loader.device
        self._non_blocking = non_blocking
        self._yielded = 0
        self._total = len(loader)
        if loader.active_loaders is not None:
            loader.active_loaders.push(self)

    @property
    def end_of_dataloader(self) -> bool:
        """True once the last batch of the epoch has been handed out."""
        return self._yielded >= self._total

    def __iter__(self) -> _DeviceIterator:
        return self

    def __next__(self) -> Any:
        try:
            batch = next(self._iterator)
        except StopIteration:
            if self.loader.active_loaders is not None:
                self.loader.active_loaders.remove(self)
            raise
        self._yielded += 1
        return send_to_device(batch, self._device, self._non_blocking)

    def __len__(self) -> int:
        return len(self._iterator)  # type: ignore[arg-type]


class PreparedDataLoader(DataLoader):
    """A DataLoader that yields batches on ``device`` and sets its sampler's epoch itself.

    Build it with ``prepare_data_loader``; the constructor takes DataLoader's arguments plus
    ``device``.
    """

    def __init__(
        self,
        *args: Any,
        device: torch.device,
        remainder: int = 0,
        active_loaders: ActiveLoaders | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.device = device
        # Real samples in the last gathered round (0: the last round holds no padding).
        self.remainder = remainder
        self.active_loaders = active_loaders
        self._next_epoch = 0

    def set_epoch(self, epoch: int) -> None:
        """Set the epoch the next iteration uses (the loader counts epochs by itself otherwise)."""
        self._next_epoch = epoch

    def __iter__(self) -> _DeviceIterator:  # type: ignore[override]
        epoch, self._next_epoch = self._next_epoch, self._next_epoch + 1
        for obj in (self.batch_sampler, self.sampler):
            if obj is not None and hasattr(obj, "set_epoch"):
                obj.set_epoch(epoch)
        # Create the underlying iterator now, not lazily: DataLoader draws its base seed when
        # iter() is called, and the RNG sequence must match the original loader's.
        non_blocking = self.pin_memory and self.device.type != "cpu"
        return _DeviceIterator(self, super().__iter__(), non_blocking)


def _shared_random(sampler: Any, state: ProcessState) -> Any:
    """Replace a plain RandomSampler by a SharedSeedRandomSampler; keep anything else."""
    if type(sampler) is not RandomSampler:
        return sampler
    return SharedSeedRandomSampler(
        sampler.data_source,
        partial(broadcast_int, state=state),
        replacement=sampler.replacement,
        num_samples=sampler._num_samples,
        generator=sampler.generator,
    )


def prepare_data_loader(
    loader: DataLoader,
    state: ProcessState,
    device: torch.device,
    even_batches: bool = True,
    active_loaders: ActiveLoaders | None = None,
) -> PreparedDataLoader:
    """Rebuild ``loader`` for this process: same dataset, collation and workers, sharded sampling.

    See the module docstring for the one-process and N-process guarantees.
    """
    common: dict[str, Any] = dict(
        num_workers=loader.num_workers,
        collate_fn=loader.collate_fn,
        pin_memory=loader.pin_memory,
        timeout=loader.timeout,
        worker_init_fn=loader.worker_init_fn,
        multiprocessing_context=loader.multiprocessing_context,
        generator=loader.generator,
        prefetch_factor=loader.prefetch_factor,
        persistent_workers=loader.persistent_workers,
        pin_memory_device=loader.pin_memory_device,
        in_order=getattr(loader, "in_order", True),
        device=device,
        active_loaders=active_loaders,
    )
    dataset = loader.dataset
    if isinstance(dataset, IterableDataset):
        if state.distributed:
            raise PrepareError(
                f"a DataLoader over an IterableDataset ({type(dataset).__name__}) was prepared "
                f"on {state.world_size} processes.",
                "a map-style dataset (with __len__ and __getitem__) when running on several "
                "processes; iterable datasets are only supported on one process so far.",
                "use a map-style dataset, or shard the iterable dataset yourself by "
                "accelerator.process_index and do not prepare its loader.",
            )
        return PreparedDataLoader(
            dataset, batch_size=loader.batch_size, drop_last=loader.drop_last, **common
        )

    batch_sampler = loader.batch_sampler
    if not state.distributed:
        if batch_sampler is None:
            return PreparedDataLoader(
                dataset, sampler=loader.sampler, batch_size=None, **common
            )
        return PreparedDataLoader(dataset, batch_sampler=batch_sampler, **common)

    n, rank = state.world_size, state.rank
    if batch_sampler is None:  # automatic batching off: shard single indices
        shard = ShardSampler(_shared_random(loader.sampler, state), n, rank, even_batches)
        remainder = len(loader.sampler) % n if even_batches else 0
        return PreparedDataLoader(
            dataset, sampler=shard, batch_size=None, remainder=remainder, **common
        )
    if type(batch_sampler) is BatchSampler:
        batch_sampler = BatchSampler(
            _shared_random(batch_sampler.sampler, state),
            batch_sampler.batch_size,
            batch_sampler.drop_last,
        )
    shard = ShardSampler(
        batch_sampler,
        n,
        rank,
        even_batches,
        drop_last=bool(getattr(batch_sampler, "drop_last", False)),
        batch_size=getattr(batch_sampler, "batch_size", None),
    )
    remainder = 0
    if even_batches and not shard.drop_last and shard.batch_size is not None:
        sampler = getattr(batch_sampler, "sampler", None)
        if isinstance(sampler, Sized):
            remainder = len(sampler) % (n * shard.batch_size)
    return PreparedDataLoader(dataset, batch_sampler=shard, remainder=remainder, **common)
