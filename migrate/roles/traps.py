"""Shapes reported instead of rewritten, found while the roles are resolved.

A training step hidden in another module (an optimizer but no backward in the file: AM003), apex
AMP (AM006), `torch.compile` of the model before the prepare call (AM004), and a prepared model
wrapped again by hand in DDP / DataParallel where AM007 cannot remove the wrapper (AM007), a copy
of the prepared model trained in its place (`learner = maml.clone()`), an optimizer rebound to
another library's distributed optimizer (AM004) and a model split over the GPUs by
`device_map="auto"` (AM004): the last four refuse the file."""

from __future__ import annotations

import libcst as cst

from migrate.analysis import Binding, Scope, StmtRef
from migrate.names import call_argument, instance_attribute
from migrate.roles.calls import HAND_WRAPPERS
from migrate.roles.class_wrappers import ClassWrapper, class_wrapper
from migrate.roles.model import BACKWARD, DISTRIBUTED, MIXED_PRECISION, PREPARE, Finding, Roles


def report_hidden_training_step(roles: Roles) -> None:
    """An optimizer and a model but no `.backward()`: the step is hidden in another module."""
    if any(scope.backwards for scope in roles.facts.scopes) or not roles.models or roles.hidden_steps:
        return
    if any(loop.has_backward for scope in roles.facts.scopes for loop in scope.loops) or roles.accelerator_exists:
        return  # already migrated: `accelerator.backward(...)`, maybe in a helper method outside the loop
    home = roles.home
    assert home is not None
    binding = home.bindings[roles.optimizers[0]][0]
    roles.findings.append(
        Finding(
            BACKWARD,
            binding.where.stmt,
            "an optimizer is built here but no `.backward()` was found in this file: the training step "
            "is hidden in another module (a trainer, a loss-scaler object such as timm's NativeScaler); "
            "call `accelerator.backward(loss)` there, and check that its loader is prepared", unconverted=True,
        )
    )


# qualified name -> (code, message, training code left unconverted: see `Finding`)
_LIBRARY_TRAPS = {
    "apex.amp.initialize": (
        MIXED_PRECISION,
        "apex AMP is not converted: remove `amp.initialize`/`amp.scale_loss` and use "
        "`Accelerator(mixed_precision=\"fp16\")` with `accelerator.backward(loss)`",
        True,
    ),
    "torch.compile": (
        PREPARE,
        "`torch.compile` before `accelerator.prepare(...)` compiles the unwrapped model; compile the "
        "prepared model instead (move this line after the prepare call)",
        False,  # the prepared model wraps the compiled one and trains; advice on where to compile
    ),
}


def report_library_traps(roles: Roles) -> None:
    for scope in roles.facts.scopes:
        for call in scope.library_calls:
            trap = _LIBRARY_TRAPS.get(call.qualified)
            if trap is None:
                continue
            if call.qualified == "torch.compile" and (
                not _compiles_a_model(roles, scope, call.call) or _never_runs(roles, scope, call.where)
            ):
                continue
            roles.findings.append(Finding(trap[0], call.call, trap[1], unconverted=trap[2]))


def _compiles_a_model(roles: Roles, scope: Scope, call: cst.Call) -> bool:
    if not call.args or scope is not roles.home:
        return False
    arg = call.args[0].value
    return isinstance(arg, cst.Name) and arg.value in roles.models


def _never_runs(roles: Roles, scope: Scope, where: StmtRef) -> bool:
    """The statement is in the body of an `if` whose test is constant false: `if False:`, or a name
    the scope binds only to `False` (`use_compile = False` ... `if use_compile:`, nanoGPT's switch
    left off), read in a file that never rebinds it elsewhere (no other scope binds it, no
    `global`, no `exec`/`globals()` that could set it from a config file)."""
    chain = (*where.path, where)
    for outer, inner in zip(chain, chain[1:]):
        test = outer.stmt
        if type(test) is not cst.If or not any(s is inner.stmt for s in test.body.body):
            continue
        if _constant_false(roles, scope, test.test):
            return True
    return False


