"""Shapes reported instead of rewritten, found while the roles are resolved.

A training step hidden in another module (an optimizer but no backward in the file: AM003), apex
AMP (AM006) and `torch.compile` of the model before the prepare call (AM004)."""

from __future__ import annotations

import libcst as cst

from migrate.analysis import Scope
from migrate.roles.model import BACKWARD, MIXED_PRECISION, PREPARE, Finding, Roles


def report_hidden_training_step(roles: Roles) -> None:
    """An optimizer and a model but no `.backward()`: the step is hidden in another module."""
    if any(scope.backwards for scope in roles.facts.scopes) or not roles.models:
        return
    if any(loop.has_backward for scope in roles.facts.scopes for loop in scope.loops):
        return  # already migrated: `accelerator.backward(...)`
    home = roles.home
    assert home is not None
    binding = home.bindings[roles.optimizers[0]][0]
    roles.findings.append(
        Finding(
            BACKWARD,
            binding.where.stmt,
            "an optimizer is built here but no `.backward()` was found in this file: the training step "
            "is hidden in another module (a trainer, a loss-scaler object such as timm's NativeScaler); "
            "call `accelerator.backward(loss)` there, and check that its loader is prepared",
        )
    )


_LIBRARY_TRAPS = {
    "apex.amp.initialize": (
        MIXED_PRECISION,
        "apex AMP is not converted: remove `amp.initialize`/`amp.scale_loss` and use "
        "`Accelerator(mixed_precision=\"fp16\")` with `accelerator.backward(loss)`",
    ),
    "torch.compile": (
        PREPARE,
        "`torch.compile` before `accelerator.prepare(...)` compiles the unwrapped model; compile the "
        "prepared model instead (move this line after the prepare call)",
    ),
}


def report_library_traps(roles: Roles) -> None:
    for scope in roles.facts.scopes:
        for call in scope.library_calls:
            trap = _LIBRARY_TRAPS.get(call.qualified)
            if trap is None:
                continue
            if call.qualified == "torch.compile" and not _compiles_a_model(roles, scope, call.call):
                continue
            roles.findings.append(Finding(trap[0], call.call, trap[1]))


def _compiles_a_model(roles: Roles, scope: Scope, call: cst.Call) -> bool:
    if not call.args or scope is not roles.home:
        return False
    arg = call.args[0].value
    return isinstance(arg, cst.Name) and arg.value in roles.models
