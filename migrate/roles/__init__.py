"""Turn the analysis facts into roles: who is the model, the optimizer, the training loader.

Names are followed through assignments, function parameters (via the module's own call sites)
and enclosing scopes, so `train(model, loader, optimizer)` called from `main()` is understood as
working on main's prepared objects. Everything the rules decide is derived here once, by
`find_roles`, one straight pipeline of finders:

- `model`: the `Roles` record, its name resolution (`origins`) and reach (`can_reach`);
- `spawn`: an `mp.spawn` launcher AM007 can convert, or the reason it cannot;
- `optimizers`: where the optimizer is built (home) and which models it optimizes;
- `entry`: whether the file is a script at all (a test or library module is left alone);
- `loaders`, `schedulers`: the training loaders (and their sharding), the schedulers to prepare,
  the evaluation loops;
- `mpi_launch`: processes started by MPI (a process group built from mpi4py's ranks): refused whole;
- `traps`: shapes reported instead of rewritten (a hidden training step, apex, torch.compile, a
  prepared model wrapped again by hand where AM007 cannot remove the wrapper);
- `placement`: where `accelerator = Accelerator()` and `accelerator.prepare(...)` go.

A finder that cannot give a training object a role says so with a `Finding` (the diagnostic of the
rule that would have rewritten it); `Roles.refused` leaves the whole file as it is.

Key terms:
- home: the scope that builds the optimizer; `accelerator.prepare(...)` goes there.
- accelerator scope: where `accelerator = Accelerator()` lives (the device choice, or home).
- reach: whether a scope can see `accelerator` (same or nested scope, a module-level accelerator,
  or a function every caller of which can pass it in as a new parameter).
"""

from __future__ import annotations

from migrate import hand_sharding
from migrate.roles import mpi_launch
from migrate.analysis import Facts
from migrate.roles.entry import (
    built_in_a_class_body,
    is_library_module,
    training_functions,
)
from migrate.roles.loaders import (
    find_eval_loops,
    find_loaders,
    kept_as_attribute,
    loader_calls,
    loaders_for_training_only,
    prefer_attributes,
    report_instance_fed,
    report_unsharded_training,
    sampler_values,
)
from migrate.roles.hidden_step import find_hidden_steps
from migrate.roles.model import Finding, Origin, Roles
from migrate.roles.optimizers import (
    find_existing_accelerator,
    find_home_and_optimizers,
    find_models,
    refuse_retrained_objects,
)
from migrate.roles.placement import place_accelerator, place_prepare
from migrate.roles.schedulers import find_schedulers
from migrate.roles.spawn import SpawnLaunch, check_spawn_worker, find_group_flag, spawn_launch
from migrate.roles.unread_handoffs import report_prepared_models_handed_to_unread_code
from migrate.roles.traps import (
    refuse_forward_bypassing_copies,
    refuse_kept_wraps,
    refuse_models_spread_by_device_map,
    refuse_rewrapped_models,
    report_hidden_training_step,
    report_library_traps,
)

__all__ = [
    "Finding", "Origin", "Roles", "SpawnLaunch", "find_roles", "kept_as_attribute", "loader_calls", "sampler_values",
]


def find_roles(facts: Facts) -> Roles:
    roles = Roles(facts)
    spawn = spawn_launch(facts)
    if isinstance(spawn, Finding):
        roles.refused = True
        roles.findings.append(spawn)
        return roles
    _find_roles(roles)
    if roles.home is not None and not roles.accelerator_exists and mpi_launch.refuse(roles):
        return roles  # processes started by MPI: left whole, every MPI rank read named
    if spawn is not None and not roles.refused:
        check_spawn_worker(roles, spawn)
    elif not roles.refused:
        find_group_flag(roles)
    if roles.home is not None and roles.models and not roles.refused and not roles.accelerator_exists:
        sharding = hand_sharding.find(roles)
        if isinstance(sharding, Finding):
            roles.refused = True
            roles.findings = [sharding]
        else:
            roles.sharding = sharding
    return roles


def _find_roles(roles: Roles) -> None:
    facts = roles.facts
    roles._training_functions = training_functions(roles)
    find_home_and_optimizers(roles)
    find_existing_accelerator(roles)
    if roles.home is None or built_in_a_class_body(roles):
        return
    find_models(roles)
    find_hidden_steps(roles)
    find_loaders(roles)
    if roles.refused or is_library_module(roles):
        return
    prefer_attributes(roles)
    report_unsharded_training(roles)
    report_hidden_training_step(roles)
    report_library_traps(roles)
    refuse_rewrapped_models(roles)
    refuse_forward_bypassing_copies(roles)
    refuse_models_spread_by_device_map(roles)
    find_schedulers(roles)
    find_eval_loops(roles)
    place_accelerator(roles)
    report_instance_fed(roles)
    place_prepare(roles)
    refuse_kept_wraps(roles)
    loaders_for_training_only(roles)
    refuse_retrained_objects(roles)
    report_prepared_models_handed_to_unread_code(roles)
