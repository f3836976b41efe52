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

Sharding by position needs every rank to see the same batches in the same order. A source that
shuffles with a random generator of its own, built from RNGs seeded differently on each process (a
torchtext iterator with ``train=True`` keeps python ``random``'s state taken when it is built),
would give each rank another epoch, and the shares would overlap: at ``prepare`` the random
generators the source holds (``torch.Generator``, ``random.Random``, a python ``random`` state,
numpy's ``RandomState`` / ``Generator``, found among its attributes and theirs) take rank 0's
states (one object broadcast), as a DataLoader's ``generator`` does. A source that draws from the
global RNGs while it iterates is not changed: each epoch the ranks compare a digest of the first
round's batches (one small ``all_gather_object``), and all raise ``PrepareError`` when they differ,
before any step of that round, saying to seed those RNGs alike. Every rank must therefore start
iterating the prepared source, as every rank does in a training loop.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterator
from typing import Any

import torch

from .errors import PrepareError
from .ops import broadcast_object, gather_object
from .state import ProcessState

__all__ = ["PreparedIterable", "batch_digest", "share_own_generators"]

_OWN = ("_source", "_state", "_even_batches")
_ITEMS = 16  # items of a list / dict / object a digest looks at


class PreparedIterable:
    """This rank's share of the batches of ``source`` (see the module docstring)."""

    def __init__(self, source: Any, state: ProcessState, even_batches: bool = True) -> None:
        share_own_generators(source, state)
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

    def __bool__(self) -> bool:  # as the source answers (without it, `len()` would decide)
        return bool(self._source)

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
    sums, its numbers and strings, looked up through lists, dicts and the tensor / list / dict
    attributes of objects (the first few items of each, a few levels deep): equal on every rank
    when the batches are."""
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
        # an object's data: its tensors and arrays, and the lists / dicts holding them; not its
        # other attributes (a `dataset` it points to, a device name, a rank), which may differ per process
        items = sorted((k, v) for k, v in fields.items() if isinstance(k, str) and _is_data(v))[:_ITEMS]
        return (name, [(k, _summary(v, depth - 1)) for k, v in items])
    return name


def _is_data(value: Any) -> bool:
    return isinstance(value, (torch.Tensor, list, tuple, dict)) or (
        type(value).__module__ == "numpy" and hasattr(value, "shape"))


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


# -- the source's own random generators ---------------------------------------------------------

_DEPTH = 2  # the source's attributes, and theirs (torchtext: `iterator.random_shuffler._random_state`)


def share_own_generators(source: Any, state: ProcessState) -> None:
    """Give the random generators ``source`` holds rank 0's states (a collective: every rank calls
    it with a source of the same structure); on one process nothing happens."""
    if not state.distributed:
        return
    own = _generators(source)
    ranks0 = broadcast_object([(path, kind, _get_state(kind, value)) for path, kind, value, _ in own], state)
    if state.rank == 0:
        return
    mine = {path: (kind, value, parent) for path, kind, value, parent in own}
    for path, kind, rank0_state in ranks0:
        found = mine.get(path)
        if found is not None and found[0] == kind:
            _set_state(kind, found[1], found[2], path[-1], rank0_state)


def _generators(obj: Any, depth: int = _DEPTH, path: tuple[str, ...] = (),
                seen: set[int] | None = None) -> list[tuple[tuple[str, ...], str, Any, Any]]:
    """(attribute path, kind, generator, the object holding it) for each random generator found."""
    seen = set() if seen is None else seen
    fields = getattr(obj, "__dict__", None)
    if not isinstance(fields, dict) or id(obj) in seen:
        return []
    seen.add(id(obj))
    found = []
    for name in sorted(k for k in fields if isinstance(k, str)):
        value = fields[name]
        kind = _kind(value)
        if kind is not None:
            found.append(((*path, name), kind, value, obj))
        elif depth > 1 and not isinstance(value, (type, torch.Tensor, list, tuple, dict, set)):
            found += _generators(value, depth - 1, (*path, name), seen)
    return found


def _kind(value: Any) -> str | None:
    if isinstance(value, torch.Generator):
        return "torch"
    if isinstance(value, random.Random):
        return "random"
    if (isinstance(value, tuple) and len(value) == 3 and value[0] == 3 and isinstance(value[1], tuple)
            and len(value[1]) == 625):  # `random.getstate()` kept as a value (torchtext's RandomShuffler)
        return "random_state"
    module = type(value).__module__ or ""
    if module.startswith("numpy.random"):
        if type(value).__name__ == "RandomState":
            return "numpy_random_state"
        if type(value).__name__ == "Generator":
            return "numpy_generator"
    return None


def _get_state(kind: str, value: Any) -> Any:
    if kind == "torch":
        return value.get_state()
    if kind == "random":
        return value.getstate()
    if kind == "random_state":
        return value
    if kind == "numpy_random_state":
        return value.get_state()
    return value.bit_generator.state


def _set_state(kind: str, value: Any, parent: Any, name: str, state: Any) -> None:
    if kind == "torch":
        value.set_state(state)
    elif kind == "random":
        value.setstate(state)
    elif kind == "random_state":
        setattr(parent, name, state)
    elif kind == "numpy_random_state":
        value.set_state(state)
    else:
        value.bit_generator.state = state
