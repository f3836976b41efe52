"""Who am I: rank and world from torchrun's environment, and process-group setup.

``ProcessState.from_env`` is the only place the runtime reads torchrun's variables or creates the
default process group. The state is a frozen value; nothing is cached in module-level dicts, so a
second ``Accelerator()`` in the same process simply reads the environment again and reuses the
already-initialised group.

A script that initialises the group itself (``init_distributed_mode(args)``, ``setup()``) works in
either order:

* the script's ``dist.init_process_group`` first, then ``Accelerator()``: the Accelerator joins
  that group, with its rank and size, also when the environment has no torchrun variables (a
  helper that read ``SLURM_PROCID`` under ``srun``); RANK / WORLD_SIZE that contradict it raise. It
  leaves the group to
  the script: ``end_training`` waits for every process but does not destroy it, so the script's
  own ``dist.destroy_process_group()`` still works. At exit the group is torn down like one the
  runtime created (barrier, destroy) if the script did not destroy it.
* ``Accelerator()`` first, then the script's ``dist.init_process_group``: torch raises
  "trying to initialize the default process group twice" on every rank (so nothing hangs), and
  the traceback carries a note saying that the Accelerator created the group and what to do
  (create the Accelerator after the script's own call, or guard the call with
  ``if not dist.is_initialized()``). Making the second call succeed would mean replacing
  ``torch.distributed.init_process_group`` for every library in the process, and it would still
  miss a ``from torch.distributed import init_process_group`` bound before the runtime was
  imported; the call's own arguments (backend, timeout, a ``file://`` init method) could also
  contradict the existing group. A precise error is safer than a patched torch.
"""

from __future__ import annotations

import atexit
import gc
import os
import sys
import time
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from .errors import DistributedEnvironmentError
from .settings import DEFAULT_TIMEOUT_SECONDS

DEFAULT_TIMEOUT = timedelta(seconds=DEFAULT_TIMEOUT_SECONDS)

# The rendezvous torchrun's agent serves (its own store, on the port it sets), read when the runtime
# is imported: before the script's code runs, so a script that later sets the variables itself
# (`os.environ["MASTER_PORT"] = "12345"`, written for its own mp.spawn launch) cannot hide them.
_RENDEZVOUS = ("MASTER_ADDR", "MASTER_PORT")
_LAUNCHER_RENDEZVOUS = (
    {name: os.environ[name] for name in _RENDEZVOUS if name in os.environ}
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True" else {}
)
"""Collective timeout: a rank that waits longer than this fails instead of hanging forever."""