def _constant_false(roles: Roles, scope: Scope, test: cst.BaseExpression) -> bool:
    if type(test) is cst.Name and test.value == "False":
        return True
    if type(test) is cst.BooleanOperation and type(test.operator) is cst.And:
        return _constant_false(roles, scope, test.left) or _constant_false(roles, scope, test.right)
    if type(test) is not cst.Name or test.value in scope.params:
        return False
    name = test.value
    bound = scope.bindings.get(name, [])
    if not bound or not all(type(b.value) is cst.Name and b.value.value == "False" for b in bound):
        return False
    if any(other is not scope and other.bindings.get(name) for other in roles.facts.scopes):
        return False
    text = roles.facts.text if roles.facts.text is not None else roles.facts.module.code
    return "global " not in text and "exec(" not in text and "globals()" not in text


def refuse_rewrapped_models(roles: Roles) -> None:
    """`self.model = DDP(self.model, device_ids=[...])` in a class the prepared model reaches through
    a constructor argument (`dataset, model, optimizer = load_train_objs()`, then
    `Trainer(model, ...)`): in the class's constructor, AM007 removes it with its readers
    (`migrate.roles.class_wrappers`, kept in `roles.class_wrappers`); anywhere else it would stay and
    wrap the prepared model (DistributedDataParallel itself on N processes) in a second DDP, so the
    file is refused with the line and the reason."""
    home = roles.home
    if home is None or not roles.models or roles.refused or roles.accelerator_exists:
        return
    for scope in roles.facts.scopes:
        if scope is home:
            continue  # AM007 removes the wrappers of home's models there
        for call in scope.library_calls:
            if call.qualified not in HAND_WRAPPERS or not call.call.args:
                continue
            arg = call.call.args[0].value
            ref = arg.value if isinstance(arg, cst.Name) else instance_attribute(arg)
            if ref is None:
                continue
            model = _prepared_model(roles, scope, ref)
            if model is None:
                continue
            constructor = roles.constructor_of(scope) if scope.is_method else None
            why = "the wrapper is outside the function that prepares the model"
            if constructor is scope:
                found = class_wrapper(roles.methods_of(scope) or [], scope, call.call)
                if isinstance(found, ClassWrapper):
                    roles.class_wrappers.append(found)  # AM007 removes it, and unwraps its readers
                    continue
                why = found
            if call.qualified.endswith(".DataParallel"):
                kind, harm = "DataParallel", ("DataParallel around the prepared model (each process would split its "
                                              "batches over every visible GPU, beside DDP's one GPU per process")
            else:
                kind, harm = "DistributedDataParallel", "DDP inside DDP (every gradient all-reduced twice"
            roles.refused = True
            roles.findings = [Finding(DISTRIBUTED, call.call, (
                f"`{ref}` in `{scope.qualname}` is the model `{model}` that `accelerator.prepare(...)` would wrap in "
                f"`{home.qualname}`, and this line wraps it again in {kind}: {harm}; `.module.state_dict()` "
                "would save another `module.` prefix that the original's checkpoints do not have). It cannot be "
                f"removed here ({why}), and the file was left as it is: remove this wrapper by hand (prepare "
                "wraps the model), read the bare module with `accelerator.unwrap_model(...)` instead of `.module`, "
                "and run again"
            ), unconverted=True)]
            return


def _prepared_model(roles: Roles, scope: Scope, ref: str) -> str | None:
    """The model of home that `ref` in `scope` holds: home's own binding, or home's return value
    (`model = build()`, `dataset, model, optimizer = load_train_objs()` where home returns it)."""
    home = roles.home
    found = roles.origins(scope, ref)
    for origin_scope, name in found or ():
        if origin_scope is home and name in roles.models:
            return name
        for binding in origin_scope.bindings.get(name, []):
            returned = _returned_by_home(roles, binding)
            if returned is not None:
                return returned
    return None


def _returned_by_home(roles: Roles, binding: Binding) -> str | None:
    stmt = binding.where.stmt
    assign = stmt.body[0] if isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1 else None
    if not (isinstance(assign, cst.Assign) and len(assign.targets) == 1 and isinstance(assign.value, cst.Call)):
        return None
    if roles.facts.function_called(assign.value) is not roles.home or roles.home is None:
        return None
    target = assign.targets[0].target
    index: int | None = None
    if isinstance(target, (cst.Tuple, cst.List)):
        for i, element in enumerate(target.elements):
            if isinstance(element.value, cst.Name) and element.value.value == binding.name:
                index = i
    for returned in roles.home.returns:
        value = returned
        if index is not None:
            if not isinstance(returned, cst.Tuple) or index >= len(returned.elements):
                continue
            value = returned.elements[index].value
        if isinstance(value, cst.Name) and value.value in roles.models:
            return value.value
    return None


