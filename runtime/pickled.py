"""What an ``Accelerator`` becomes when it is pickled: a ``WorkerAccelerator``.

A Dataset (or a ``collate_fn``, a ``worker_init_fn``) that holds the Accelerator is pickled into
each DataLoader worker when the loader starts its workers with ``multiprocessing_context="spawn"``
or ``"forkserver"`` (the default on macOS and Windows, and for every platform from Python 3.14).
The Accelerator itself cannot cross: it holds the process group, DDP's reducer, trackers' open
files and locks. Pickling it gives a ``WorkerAccelerator`` instead, a small value that answers
what a Dataset reads about the training process it serves:

* ``process_index``, ``local_process_index``, ``num_processes``, ``is_main_process``,
  ``is_local_main_process``, ``use_distributed``, ``distributed_type``, ``device``, ``state``,
  ``mixed_precision``, ``gradient_accumulation_steps``, ``split_batches``, ``even_batches``,
  ``project_dir``, ``logging_dir``: the values of the training process that started the worker
  (so ``if accelerator.is_main_process:`` in ``__getitem__`` means "a worker of rank 0");
* ``print`` (prints where the training process would), and the decorators ``on_main_process``,
  ``on_local_main_process``, ``on_last_process``, ``on_process(process_index=i)``.

Everything else of the Accelerator's API (collectives such as ``gather`` or
``wait_for_everyone``, ``prepare``, ``backward``, checkpoints, trackers) raises
``WorkerProcessError`` saying that it runs in the training processes only: a worker is not a
member of the process group, and a collective there would wait for peers that never come.

``copy.copy`` and ``copy.deepcopy`` of an Accelerator return the Accelerator itself (a copied
trainer object keeps training with the one process group), so only real pickling (workers,
``torch.save``, ``multiprocessing`` queues) gives the worker-side value. The prepared model,
optimizer and scheduler pickle as the user's own objects (runtime/user_module.py,
runtime/optim.py); a prepared DataLoader pickles without its running iterator.

HF Accelerate's ``Accelerator`` pickles its whole state (it fails on a process group under
spawn); Lightning Fabric's is not meant to be pickled either.
"""

from __future__ import annotations

import builtins
import functools
from collections.abc import Callable
from typing import Any

from .errors import AccelError
from .state import ProcessState, ProcessView

# Values copied from the Accelerator into its pickled form (besides ``state``).
SNAPSHOT = (
    "mixed_precision",
    "gradient_accumulation_steps",
    "split_batches",
    "even_batches",
    "project_dir",
    "logging_dir",
)


class WorkerProcessError(AccelError):
    """An Accelerator method that needs the training process was called on a pickled copy."""


class WorkerAccelerator(ProcessView):
    """A pickled ``Accelerator``: the training process's identity, no process group."""

    def __init__(self, state: ProcessState, values: dict[str, Any], distributed_type: Any) -> None:
        self.state = state
        self._values = dict(values)
        self.distributed_type = distributed_type

    def __reduce__(self) -> tuple[Any, ...]:
        return (WorkerAccelerator, (self.state, self._values, self.distributed_type))

    # -- who am I (the training process this copy came from) ------------------------------------

    def print(self, *args: Any, **kwargs: Any) -> None:
        """``print`` where the training process would print (its local main process)."""
        if self.is_local_main_process:
            builtins.print(*args, **kwargs)

    def on_main_process(self, function: Callable[..., Any]) -> Callable[..., Any]:
        return _only_if(function, lambda: self.is_main_process)

    def on_local_main_process(self, function: Callable[..., Any]) -> Callable[..., Any]:
        return _only_if(function, lambda: self.is_local_main_process)

    def on_last_process(self, function: Callable[..., Any]) -> Callable[..., Any]:
        return _only_if(function, lambda: self.process_index == self.num_processes - 1)

    def on_process(self, function: Callable[..., Any] | None = None,
                   process_index: int | None = None) -> Callable[..., Any]:
        if process_index is None:
            raise TypeError("on_process() needs process_index=, e.g. @accelerator.on_process(process_index=1)")
        if function is None:
            return functools.partial(self.on_process, process_index=process_index)
        return _only_if(function, lambda: self.process_index == process_index)

    # -- everything else ----------------------------------------------------------------------

    def __getattr__(self, name: str) -> Any:
        values = self.__dict__.get("_values")
        if values is not None and name in values:
            return values[name]
        from .accelerator import Accelerator  # the API this copy stands for

        if name.startswith("_") or not hasattr(Accelerator, name) and name not in _INSTANCE_NAMES:
            raise AttributeError(f"'WorkerAccelerator' object has no attribute {name!r}")
        raise WorkerProcessError(
            f"accelerator.{name} was used in a process that holds a pickled copy of the "
            f"Accelerator (a DataLoader worker started with spawn or forkserver, or another "
            f"process it was sent to), copied from process {self.state.rank} of "
            f"{self.state.world_size}.",
            "in such a copy only what the process reads about itself: process_index, "
            "num_processes, is_main_process, is_local_main_process, local_process_index, device, "
            "mixed_precision, print; collectives, prepare, backward, checkpoints and trackers run "
            "in the training processes only (a worker is not part of the process group).",
            f"call accelerator.{name} in the training loop (the main script), not in a "
            "Dataset's __getitem__, a collate_fn or a worker_init_fn.",
        )

    def __repr__(self) -> str:
        return (f"WorkerAccelerator(process_index={self.state.rank}, "
                f"num_processes={self.state.world_size}, device={str(self.state.device)!r})")


# Attributes an Accelerator sets in __init__ (not on its class): a copy raises for them as well.
_INSTANCE_NAMES = frozenset({
    "scaler", "strategy", "precision", "gradient_state", "timeout", "settings_sources",
    "project_configuration", "step_scheduler_with_optimizer",
})


def _only_if(function: Callable[..., Any], condition: Callable[[], bool]) -> Callable[..., Any]:
    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if condition():
            return function(*args, **kwargs)
        return None

    return wrapper


def worker_copy(accelerator: Any) -> WorkerAccelerator:
    """The ``WorkerAccelerator`` that ``accelerator`` pickles as."""
    values = {name: getattr(accelerator, name, None) for name in SNAPSHOT}
    return WorkerAccelerator(accelerator.state, values, accelerator.distributed_type)
