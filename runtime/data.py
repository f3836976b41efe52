"""Prepared data loaders: per-rank sharding, per-epoch shared shuffling, device placement.

One process: the prepared loader reuses the original sampler / batch sampler unchanged, so it
yields the same batches in the same order and draws from the global RNG exactly like the original
(a migrated script's losses stay bit-identical).

N processes: rank ``i`` gets global batches ``i, i+n, i+2n, ...`` of the original batch sampler
(HF Accelerate's assignment). A shuffling ``RandomSampler`` is replaced by ``SharedSeedRandomSampler``,
which draws its seed where ``RandomSampler`` does and takes rank 0's value (one broadcast per epoch),
so every rank walks the same permutation and it changes every epoch. A sampler with an explicit
``generator`` walks that generator itself, as ``RandomSampler`` does, after taking rank 0's state
(as HF Accelerate does): N processes then see the one-process order, and Accelerate's batches.

``split_batches=True`` (``SplitBatchSampler``): rank ``i`` gets slice ``i`` of every global batch
(``batch_size / n`` samples each), so N processes together see exactly the one-process batches in
the one-process order.

IterableDataset on N processes (``IterableDatasetShard``, HF Accelerate's semantics): every rank
iterates the whole dataset, cuts it into buffers of ``batch_size * n`` samples (``batch_size``
with ``split_batches``) and keeps its slice ``i`` of each buffer; an unfinished last buffer is
completed by cycling the epoch's first samples (dropped instead with ``drop_last``). On one
process the original loader's batches come through unchanged.

A loader that already shards by rank (``kept_sharding_sampler``: its sampler, batch sampler or
batch sampler's sampler is a ``DistributedSampler``, or has ``num_replicas`` and ``rank``) is
never sharded again: sharding it a second time would give each rank 1/N^2 of the data. It is kept
as it is (device placement, epoch counting, end-of-loader bookkeeping added), with one warning on
the main process; a sampler built for another number of processes or another rank is a
``PrepareError`` naming both. The runtime sets such a sampler's epoch itself unless the script
does (``sampler.set_epoch(e)`` before iterating wins). For torch's ``DistributedSampler``,
``gather_for_metrics`` drops the samples it repeats to pad the epoch (``keep_rows``), so an
epoch again gathers exactly ``len(dataset)`` items; the padding of other sharding samplers is
unknown and stays in.
"""

from __future__ import annotations

import copy
import math
import warnings
import weakref
from collections.abc import Callable, Iterable, Iterator, Sized
from dataclasses import dataclass
from functools import partial
from typing import Any, TypeVar

import torch
from torch.utils.data import BatchSampler, DataLoader, IterableDataset, RandomSampler, Sampler
from torch.utils.data.distributed import DistributedSampler

from .checkpoint import capture_rng_state, restore_rng_state
from .errors import PrepareError
from .ops import apply_to_tensors, broadcast_generator, broadcast_int
from .state import ProcessState

T = TypeVar("T")


def send_to_device(batch: T, device: torch.device, non_blocking: bool = False) -> T:
    """Move every tensor in a (nested) batch to ``device``; tensors already there are not copied."""
    return apply_to_tensors(batch, lambda t: t.to(device, non_blocking=non_blocking))


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

    def __init__(
        self, loader: PreparedDataLoader, iterator: Iterator[Any], non_blocking: bool, start: int = 0
    ) -> None:
        self.loader = loader
        self._iterator = iterator
        self._device = loader.device
        self._non_blocking = non_blocking
        self._yielded = start  # batches of this epoch handed out, counting skipped ones
        try:
            self._total: int | None = len(loader) + loader.skip_batches
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


_END = object()


@dataclass
class LoaderProgress:
    """Where a prepared loader stands in its epochs (shared with its skip_first_batches views)."""

    next_epoch: int = 0
    epoch: int = 0  # the epoch of the latest iteration
    current: weakref.ref[_DeviceIterator] | None = None  # that iteration, while it is alive
    epoch_start: dict[str, Any] | None = None  # the RNG states that iteration started from
    resume: dict[str, Any] | None = None  # a mid-epoch position restored by load_state_dict