# nn.Module methods that run no forward and return no module to run one through.
_MODULE_METHODS = frozenset({
    "parameters", "named_parameters", "buffers", "named_buffers", "children", "named_children", "modules",
    "named_modules", "state_dict", "load_state_dict", "train", "eval", "to", "cuda", "cpu", "half", "float",
    "double", "bfloat16", "zero_grad", "requires_grad_", "apply", "type", "share_memory", "extra_repr",
    "get_submodule", "get_parameter", "get_buffer", "register_buffer", "register_parameter", "register_module",
    "add_module", "register_forward_hook", "register_forward_pre_hook", "register_full_backward_hook",
})


def refuse_forward_bypassing_copies(roles: Roles) -> None:
    """`learner = maml.clone()` in a training loop, then `learner(x)` and a backward, the prepared
    model itself never called there: on N processes the prepared model is DDP, whose reducer only
    synchronises a backward that its own forward prepared. The copy's forward is the wrapped
    module's (`PreparedDDP` hands `clone` to it), so no gradient is ever averaged across processes
    (the runtime raises GradientSyncError at the first backward). The file is refused with the line."""
    home = roles.home
    if home is None or not roles.models or roles.refused or roles.accelerator_exists:
        return
    for scope in roles.facts.scopes:
        for site in scope.method_calls:
            receiver = site.receiver
            assert type(receiver) is cst.Name
            method = site.call.func.attr.value  # type: ignore[attr-defined]
            if method in _MODULE_METHODS or not roles.all_in(scope, receiver.value, roles.models):
                continue
            loops = [loop for loop in site.loops if loop.has_backward]
            copy = _bound_name(site.where.stmt, site.call)
            if not loops or copy is None or _model_called(scope, receiver.value, loops[0]):
                continue
            if not _runs(roles, scope, copy):
                continue
            roles.refused = True
            roles.findings = [Finding(PREPARE, site.call, (
                f"`{copy} = {receiver.value}.{method}(...)` in a training loop, then `{copy}(...)`: on N processes the "
                f"prepared `{receiver.value}` is DistributedDataParallel, and `{receiver.value}.{method}()` runs on the "
                f"wrapped module (the prepared model hands attributes it does not have to it), so it returns a module "
                "whose forward DDP never sees: DDP synchronises only a backward that its own forward prepared, so no "
                "gradient would be averaged across processes (the runtime's check raises GradientSyncError). The "
                "file was left as it is: compute the loss inside the model's `forward` and call the prepared model, or "
                f"leave `{receiver.value}` unprepared and all-reduce its gradients yourself before the optimizer steps"
            ), unconverted=True)]
            for wrapper in _distributed_optimizer_wrappers(roles):
                roles.findings.append(wrapper)
            return
    wrappers = _distributed_optimizer_wrappers(roles)
    if wrappers:
        roles.refused = True
        roles.findings = wrappers


# `device_map=` values that spread a model over the GPUs of one process (transformers / Accelerate's
# big-model loading): model parallel, where `prepare` needs a whole copy on each process's device.
_SPREADING_DEVICE_MAPS = frozenset({"auto", "balanced", "balanced_low_0", "sequential"})


def refuse_models_spread_by_device_map(roles: Roles) -> None:
    """A model loaded with `device_map="auto"` (or `"balanced"`, `"balanced_low_0"`, `"sequential"`:
    `from_pretrained(..., device_map="auto")`) is split over every GPU the process sees, layer by
    layer: one process trains one model across the GPUs. `prepare` needs a whole copy on each
    process's own device: on N processes each would load its own copy spread over all the same
    GPUs, and `prepare` would wrap a model that is not on one device. The file is refused with the
    line; a single-device map (`device_map={"": 0}`, `"cuda"`) is not this shape."""
    home = roles.home
    if home is None or not roles.models or roles.refused or roles.accelerator_exists:
        return
    for model in roles.models:
        for binding in home.bindings.get(model, []):
            value = binding.value
            if type(value) is not cst.Call:
                continue
            spread = next((arg.value for arg in value.args if arg.keyword is not None
                           and arg.keyword.value == "device_map" and type(arg.value) is cst.SimpleString
                           and arg.value.evaluated_value in _SPREADING_DEVICE_MAPS), None)
            if spread is None:
                continue
            roles.refused = True
            roles.findings = [Finding(PREPARE, value, (
                f"`{model}` is loaded with `device_map={spread.value}`, which splits it over all the GPUs this "
                "process sees (model parallel: one process trains one model across the GPUs), while "
                "`accelerator.prepare` trains data parallel, a whole copy of the model on each process's own "
                "device: on N processes each would load its own copy spread over all the same GPUs, and `prepare` "
                "would wrap a model that is not on one device. The file was left as it is: to train data parallel, drop `device_map=` (prepare puts the "
                "whole model on each process's device) and run the migration again; to keep the model split over "
                "the GPUs, run the script as it is, on one process"
            ), unconverted=True)]
            return


