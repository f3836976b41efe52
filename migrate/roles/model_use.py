"""Which arguments of a call the code uses as a model, for calls the migration cannot read.

An optimizer's parameter groups or the optimizer itself may come from a function of a module the
run does not hold (`utils.get_params_groups(student)`, timm's `create_optimizer_v2(model, ...)`):
its body cannot be read, so which argument is the model is decided from what the calling scope does
with each argument, as the training step would: a model is built as a `torch.nn` module
(`nn.Linear(...).to(device)`), called by the training step or on inputs (`model(x)`), wrapped by
hand (`DDP(model)`) or asked for its parameters or mode (`model.parameters()`, `model.train()`).
`args`, a weight decay, a config namespace or an optimizer passed beside it shows none of these (a
move is no evidence: tensors move too).
"""

from __future__ import annotations

import libcst as cst

from migrate.analysis import CallSite, Scope
from migrate.roles.calls import HAND_WRAPPERS, is_move_call
from migrate.roles.model import Roles
from migrate.roles.unwrapped_alias import wrapped_model

# Methods only a torch module answers in a training script (not `zero_grad` or `state_dict`, which
# an optimizer answers too: a scheduler factory handed the optimizer must not make it a model).
_MODULE_METHODS = frozenset({
    "parameters", "named_parameters", "train", "eval", "modules", "named_modules", "children",
    "requires_grad_", "apply",
})


def model_arguments(roles: Roles, home: Scope, call: cst.Call) -> list[str]:
    """The names passed to `call` (by position or keyword) that `home` uses as a model, each as the
    model it names (`model_without_ddp` -> `model`, the hand-wrapped module it aliases)."""
    found: list[str] = []
    for arg in call.args:
        if arg.star or type(arg.value) is not cst.Name:
            continue
        name = wrapped_model(home, arg.value.value, roles.facts.aliases)
        if name not in found and (used_as_model(roles, home, name) or used_as_model(roles, home, arg.value.value)):
            found.append(name)
    return found


def used_as_model(roles: Roles, home: Scope, name: str) -> bool:
    """`home` binds `name` (or takes it as a parameter) and builds it as a `torch.nn` module, wraps,
    calls it or asks it a module's question."""
    if not home.binds(name):
        return False
    if any(_built_as_module(roles, binding.value) for binding in home.bindings.get(name, [])):
        return True
    if called_in_training_step(roles, home, name):
        return True
    if any(call.callee == name for call in home.calls):
        return True
    for site in home.method_calls:
        func = site.call.func
        if type(site.receiver) is cst.Name and site.receiver.value == name and type(func) is cst.Attribute \
                and func.attr.value in _MODULE_METHODS:
            return True
    for library in home.library_calls:
        args = library.call.args
        if library.qualified in HAND_WRAPPERS and args and type(args[0].value) is cst.Name \
                and args[0].value.value == name:
            return True
    return False


def _built_as_module(roles: Roles, value: cst.BaseExpression | None) -> bool:
    """`nn.Sequential(...)`, `nn.Linear(...).to(device)`: a `torch.nn` module built (and moved)."""
    while type(value) is cst.Call and type(value.func) is cst.Attribute and value.func.attr.value in ("to", "cuda"):
        value = value.func.value
    if type(value) is not cst.Call:
        return False
    return (roles.facts.aliases.qualify(value.func) or "").startswith("torch.nn.")


def unread_builder_models(roles: Roles, home: Scope, call: cst.Call) -> list[str] | None:
    """The models an object-building call the migration cannot read is handed, or None when the
    call is read (or is no such call): the arguments used as models for a function of a package or
    of a module outside the run (`create_optimizer(args, model)`), the receiver for a method no class
    of the view defines, called on a model (`model.configure_optimizers(config)`, the model's class
    in another module)."""
    if unread_function(roles, home, call):
        return model_arguments(roles, home, call)
    func = call.func
    if type(func) is not cst.Attribute or type(func.value) is not cst.Name or is_move_call(call):
        return None  # `x.to(device)` moves a tensor or a module: it builds nothing
    receiver = func.value.value
    if roles.facts.aliases.qualify(func.value) is not None:
        return None  # `utils.f(...)`: a module, handled above
    if any(s.is_method and s.name == func.attr.value for s in roles.facts.scopes):
        return None  # a method of a class of the view: read by the factories of `optimizers`
    model = wrapped_model(home, receiver, roles.facts.aliases)
    return [model] if used_as_model(roles, home, model) or used_as_model(roles, home, receiver) else None


