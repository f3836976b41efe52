"""Checkpoints: ``save_state`` / ``load_state`` with atomic writes, rotation and exact resumption.

A checkpoint is a directory (file names as in HF Accelerate, contents in ``torch.save`` format):

- ``pytorch_model.bin``, ``pytorch_model_1.bin``, ...: each prepared model's unwrapped state dict;
- ``optimizer.bin``, ``scheduler.bin`` (``_1``, ``_2``, ... for further ones), ``scaler.pt``;
- ``custom_checkpoint_0.pkl``, ...: objects given to ``register_for_checkpointing``;
- ``random_states_<rank>.pkl``: that rank's python / numpy / torch / CUDA RNG states;
- ``dataloaders_<rank>.bin``: that rank's prepared loaders (epoch, batches already yielded, the
  RNG states the epoch started from), so a mid-epoch checkpoint resumes at the next batch;
- ``checkpoint.json``: what was saved (counts, world size), to explain mismatches at load time.

Writing is atomic: every rank writes into ``.<name>.tmp`` next to the target, the ranks agree
that all writes succeeded (one all-reduce), and only then does the main process rename the
directory into place. A crash while saving leaves the previous checkpoint untouched and no
half-written target; the stale temporary directory is removed by the next save. Every file is
fsynced before the rename. All ranks must see the same filesystem (as with Accelerate).

Every file is read with ``torch.load(weights_only=True)``: RNG states are stored as tensors,
ints and tuples (numpy's state array as an int64 tensor), so no pickled code is ever executed; a
file that would run code is refused with a ``CheckpointError``.

Loading fails loudly, naming what is wrong: a truncated or corrupted file (the file's path), a
model of another shape (the parameter and both shapes, before anything is loaded into it), other
numbers of objects. A checkpoint from another number of processes restores the model, optimizer,
scheduler and registered objects and warns that RNG states and loader positions were not.
"""

from __future__ import annotations

import json
import os
import pickle
import random
import re
import shutil
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from .errors import AccelError
from .sharded_checkpoint import SHARDED_DIR, ShardedStates
from .state import ProcessState, barrier

MODEL_NAME = "pytorch_model"
OPTIMIZER_NAME = "optimizer"
SCHEDULER_NAME = "scheduler"
SCALER_NAME = "scaler.pt"
CUSTOM_NAME = "custom_checkpoint"
RNG_STATE_NAME = "random_states"
DATALOADER_NAME = "dataloaders"
MANIFEST_NAME = "checkpoint.json"
CHECKPOINTS_DIR = "checkpoints"
FORMAT_VERSION = 1

_AUTO_NAME = re.compile(r"^checkpoint_(\d+)$")


class CheckpointError(AccelError):
    """A checkpoint cannot be written or read, or does not match the objects being restored."""


class CheckpointRegistrationError(CheckpointError, ValueError):
    """An object given to ``register_for_checkpointing`` cannot be saved and restored.

    Also a ``ValueError``, which is what Accelerate raises in this case.
    """


@runtime_checkable
class Stateful(Protocol):
    """Anything with ``state_dict()`` and ``load_state_dict(state)``."""

    def state_dict(self) -> Any: ...

    def load_state_dict(self, state_dict: Any) -> Any: ...


@dataclass
class ProjectConfiguration:
    """Where ``save_state`` writes and how it names and rotates checkpoints (Accelerate's fields).

    With ``automatic_checkpoint_naming``, ``save_state()`` writes
    ``<project_dir>/checkpoints/checkpoint_<iteration>`` and keeps the newest ``total_limit`` of
    them; ``load_state()`` reads the newest one.
    """

    project_dir: str | None = None
    logging_dir: str | None = None
    automatic_checkpoint_naming: bool = False
    total_limit: int | None = None
    iteration: int = 0
    save_on_each_node: bool = False

    def __post_init__(self) -> None:
        if self.logging_dir is None:
            self.logging_dir = self.project_dir
        if self.total_limit is not None and self.total_limit < 1:
            raise CheckpointError(
                f"ProjectConfiguration(total_limit={self.total_limit}) would delete every checkpoint.",
                "total_limit=None (keep all) or a positive number of checkpoints to keep.",
                "pass total_limit=None or total_limit >= 1.",
            )

    def set_directories(self, project_dir: str | os.PathLike[str] | None = None) -> None:
        """Set ``project_dir`` (and ``logging_dir`` when it was not set separately)."""
        self.project_dir = None if project_dir is None else os.fspath(project_dir)
        if self.logging_dir is None:
            self.logging_dir = self.project_dir