def _bound_name(stmt: cst.BaseStatement, call: cst.Call) -> str | None:
    """`name = <call>` as a statement of its own: the name."""
    small = stmt.body[0] if type(stmt) is cst.SimpleStatementLine and len(stmt.body) == 1 else None
    if type(small) is cst.Assign and small.value is call and len(small.targets) == 1:
        target = small.targets[0].target
        return target.value if type(target) is cst.Name else None
    return None


def _model_called(scope: Scope, model: str, loop: object) -> bool:
    return any(site.callee == model and loop in site.loops for site in scope.calls)


def _runs(roles: Roles, scope: Scope, name: str) -> bool:
    """`name(...)` in `scope`, or `name` passed to a function of this file that calls that parameter."""
    for site in scope.calls:
        if site.callee == name:
            return True
        callee = roles.facts.function_called(site.call)
        if callee is None:
            continue
        params = callee.params[1:] if callee.is_method else callee.params
        for index, param in enumerate(params):
            arg = call_argument(site.call, index, param)
            if type(arg) is cst.Name and arg.value == name and any(s.callee == param for s in callee.calls):
                return True
    return False


def _distributed_optimizer_wrappers(roles: Roles) -> list[Finding]:
    """`optimizer = cherry.optim.Distributed(params, opt=optimizer)`: home's optimizer rebound to
    another library's distributed optimizer, which averages the gradients (and syncs the
    parameters) across processes with its own collectives; prepared, it would run them beside DDP's."""
    home = roles.home
    found: list[Finding] = []
    if home is None:
        return found
    for name in roles.optimizers:
        for binding in home.bindings.get(name, []):
            value = binding.value
            if type(value) is not cst.Call:
                continue
            qualified = roles.facts.aliases.qualify(value.func) or cst.Module([]).code_for_node(value.func)
            takes_it = any(type(a.value) is cst.Name and a.value.value == name for a in value.args)
            if takes_it and "Distributed" in qualified.rsplit(".", 1)[-1]:
                found.append(Finding(PREPARE, value, (
                    f"`{name}` is wrapped in `{qualified}(...)`, another library's distributed optimizer: it averages "
                    "gradients (and synchronises parameters) across processes with its own collectives, so "
                    f"`accelerator.prepare({name})` would hand it a model DDP already synchronises; the file was left "
                    "as it is: keep one of the two (drop the wrapper and prepare the inner optimizer, or keep the "
                    "wrapper and leave the model unprepared)"
                ), unconverted=True))
    return found