def find_generators(loader: DataLoader) -> list[torch.Generator]:
    """The ``torch.Generator`` objects that decide a loader's order (loader, samplers), in order."""
    found: list[torch.Generator] = []
    seen: set[int] = set()
    pending: list[tuple[Any, int]] = [(loader, 0)]
    while pending:
        obj, depth = pending.pop(0)
        if obj is None or id(obj) in seen or depth > 4:
            continue
        seen.add(id(obj))
        if isinstance(obj, torch.Generator):
            found.append(obj)
            continue
        for name in ("generator", "batch_sampler", "sampler", "source"):
            child = getattr(obj, name, None)
            if isinstance(child, (torch.Generator, Sampler, BatchSampler)) or (
                child is not None and name != "generator" and hasattr(child, "__iter__")
            ):
                pending.append((child, depth + 1))
    return found


def rng_snapshot(generators: list[torch.Generator]) -> dict[str, Any]:
    """This process's python/numpy/torch RNG states plus the given generators' states."""
    return {
        "rng": capture_rng_state(include_cuda=False),
        "generators": [generator.get_state() for generator in generators],
    }


def restore_rng_snapshot(snapshot: dict[str, Any], generators: list[torch.Generator]) -> None:
    """Set the states ``rng_snapshot`` captured."""
    restore_rng_state(snapshot["rng"])
    for generator, state in zip(generators, snapshot["generators"]):
        generator.set_state(state)


class _SkipFirst(Sampler[Any]):
    """An index sampler whose iterators drop the first ``count`` items, until one has done so.

    DataLoader's iterators may call ``iter()`` more than once before fetching (multi-worker
    iterators do); only the first skip that really happens counts, later iterators (e.g. the next
    epoch of persistent workers) pass everything through.
    """

    def __init__(self, source: Any, count: int) -> None:
        self.source = source
        self.count = count
        self.done = False
        self._last: _SkippingIterator | None = None

    def __iter__(self) -> Iterator[Any]:
        if self.done:
            return iter(self.source)
        self._last = _SkippingIterator(self, iter(self.source), self.count)
        return self._last

    def __len__(self) -> int:
        return max(len(self.source) - (0 if self.done else self.count), 0)

    def skip_now(self) -> None:
        """Perform the pending skip of the latest iterator (this draws the epoch's shuffle)."""
        if self._last is not None:
            self._last.skip()