# -- RNG states ---------------------------------------------------------------------------------


def capture_rng_state(include_cuda: bool = True) -> dict[str, Any]:
    """This process's python, numpy, torch (and CUDA) RNG states, in a weights_only-safe form."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state(legacy=True)  # type: ignore[misc]
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": {
            "kind": str(kind),
            "keys": torch.from_numpy(np.asarray(keys, dtype=np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "gauss": float(gauss),
        },
        "torch": torch.get_rng_state(),
    }
    if include_cuda and torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: dict[str, Any]) -> None:
    """Set the RNG states ``capture_rng_state`` returned (keys that are absent are left alone)."""
    if "python" in state:
        version, internal, gauss_next = state["python"]
        random.setstate((version, tuple(internal), gauss_next))
    if "numpy" in state:
        saved = state["numpy"]
        np.random.set_state(
            (
                saved["kind"],
                saved["keys"].numpy().astype(np.uint32),
                saved["pos"],
                saved["has_gauss"],
                saved["gauss"],
            )
        )
    if "torch" in state:
        torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        cuda_states = state["cuda"]
        if len(cuda_states) != torch.cuda.device_count():
            warnings.warn(
                f"the checkpoint holds CUDA RNG states for {len(cuda_states)} devices but this "
                f"process sees {torch.cuda.device_count()}; restoring the common ones only.",
                stacklevel=2,
            )
        for index, cuda_state in enumerate(cuda_states[: torch.cuda.device_count()]):
            torch.cuda.set_rng_state(cuda_state, index)


# -- what is saved ----------------------------------------------------------------------------


@dataclass
class CheckpointContents:
    """The objects one checkpoint holds, in a fixed order (the order they were prepared)."""

    models: Sequence[nn.Module] = ()
    optimizers: Sequence[Stateful] = ()
    schedulers: Sequence[Stateful] = ()
    dataloaders: Sequence[Stateful] = ()
    custom_objects: Sequence[Stateful] = ()
    scaler: Stateful | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    """Small per-checkpoint values (ints, floats, strings), e.g. the accumulation step counter."""

    def counts(self) -> dict[str, int]:
        return {
            "models": len(self.models),
            "optimizers": len(self.optimizers),
            "schedulers": len(self.schedulers),
            "dataloaders": len(self.dataloaders),
            "custom_objects": len(self.custom_objects),
            "scaler": int(self.scaler is not None),
        }


def check_stateful(obj: object) -> None:
    """Raise ``CheckpointRegistrationError`` unless ``obj`` has state_dict and load_state_dict."""
    missing = [name for name in ("state_dict", "load_state_dict") if not callable(getattr(obj, name, None))]
    if missing:
        raise CheckpointRegistrationError(
            f"register_for_checkpointing got a {type(obj).__name__} object without "
            f"{' and '.join(missing)}().",
            "objects with state_dict() -> state and load_state_dict(state) methods.",
            "add those two methods to the class (state_dict returning tensors, numbers, strings, "
            "lists and dicts), or save this object yourself.",
        )


def _numbered(stem: str, index: int, suffix: str) -> str:
    return f"{stem}{suffix}" if index == 0 else f"{stem}_{index}{suffix}"


def model_file(index: int) -> str:
    return _numbered(MODEL_NAME, index, ".bin")


def optimizer_file(index: int) -> str:
    return _numbered(OPTIMIZER_NAME, index, ".bin")


def scheduler_file(index: int) -> str:
    return _numbered(SCHEDULER_NAME, index, ".bin")


def custom_file(index: int) -> str:
    return f"{CUSTOM_NAME}_{index}.pkl"


def rng_file(rank: int) -> str:
    return f"{RNG_STATE_NAME}_{rank}.pkl"


def dataloader_file(rank: int) -> str:
    return f"{DATALOADER_NAME}_{rank}.bin"


# -- writing ------------------------------------------------------------------------------------


def write_file(obj: Any, path: Path) -> None:
    """``torch.save(obj, path)``, flushed to disk (fsync) before returning."""
    with open(path, "wb") as handle:
        torch.save(obj, handle)
        handle.flush()
        os.fsync(handle.fileno())


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # e.g. platforms that cannot open directories
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _temp_dir(target: Path) -> Path:
    return target.parent / f".{target.name}.tmp"


def _old_dir(target: Path) -> Path:
    return target.parent / f".{target.name}.old"


def _write_shared_files(
    directory: Path, contents: CheckpointContents, state: ProcessState, sharded: bool
) -> None:
    if not sharded:  # else the models and optimizers are in sharded/ (sharded_checkpoint.py)
        for i, model in enumerate(contents.models):
            write_file(model.state_dict(), directory / model_file(i))
        for i, optimizer in enumerate(contents.optimizers):
            write_file(optimizer.state_dict(), directory / optimizer_file(i))
    for i, scheduler in enumerate(contents.schedulers):
        write_file(scheduler.state_dict(), directory / scheduler_file(i))
    if contents.scaler is not None:
        write_file(contents.scaler.state_dict(), directory / SCALER_NAME)
    for i, obj in enumerate(contents.custom_objects):
        write_file(obj.state_dict(), directory / custom_file(i))
    manifest = {
        "format_version": FORMAT_VERSION,
        "world_size": state.world_size,
        "sharded": sharded,
        "counts": contents.counts(),
        "extra": contents.extra,
    }
    with open(directory / MANIFEST_NAME, "w", encoding="utf-8") as handle:
        json.dump(manifest, handle, indent=2)
        handle.flush()
        os.fsync(handle.fileno())


def _write_rank_files(directory: Path, contents: CheckpointContents, state: ProcessState) -> None:
    write_file(capture_rng_state(), directory / rng_file(state.rank))
    loaders = [loader.state_dict() for loader in contents.dataloaders]
    write_file(loaders, directory / dataloader_file(state.rank))


def _all_succeeded(ok: bool, state: ProcessState) -> bool:
    """True on every rank when ``ok`` is True on every rank (one all-reduce; no-op on 1 process)."""
    if not state.distributed:
        return ok
    flag = torch.tensor([1 if ok else 0], dtype=torch.int32, device=state.device)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    return bool(flag.item())


def replace_directory(source: Path, target: Path) -> None:
    """Move the finished directory ``source`` to ``target``, replacing an older ``target``.

    An existing ``target`` is first renamed to ``.<name>.old`` (so it survives a crash between the
    two renames), then deleted once ``source`` is in place.
    """
    old = _old_dir(target)
    if target.exists():
        if old.exists():
            shutil.rmtree(old)
        os.replace(target, old)
        os.replace(source, target)
        _fsync_dir(target.parent)
        shutil.rmtree(old)
    else:
        os.replace(source, target)
        _fsync_dir(target.parent)


def save_checkpoint(
    directory: str | os.PathLike[str],
    contents: CheckpointContents,
    state: ProcessState,
    sharded: ShardedStates | None = None,
) -> Path:
    """Write ``contents`` to ``directory`` atomically; every rank must call this together.

    The main process writes the shared files (models, optimizers, schedulers, scaler, registered
    objects, manifest), every rank its RNG and data-loader files. With ``sharded`` (zero1, fsdp)
    the models and optimizers are written by every rank, each its shards, into ``sharded/``.
    """
    target = Path(directory).absolute()
    temp = _temp_dir(target)
    if state.is_main_process:
        target.parent.mkdir(parents=True, exist_ok=True)
        if temp.exists():  # left behind by a save that crashed
            shutil.rmtree(temp)
        temp.mkdir()
    barrier()  # the temporary directory exists before any rank writes into it

    error: BaseException | None = None
    try:
        _write_rank_files(temp, contents, state)
        if sharded is not None:
            # A collective: a rank failing before it would leave the others waiting in it
            # (until the timeout), which is why it comes after this rank's own files.
            sharded.save(temp)
        if state.is_main_process:
            _write_shared_files(temp, contents, state, sharded is not None)
    except BaseException as exc:  # noqa: BLE001 - re-raised below, after the ranks agree
        error = exc
    if not _all_succeeded(error is None, state):
        if state.is_main_process:
            shutil.rmtree(temp, ignore_errors=True)
        if error is not None:
            raise error
        raise CheckpointError(
            f"another rank failed while writing the checkpoint {target}.",
            "every rank to write its files successfully.",
            "see the other rank's error above; the previous checkpoint (if any) is unchanged.",
        )
    if state.is_main_process:
        _fsync_dir(temp)
        replace_directory(temp, target)
    barrier()  # nobody reads the checkpoint before it is in place
    return target


# -- reading ------------------------------------------------------------------------------------


def load_file(path: Path, map_location: str | torch.device = "cpu") -> Any:
    """``torch.load(path, weights_only=True)``; a refused pickle becomes a ``CheckpointError``."""
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except FileNotFoundError:
        raise CheckpointError(
            f"the checkpoint file {path} does not exist.",
            f"{path.name} in {path.parent}, as save_state writes it.",
            "load a directory written by save_state with the same prepared objects.",
        ) from None
    except pickle.UnpicklingError as exc:  # weights_only refused a global, or the bytes are no pickle
        reason = _unpickler_reason(str(exc))
        if "global" not in reason.lower():
            raise _corrupted(path, exc) from exc
        raise CheckpointError(
            f"{path} contains objects that torch.load(weights_only=True) refuses to unpickle "
            f"({reason}); nothing in it was run.",
            "tensors, numbers, strings, lists, tuples and dicts only (what state_dict() returns).",
            "make the object's state_dict() return only such values, or, if you trust the file, "
            "allow its classes with torch.serialization.add_safe_globals([...]).",
        ) from exc
    except (RuntimeError, EOFError, OSError, ValueError) as exc:  # truncated or corrupted
        raise _corrupted(path, exc) from exc


def _unpickler_reason(message: str) -> str:
    """The specific part of torch's weights_only error, e.g. "Unsupported global: GLOBAL x ...".

    torch puts it after "WeightsUnpickler error:", on the same line or the next non-empty one.
    """
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    for i, line in enumerate(lines):
        if "WeightsUnpickler error:" in line:
            reason = line.split("WeightsUnpickler error:", 1)[1].strip()
            if not reason and i + 1 < len(lines):
                reason = lines[i + 1]
            if reason:
                return reason.split(". ")[0]
    return lines[0] if lines else "no details"


def _corrupted(path: Path, exc: BaseException) -> CheckpointError:
    text = str(exc).strip()
    detail = _unpickler_reason(text) if "WeightsUnpickler" in text else (text.splitlines() or [""])[0]
    return CheckpointError(
        f"the checkpoint file {path} cannot be read: it is truncated or corrupted "
        f"({type(exc).__name__}: {detail}).",
        f"{path.name} as save_state writes it (a complete torch.save file).",
        "load an older checkpoint (save_state writes atomically, so an interrupted save never "
        "replaces a complete one), or save this one again.",
    )


def check_model_shapes(path: Path, model: nn.Module, weights: dict[str, Any]) -> None:
    """Raise ``CheckpointError`` naming the first parameter whose saved shape differs."""
    current = model.state_dict()
    for name, saved in weights.items():
        now = current.get(name)
        if isinstance(saved, torch.Tensor) and isinstance(now, torch.Tensor) and saved.shape != now.shape:
            raise CheckpointError(
                f"{path} holds {name} with shape {tuple(saved.shape)}, but this model's {name} "
                f"has shape {tuple(now.shape)}.",
                "a checkpoint of the same model architecture (same layer sizes).",
                "build the model with the sizes used when saving, or load a checkpoint of this model.",
            )


def _check_counts(directory: Path, contents: CheckpointContents) -> dict[str, Any]:
    manifest_path = directory / MANIFEST_NAME
    if not manifest_path.exists():
        return {}
    try:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise CheckpointError(
            f"the checkpoint file {manifest_path} cannot be read: it is truncated or corrupted "
            f"({type(exc).__name__}: {exc}).",
            f"{MANIFEST_NAME} as save_state writes it (JSON).",
            "load an older checkpoint, or save this one again.",
        ) from exc
    saved = manifest.get("counts", {})
    now = contents.counts()
    for kind in ("models", "optimizers", "schedulers", "custom_objects"):
        if saved.get(kind, now[kind]) != now[kind]:
            raise CheckpointError(
                f"the checkpoint {directory} holds {saved[kind]} {kind} but this run has "
                f"{now[kind]} (prepared or registered).",
                f"the same number of {kind}, prepared/registered in the same order as when saving.",
                "prepare (and register_for_checkpointing) the same objects in the same order "
                "before load_state, or load a checkpoint of this script.",
            )
    return manifest


def _load_whole_files(
    path: Path,
    contents: CheckpointContents,
    load_model: Callable[[nn.Module, dict[str, Any]], Any] | None,
) -> None:
    for i, model in enumerate(contents.models):
        weights = load_file(path / model_file(i))
        check_model_shapes(path / model_file(i), model, weights)
        if load_model is None:
            model.load_state_dict(weights)
        else:
            load_model(model, weights)
    for i, optimizer in enumerate(contents.optimizers):
        optimizer.load_state_dict(load_file(path / optimizer_file(i)))


def load_checkpoint(
    directory: str | os.PathLike[str],
    contents: CheckpointContents,
    state: ProcessState,
    load_model: Callable[[nn.Module, dict[str, Any]], Any] | None = None,
    sharded: ShardedStates | None = None,
) -> dict[str, Any]:
    """Restore ``contents`` from ``directory`` on this rank; return the saved ``extra`` values.

    ``load_model(model, state_dict)`` loads one model (default: ``model.load_state_dict``).
    A checkpoint saved under a sharded strategy has its models and optimizers in ``sharded/``:
    they are read through ``sharded`` (whatever the number of processes now). RNG states are
    restored last, so nothing done while loading can move them.
    """
    path = Path(directory)
    if not path.is_dir():
        old = _old_dir(path.absolute())
        hint = (
            f"a save into it was interrupted after moving the previous checkpoint to {old}; "
            f"rename {old} back to {path}"
            if old.is_dir()
            else "pass the directory save_state wrote (or use automatic checkpoint naming)"
        )
        raise CheckpointError(
            f"the checkpoint directory {path} does not exist.",
            "a directory written by save_state.",
            hint + ".",
        )
    manifest = _check_counts(path, contents)
    if manifest.get("sharded"):
        if sharded is None:
            raise CheckpointError(
                f"the checkpoint {path} was saved under a sharded strategy (zero1 or fsdp).",
                "the runtime's Accelerator to load it (models and optimizers are in "
                f"{path / SHARDED_DIR}, written by torch.distributed.checkpoint).",
                "load it with accelerator.load_state(...).",
            )
        sharded.load(path)
    else:
        if sharded is not None and sharded.holds_dtensors():
            raise CheckpointError(
                f"the checkpoint {path} was saved under strategy ddp (one file per model) and "
                "this run shards the model (fsdp).",
                "a checkpoint saved under a sharded strategy, or the strategy it was saved with.",
                "resume with --strategy ddp (or the strategy used when saving); a model file "
                "saved by save_model loads into the model before prepare().",
            )
        _load_whole_files(path, contents, load_model)
    for i, scheduler in enumerate(contents.schedulers):
        scheduler.load_state_dict(load_file(path / scheduler_file(i)))
    scaler_path = path / SCALER_NAME
    if contents.scaler is not None and scaler_path.exists():
        contents.scaler.load_state_dict(load_file(scaler_path))
    for i, obj in enumerate(contents.custom_objects):
        obj.load_state_dict(load_file(path / custom_file(i)))

    saved_world = manifest.get("world_size", state.world_size)
    rank_rng, rank_loaders = path / rng_file(state.rank), path / dataloader_file(state.rank)
    if saved_world != state.world_size or not rank_rng.exists():
        warnings.warn(
            f"the checkpoint {path} was written by {saved_world} processes and this job has "
            f"{state.world_size}: model, optimizer, scheduler and registered objects were "
            "restored, but RNG states and data-loader positions were not (the run will not "
            "continue the exact trajectory). Resume with the original number of processes for "
            "that.",
            stacklevel=3,
        )
        return dict(manifest.get("extra", {}))
    if rank_loaders.exists():
        loader_states = load_file(rank_loaders)
        if len(loader_states) != len(contents.dataloaders):
            raise CheckpointError(
                f"the checkpoint {path} holds {len(loader_states)} data loader states but this "
                f"run prepared {len(contents.dataloaders)} data loaders.",
                "the same data loaders, prepared in the same order as when saving.",
                "prepare the same DataLoaders in the same order before load_state.",
            )
        for loader, loader_state in zip(contents.dataloaders, loader_states):
            loader.load_state_dict(loader_state)
    restore_rng_state(load_file(rank_rng))
    return dict(manifest.get("extra", {}))


# -- automatic naming and rotation ------------------------------------------------------------


def checkpoints_root(config: ProjectConfiguration) -> Path:
    """``<project_dir>/checkpoints``; a clear error when no project directory is configured."""
    if config.project_dir is None:
        raise CheckpointError(
            "automatic_checkpoint_naming is on but no project directory was given.",
            "Accelerator(project_dir=...) or ProjectConfiguration(project_dir=...).",
            "pass project_dir, or call save_state/load_state with an explicit directory.",
        )
    return Path(config.project_dir) / CHECKPOINTS_DIR


def automatic_checkpoints(root: Path) -> list[tuple[int, Path]]:
    """``(number, path)`` of every ``checkpoint_<number>`` directory under ``root``, oldest first."""
    if not root.is_dir():
        return []
    found = []
    for entry in root.iterdir():
        match = _AUTO_NAME.match(entry.name)
        if match and entry.is_dir():
            found.append((int(match.group(1)), entry))
    return sorted(found)


def next_checkpoint_dir(config: ProjectConfiguration) -> Path:
    """Where the next automatic checkpoint goes: ``checkpoint_<iteration>``, which must be new."""
    target = checkpoints_root(config) / f"checkpoint_{config.iteration}"
    if target.exists():
        raise CheckpointError(
            f"the automatic checkpoint directory {target} already exists.",
            "a new checkpoint_<iteration> directory for every save_state().",
            "call load_state() first (it continues the numbering after the newest checkpoint), "
            "or set accelerator.project_configuration.iteration to the next free number.",
        )
    return target


def rotate_checkpoints(root: Path, total_limit: int | None) -> list[Path]:
    """Delete the oldest automatic checkpoints so that at most ``total_limit`` remain."""
    if total_limit is None:
        return []
    existing = automatic_checkpoints(root)
    doomed = [path for _, path in existing[: max(len(existing) - total_limit, 0)]]
    for path in doomed:
        shutil.rmtree(path)
    return doomed


def latest_checkpoint(config: ProjectConfiguration) -> tuple[int, Path]:
    """The newest automatic checkpoint; a clear error when there is none."""
    root = checkpoints_root(config)
    existing = automatic_checkpoints(root)
    if not existing:
        raise CheckpointError(
            f"load_state() found no checkpoint_<n> directory under {root}.",
            "at least one checkpoint written by save_state() with automatic naming.",
            "save a checkpoint first, or pass the checkpoint directory to load_state(...).",
        )
    return existing[-1]