@dataclass(frozen=True)
class ProcessState:
    """This process's place in the job: its ranks, the job's size, the backend and its device."""

    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    local_world_size: int = 1
    backend: str | None = None
    device: torch.device = torch.device("cpu")

    @property
    def distributed(self) -> bool:
        """True when more than one process takes part (and a process group exists)."""
        return self.world_size > 1

    @property
    def is_main_process(self) -> bool:
        return self.rank == 0

    @property
    def is_local_main_process(self) -> bool:
        return self.local_rank == 0

    @classmethod
    def from_env(
        cls,
        cpu: bool = False,
        backend: str | None = None,
        timeout: timedelta = DEFAULT_TIMEOUT,
        environ: Mapping[str, str] | None = None,
    ) -> ProcessState:
        """Read torchrun's variables, pick the device and, for world_size > 1, join the group.

        No torchrun variables means one process. ``cpu=True`` forces the CPU (and gloo) even
        where CUDA is available.
        """
        env = os.environ if environ is None else environ
        if dist.is_available() and dist.is_initialized():
            return cls._join_existing_group(env, cpu)
        world_size = _int_env(env, "WORLD_SIZE", 1)
        rank = _int_env(env, "RANK", 0)
        local_rank = _int_env(env, "LOCAL_RANK", 0)
        local_world_size = _int_env(env, "LOCAL_WORLD_SIZE", world_size)
        if not 0 <= rank < world_size:
            raise DistributedEnvironmentError(
                f"RANK={rank} is outside WORLD_SIZE={world_size}.",
                "0 <= RANK < WORLD_SIZE, as torchrun sets them.",
                "launch with `accel launch` (or torchrun) instead of setting the variables by hand.",
            )

        use_cuda = not cpu and torch.cuda.is_available()
        device = torch.device("cuda", local_rank) if use_cuda else torch.device("cpu")
        if use_cuda:
            torch.cuda.set_device(device)

        if world_size == 1:
            return cls(rank, local_rank, 1, local_world_size, None, device)

        if env is os.environ:
            _restore_launcher_rendezvous(rank)
        missing = [name for name in ("MASTER_ADDR", "MASTER_PORT") if name not in env]
        if missing:
            raise DistributedEnvironmentError(
                f"WORLD_SIZE={world_size} is set but {', '.join(missing)} is not.",
                "the rendezvous variables torchrun sets (MASTER_ADDR and MASTER_PORT).",
                "launch with `accel launch --nproc-per-node N script.py` (or torchrun).",
            )
        chosen = backend or ("nccl" if use_cuda else "gloo")
        dist.init_process_group(
            backend=chosen,
            rank=rank,
            world_size=world_size,
            timeout=timeout,
            **_rendezvous(env, world_size, timeout),
        )
        _groups.append(dist.group.WORLD)  # freed by the exit handler (see _drop_groups)
        _created.append(dist.group.WORLD)
        _install_exit_handler()
        return cls(rank, local_rank, world_size, local_world_size, chosen, device)

    @classmethod
    def _join_existing_group(cls, env: Mapping[str, str], cpu: bool) -> ProcessState:
        """The script built the default group itself (``init_distributed_mode(args)``, from torchrun's
        variables, SLURM's ``SLURM_PROCID`` or its own arguments): the Accelerator takes that group's
        rank and size, whatever launched the processes. A torchrun variable that contradicts the
        group is an error: the job would shard data by one count and average gradients over another.
        """
        rank, world_size = dist.get_rank(), dist.get_world_size()
        said = {name: _int_env(env, name, 0) for name in ("RANK", "WORLD_SIZE") if env.get(name, "") != ""}
        if said.get("RANK", rank) != rank or said.get("WORLD_SIZE", world_size) != world_size:
            told = ", ".join(f"{name}={value}" for name, value in said.items())
            raise DistributedEnvironmentError(
                f"a process group already exists with rank {rank} of {world_size}, but the environment "
                f"says {told}.",
                "the process group the script initialised and the launcher's RANK / WORLD_SIZE to agree "
                "(or no RANK / WORLD_SIZE, as under `srun`: the Accelerator then joins the group as it is).",
                "initialise the group with the environment's rank and world size, or launch without "
                "stale RANK / WORLD_SIZE variables (a launcher inside a launcher).",
            )
        local_rank = _local_rank(env, rank)
        local_world_size = _int_env(env, "LOCAL_WORLD_SIZE", world_size)
        device = torch.device("cpu")
        if not cpu and torch.cuda.is_available():
            index = local_rank
            if index >= torch.cuda.device_count():
                # fewer GPUs visible than the local rank (one GPU bound per task, as `srun --gpus-per-task`
                # does): the device the script set, else the local rank among the visible ones
                index = torch.cuda.current_device() if torch.cuda.is_initialized() else index % torch.cuda.device_count()
            device = torch.device("cuda", index)
            torch.cuda.set_device(device)
        if world_size == 1:
            return cls(rank, local_rank, 1, local_world_size, None, device)
        _install_exit_handler()
        return cls(rank, local_rank, world_size, local_world_size, dist.get_backend(), device)


class ProcessView:
    """Which process this is, read from ``self.state`` (a ``ProcessState``): what the Accelerator
    and its copy in a DataLoader worker (runtime/pickled.py) both answer."""

    state: ProcessState

    @property
    def device(self) -> torch.device:
        return self.state.device

    @property
    def process_index(self) -> int:
        return self.state.rank

    @property
    def local_process_index(self) -> int:
        return self.state.local_rank

    @property
    def num_processes(self) -> int:
        return self.state.world_size

    @property
    def is_main_process(self) -> bool:
        return self.state.is_main_process

    @property
    def is_local_main_process(self) -> bool:
        return self.state.is_local_main_process

    @property
    def use_distributed(self) -> bool:
        return self.state.distributed


