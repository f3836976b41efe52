"""A device returned by the script's own process-group setup helper: `device = setup()`.

A torchrun script often puts its distributed setup in one helper of its own file:

    def setup():
        dist.init_process_group(backend="nccl")
        local_rank = int(os.environ["LOCAL_RANK"])
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)

    device = setup()

The call is both the process-group setup (the Accelerator must be created after it, to join the
group instead of initialising a second one) and the device choice (which becomes
`accelerator.device`). `setup_device_choices` finds such calls so that placement treats them as a
device choice; AM001 then keeps the call for its setup (`setup()`), creates the Accelerator right
after it and binds the name to `accelerator.device` there."""

from __future__ import annotations

import libcst as cst

from migrate.analysis import DeviceBinding, Facts, Scope, is_device_choice

_INIT = "torch.distributed.init_process_group"


def setup_device_choices(facts: Facts, scope: Scope) -> list[DeviceBinding]:
    """`name = helper(...)` statements directly in `scope`'s body (not under an `if`, not in a
    loop) where `helper` is a plain function of this file that initialises the process group and
    returns only devices: each as a `DeviceBinding` whose value is the call."""
    found: list[DeviceBinding] = []
    for name, bindings in scope.bindings.items():
        for binding in bindings:
            where, value = binding.where, binding.value
            if where.path or where.in_loop or binding.is_loop_target or type(value) is not cst.Call:
                continue
            stmt = where.stmt
            if not (type(stmt) is cst.SimpleStatementLine and len(stmt.body) == 1 and type(stmt.body[0]) is cst.Assign):
                continue
            helper = facts.function_called(value)
            if helper is not None and initialises_group(helper) and returns_device(facts, helper):
                found.append(DeviceBinding(name, where, value))
    return found


def initialises_group(helper: Scope) -> bool:
    """The function calls `init_process_group` itself, as a statement outside loops."""
    return any(c.qualified == _INIT and not c.where.in_loop for c in helper.library_calls)


def returns_device(facts: Facts, helper: Scope) -> bool:
    """Every `return` of `helper` gives a device: a device expression (`torch.device("cuda",
    local_rank)`, `"cuda"`), or a name the helper binds only to device choices."""
    if not helper.returns:
        return False
    chosen = {d.name for d in helper.devices}
    for value in helper.returns:
        if is_device_choice(value, facts.aliases):
            continue
        if type(value) is cst.Name and value.value in chosen and all(
            b.value is not None and is_device_choice(b.value, facts.aliases)
            or any(d.where.stmt is b.where.stmt for d in helper.devices)
            for b in helper.bindings.get(value.value, [])
        ):
            continue
        return False
    return True


def binds_setup_device(facts: Facts, scope: Scope, name: str) -> bool:
    """Every binding of `name` in `scope` is a `name = setup()` device choice (a device, as
    `torch.device(...)` bindings are, for the moves that use it)."""
    bindings = scope.bindings.get(name, [])
    if not bindings:
        return False
    choices = {id(d.where.stmt) for d in setup_device_choices(facts, scope) if d.name == name}
    return all(id(b.where.stmt) in choices for b in bindings)
