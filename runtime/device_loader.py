"""The prepared loader itself: batches moved to the device, the loader being iterated
(for ``accumulate`` and ``gather_for_metrics``), epochs, ``skip_first_batches`` and its state."""

from __future__ import annotations

import copy
import weakref
from collections.abc import Iterator
from typing import Any, TypeVar

import torch
from torch.utils.data import DataLoader, IterableDataset, Sampler

from .errors import PrepareError
from .loader_state import LoaderProgress, find_generators, restore_rng_snapshot, rng_snapshot
from .ops import apply_to_tensors

T = TypeVar("T")


def send_to_device(batch: T, device: torch.device, non_blocking: bool = False) -> T:
    """Move every tensor in a (nested) batch to ``device``; tensors already there are not copied.

    Another object with a ``to`` method (PyG's ``Batch``, a collate function's own batch class) is
    moved with it, as HF Accelerate's ``send_to_device`` does: the migration drops the script's own
    ``batch = batch.to(device)`` for a prepared loader's batches."""

    def move_object(obj: Any) -> Any:
        to = getattr(obj, "to", None)
        if isinstance(obj, type) or not callable(to):
            return obj  # strings, numbers, None...: left as they are
        try:
            return to(device, non_blocking=non_blocking)
        except TypeError:  # a `to(device)` without non_blocking
            return to(device)

    return apply_to_tensors(batch, lambda t: t.to(device, non_blocking=non_blocking), move_object)


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

    def clear(self) -> None:
        """Forget the iterators in progress (``free_memory``). The object itself stays: every loader
        prepared before keeps reporting to it when it is iterated again."""
        self._stack = []

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

    def __copy__(self) -> PreparedDataLoader:
        # A shallow copy (skip_first_batches' views) shares the epoch counter and the active
        # loaders: not what __getstate__ gives a pickled copy.
        view = object.__new__(type(self))
        view.__dict__.update(self.__dict__)
        return view

    def __getstate__(self) -> dict[str, Any]:
        """Pickled (a Dataset holding it, sent to spawn/forkserver DataLoader workers): without
        the running iteration (its workers, the Accelerator's stack of active loaders)."""
        state = self.__dict__.copy()
        state["_iterator"] = None
        state["active_loaders"] = None
        state["_progress"] = copy.copy(self._progress)
        state["_progress"].current = None
        return state

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
            # ``sampler`` may be the user's own sampler shown as ``loader.sampler`` (data.py):
            # its epoch is the batch sampler's business, as in the unprepared loader.
            sampler = None if self.__dict__.get("_shows_user_sampler") else self.sampler
            for obj in (self.batch_sampler, sampler):
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
