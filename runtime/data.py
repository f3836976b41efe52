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

import warnings
from collections.abc import Sized
from functools import partial
from typing import Any

import torch
from torch.utils.data import BatchSampler, DataLoader, IterableDataset, RandomSampler, SequentialSampler
from torch.utils.data.distributed import DistributedSampler

from .device_loader import ActiveLoaders, PreparedDataLoader, send_to_device
from .errors import PrepareError
from .ops import broadcast_generator, broadcast_int, broadcast_object
from .samplers import (
    IterableDatasetShard,
    RankShareView,
    SameOnEveryRank,
    ShardSampler,
    SharedSeedRandomSampler,
    SplitBatchSampler,
)
from .state import ProcessState

__all__ = [
    "ActiveLoaders",
    "IterableDatasetShard",
    "PreparedDataLoader",
    "ShardSampler",
    "SharedSeedRandomSampler",
    "SplitBatchSampler",
    "kept_sharding_sampler",
    "prepare_data_loader",
    "send_to_device",
]


def _shared_random(sampler: Any, state: ProcessState) -> Any:
    """The user's (batch) sampler, made to give every rank the same order each epoch.

    A plain ``RandomSampler`` becomes a ``SharedSeedRandomSampler`` (its seed drawn where
    ``RandomSampler`` draws it: N processes keep the one-process order). A ``SequentialSampler``
    needs nothing. Anything else (``SubsetRandomSampler``, ``WeightedRandomSampler``, a custom
    sampler or batch sampler) may draw from RNGs that differ between ranks: ``SameOnEveryRank``
    gives every rank rank 0's order.
    """
    if type(sampler) is SequentialSampler:
        return sampler
    if type(sampler) is not RandomSampler:
        return SameOnEveryRank(sampler, partial(broadcast_object, state=state), state.rank)
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

    One case per kind of loader (see the module docstring for the guarantees of each).
    ``batch_size`` stays readable: a loader built with ``batch_size=B`` is rebuilt around a batch
    sampler, which makes DataLoader's ``batch_size`` None; it is set back to this process's batch
    size (``B``, or ``B // N`` with ``split_batches``), which scripts read in the training loop
    (``total_num += loader.batch_size``).
    """
    prepared = _prepare(loader, state, device, even_batches, active_loaders, split_batches)
    if (
        loader.batch_size is not None and prepared.batch_size is None and prepared.batch_sampler is not None
        and not isinstance(loader.dataset, IterableDataset)
    ):
        per_process = loader.batch_size // state.world_size if split_batches and state.distributed else loader.batch_size
        object.__setattr__(prepared, "batch_size", per_process)  # DataLoader forbids setting it after init
    return prepared


def _prepare(
    loader: DataLoader,
    state: ProcessState,
    device: torch.device,
    even_batches: bool,
    active_loaders: ActiveLoaders | None,
    split_batches: bool,
) -> PreparedDataLoader:
    common = _loader_arguments(loader, device, active_loaders)
    sharding = kept_sharding_sampler(loader)
    if sharding is not None:
        return _keep_sharded(loader, sharding, state, common)
    batch_size = loader.batch_size
    if batch_size is None:  # a custom batch_sampler: DataLoader.batch_size is None then
        batch_size = getattr(loader.batch_sampler, "batch_size", None)
    if split_batches and state.distributed:
        _check_split(loader, batch_size, state.world_size)
    if isinstance(loader.dataset, IterableDataset):
        return _prepare_iterable(loader, state, batch_size, split_batches, common)
    if not state.distributed:
        return _prepare_one_process(loader, common)
    if loader.batch_sampler is None:
        return _prepare_single_samples(loader, state, even_batches, common)
    batch_sampler = loader.batch_sampler
    if type(batch_sampler) is BatchSampler:
        batch_sampler = BatchSampler(
            _shared_random(batch_sampler.sampler, state),
            batch_sampler.batch_size,
            batch_sampler.drop_last,
        )
    else:  # the script's own batch sampler: its order may be random too
        batch_sampler = _shared_random(batch_sampler, state)
    if split_batches:
        prepared = _prepare_split(loader, batch_sampler, state, batch_size, even_batches, common)
    else:
        prepared = _prepare_rank_batches(loader, batch_sampler, state, even_batches, common)
    original = loader.batch_sampler
    if type(original) is BatchSampler and isinstance(original.sampler, Sized):
        # loader.sampler: this rank's share of the user's sampler (see RankShareView)
        view = RankShareView(original.sampler, prepared.batch_sampler, original.batch_size, original.drop_last)
        object.__setattr__(prepared, "sampler", view)  # DataLoader forbids setting it after init
        prepared._shows_user_sampler = True
    return prepared


def _loader_arguments(
    loader: DataLoader, device: torch.device, active_loaders: ActiveLoaders | None
) -> dict[str, Any]:
    """The original loader's arguments every prepared loader keeps, plus the device."""
    return dict(
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


def _prepare_iterable(
    loader: DataLoader,
    state: ProcessState,
    batch_size: int | None,
    split_batches: bool,
    common: dict[str, Any],
) -> PreparedDataLoader:
    """An IterableDataset: unchanged on one process, an ``IterableDatasetShard`` on N."""
    dataset = loader.dataset
    if not state.distributed:
        return PreparedDataLoader(dataset, batch_size=batch_size, drop_last=loader.drop_last, **common)
    shard = IterableDatasetShard(
        dataset,
        batch_size=batch_size or 1,
        num_processes=state.world_size,
        process_index=state.rank,
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


def _prepare_one_process(loader: DataLoader, common: dict[str, Any]) -> PreparedDataLoader:
    """One process: the original sampler or batch sampler, unchanged (bit-identical batches)."""
    if loader.batch_sampler is None:
        return PreparedDataLoader(loader.dataset, sampler=loader.sampler, batch_size=None, **common)
    prepared = PreparedDataLoader(loader.dataset, batch_sampler=loader.batch_sampler, **common)
    # DataLoader(batch_sampler=...) would make .sampler a SequentialSampler over the whole
    # dataset: keep the user's (len(loader.sampler) is 40000 for a 40000-sample subset, not 50000).
    object.__setattr__(prepared, "sampler", loader.sampler)
    prepared._shows_user_sampler = True
    return prepared


def _prepare_single_samples(
    loader: DataLoader, state: ProcessState, even_batches: bool, common: dict[str, Any]
) -> PreparedDataLoader:
    """Automatic batching off (``batch_size=None``): rank i gets samples i, i+n, ..."""
    n = state.world_size
    shard = ShardSampler(_shared_random(loader.sampler, state), n, state.rank, even_batches)
    remainder = len(loader.sampler) % n if even_batches else 0
    return PreparedDataLoader(
        loader.dataset, sampler=shard, batch_size=None, remainder=remainder, **common
    )


def _prepare_split(
    loader: DataLoader,
    batch_sampler: Any,
    state: ProcessState,
    batch_size: int | None,
    even_batches: bool,
    common: dict[str, Any],
) -> PreparedDataLoader:
    """``split_batches``: rank i gets slice i of every global batch."""
    split = SplitBatchSampler(batch_sampler, state.world_size, state.rank, batch_size, even_batches)
    remainder = 0
    sampler = getattr(batch_sampler, "sampler", None)
    drop_last = bool(getattr(batch_sampler, "drop_last", False))
    if even_batches and not drop_last and batch_size and isinstance(sampler, Sized):
        remainder = len(sampler) % batch_size
    return PreparedDataLoader(loader.dataset, batch_sampler=split, remainder=remainder, **common)


def _prepare_rank_batches(
    loader: DataLoader,
    batch_sampler: Any,
    state: ProcessState,
    even_batches: bool,
    common: dict[str, Any],
) -> PreparedDataLoader:
    """The default on N processes: rank i gets global batches i, i+n, ... (Accelerate's)."""
    n = state.world_size
    shard = ShardSampler(
        batch_sampler,
        n,
        state.rank,
        even_batches,
        drop_last=bool(getattr(batch_sampler, "drop_last", False)),
        batch_size=getattr(batch_sampler, "batch_size", None),
    )
    remainder = 0
    if even_batches and not shard.drop_last and shard.batch_size is not None:
        sampler = getattr(batch_sampler, "sampler", None)
        if isinstance(sampler, Sized):
            remainder = len(sampler) % (n * shard.batch_size)
    return PreparedDataLoader(loader.dataset, batch_sampler=shard, remainder=remainder, **common)


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
