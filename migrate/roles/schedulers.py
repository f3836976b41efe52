"""Which learning-rate schedulers are prepared.

A scheduler of home stepped inside a training loop over a prepared loader is prepared (it then
steps once per optimizer step, as Accelerate does); one stepped per epoch stays unprepared:
prepared, it would advance per optimizer step times the number of processes."""

from __future__ import annotations

import libcst as cst

from migrate.roles.calls import SCHEDULER, call_name
from migrate.roles.model import Roles


def find_schedulers(roles: Roles) -> None:
    home = roles.home
    assert home is not None
    candidates = [
        name
        for name, bindings in home.bindings.items()
        if any(call_name(roles, b.value, SCHEDULER) for b in bindings)
    ]
    for name in candidates:
        per_batch = False
        for scope in roles.facts.scopes:
            for site in scope.steps:
                if not (isinstance(site.receiver, cst.Name) and roles.all_in(scope, site.receiver.value, [name])):
                    continue
                per_batch = per_batch or any(
                    loop.source is not None
                    and roles.is_training_loop(loop)
                    and roles.all_in(scope, loop.source, roles.loaders)
                    for loop in site.loops
                )
        # A scheduler stepped per epoch stays unprepared: prepared, it would advance per optimizer
        # step times the number of processes.
        if per_batch:
            roles.schedulers.append(name)
        else:
            roles.epoch_schedulers.append(name)
