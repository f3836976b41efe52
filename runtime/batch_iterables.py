"""Batch sources that are not DataLoaders, prepared for N processes (``PreparedIterable``).

A training loop may iterate something else than a torch DataLoader: a torchtext
``BucketIterator``, a loader wrapper of another library, a class of the script's own that makes
batches, a list of batches. ``prepare`` cannot rebuild its sampling, but it can share out what it
yields. On one process ``prepare`` returns the object itself (nothing to share: the loop trains
exactly as before). On N processes it returns a ``PreparedIterable``:

- every rank iterates the whole source and keeps batch ``i`` when ``i % N`` is its rank (HF
  Accelerate's assignment of a DataLoader's batches); a rank takes its batch at the end of each
  round of N batches, so at most one round and the epoch's first N batches are held, also for an
  endless source (no ``__len__``, or one that repeats);
- with ``even_batches`` (the default) an incomplete last round is completed from the epoch's first
  batches, as Accelerate completes a DataLoader's last batch: every rank takes the same number of
  steps (a rank with one step more would wait for the others in its gradient all-reduce forever);
  without it the ranks past the round's end stop one step earlier;
- the batches are yielded as the source makes them, not moved: their type is unknown, and the loop
  keeps its own ``.to(device)`` (with ``device = accelerator.device``, each process's device);
- attribute reads and writes go to the source (``train_iter.epoch``, ``init_epoch()``,
  ``dataset``, ``batch_size``...); ``len()`` is this rank's number of batches per epoch.

Sharding by position needs every rank to see the same batches in the same order: a source that
shuffles with an unseeded RNG (a torchtext iterator with ``train=True`` takes python ``random``'s
state when it is built) would give each rank another epoch, and the shares would overlap. So each
epoch the ranks compare a digest of the first round's batches (one small ``all_gather_object``),
and all raise ``PrepareError`` when they differ, before any step of that round. Every rank must
therefore start iterating the prepared source, as every rank does in a training loop.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from typing import Any

import torch

from .errors import PrepareError
from .ops import gather_object
from .state import ProcessState

__all__ = ["PreparedIterable", "batch_digest"]

_OWN = ("_source", "_state", "_even_batches")
_ITEMS = 16  # items of a list / dict / object a digest looks at


class PreparedIterable:
    """This rank's share of the batches of ``source`` (see the module docstring)."""

    def __init__(self, source: Any, state: ProcessState, even_batches: bool = True) -> None:
        object.__setattr__(self, "_source", source)
        object.__setattr__(self, "_state", state)
        object.__setattr__(self, "_even_batches", even_batches)

    # -- the user's object -------------------------------------------------------------------

    def __getattr__(self, name: str) -> Any:
        # Reached only for names this class lacks: the source's own attributes and methods.
        if name in _OWN or name.startswith("__"):
            raise AttributeError(name)
        return getattr(self._source, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._source, name, value)

    def __delattr__(self, name: str) -> None:
        delattr(self._source, name)

    def __repr__(self) -> str:
        state = self._state
        return f"PreparedIterable({self._source!r}, rank {state.rank} of {state.world_size})"

    def __len__(self) -> int:
        total = len(self._source)
        n, rank = self._state.world_size, self._state.rank
        if self._even_batches:
            return -(-total // n)
        return len(range(rank, total, n))

    # -- this rank's share ---------------------------------------------------------------------

    def __iter__(self) -> Iterator[Any]:
        n, rank = self._state.world_size, self._state.rank
        first: list[Any] = []  # the epoch's first round: checked, and completes the last round
        mine: Any = None
        count = 0
        for batch in self._source:
            if count < n:
                first.append(batch)
            if count % n == rank:
                mine = batch
            count += 1
            if count == n:
                self._check_same(first)
                if not self._even_batches:
                    first = []
            if count % n == 0:
                batch, mine = mine, None
                yield batch
        if count < n:
            self._check_same(first)
        left = count % n
        if left == 0:
            return
        if rank < left:
            batch, mine = mine, None
            yield batch
        elif self._even_batches:
            yield first[(rank - left) % len(first)]

    def _check_same(self, batches: list[Any]) -> None:
        digests = gather_object(batch_digest(batches), self._state)
        if any(d != digests[0] for d in digests):
            kind = f"{type(self._source).__module__}.{type(self._source).__qualname__}"
            differ = [rank for rank, d in enumerate(digests) if d != digests[0]]
            raise PrepareError(
                f"the prepared {kind} gave other batches on process(es) {differ} than on process 0 at the "
                "start of this epoch: its batches are shared out by position, so the processes would train "
                "on overlapping shares and miss others.",
                "a batch source that makes the same batches in the same order on every process (each then "
                "keeps every N-th of them).",
                "seed the random generators it draws from with the same value on every process before it is "
                "built (`random.seed(s)`, `numpy.random.seed(s)`, `torch.manual_seed(s)`; a torchtext "
                "iterator with train=True shuffles with python random's state taken when it is built), or "
                "build the batches with a torch.utils.data.DataLoader, which prepare() shards with a shared "
                "shuffle.",
            )


def batch_digest(batches: Any) -> str:
    """A short digest of what a batch holds: its tensors' shapes, dtypes and (position-weighted)
    sums, its numbers and strings, looked up through lists, dicts and object attributes (the first
    few items of each, a few levels deep): equal on every rank when the batches are."""
    return hashlib.sha256(repr(_summary(batches, 4)).encode()).hexdigest()


def _summary(obj: Any, depth: int) -> Any:
    if obj is None or isinstance(obj, (bool, int, float, complex, str, bytes)):
        return obj
    if isinstance(obj, torch.Tensor):
        return _tensor_summary(obj)
    if type(obj).__module__ == "numpy" and hasattr(obj, "shape") and hasattr(obj, "dtype"):
        try:
            return _tensor_summary(torch.as_tensor(obj))
        except (TypeError, RuntimeError, ValueError):
            return ("ndarray", str(obj.dtype), tuple(obj.shape))
    name = f"{type(obj).__module__}.{type(obj).__qualname__}"
    if depth <= 0:
        return name
    if isinstance(obj, (list, tuple)):
        return (name, len(obj), [_summary(item, depth - 1) for item in obj[:_ITEMS]])
    if isinstance(obj, dict):
        items = sorted(obj.items(), key=lambda kv: repr(kv[0]))[:_ITEMS]
        return (name, len(obj), [(repr(k), _summary(v, depth - 1)) for k, v in items])
    fields = getattr(obj, "__dict__", None)
    if isinstance(fields, dict):
        items = sorted(fields.items())[:_ITEMS]
        return (name, [(k, _summary(v, depth - 1)) for k, v in items])
    return name


def _tensor_summary(tensor: torch.Tensor) -> Any:
    t = tensor.detach()
    shape = tuple(t.shape)
    if t.is_complex():
        t = torch.view_as_real(t)
    try:
        flat = t.reshape(-1).to(torch.float64)
    except (RuntimeError, TypeError):
        return ("tensor", str(tensor.dtype), shape)
    weights = torch.arange(1, flat.numel() + 1, dtype=torch.float64, device=flat.device)
    return ("tensor", str(tensor.dtype), shape, float(flat.sum()), float((flat * weights).sum()))