def _restore_launcher_rendezvous(rank: int) -> None:
    """Give back the rendezvous torchrun set, where the script changed it since (a migrated
    `mp.spawn` script keeps `os.environ["MASTER_PORT"] = "12345"`): under torchrun the agent serves
    the store on its own port, workers sent to another port wait for each other forever. HF
    Accelerate would hang there; the runtime warns once and uses the launcher's values."""
    changed = {name: value for name, value in _LAUNCHER_RENDEZVOUS.items() if os.environ.get(name) != value}
    if not changed:
        return
    if rank == 0:
        import warnings

        said = ", ".join(f"{name}={os.environ.get(name)!r}" for name in changed)
        warnings.warn(
            f"the script set {said} after the launcher set {', '.join(f'{k}={v!r}' for k, v in changed.items())}; "
            "under torchrun / accel launch the launcher serves the rendezvous, so its values are used (the "
            "script's would leave the processes waiting for each other). Remove the script's assignment to "
            "silence this.",
            stacklevel=_outside_runtime(),
        )
    os.environ.update(changed)


def _outside_runtime() -> int:
    """The warnings stacklevel of the first caller outside this package (the user's line)."""
    here = os.path.dirname(__file__)
    frame, level = sys._getframe(1), 1
    while frame is not None and os.path.dirname(frame.f_code.co_filename) == here:
        frame, level = frame.f_back, level + 1
    return level


def _rendezvous(env: Mapping[str, str], world_size: int, timeout: timedelta) -> dict[str, object]:
    """``init_method="env://"``, except in a restarted torchelastic attempt on the agent's store.

    torchrun's agent keeps one store for every attempt (always with ``--master-addr``, static
    rendezvous), so a restarted worker group finds the previous attempt's keys: a peer's stale
    address makes init fail ("Gloo connectFullMesh failed ... Connection refused") or wait
    forever (pytorch/pytorch#135712). Each restarted attempt therefore uses its own key prefix.
    """
    attempt = env.get("TORCHELASTIC_RESTART_COUNT", "0")
    if env.get("TORCHELASTIC_USE_AGENT_STORE") != "True" or attempt == "0":
        return {"init_method": "env://"}
    store = dist.TCPStore(
        env["MASTER_ADDR"], int(env["MASTER_PORT"]), world_size, is_master=False, timeout=timeout
    )
    return {"store": dist.PrefixStore(f"/accel/attempt_{attempt}", store)}


def barrier() -> None:
    """Block until every rank of the default group arrives (no-op without a group).

    The runtime's only barrier (``wait_for_everyone``, checkpoints, exit). nccl gets the current
    device explicitly: without ``device_ids`` it guesses one from the rank and warns.
    """
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return
    if dist.get_backend() == "nccl" and torch.cuda.is_available():
        dist.barrier(device_ids=[torch.cuda.current_device()])
    else:
        dist.barrier()


def destroy_process_group() -> None:
    """Destroy the default process group if the runtime created it (idempotent, safe at exit).

    A group the script initialised itself is the script's to destroy (its own
    ``dist.destroy_process_group()`` would fail on a destroyed group); the exit handler tears it
    down if the script does not.
    """
    if dist.is_available() and dist.is_initialized() and created_default_group():
        dist.destroy_process_group()
    _created.clear()


def created_default_group() -> bool:
    """True when the current default process group was created by ``ProcessState.from_env``."""
    return bool(_created) and dist.is_initialized() and _created[-1] is dist.group.WORLD


_exit_handler_installed = False
_failed = False
# DDP wrappers still alive at exit keep the process group alive through their reducer; its gloo
# threads would then be torn down during interpreter finalization, which aborts the process.
_wrappers: "weakref.WeakSet[torch.nn.Module]" = weakref.WeakSet()
# The groups this process created, held so that their last reference is dropped by the exit
# handler, never by whatever frame happens to free the last DDP model (see _drop_groups).
_groups: list[object] = []
# The default group, while it is one this process's runtime created (not the script).
_created: list[object] = []