def unread_function(roles: Roles, home: Scope, call: cst.Call) -> bool:
    """`call` runs a function of a module outside the run (an installed package, or a project module
    not given): imported, not torch's own, and not a function of this module or of the unit."""
    func = call.func
    if type(func) is cst.Name and (roles.facts.resolve(func.value, home) is not None or func.value in roles.facts.classes):
        return False
    qualified = roles.facts.aliases.qualify(func)
    if qualified is None or qualified.startswith("torch."):
        return False
    # `utils.save_model(...)` with utils.py in the run: a function the joined view holds
    return not (type(func) is cst.Attribute and qualified.rpartition(".")[2] in roles.facts.functions)


def called_in_training_step(roles: Roles, home: Scope, model: str) -> bool:
    """The training step calls `model` (home's name, followed through parameters and `self.`
    attributes): `student(images)` in the function that calls `backward`, in a closure beside it
    (`_forward` next to `_backward`), or in a function those call. A model only a wrapper object
    calls (`task(input, target)` holding it) is not what the step trains through."""
    scopes = _training_step_scopes(roles)
    for scope in scopes:
        for call in scope.calls:
            if (home, model) in (roles.origins(scope, call.callee) or ()):
                return True
    return False


def hidden_step_calls(roles: Roles, scope: Scope) -> list[CallSite]:
    """Calls in a loop of `scope` of an object that is no function of the module or the unit
    (`loss_scaler(loss, optimizer, clip_grad=...)`, timm's NativeScaler, whose `__call__` runs
    `backward` and the optimizer step): where the training step is, when no `.backward()` shows."""
    return [
        call for call in scope.calls
        if call.loops and not call.callee.startswith("self.") and roles.facts.resolve(call.callee, scope) is None
        and not roles.facts.aliases.qualify(call.call.func)
        and _binds_an_object(roles, scope, call.callee)
        and any(type(arg.value) is cst.Name for arg in call.call.args)
    ]


def unread_step_function_calls(roles: Roles, scope: Scope) -> list[CallSite]:
    """Calls in a loop of `scope` of a function of a module outside the run that are handed a name
    the same loop computes and another one it does not (`scaled_step(loss, optimizer)` imported from
    a package: the step, when no `.backward()` shows), as call sites named by their qualified name.
    `get_state_dict(model_ema)` or `math.isfinite(loss_value)` (one argument) are not."""
    found: list[CallSite] = []
    for call in scope.library_calls:
        if not call.loops or not unread_function(roles, scope, call.call):
            continue
        loop = call.loops[-1].node
        names = [arg.value.value for arg in call.call.args if type(arg.value) is cst.Name]
        in_loop = [n for n in names if any(
            any(ref.stmt is loop for ref in b.where.path) for b in scope.bindings.get(n, []))]
        if in_loop and len(in_loop) < len(names):
            found.append(CallSite(call.qualified, call.call, call.where, call.loops))
    return found


def _binds_an_object(roles: Roles, scope: Scope, name: str) -> bool:
    """`name` is bound by the code (not a builtin) and none of its bindings builds a `torch.nn`
    module: `model(x)` or `criterion(out, y)` run a forward, not a hidden training step."""
    origins = roles.origins(scope, name)
    if not origins:
        return False
    return not any(
        _built_as_module(roles, binding.value)
        for origin, bound in origins
        for binding in origin.bindings.get(bound, [])
    )


def _training_step_scopes(roles: Roles) -> list[Scope]:
    """The functions that call `backward`, the functions they are nested in and the other closures
    of those, and the functions of the module all of these call."""
    stepping = [s for s in roles.facts.scopes if s.backwards] or [
        s for s in roles.facts.scopes if hidden_step_calls(roles, s)
    ]
    enclosing: list[Scope] = []
    for scope in stepping:
        outer = scope.parent
        while outer is not None and outer.is_function:
            enclosing.append(outer)
            outer = outer.parent
    around = {id(s) for s in enclosing}
    found = {id(s): s for s in (*stepping, *enclosing)}
    for scope in roles.facts.scopes:
        if scope.parent is not None and id(scope.parent) in around:
            found[id(scope)] = scope
    for scope in list(found.values()):
        for call in scope.calls:
            callee = roles.facts.resolve(call.callee, scope)
            if callee is not None:
                found.setdefault(id(callee), callee)
    return list(found.values())
