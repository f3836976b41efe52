"""The single ordered list of rules.

Order matters: rules that decide where `accelerator` is used (prepare, backward) run before
create-accelerator, which creates it only when something uses it and threads it as a parameter
into exactly those functions. Device-move removal is independent of the others.
"""

from __future__ import annotations

from migrate.rules import create_accelerator, prepare_training_objects, remove_device_moves, replace_loss_backward
from migrate.rules.base import Rule

RULES: list[Rule] = [
    Rule.from_module(prepare_training_objects),
    Rule.from_module(remove_device_moves),
    Rule.from_module(replace_loss_backward),
    Rule.from_module(create_accelerator),
]

BY_CODE: dict[str, Rule] = {rule.code: rule for rule in RULES}


def documented_rules() -> list[Rule]:
    """The rules in code order, for listings."""
    return sorted(RULES, key=lambda rule: rule.code)
