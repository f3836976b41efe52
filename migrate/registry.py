"""The single ordered list of rules.

Order matters: rules that decide where `accelerator` is used (prepare, backward, accumulate,
clipping) run before checkpoints-and-output (which converts prints only where the accelerator is
already in use) and before create-accelerator, which creates it only when something uses it and threads it as a parameter
into exactly those functions. Device-move removal is independent of the others.
"""

from __future__ import annotations

from migrate.rules import (
    accumulate_gradients,
    checkpoints_and_output,
    clip_gradients,
    convert_mixed_precision,
    create_accelerator,
    gather_eval_metrics,
    guard_experiment_loggers,
    prepare_training_objects,
    reduce_per_rank_decisions,
    remove_device_moves,
    remove_distributed_boilerplate,
    replace_loss_backward,
)
from migrate.rules.base import Rule

RULES: list[Rule] = [
    Rule.from_module(gather_eval_metrics),  # decides which evaluation loaders prepare includes
    Rule.from_module(remove_distributed_boilerplate),  # decides which rank-sharded loaders are freed
    Rule.from_module(prepare_training_objects),
    Rule.from_module(remove_device_moves),
    Rule.from_module(convert_mixed_precision),  # before backward: it owns `scaler.scale(loss).backward()`
    Rule.from_module(replace_loss_backward),
    Rule.from_module(accumulate_gradients),  # before clipping: clipping inside it is guarded
    Rule.from_module(clip_gradients),
    Rule.from_module(checkpoints_and_output),  # after the rules that decide who uses accelerator
    # after AM007 and AM010 (which decide which loaders get prepared: only sums over those differ
    # per rank) and before AM001, which creates the accelerator for every function that uses it
    Rule.from_module(reduce_per_rank_decisions),
    # before AM001: the helpers whose logging it guards must receive the accelerator, and a guard
    # above the device choice moves the Accelerator's creation up
    Rule.from_module(guard_experiment_loggers),
    Rule.from_module(create_accelerator),
]

BY_CODE: dict[str, Rule] = {rule.code: rule for rule in RULES}


def documented_rules() -> list[Rule]:
    """The rules in code order, for listings."""
    return sorted(RULES, key=lambda rule: rule.code)
