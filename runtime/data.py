"""Prepared data loaders: per-rank sharding, per-epoch shared shuffling, device placement.

One process: the prepared loader reuses the original sampler / batch sampler unchanged, so it
yields the same batches in the same order and draws from the global RNG exactly like the original
(a migrated script's losses stay bit-identical).

N processes: rank ``i`` gets global batches ``i, i+n, i+2n, ...`` of the original batch sampler
(HF Accelerate's assignment). A shuffling ``RandomSampler`` is replaced by ``SharedSeedRandomSampler``,
which draws its seed where ``RandomSampler`` does and takes rank 0's value (one broadcast per epoch),
so every rank walks the same permutation and it changes every epoch.

``split_batches=True`` (``SplitBatchSampler``): rank ``i`` gets slice ``i`` of every global batch
(``batch_size / n`` samples each), so N processes together see exactly the one-process batches in
the one-process order.

IterableDataset on N processes (``IterableDatasetShard``, HF Accelerate's semantics): every rank
iterates the whole dataset, cuts it into buffers of ``batch_size * n`` samples (``batch_size``
with ``split_batches``) and keeps its slice ``i`` of each buffer; an unfinished last buffer is
completed by cycling the epoch's first samples (dropped instead with ``drop_last``). On one
process the original loader's batches come through unchanged.
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
        try:
            self._total: int | None = len(loader)
        except TypeError:  # an IterableDataset without __len__: look one batch ahead instead
            self._total = None
        self._ahead: list[Any] = []
        self._exhausted = False
        if loader.active_loaders is not None:
            loader.active_loaders.push(self)

    @property
    def end_of_dataloader(self) -> bool:
        """True once the last batch of the epoch has been handed out."""
        if self._total is None:
            return self._exhausted and not self._ahead
        return self._yielded >= self._total

    def _fetch(self) -> Any:
        """The next raw batch; for unsized loaders, keeps one batch in hand to see the end coming."""
        if self._total is not None:
            return next(self._iterator)
        if not self._ahead and not self._exhausted:
            self._ahead.append(next(self._iterator))  # first batch (StopIteration: empty epoch)
        if not self._ahead:
            raise StopIteration
        batch = self._ahead.pop()
        try:
            self._ahead.append(next(self._iterator))
        except StopIteration:
            self._exhausted = True
        return batch

    def __iter__(self) -> _DeviceIterator:
        return self

    def __next__(self) -> Any:
        try:
            batch = self._fetch()
        except StopIteration:
            self._exhausted = True
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
    split_batches: bool = False,
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
    n, rank = state.world_size, state.rank
    batch_size = loader.batch_size
    if batch_size is None:  # a custom batch_sampler: DataLoader.batch_size is None then
        batch_size = getattr(loader.batch_sampler, "batch_size", None)
    if split_batches and state.distributed:
        _check_split(loader, batch_size, n)
    if isinstance(dataset, IterableDataset):
        if not state.distributed:
            return PreparedDataLoader(
                dataset, batch_size=batch_size, drop_last=loader.drop_last, **common
            )
        shard = IterableDatasetShard(
            dataset,
            batch_size=batch_size or 1,
            num_processes=n,
            process_index=rank,
            split_batches=split_batches and batch_size is not None,
            drop_last=loader.drop_last,
        )
        try:
            remainder = len(dataset) % shard.buffer_size  # type: ignore[arg-type]
        except TypeError:
            remainder = -1  # unknown until the epoch ends: gather_for_metrics asks the shard
        return PreparedDataLoader(
            shard,
            batch_size=None if batch_size is None else shard.process_batch_size,
            drop_last=False,
            remainder=0 if loader.drop_last else remainder,
            **common,
        )

    batch_sampler = loader.batch_sampler
    if not state.distributed:
        if batch_sampler is None:
            return PreparedDataLoader(
                dataset, sampler=loader.sampler, batch_size=None, **common
            )
        return PreparedDataLoader(dataset, batch_sampler=batch_sampler, **common)

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
    if split_batches:
        split = SplitBatchSampler(batch_sampler, n, rank, batch_size, even_batches)
        remainder = 0
        sampler = getattr(batch_sampler, "sampler", None)
        drop_last = bool(getattr(batch_sampler, "drop_last", False))
        if even_batches and not drop_last and batch_size and isinstance(sampler, Sized):
            remainder = len(sampler) % batch_size
        return PreparedDataLoader(dataset, batch_sampler=split, remainder=remainder, **common)
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


def _check_split(loader: DataLoader, batch_size: int | None, num_processes: int) -> None:
    """``split_batches`` needs a batch size that the number of processes divides."""
    if batch_size is None and loader.batch_sampler is None:
        raise PrepareError(
            "split_batches=True was given a DataLoader with batch_size=None (no batching).",
            "a batched DataLoader whose batch_size is a multiple of the number of processes.",
            "give the DataLoader a batch_size, or use split_batches=False.",
        )
    if batch_size is not None and batch_size % num_processes != 0:
        raise PrepareError(
            f"split_batches=True cannot split batch_size={batch_size} across "
            f"{num_processes} processes: {batch_size} is not a multiple of {num_processes}.",
            f"a batch_size that is a multiple of the number of processes ({num_processes}), "
            "so that every process gets batch_size / num_processes samples of each batch.",
            f"use a batch_size divisible by {num_processes} (e.g. "
            f"{max(num_processes, batch_size // num_processes * num_processes)}), launch a "
            "number of processes that divides it, or use split_batches=False.",
        )
