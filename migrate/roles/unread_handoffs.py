"""Prepared models handed to code the migration cannot read, after the prepare call.

After `accelerator.prepare(...)` a model may be wrapped (DistributedDataParallel on N processes):
its state dict's keys carry a `module.` prefix, while the checkpoints the migrated script saves
hold the user's module (`accelerator.unwrap_model(model).state_dict()`, AM009). A function of a
package or of a module outside the run that the setup code hands the prepared model to
(`utils.restart_from_checkpoint(path, student=student, ...)`) cannot be read: if it loads or saves
the model's state, it would miss every key on N processes (a `strict=False` load silently loads
nothing) or write the prefix. Each such call in the function that prepares, after the prepare call,
that also takes a file path (`os.path.join(...)`, a `Path`, a string naming a checkpoint file,
or a name bound to one: what loads or saves state) is reported once (AM004) with the fix: hand it `accelerator.unwrap_model(model)`, the same
parameters without the wrapper. Calls inside loops (the training step's helpers, which may run the
forward and must keep the wrapper) are not reported.

Reported for `--target accelerate` only: the runtime's prepared model is the user's module from
the outside on any number of processes (runtime/user_module.py): its `state_dict()` has the
user's keys, its `load_state_dict(..., strict=True)` takes them and `module.`-prefixed ones, and
it pickles as the user's module, so such a helper loads and saves what it did before the
migration (tests/e2e/test_checkpoint_helper_prepared.py).
"""

from __future__ import annotations

import libcst as cst

from migrate.analysis import Scope
from migrate.roles.model import PREPARE, Finding, Roles
from migrate.roles.model_use import unread_function

_PATH_CALLS = frozenset({"os.path.join", "pathlib.Path", "os.path.expanduser", "os.path.abspath"})
_SUFFIXES = (".pt", ".pth", ".ckpt", ".bin", ".tar", ".safetensors", ".pkl")


def report_prepared_models_handed_to_unread_code(roles: Roles) -> None:
    home, after = roles.home, roles.prepare_after
    if home is None or after is None or roles.refused or not roles.models:
        return
    seen: set[str] = set()
    for call in home.library_calls:
        where = call.where
        if call.loops or where.order <= after.order or where.stmt is after.stmt \
                or any(outer.stmt is after.stmt for outer in where.path):
            continue
        if call.qualified in seen or not unread_function(roles, home, call.call):
            continue
        handed = [a.value.value for a in call.call.args
                  if type(a.value) is cst.Name and a.value.value in roles.models]
        if not handed or not any(_path_like(roles, home, a.value) for a in call.call.args):
            continue
        seen.add(call.qualified)
        model = handed[0]
        shown = cst.Module([]).code_for_node(call.call.func)
        roles.findings.append(Finding(
            PREPARE,
            where.stmt,
            f"`{shown}(...)` is handed the prepared `{model}` (wrapped in DistributedDataParallel on N processes, "
            f"its state dict keys prefixed with `module.`), and the migration cannot read it: if it loads or saves "
            f"the model's state (the migrated script saves the unwrapped module), pass "
            f"`accelerator.unwrap_model({model})` instead",
            unconverted=True,  # a resume would silently load nothing on N processes
            targets=("accelerate",),  # the runtime's prepared model has the user's keys
        ))


def _path_like(roles: Roles, home: Scope, value: cst.BaseExpression, depth: int = 0) -> bool:
    """A file path: `os.path.join(...)`, `Path(...)`, `directory / "name.pt"`, a string naming a
    checkpoint file, or a name of home bound to one of these."""
    if type(value) is cst.Call:
        return roles.facts.aliases.qualify(value.func) in _PATH_CALLS
    if type(value) is cst.BinaryOperation:
        return type(value.operator) is cst.Divide and (
            _path_like(roles, home, value.left, depth) or _path_like(roles, home, value.right, depth))
    if type(value) is cst.SimpleString:
        return str(value.evaluated_value).endswith(_SUFFIXES)
    if type(value) is cst.FormattedString:
        return any(type(part) is cst.FormattedStringText and part.value.endswith(_SUFFIXES) for part in value.parts[-1:])
    if type(value) is cst.Name and depth < 2:
        return any(b.value is not None and _path_like(roles, home, b.value, depth + 1)
                   for b in home.bindings.get(value.value, []))
    return False