def refuse_kept_wraps(roles: Roles) -> None:
    """A hand-written DDP / DataParallel that the training step runs, which AM007 would not remove
    (it removes `model = DDP(model)`, the wrapper bound to the model's own name, and the second name
    prepare binds, `roles.model_aliases`). Found from use, not from where it is written:

    - a wrap in home bound to anything else (`model, opt = DDP(model), opt`, `model = DDP(model) if
      args.distributed else model`, a second name read before the prepare point);
    - a model of home bound from a function of the file that wraps it (`model = wrap(Net())` with
      `def wrap(m): return DDP(m)`, `model = build(args)` whose `if args.distributed: model =
      DDP(model)` runs before `return model`): where the wrap can go there whole
      (`_helper_wraps_go`), it is kept in `roles.helper_wraps` for AM007 to remove; otherwise refused.

    Kept, the wrap runs beside `accelerator.prepare(...)`: DDP without a process group under plain
    `python`, DDP inside DDP at N processes, or a DDP the Accelerator does not know trained in place
    of the prepared model. The file is refused on the wrap's line, with how to remove it by hand."""
    home = roles.home
    if home is None or not roles.models or roles.refused or roles.accelerator_exists:
        return
    removed = _removed_wraps(roles, home)
    for call in home.library_calls:
        if call.qualified not in HAND_WRAPPERS or not call.call.args or id(call.call) in removed:
            continue
        arg = call.call.args[0].value
        ref = arg.value if isinstance(arg, cst.Name) else instance_attribute(arg)
        if ref is None or ref not in roles.models:
            continue
        _refuse_kept_wrap(roles, call, home, ref, (
            f"the wrapper's value is not bound to `{ref}` itself, so it cannot go as a whole here. Remove the wrap by "
            f"hand (`{ref}` alone where the wrapped model was used: prepare wraps it), read the bare module with "
            "`accelerator.unwrap_model(...)` instead of `.module`, and run again"))
        return
    for name in roles.models:
        for binding in home.bindings.get(name, []):
            value = binding.value
            if not isinstance(value, cst.Call):
                continue
            helper = roles.facts.function_called(value)
            if helper is None or helper is home:
                continue
            wraps = [call for call in helper.library_calls if call.qualified in HAND_WRAPPERS and call.call.args]
            why = _helper_wraps_go(roles, helper, value, wraps) if wraps else None
            if wraps and why is None:
                roles.helper_wraps.extend((name, call.call, call.where, helper) for call in wraps)
                continue
            for call in wraps:
                if True:
                    wrapped = cst.Module([]).code_for_node(call.call.args[0].value)
                    _refuse_kept_wrap(roles, call, helper, wrapped, (
                        f"`{name}` in `{home.qualname}` is what `{helper.qualname}` returns, and it is wrapped there, "
                        f"outside the function that prepares it, where the wrap cannot go as a whole ({why}). Return the bare model from `{helper.qualname}` "
                        "(remove this wrap, and an `if` left empty by it: prepare wraps the model), read the bare "
                        "module with `accelerator.unwrap_model(...)` instead of `.module`, and run again"))
                    return
    _refuse_returned_wraps(roles, home)


def _refuse_returned_wraps(roles: Roles, home: Scope) -> None:
    """A function or method of the file that home calls, and that returns a hand wrap in any other
    shape than the one `refuse_kept_wraps` removes: in a tuple (`model, k = build()` with `return
    DDP(m), k`), or bound by home to a name the step runs (`self.ddp_model = self.wrap(self.model)`).
    Kept, the step would run a hand-written DDP beside the prepared model: refused on the wrap."""
    handled = {id(call) for _, call, _, _ in roles.helper_wraps}
    for site in home.calls:
        helper = roles.facts.resolve(site.callee, home)
        if helper is None or helper is home:
            continue
        wraps = [call for call in helper.library_calls
                 if call.qualified in HAND_WRAPPERS and call.call.args and id(call.call) not in handled]
        returned = _returned_nodes(helper)
        for call in wraps:
            small = call.where.stmt.body[0] if isinstance(call.where.stmt, cst.SimpleStatementLine) else None
            bound = (small.targets[0].target.value if isinstance(small, cst.Assign) and small.value is call.call
                     and len(small.targets) == 1 and isinstance(small.targets[0].target, cst.Name) else None)
            if id(call.call) not in returned and (bound is None or bound not in returned.values()):
                continue
            wrapped = cst.Module([]).code_for_node(call.call.args[0].value)
            _refuse_kept_wrap(roles, call, helper, wrapped, (
                f"`{home.qualname}` runs what `{helper.qualname}` returns, which is wrapped there, and the wrap cannot go "
                f"as a whole (`{helper.qualname}` returns it in another shape than `return DDP(m)` bound to the model). "
                "Remove this wrap by hand and have the training step run the model itself (the one whose parameters "
                "the optimizer trains) where it ran the wrapped one: prepare wraps it; read the bare module with "
                "`accelerator.unwrap_model(...)` instead of `.module`, and run again"))
            return


def _returned_nodes(helper: Scope) -> dict[int, str]:
    """id -> name (or "") of every node a `return` of `helper` hands back: the value itself and the
    elements of a returned tuple or list."""
    found: dict[int, str] = {}
    for value in helper.returns:
        for node in (value, *(e.value for e in getattr(value, "elements", ()) if isinstance(value, (cst.Tuple, cst.List)))):
            found[id(node)] = node.value if isinstance(node, cst.Name) else ""
    return found


