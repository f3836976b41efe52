"""Models and optimizers of a checkpoint under a sharded strategy (zero1, fsdp), through DCP.

``torch.distributed.checkpoint`` (DCP) writes the ``sharded/`` folder of a checkpoint: each rank
writes its own shards (``__<rank>_0.distcp``) and the coordinator a ``.metadata`` file; nothing is
gathered on rank 0. The state dict it writes holds ``model_<i>`` (each prepared model, keyed by the
user's module's parameter names) and ``optimizer_<i>`` (each prepared optimizer's state keyed by
the same names, ``get_optimizer_state_dict``): fsdp's DTensor shards, zero1's per-rank optimizer
partition, plain tensors on one process. Because everything is keyed by parameter name and DCP
reshards on load, a checkpoint written by N processes loads at M processes, under the same
strategy or another one (2 -> 1, 1 -> 2, fsdp -> ddp, ...).

The other files of a checkpoint (schedulers, scaler, RNG states, loader positions, registered
objects, ``checkpoint.json``) and the atomic rename are runtime/checkpoint.py's, unchanged.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .errors import AccelError

SHARDED_DIR = "sharded"


def _groups_text(optimizer: torch.optim.Optimizer) -> str:
    """The hyperparameters of every parameter group (lr, betas, ...), as JSON."""
    groups = []
    for group in optimizer.param_groups:
        kept = {}
        for key, value in group.items():
            if key == "params":
                continue
            try:
                kept[key] = json.loads(json.dumps(value))
            except (TypeError, ValueError):  # e.g. a tensor lr: the per-rank state keeps it
                continue
        groups.append(kept)
    return json.dumps(groups)


@dataclass
class ShardedStates:
    """The prepared models (unwrapped) and optimizers one checkpoint holds.

    ``optimizers`` are the prepared ones (every rank has all their parameter groups);
    ``local`` are the torch optimizers holding this rank's state (zero1: its partition), the
    same objects otherwise. Each optimizer's group hyperparameters are also saved from the
    prepared one: the same on every rank, whereas a zero1 partition's groups differ by rank.
    """

    models: Sequence[nn.Module]
    optimizers: Sequence[torch.optim.Optimizer]
    local: Sequence[torch.optim.Optimizer]

    def _owner(self, optimizer: torch.optim.Optimizer) -> nn.Module:
        """The model whose parameters ``optimizer`` updates (DCP keys its state by their names)."""
        ids = {id(p) for group in optimizer.param_groups for p in group["params"]}
        for model in self.models:
            if any(id(p) in ids for p in model.parameters()):
                return model
        if not ids:  # this rank owns no parameter of it (zero1 with more ranks than tensors)
            return self.models[0] if self.models else nn.Module()
        raise AccelError(
            f"a prepared {type(optimizer).__name__} updates parameters of no prepared model, so "
            "its state cannot be saved under a sharded strategy (it is keyed by parameter name).",
            "every prepared optimizer to update parameters of a prepared model.",
            "pass the model to accelerator.prepare(...) together with its optimizer.",
        )

    def holds_dtensors(self) -> bool:
        """True when a model's parameters are sharded DTensors (fsdp on several processes)."""
        from torch.distributed.tensor import DTensor

        return any(isinstance(p, DTensor) for model in self.models for p in model.parameters())

    def state_dict(self) -> dict[str, Any]:
        from torch.distributed.checkpoint.state_dict import (
            get_model_state_dict,
            get_optimizer_state_dict,
        )

        states: dict[str, Any] = {}
        for i, model in enumerate(self.models):
            states[f"model_{i}"] = get_model_state_dict(model)
        for i, (optimizer, local) in enumerate(zip(self.optimizers, self.local)):
            states[f"optimizer_{i}"] = get_optimizer_state_dict(self._owner(local), local)
            states[f"optimizer_{i}_groups"] = _groups_text(optimizer)
        return states

    def save(self, directory: Path) -> None:
        """Every rank writes its shards into ``directory/sharded`` (a collective)."""
        import torch.distributed.checkpoint as dcp

        dcp.save(self.state_dict(), checkpoint_id=str(directory / SHARDED_DIR))

    def load(self, directory: Path) -> None:
        """Read ``directory/sharded`` into the models and optimizers (a collective)."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import (
            set_model_state_dict,
            set_optimizer_state_dict,
        )

        folder = directory / SHARDED_DIR
        if not (folder / ".metadata").is_file():
            raise AccelError(
                f"the checkpoint {directory} has no {SHARDED_DIR}/.metadata, which a checkpoint "
                "saved under a sharded strategy (zero1, fsdp) holds.",
                "a checkpoint written by save_state under the same kind of strategy.",
                "load it with the strategy it was saved with, or save it again.",
            )
        states = self.state_dict()  # allocates the tensors DCP loads into (optimizer state too)
        try:
            dcp.load(states, checkpoint_id=str(folder))
        except Exception as error:  # noqa: BLE001 - DCP wraps every rank's error in one type
            raise AccelError(
                f"the sharded checkpoint {folder} does not fit the prepared models/optimizers "
                f"({type(error).__name__}: {str(error).strip().splitlines()[0][:300]}).",
                "the same model architecture and optimizer class as when saving.",
                "prepare the same models and optimizers (in the same order) before load_state.",
            ) from error
        for i, model in enumerate(self.models):
            set_model_state_dict(model, states[f"model_{i}"])
        for i, (optimizer, local) in enumerate(zip(self.optimizers, self.local)):
            set_optimizer_state_dict(self._owner(local), local, states[f"optimizer_{i}"])
            saved = json.loads(states[f"optimizer_{i}_groups"])
            for group, hyper in zip(optimizer.param_groups, saved):
                group.update({k: tuple(v) if isinstance(group.get(k), tuple) else v
                              for k, v in hyper.items()})