_TWICE = "trying to initialize the default process group twice"
_TWICE_NOTE = (
    "accel runtime: the Accelerator already initialised the default process group from "
    "torchrun's environment, and the script then called dist.init_process_group itself.\n"
    "  fix: create the Accelerator after the script's own init_process_group call (it then "
    "reuses that group), guard the call with `if not dist.is_initialized():`, or remove it."
)


def release_at_exit(ddp_module: torch.nn.Module) -> None:
    """Have the exit handler drop this DDP wrapper's hold on the process group."""
    _wrappers.add(ddp_module)


def _install_exit_handler() -> None:
    """Tear the group down at interpreter exit, after every rank got there.

    A gloo rank whose peer closes its sockets first dies with SIGABRT ("terminate called without
    an active exception"). So on a normal exit the ranks meet at a barrier, then destroy the group.
    After an uncaught exception there is no barrier: the other ranks are still training, and
    torchrun stops them once this process is gone.
    """
    global _exit_handler_installed
    if _exit_handler_installed:
        return
    _exit_handler_installed = True
    previous_hook = sys.excepthook

    def record_failure(*exc_info) -> None:  # type: ignore[no-untyped-def]
        global _failed
        _failed = True
        _explain_double_init(exc_info[1])
        previous_hook(*exc_info)

    sys.excepthook = record_failure
    atexit.register(_leave_process_group)


def _explain_double_init(error: BaseException | None) -> None:
    """Add a note naming the fix to torch's double-initialisation error, when the runtime's
    Accelerator created the group the script tried to create again."""
    if isinstance(error, ValueError) and _TWICE in str(error) and created_default_group():
        notes = getattr(error, "__notes__", None)
        if notes is None:
            notes = error.__notes__ = []  # type: ignore[attr-defined]  # add_note is 3.11+
        if _TWICE_NOTE not in notes:
            notes.append(_TWICE_NOTE)


def _leave_process_group() -> None:
    if dist.is_available() and dist.is_initialized():
        if not _failed:
            barrier()
        dist.destroy_process_group()
    _release_wrappers()  # also after end_training(), which destroyed the group but kept the wrappers
    _drop_groups()


def _release_wrappers() -> None:
    """DDP wrappers alive at exit hold the group through their reducer; torn down during
    interpreter finalization, its gloo threads abort the process. Drop them here instead."""
    for wrapper in list(_wrappers):
        for name in ("reducer", "logger"):
            if hasattr(wrapper, name):
                delattr(wrapper, name)
        wrapper.process_group = None
    gc.collect()


def _drop_groups() -> None:
    """Free the held groups once their gloo worker threads are idle.

    Freeing a gloo group joins its worker threads while holding the GIL. A worker that has just
    completed a collective may still be destroying that work object, and destroying one created
    during backward (DDP's all-reduce) takes the GIL: a deadlock, torch 2.13, seen in 11 of 68
    exits of scripts whose last DDP model was freed right after a barrier. Sleeping first
    releases the GIL so the workers finish; holding the groups until here makes this the only
    place where the last reference goes.
    """
    if not _groups:
        return
    time.sleep(0.05)
    _groups.clear()
    gc.collect()


def _local_rank(env: Mapping[str, str], rank: int) -> int:
    """This process's index on its node, for a process group the script built itself: LOCAL_RANK
    (torchrun), else SLURM_LOCALID (srun), else the CUDA device the script already set (CUDA
    initialised: `torch.cuda.set_device(args.gpu)`), else the rank modulo the node's GPUs, else
    (no GPU) the rank itself, as on one node."""
    for name in ("LOCAL_RANK", "SLURM_LOCALID"):
        if env.get(name, "") != "":
            return _int_env(env, name, 0)
    if torch.cuda.is_available():
        if torch.cuda.is_initialized():
            return torch.cuda.current_device()
        return rank % torch.cuda.device_count()
    return rank


def _int_env(env: Mapping[str, str], name: str, default: int) -> int:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise DistributedEnvironmentError(
            f"environment variable {name}={raw!r} is not an integer.",
            f"{name} to be a non-negative integer, as torchrun sets it.",
            f"unset {name} or launch with `accel launch`.",
        ) from None