class _SkippingIterator:
    def __init__(self, view: _SkipFirst, iterator: Iterator[Any], count: int) -> None:
        self._view = view
        self._iterator = iterator
        self._count = count

    def skip(self) -> None:
        while self._count > 0:
            self._count -= 1
            if next(self._iterator, _END) is _END:
                self._count = 0
        self._view.done = True

    def __iter__(self) -> _SkippingIterator:
        return self

    def __next__(self) -> Any:
        if self._count:
            self.skip()
        return next(self._iterator)


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
        keep_rows: list[int] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.device = device
        # Real samples in the last gathered round (0: the last round holds no padding).
        self.remainder = remainder
        # A kept DistributedSampler's padding is not a tail of the last gathered round: the rows
        # of that round that are real samples (None: all of them, or use ``remainder``).
        self.keep_rows = keep_rows
        # A sharding sampler kept as it is, and the epoch this loader last gave it (to tell
        # whether the script set another one itself: then the script's value wins).
        self._kept_sampler: Any = None
        self._kept_epoch: list[Any] = [None]  # shared with skip_first_batches views
        self.active_loaders = active_loaders
        # Epoch counter and checkpoint position; shared with skip_first_batches views.
        self._progress = LoaderProgress()
        self.skip_batches = 0  # > 0 only in loaders returned by skip_first_batches
        self._skip_view: _SkipFirst | None = None

    def set_epoch(self, epoch: int) -> None:
        """Set the epoch the next iteration uses (the loader counts epochs by itself otherwise)."""
        self._progress.next_epoch = epoch

    def __len__(self) -> int:
        return max(super().__len__() - getattr(self, "skip_batches", 0), 0)

    @property
    def _index_sampler(self) -> Any:
        # DataLoader's iterators read their (batch) sampler here; while an iteration that skips
        # batches starts, this is the skipping view (see _start_iteration).
        view = self.__dict__.get("_skip_view")
        return view if view is not None else DataLoader._index_sampler.fget(self)  # type: ignore[attr-defined]

    def __iter__(self) -> _DeviceIterator:  # type: ignore[override]
        progress = self._progress
        resume, progress.resume = progress.resume, None
        if resume is not None:  # the epoch load_state_dict restored: continue it
            epoch, start = resume["epoch"], self.skip_batches or resume["position"]
        else:
            epoch, start = progress.next_epoch, self.skip_batches
        progress.next_epoch = epoch + 1
        kept = self._kept_sampler
        if kept is not None:
            self._set_kept_epoch(kept, epoch)
        else:
            for obj in (self.batch_sampler, self.sampler):
                if obj is not None and hasattr(obj, "set_epoch"):
                    obj.set_epoch(epoch)
        generators = find_generators(self)
        if resume is not None:
            # Replay the epoch's start from the RNG states it began with (same shuffle, same
            # worker seeds), skip what was already trained on, then return to the restored states.
            restored = rng_snapshot(generators)
            epoch_start = resume["epoch_start"]
            restore_rng_snapshot(epoch_start, generators)
            try:
                iterator = self._start_iteration(start)
            finally:
                restore_rng_snapshot(restored, generators)
        else:
            epoch_start = rng_snapshot(generators)
            # Create the underlying iterator now, not lazily: DataLoader draws its base seed when
            # iter() is called, and the RNG sequence must match the original loader's.
            iterator = self._start_iteration(start)
        non_blocking = self.pin_memory and self.device.type != "cpu"
        device_iterator = _DeviceIterator(self, iterator, non_blocking, start)
        progress.epoch, progress.epoch_start = epoch, epoch_start
        progress.current = weakref.ref(device_iterator)
        return device_iterator

    def _set_kept_epoch(self, sampler: Any, epoch: int) -> None:
        """Give a kept sharding sampler this iteration's epoch, unless the script set one."""
        if not hasattr(sampler, "set_epoch"):
            return
        current, given = getattr(sampler, "epoch", None), self._kept_epoch[0]
        if current is not None and given is not None and current != given:
            self._kept_epoch[0] = current  # the script called set_epoch itself: keep its value
            return
        sampler.set_epoch(epoch)
        self._kept_epoch[0] = getattr(sampler, "epoch", epoch)

    def _start_iteration(self, start: int) -> Iterator[Any]:
        """``DataLoader.__iter__``, with the epoch's first ``start`` batches skipped.

        Map-style datasets skip indices in the (batch) sampler without loading the samples; an
        IterableDataset is iterated and the skipped batches are dropped.
        """
        if start <= 0:
            return super().__iter__()
        if isinstance(self.dataset, IterableDataset):
            iterator = super().__iter__()
            for _ in range(start):
                if next(iterator, _END) is _END:
                    break
            return iterator
        view = _SkipFirst(DataLoader._index_sampler.fget(self), start)  # type: ignore[attr-defined]
        if self.persistent_workers and self.num_workers > 0:
            self._iterator = None  # its workers keep their old sampler: start fresh ones
        self._skip_view = view
        try:
            iterator = super().__iter__()
        finally:
            self._skip_view = None
        view.skip_now()  # draw the shuffle now, from the epoch's RNG states (no-op if done)
        return iterator

    def state_dict(self) -> dict[str, Any]:
        """Epoch, batches already yielded in it, and the RNG states needed to replay its order.

        Only tensors, ints, bools, tuples and dicts: loadable with ``torch.load(weights_only=True)``.
        A loader whose last iterator was abandoned (and collected) counts as between epochs.
        """
        progress = self._progress
        generators = [g.get_state() for g in find_generators(self)]
        if progress.resume is not None:  # restored but not iterated yet
            return {**progress.resume, "generators": generators}
        current = progress.current() if progress.current is not None else None
        if current is not None and not current.end_of_dataloader:
            return {
                "epoch": progress.epoch,
                "position": current._yielded,
                "in_progress": True,
                "epoch_start": progress.epoch_start,
                "generators": generators,
            }
        return {
            "epoch": progress.next_epoch,
            "position": 0,
            "in_progress": False,
            "epoch_start": None,
            "generators": generators,
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore ``state_dict()``: the next iteration continues where the saved one stood."""
        generators = find_generators(self)
        saved = state_dict["generators"]
        if len(saved) != len(generators):
            raise PrepareError(
                f"the saved data loader state holds {len(saved)} torch.Generator states but this "
                f"loader uses {len(generators)}.",
                "the same DataLoader configuration (sampler, generator) as when saving.",
                "build the DataLoader exactly as in the run that saved the checkpoint.",
            )
        for generator, generator_state in zip(generators, saved):
            generator.set_state(generator_state)
        progress = self._progress
        progress.current = None
        if state_dict["in_progress"]:
            progress.resume = {k: v for k, v in state_dict.items() if k != "generators"}
        else:
            progress.resume = None
            progress.next_epoch = int(state_dict["epoch"])

    def skip_first_batches(self, num_batches: int) -> PreparedDataLoader:
        """This loader, minus the first ``num_batches`` batches of each iteration (not loaded).

        The returned loader shares this one's epoch counter and checkpoint position; if
        ``load_state`` restored a position, ``num_batches`` replaces it (no double skipping).
        """
        if isinstance(num_batches, bool) or not isinstance(num_batches, int) or num_batches < 0:
            raise PrepareError(
                f"skip_first_batches got num_batches={num_batches!r}.",
                "a non-negative integer number of batches.",
                "pass the number of batches of this epoch that were already trained on.",
            )
        view = copy.copy(self)
        view.skip_batches = self.skip_batches + num_batches
        view._iterator = None  # never share persistent workers
        return view


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
        share_generator=partial(broadcast_generator, state=state),
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
    sharding = kept_sharding_sampler(loader)
    if sharding is not None:
        return _keep_sharded(loader, sharding, state, common)
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


def kept_sharding_sampler(loader: DataLoader) -> Any | None:
    """The sampler of ``loader`` that already shards by rank, or None.

    Looks at the sampler, the batch sampler and the batch sampler's sampler: a
    ``DistributedSampler`` (or subclass), or any object with ``num_replicas`` and ``rank``.
    """
    batch_sampler = loader.batch_sampler
    candidates = (loader.sampler, batch_sampler, getattr(batch_sampler, "sampler", None))
    for obj in candidates:
        if isinstance(obj, DistributedSampler):
            return obj
    for obj in candidates:
        if obj is not None and hasattr(obj, "num_replicas") and hasattr(obj, "rank"):
            return obj
    return None


def _keep_sharded(
    loader: DataLoader, sharding: Any, state: ProcessState, common: dict[str, Any]
) -> PreparedDataLoader:
    """``loader`` with its own sharding sampler, after checking it was built for this job."""
    name = type(sharding).__name__
    replicas, rank = getattr(sharding, "num_replicas"), getattr(sharding, "rank")
    if replicas != state.world_size:
        raise PrepareError(
            f"the DataLoader's {name} shards for num_replicas={replicas} processes, but this "
            f"job runs {state.world_size} process(es) (WORLD_SIZE={state.world_size}).",
            f"a sampler built for {state.world_size} process(es), or none that shards.",
            f"drop the {name} and pass shuffle=... to the DataLoader (prepare() shards it for "
            "every process), or build it with num_replicas=accelerator.num_processes, "
            "rank=accelerator.process_index.",
        )
    if rank != state.rank:
        raise PrepareError(
            f"the DataLoader's {name} was built for rank={rank}, but this process is rank "
            f"{state.rank} of {state.world_size}.",
            "every process's sampler built with its own rank.",
            f"drop the {name} (prepare() shards the DataLoader itself), or build it with "
            "rank=accelerator.process_index.",
        )
    keep_rows = _distributed_sampler_keep_rows(loader, sharding)
    if state.is_main_process and state.distributed:
        trimmed = type(sharding).__iter__ is DistributedSampler.__iter__
        warnings.warn(
            f"prepare(): the DataLoader's {name} already shards by rank (num_replicas={replicas}); "
            "it is kept as it is and not sharded again. "
            + (
                "gather_for_metrics drops the samples it repeats to pad the epoch."
                if trimmed
                else "gather_for_metrics cannot tell which samples it repeats: they stay in."
            ),
            stacklevel=6,
        )
    batch_sampler = loader.batch_sampler
    if batch_sampler is None:
        prepared = PreparedDataLoader(
            loader.dataset, sampler=loader.sampler, batch_size=None, keep_rows=keep_rows, **common
        )
    elif type(batch_sampler) is BatchSampler and batch_sampler.sampler is loader.sampler:
        # DataLoader(sampler=..., batch_size=...): rebuilt the same way, so that
        # ``prepared.sampler`` is still the script's sampler (``loader.sampler.set_epoch(e)``).
        prepared = PreparedDataLoader(
            loader.dataset,
            sampler=loader.sampler,
            batch_size=batch_sampler.batch_size,
            drop_last=batch_sampler.drop_last,
            keep_rows=keep_rows,
            **common,
        )
    else:
        prepared = PreparedDataLoader(
            loader.dataset, batch_sampler=batch_sampler, keep_rows=keep_rows, **common
        )
    prepared._kept_sampler = sharding
    prepared._kept_epoch = [getattr(sharding, "epoch", None)]
    return prepared


def _distributed_sampler_keep_rows(loader: DataLoader, sampler: Any) -> list[int] | None:
    """The real rows of the last gathered round over a kept ``DistributedSampler``.

    ``DistributedSampler`` pads its index list to ``num_samples * num_replicas`` by repeating
    its first indices, then gives rank ``r`` positions ``r, r + n, ...``: position ``p`` is rank
    ``p % n``'s item ``p // n`` and is padding when ``p >= len(dataset)``. The last gathered
    round holds each rank's last batch (``k`` items from rank-local position ``start``) in rank
    order, so row ``r * k + j`` is real when ``(start + j) * n + r < len(dataset)``. None when
    the round holds no padding or the sampler is not torch's (its order is then unknown).
    """
    if not isinstance(sampler, DistributedSampler) or sampler.drop_last:
        return None
    if type(sampler).__iter__ is not DistributedSampler.__iter__:
        return None
    n, per_rank = sampler.num_replicas, sampler.num_samples
    total = len(sampler.dataset)  # type: ignore[arg-type]
    if per_rank * n <= total:
        return None
    batch_sampler = loader.batch_sampler
    if batch_sampler is None:
        start, k = per_rank - 1, 1
    else:
        if getattr(batch_sampler, "sampler", None) is not sampler or type(batch_sampler) is not BatchSampler:
            return None
        batches = len(batch_sampler)
        if batches == 0:
            return None
        start = (batches - 1) * batch_sampler.batch_size
        k = min(batch_sampler.batch_size, per_rank - start)
    rows = [r * k + j for r in range(n) for j in range(k) if (start + j) * n + r < total]
    return None if len(rows) == n * k else rows


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