def _helper_wraps_go(roles: Roles, helper: Scope, called: cst.Call, wraps: list) -> str | None:  # type: ignore[type-arg]
    """The hand wraps of `helper` can go there, so that it returns the bare model that prepare then
    wraps at the call site: home's `called` is the helper's only call in the file (no other caller
    gets a bare model where it had a wrapped one), and each wrap is `return DDP(m, ...)` or `m =
    DDP(m, ...)` (a statement of its own, alone in an `if` without `else` or in a block that keeps
    others) of a name the helper returns, with no `m.module` in the helper; every `return` returns
    a plain name or such a wrap. Returns None when they go, else why they cannot."""
    sites = [site for scope in roles.facts.scopes for site in scope.calls
             if roles.facts.function_called(site.call) is helper]
    if len(sites) != 1 or sites[0].call is not called:
        return f"`{helper.qualname}` is called {len(sites)} times in the file, and every caller would get the bare model"
    if helper.module_accesses:
        return f"`{helper.qualname}` reads `.module` of what it wraps"
    wrap_calls = {id(call.call) for call in wraps}
    returned: set[str] = set()
    for value in helper.returns:
        if isinstance(value, cst.Name):
            returned.add(value.value)
        elif id(value) not in wrap_calls:
            return f"`{helper.qualname}` returns another value than a name or the wrap"
    for call in wraps:
        inner = call.call.args[0].value
        stmt = call.where.stmt
        small = stmt.body[0] if isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1 else None
        shape = "the wrap is not `return DDP(m)` or `m = DDP(m)` of a name the helper returns"
        if not isinstance(inner, cst.Name) or call.where.in_loop:
            return shape
        if isinstance(small, cst.Return) and small.value is call.call:
            continue
        if not (isinstance(small, cst.Assign) and small.value is call.call and len(small.targets) == 1):
            return shape
        target = small.targets[0].target
        if not (isinstance(target, cst.Name) and target.value == inner.value and inner.value in returned):
            return shape
        parent = call.where.path[-1].stmt if call.where.path else None
        if len(getattr(call.where.block, "body", ())) == 1 and not (isinstance(parent, cst.If) and parent.orelse is None):
            return shape
    return None


def _removed_wraps(roles: Roles, home: Scope) -> set[int]:
    """The wrapper calls of home that AM007 removes (`_remove_wrappers`, `alias_removal`)."""
    found: set[int] = set()
    for name in (*roles.models, *roles.model_aliases):
        for binding in home.bindings.get(name, []):
            value = binding.value
            while (isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute)
                   and value.func.attr.value in ("cuda", "to") and isinstance(value.func.value, cst.Call)):
                value = value.func.value
            conditional = wrapped_or_itself(roles, value, name)
            if conditional is not None and isinstance(binding.where.stmt, cst.SimpleStatementLine) \
                    and len(binding.where.stmt.body) == 1:
                found.add(id(conditional))
            elif isinstance(value, cst.Call):
                found.add(id(value))
    return found


def wrapped_or_itself(roles: Roles, value: cst.BaseExpression | None, name: str) -> cst.Call | None:
    """`model = DDP(model, ...) if args.distributed else model` (or the branches the other way
    round): the wrapper call, which AM007 removes with its statement as it removes `if
    args.distributed: model = DDP(model)`; None for any other value."""
    if not isinstance(value, cst.IfExp):
        return None
    for wrapped, other in ((value.body, value.orelse), (value.orelse, value.body)):
        bare = other.value if isinstance(other, cst.Name) else instance_attribute(other)
        if bare != name or not isinstance(wrapped, cst.Call) or not wrapped.args:
            continue
        if roles.facts.aliases.qualify(wrapped.func) not in HAND_WRAPPERS:
            continue
        inner = wrapped.args[0].value
        if (inner.value if isinstance(inner, cst.Name) else instance_attribute(inner)) == name:
            return wrapped
    return None


def _refuse_kept_wrap(roles: Roles, call: object, scope: Scope, ref: str, advice: str) -> None:
    qualified = call.qualified  # type: ignore[attr-defined]
    kind = "DataParallel" if qualified.endswith(".DataParallel") else "DistributedDataParallel"
    roles.refused = True
    roles.findings = [Finding(DISTRIBUTED, call.call, (  # type: ignore[attr-defined]
        f"this line wraps `{ref}` in {kind} by hand in `{scope.qualname}`, and the training step runs the wrapped "
        "model: kept beside `accelerator.prepare(...)` it would fail under plain `python` (no process group) and "
        "wrap the prepared model again at N processes (or train a copy the Accelerator does not know); "
        f"the file was left as it is: {advice}"
    ), unconverted=True)]
