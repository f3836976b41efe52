"""Where the optimizer is built (home), and which models it optimizes.

An optimizer is `torch.optim.X(...)` (or transformers' AdamW / Adafactor, or ZeRO, which AM007
unwraps), a subclass of a torch optimizer defined in the file (`LARS(...)`), or a factory of the
file that returns one (`model.configure_optimizers()`, `create_optimizer(args, model)`). The first
one built is home's; its models are the roots of `X.parameters()` in its arguments, the receiver of
a factory method, the arguments a factory function passes on as parameters, and the arguments a
function of the module (or of the joined cross-module view) builds parameter groups from
(`AdamW(param_groups(model, wd))`), or the arguments the code uses as models when that function
cannot be read (`utils.get_params_groups(student)`, `model_use`). With no known constructor, the
optimizer is found from use: a package factory's result that the training step steps after
`backward` (`optimizer = create_optimizer_v2(model, ...)`). Alternatives in `if/elif/else`
branches are one optimizer, prepared once after the chain. Optimizers built elsewhere, wrapped without a binding
(`ScheduledOptim(Adam(...))`), rebuilt after the prepare call, or whose model is not found are
reported (AM004). A rebuilt optimizer refuses the file, and so does a factory or optimizer subclass
whose model is not found; a `torch.optim` optimizer whose model is not found is prepared without a
model (none is guessed) and reported at its line."""

from __future__ import annotations

import libcst as cst

from migrate.analysis import Binding, CallSite, Scope, StmtRef
from migrate.names import call_argument, instance_attribute, root_name
from migrate.roles.calls import OPTIMIZER, call_name, callee
from migrate.roles.hand_update import find_hand_updates, hand_trained_home
from migrate.roles.loaders import unpacked_call
from migrate.roles.model import BACKWARD, Finding, ObjectBuilder, Roles, WrappedOptimizer
from migrate.roles.model_use import (
    called_in_training_step,
    hidden_step_calls,
    unread_step_function_calls,
    model_arguments,
    unread_builder_models,
    unread_function,
    used_as_model,
)
from migrate.roles.unwrapped_alias import wrapped_model
from migrate.walk import walk


def find_home_and_optimizers(roles: Roles) -> None:
    found: list[tuple[Scope, Binding]] = []
    wrapped_in: list[tuple[Scope, WrappedOptimizer]] = []
    classes = optimizer_classes(roles)
    factories = optimizer_factories(roles, classes)
    builders = training_object_builders(roles, classes)
    roles.object_builders = builders
    for scope in roles.facts.scopes:
        if scope.name in factories or id(scope) in builders:
            continue  # the optimizer it builds is the one its caller binds
        for bindings in scope.bindings.values():
            for binding in bindings:
                if builds_optimizer(roles, binding.value, classes, factories) or built_objects(roles, binding) == "optimizer":
                    found.append((scope, binding))
                else:
                    wrapped = _wrapped_optimizer(roles, scope, binding, classes)
                    if wrapped is not None:
                        found.append((scope, binding))
                        wrapped_in.append((scope, wrapped))
    if not found:
        found = stepped_factory_results(roles)
    if not found:
        _report_wrapped_optimizers(roles, classes)
        hand = hand_trained_home(roles) if not roles.findings else None
        if hand is not None:  # no optimizer: the step updates a module's parameters by hand (prepared alone)
            roles.home, roles.models = hand[0], hand[1]
            roles.hand_updated = True
        return
    found.sort(key=lambda pair: pair[1].where.order)
    roles.home = found[0][0]
    # only home's wrappers are prepared and wrapped again; another function's is reported below
    roles.wrapped_optimizers = {w.binding.name: w for scope, w in wrapped_in if scope is roles.home}
    for scope, binding in found:
        if scope is roles.home:
            if binding.name not in roles.optimizers:
                roles.optimizers.append(binding.name)
        else:
            roles.cannot_prepare(
                binding.where.stmt,
                f"optimizer `{binding.name}` is built in `{scope.qualname}`, not in `{roles.home.qualname}` "
                    "where the other training objects are prepared; pass it to `accelerator.prepare(...)` yourself",
            )


def stepped_factory_results(roles: Roles) -> list[tuple[Scope, Binding]]:
    """Optimizers found from use: `optimizer = create_optimizer_v2(model, ...)` (a function of a
    package or of a module outside the run, which cannot be read) whose result the training step
    steps after `backward` (`optimizer.step()`, or `scaler.step(optimizer)`, in a function that
    calls `backward`, the name followed through parameters) and whose arguments include one the
    code uses as a model (`model_use`). That argument is the model, the result the optimizer."""
    stepped: set[tuple[int, str]] = set()
    hiding: dict[tuple[int, str], CallSite] = {}  # the call that steps it, when no backward shows
    hidden = not any(scope.backwards for scope in roles.facts.scopes)
    for scope in roles.facts.scopes:
        if hidden:
            # No `.backward()` anywhere: the step is hidden in an object the loop calls
            # (`loss_scaler(loss, optimizer, ...)`, timm's NativeScaler); an argument of such a
            # call in a loop is what it steps (reported by `report_hidden_training_step`).
            for call in (*hidden_step_calls(roles, scope), *unread_step_function_calls(roles, scope)):
                for arg in call.call.args:
                    if type(arg.value) is cst.Name:
                        for origin, bound in roles.origins(scope, arg.value.value) or ():
                            stepped.add((id(origin), bound))
                            hiding.setdefault((id(origin), bound), call)
            continue
        if not scope.backwards:
            continue
        names = [site.receiver.value for site in scope.steps if type(site.receiver) is cst.Name]
        names += [n for site in scope.steps if (n := instance_attribute(site.receiver)) is not None]
        names += [
            arg.value.value
            for site in scope.method_calls
            if type(site.call.func) is cst.Attribute and site.call.func.attr.value == "step"
            for arg in site.call.args[:1]
            if type(arg.value) is cst.Name
        ]
        for name in names:
            if scope.binds(name):
                stepped.add((id(scope), name))  # `self.optimizer` bound in the method that steps it
            for origin, bound in roles.origins(scope, name) or ():
                stepped.add((id(origin), bound))
    found: list[tuple[Scope, Binding]] = []
    for scope in roles.facts.scopes:
        for name, bindings in scope.bindings.items():
            if (id(scope), name) not in stepped:
                continue
            for binding in bindings:
                value = binding.value
                if type(value) is not cst.Call:
                    continue
                models = unread_builder_models(roles, scope, value)
                if not models:
                    continue
                found.append((scope, binding))
                if (id(scope), name) in hiding:
                    pass  # the step is the call that hides it (`migrate.roles.hidden_step`)
                elif not any(called_in_training_step(roles, scope, model) for model in models):
                    _refuse_untrained_factory_model(roles, binding, value, models)
    return found


def _refuse_hidden_step(roles: Roles, binding: Binding, built: cst.Call, call: CallSite) -> None:
    """No `.backward()` anywhere: the loop hands the optimizer to an object that runs the backward
    and the step itself (timm's `NativeScaler`: `loss_scaler(loss, optimizer, clip_grad=...)`),
    scaling the loss its own way. The Accelerator cannot reach inside it, so the file is left as
    it is, at that call."""
    roles.refused = True
    code = cst.Module([]).code_for_node
    roles.findings.append(Finding(
        BACKWARD,
        call.where.stmt,
        f"`{_short(code(call.call))}` runs the backward and steps the optimizer `{binding.name}` (built by "
        f"`{_short(code(built))}`) inside an object the migration cannot read, and no `.backward()` shows "
        "anywhere, so the file was left as it is: in its place call `loss.backward()`, clip the gradients if it "
        f"did (`torch.nn.utils.clip_grad_norm_`) and call `{binding.name}.step()` (the Accelerator scales fp16 "
        "losses itself), then run the migration again",
        unconverted=True,
    ))


def _refuse_untrained_factory_model(roles: Roles, binding: Binding, call: cst.Call, models: list[str]) -> None:
    """The optimizer's model, as its factory is handed it, is not what the training step calls
    (timm's `task(input, target)` holds `model` and runs the forward): preparing `model` would
    synchronise nothing that trains, so the file is left as it is."""
    roles.refused = True
    shown = ", ".join(f"`{m}`" for m in models)
    roles.cannot_prepare(
        binding.where.stmt,
        f"optimizer `{binding.name}` comes from `{_short(cst.Module([]).code_for_node(call))}`, a function the "
        f"migration cannot read, over {shown}, but the training step (the functions that call `backward`) never "
        f"calls {shown} itself: its loss comes from another object that holds the model, so preparing {shown} "
        "would not synchronise what trains, and the file was left as it is. Migrate it by hand: create the "
        "Accelerator, pass the object the training step calls (or have it call the model directly), the "
        "optimizer and the training DataLoader to `accelerator.prepare(...)` after this line, and call "
        "`accelerator.backward(loss)`",
    )


def training_object_builders(roles: Roles, classes: set[str]) -> dict[int, ObjectBuilder]:
    """Functions of the module that build the model and its optimizer and hand both back in a tuple
    (`def load_train_objs(): ...; model = Net(); optimizer = SGD(model.parameters()); return
    dataset, model, optimizer`), called only where the tuple is unpacked into names (`dataset,
    model, optimizer = load_train_objs()`), by id of the function's scope. The optimizer and the
    model are then the caller's names: `prepare` goes in the caller, after the loaders it builds
    from the rest (the DDP tutorial's `load_train_objs` / `prepare_dataloader` / `Trainer(...)`).
    Each `return` must be a tuple of the same length with the optimizer (a `torch.optim` optimizer
    or an optimizer class of the module, bound once) and every model whose parameters it takes at
    the same positions; anything else stays the optimizer's home, as before."""
    found: dict[int, ObjectBuilder] = {}
    for scope in roles.facts.plain_functions():
        if not scope.returns or not all(isinstance(r, cst.Tuple) for r in scope.returns):
            continue
        first = scope.returns[0]
        assert isinstance(first, cst.Tuple)
        names = _element_names(first)
        if names is None or any(_element_names(r) != names for r in scope.returns):  # type: ignore[arg-type]
            continue
        optimizer_positions = [
            i for i, name in enumerate(names)
            if name is not None
            and len(scope.bindings.get(name, [])) == 1
            and name not in scope.params
            and _builds_torch_optimizer(roles, scope.bindings[name][0].value, classes)
        ]
        if len(optimizer_positions) != 1:
            continue
        position = optimizer_positions[0]
        optimizer = scope.bindings[names[position]][0]
        if optimizer.where.path:
            continue  # built under an `if` or a loop: not the one shape followed
        owners = _parameter_owners(roles, scope, optimizer.value)  # type: ignore[arg-type]
        models = [names.index(o) if o in names else None for o in owners]
        if not owners or None in models or any(o in scope.params for o in owners):
            continue
        sites = roles.call_sites(scope)
        if not sites or not all(_unpacks(roles, call, len(names), [position, *models]) for _, call in sites):  # type: ignore[list-item]
            continue
        found[id(scope)] = ObjectBuilder(scope, position, tuple(models))  # type: ignore[arg-type]
    return found


def _builds_torch_optimizer(roles: Roles, value: cst.BaseExpression | None, classes: set[str]) -> bool:
    return isinstance(value, cst.Call) and (call_name(roles, value, OPTIMIZER) or callee(value) in classes)


def _element_names(value: cst.Tuple) -> list[str | None] | None:
    """The names of a returned tuple's elements (None for another expression); None with a `*x`."""
    names: list[str | None] = []
    for element in value.elements:
        if isinstance(element, cst.StarredElement):
            return None
        names.append(element.value.value if isinstance(element.value, cst.Name) else None)
    return names


def _unpacks(roles: Roles, call: cst.Call, length: int, positions: list[int]) -> bool:
    """The call is the whole value of `a, b, c = f(...)`, a statement of its own, with `length`
    targets and plain names at `positions`."""
    site = roles.facts.call_site(call)
    stmt = site.where.stmt if site is not None else None
    if not (isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1):
        return False
    assign = stmt.body[0]
    if not (isinstance(assign, cst.Assign) and len(assign.targets) == 1 and assign.value is call):
        return False
    target = assign.targets[0].target
    if not isinstance(target, (cst.Tuple, cst.List)) or len(target.elements) != length:
        return False
    return all(
        not isinstance(target.elements[i], cst.StarredElement) and isinstance(target.elements[i].value, cst.Name)
        for i in positions
    )


def built_objects(roles: Roles, binding: Binding) -> str | None:
    """"optimizer" / "model" when `binding` unpacks that element of a training-object builder's
    tuple (`dataset, model, optimizer = load_train_objs()`); None otherwise."""
    unpacked = unpacked_call(binding)
    if unpacked is None:
        return None
    call, index = unpacked
    helper = roles.facts.function_called(call)
    builder = roles.object_builders.get(id(helper)) if helper is not None else None
    if builder is None or builder.scope is not helper:
        return None
    if index == builder.optimizer:
        return "optimizer"
    return "model" if index in builder.models else None


def _wrapped_optimizer(roles: Roles, scope: Scope, binding: Binding, classes: set[str]) -> WrappedOptimizer | None:
    """`optimizer = ScheduledOptim(torch.optim.Adam(...), ...)` as the name's only binding, a
    statement of its own: the inner optimizer can be bound to the name, prepared, and wrapped again
    (`optimizer = ScheduledOptim(optimizer, ...)`) right after the prepare call, so the wrapper
    steps the prepared optimizer. Other shapes are reported by `_report_wrapped_optimizers`."""
    value, stmt = binding.value, binding.where.stmt
    if type(value) is not cst.Call or len(scope.bindings.get(binding.name, [])) != 1:
        return None
    if not (type(stmt) is cst.SimpleStatementLine and len(stmt.body) == 1 and type(stmt.body[0]) is cst.Assign):
        return None
    if len(stmt.body[0].targets) != 1 or stmt.body[0].value is not value or binding.where.in_loop:
        return None
    inner = [a.value for a in value.args if builds_optimizer(roles, a.value, classes, set())]
    if len(inner) != 1 or type(inner[0]) is not cst.Call or not call_name(roles, inner[0], OPTIMIZER):
        return None
    return WrappedOptimizer(binding, value, inner[0])


def _report_wrapped_optimizers(roles: Roles, classes: set[str]) -> None:
    """`optimizer = ScheduledOptim(torch.optim.Adam(...), ...)`: the optimizer is never bound, so
    `prepare` has nothing to take; say how to make it visible."""
    for scope in roles.facts.scopes:
        for name, bindings in scope.bindings.items():
            for binding in bindings:
                value = binding.value
                if type(value) is not cst.Call:
                    continue
                inner = next((a.value for a in value.args if builds_optimizer(roles, a.value, classes, set())), None)
                if inner is None:
                    continue
                wrapper = cst.Module([]).code_for_node(value.func)
                roles.cannot_prepare(
                    binding.where.stmt,
                    f"the optimizer is built inside `{wrapper}(...)` and never bound, so it cannot be prepared: "
                    f"bind it first (`base = {cst.Module([]).code_for_node(inner.func)}(...)`, then "  # type: ignore[attr-defined]
                    f"`{name} = {wrapper}(base, ...)`) and run the migration again",
                )


def builds_optimizer(
    roles: Roles, value: cst.BaseExpression | None, classes: set[str], factories: set[str]
) -> bool:
    """`torch.optim.AdamW(...)`, a torch.optim.Optimizer subclass of this module (`LARS(...)`), or a
    function/method of this module that returns one (`model.configure_optimizers(...)`)."""
    if call_name(roles, value, OPTIMIZER):
        return True
    if type(value) is not cst.Call:
        return False
    func = value.func
    if type(func) is cst.Name:
        return func.value in classes or func.value in factories
    return type(func) is cst.Attribute and func.attr.value in factories and not (
        type(func.value) is cst.Name and roles.facts.aliases.qualify(func.value) is not None
    )


def optimizer_classes(roles: Roles) -> set[str]:
    """Classes of this module that subclass a torch optimizer (`class LARS(torch.optim.Optimizer)`)."""
    found: set[str] = set()
    for stmt in roles.facts.module.body:
        if type(stmt) is cst.ClassDef and any(
            (roles.facts.aliases.qualify(base.value) or "").startswith("torch.optim.") for base in stmt.bases
        ):
            found.add(stmt.name.value)
    return found


def optimizer_factories(roles: Roles, classes: set[str]) -> set[str]:
    """Functions and methods of this module that return an optimizer they build
    (`def configure_optimizers(self): ... return torch.optim.AdamW(groups)`), by name; only those
    called from elsewhere in the module, so the optimizer has a caller to be prepared in."""
    found: set[str] = set()
    for scope in roles.facts.scopes:
        if not scope.is_function:
            continue
        for value in scope.returns:
            built = builds_optimizer(roles, value, classes, set())
            if not built and type(value) is cst.Name:
                built = any(
                    builds_optimizer(roles, b.value, classes, set()) for b in scope.bindings.get(value.value, [])
                )
            if built:
                found.add(scope.name)
    # a function or method that returns what such a factory returns (`build_optimizer(cls, cfg,
    # model): return make_sgd(cfg, model)`, the trainer's own hook around a solver module's
    # factory) builds one too
    grown = True
    while grown:
        grown = False
        for scope in roles.facts.scopes:
            if scope.is_function and scope.name not in found and any(
                    builds_optimizer(roles, value, classes, found) for value in scope.returns):
                found.add(scope.name)
                grown = True
    called = {
        call.callee.removeprefix("self.") for s in roles.facts.scopes for call in s.calls
    } | {
        site.call.func.attr.value
        for s in roles.facts.scopes
        for site in s.method_calls
        if type(site.call.func) is cst.Attribute
    }
    return found & called


def find_existing_accelerator(roles: Roles) -> None:
    for scope in roles.facts.scopes:
        if scope.accelerators:
            roles.accelerator_scope = scope
            roles.accelerator_exists = True
            return


def find_models(roles: Roles) -> None:
    home = roles.home
    assert home is not None
    classes = optimizer_classes(roles)
    factories = optimizer_factories(roles, classes)
    for name in roles.optimizers:
        for binding in home.bindings[name]:
            wrapped = roles.wrapped_optimizers.get(name)
            built = binding.value
            if wrapped is not None and wrapped.binding is binding:
                built = wrapped.inner
                owners = _parameter_owners(roles, home, wrapped.inner)
            elif built_objects(roles, binding) == "optimizer":
                owners = _built_models(roles, binding)
            elif not builds_optimizer(roles, binding.value, classes, factories):
                # Built by a function the migration cannot read: its model is the argument the code
                # uses as one (`create_optimizer_v2(model, ...)`); an alternative of a known
                # optimizer that takes none (`LARS(groups)` in an `elif`) adds no model.
                for owner in (unread_builder_models(roles, home, built) or []) if type(built) is cst.Call else []:
                    if owner not in roles.models:
                        roles.models.append(owner)
                continue
            else:
                assert type(binding.value) is cst.Call
                owners = (
                    _parameter_owners(roles, home, binding.value)
                    if call_name(roles, binding.value, OPTIMIZER) or callee(binding.value) in classes
                    else _factory_owners(roles, binding.value)
                )
            owners = list(dict.fromkeys(wrapped_model(home, owner, roles.facts.aliases) for owner in owners))
            if not owners and name in home.prepared and any(
                    used_as_model(roles, home, other) for other in home.prepared if other != name):
                pass  # prepared by hand with its model, as the report below advises
            elif not owners and call_name(roles, built, OPTIMIZER):
                # Prepared without its model, the optimizer steps a model that each process trains
                # on its own: say so at the optimizer, and prepare no model by guesswork.
                assert type(built) is cst.Call
                roles.cannot_prepare(
                    binding.where.stmt,
                    f"optimizer `{name}` optimizes {_unfollowed(home, built)}, and the model whose parameters "
                    "these are was not found, so no model is prepared with it (on N processes each process would "
                    "train its own unsynchronised copy): add the model to `accelerator.prepare(...)` yourself",
                )
            elif not owners:
                # Prepared without its model, the optimizer would step a model that is neither on
                # the device nor synchronised: the file is left as it is.
                roles.refused = True
                roles.cannot_prepare(
                    binding.where.stmt,
                    f"optimizer `{name}` is built by `{callee(binding.value)}(...)`, and the model whose parameters it "
                    "optimizes was not found (or is another name for a model wrapped by hand, as in `raw_model = "
                    "model.module if ddp else model`), so the file was left as it is: create the Accelerator and pass the "
                    "model and the optimizer to `accelerator.prepare(...)` yourself",
                )
            for model in owners:
                if model == "self" and _own_method_factory(roles, home, built) is not None:
                    # `self.optimizer = self.build_optimizer(cfg, self.model)`: a method of the
                    # trainer's own class, not a model's `configure_optimizers`
                    assert type(built) is cst.Call
                    code = cst.Module([]).code_for_node
                    handed = [code(arg.value) for arg in built.args if code(arg.value).startswith("self.")]
                    models = ", ".join(f"`{h}`" for h in handed) or "an attribute of `self`"
                    roles.cannot_prepare(
                        binding.where.stmt,
                        f"`{name}` is built by `{code(built)}`, a method of this class that the migration does not "
                        f"follow to the model it optimizes (one of {models}), so only the optimizer is prepared here "
                        f"and each process would train its own copy: prepare that model, and the loader it trains on, "
                        f"with it yourself, in one call where this migration prepares `{name}` "
                        f"(`model, {name}, loader = self.accelerator.prepare(model, {name}, loader)` with the "
                        "attributes of this class)",
                    )
                elif model == "self":
                    roles.cannot_prepare(
                        binding.where.stmt,
                        "model is an attribute (`self...`); prepare it yourself",
                    )
                elif model.startswith("self.") and not _bound_in_class(roles, home, model):
                    roles.cannot_prepare(
                        binding.where.stmt,
                        f"`{model}` is not set in `{home.name}`; prepare it yourself",
                    )
                elif not model.startswith("self.") and not home.binds(model):
                    roles.cannot_prepare(
                        binding.where.stmt,
                        f"model `{model}` is not bound in `{home.name}`; prepare it where it is created",
                    )
                elif model not in roles.models:
                    roles.models.append(model)
    if not roles.hand_updated:
        _hand_updated_beside_optimizer(roles)


def _hand_updated_beside_optimizer(roles: Roles) -> None:
    """A module the training step updates by hand beside the optimizer's models (`for p in
    critic.parameters(): p.data.add_(-lr * p.grad)`, `migrate/roles/hand_update.py`): prepared with
    them when home binds it (its gradients are then averaged before the update); reported when it
    is bound elsewhere, since left unprepared each process would train its own copy."""
    home = roles.home
    assert home is not None
    for update in find_hand_updates(roles):
        if update.model is None or update.home is None or update.model in roles.models:
            continue
        if update.home is home:
            roles.models.append(update.model)
            roles.hand_updated = True
        else:
            roles.cannot_prepare(update.stmt, (
                f"`{update.shown}` updates the parameters of `{update.model}` by hand, and `{update.model}` is built "
                f"in `{update.home.qualname}`, not in `{home.qualname}` where the training objects are prepared, so "
                "it was not prepared: on N processes its gradients would not be averaged before the update. Build it "
                f"in `{home.qualname}` (or pass it to `accelerator.prepare(...)` where it is built)"))


def _built_models(roles: Roles, binding: Binding) -> list[str]:
    """The caller's names for the models a training-object builder returns beside the optimizer
    `binding` unpacks (`model` of `dataset, model, optimizer = load_train_objs()`)."""
    unpacked = unpacked_call(binding)
    assert unpacked is not None
    call = unpacked[0]
    helper = roles.facts.function_called(call)
    builder = roles.object_builders[id(helper)]
    stmt = binding.where.stmt
    assert isinstance(stmt, cst.SimpleStatementLine) and isinstance(stmt.body[0], cst.Assign)
    target = stmt.body[0].targets[0].target
    assert isinstance(target, (cst.Tuple, cst.List))
    names = [target.elements[i].value for i in builder.models]
    return [n.value for n in names if isinstance(n, cst.Name)]


def _own_method_factory(roles: Roles, home: Scope, built: cst.BaseExpression | None) -> Scope | None:
    """`self.build_optimizer(...)` in a method of a class that defines `build_optimizer` itself."""
    if not (type(built) is cst.Call and type(built.func) is cst.Attribute and type(built.func.value) is cst.Name
            and built.func.value.value == "self"):
        return None
    methods = roles.methods_of(home) or []
    return next((m for m in methods if m.name == built.func.attr.value), None)


def _factory_owners(roles: Roles, call: cst.Call) -> list[str]:
    """The models an optimizer factory of this module is handed: the receiver of a method
    (`model.configure_optimizers(...)`, whose `self.parameters()` it optimizes), or the arguments
    a function passes on as `X.parameters()` (`create_optimizer(args, model)`)."""
    func = call.func
    if type(func) is cst.Attribute:
        if type(func.value) is not cst.Name:
            return []
        receiver = func.value.value
        home = roles.home
        assert home is not None
        method = _own_method_factory(roles, home, call)
        if method is not None and method.params:
            # `self.build_optimizer(cfg, self.model)`: the trainer's own method, handed the model
            owners: list[str] = []
            for owner in _optimized_parameters(roles, method):
                index = method.params.index(owner) - 1  # `self` / `cls` is not in the call
                arg = call_argument(call, index, owner) if index >= 0 else None
                text = cst.Module([]).code_for_node(arg) if arg is not None else ""
                if (type(arg) is cst.Name or (type(arg) is cst.Attribute and text.startswith("self.")
                                              and text.count(".") == 1)) and text not in owners:
                    owners.append(text)
            if owners:
                return owners
        # `raw_model = model.module if ddp else model`: an alias of a model wrapped by hand is
        # the model (`wrapped_model`); another alias is not told apart here.
        if wrapped_model(home, receiver, roles.facts.aliases) == receiver and any(
                _aliases_a_module(b.value) for b in home.bindings.get(receiver, [])):
            return []
        return [receiver]
    assert type(func) is cst.Name
    factory = next(
        (s for s in roles.facts.scopes if s.is_function and not s.is_method and s.name == func.value), None
    )
    if factory is None:
        return []
    owners: list[str] = []
    for owner in _optimized_parameters(roles, factory):
        arg = call_argument(call, factory.params.index(owner), owner)
        if type(arg) is cst.Name and arg.value not in owners:
            owners.append(arg.value)
    return owners


def _optimized_parameters(roles: Roles, function: Scope, seen: frozenset[int] = frozenset()) -> list[str]:
    """The parameters of `function` whose `.parameters()` / `.named_parameters()` it takes, itself
    or through a function of the module it passes them to (parameter groups built by a helper:
    `parameters = set_weight_decay(model, skip)` then `optim.AdamW(parameters, ...)`)."""
    finder = _ParametersFinder()
    walk(function.node, finder)
    found = [owner for owner in finder.owners if owner in function.params]
    seen = seen | {id(function)}
    for site in function.calls:
        helper = roles.facts.resolve(site.callee, function)
        if helper is None or helper.is_method or id(helper) in seen:
            continue
        for param in _optimized_parameters(roles, helper, seen):
            arg = call_argument(site.call, helper.params.index(param), param)
            if type(arg) is cst.Name and arg.value in function.params and arg.value not in found:
                found.append(arg.value)
    return found


def _aliases_a_module(value: cst.BaseExpression | None) -> bool:
    """`other`, `other.module`, `a if c else b`: another name's module, not a model built here."""
    if type(value) is cst.IfExp:
        return True
    return type(value) is cst.Name or (type(value) is cst.Attribute and value.attr.value == "module")


_HELD_DEPTH = 3  # `self.master_params = self.model_params = list(self.model.parameters())` is two deep


def _parameter_owners(roles: Roles, home: Scope, call: cst.Call) -> list[str]:
    """Root names of `X.parameters()` inside an optimizer's arguments, and in the values of the
    names or `self.` attributes of home those arguments are (`AdamW(self.master_params)` after
    `self.master_params = self.model_params` and `self.model_params = list(self.model.parameters())`,
    the list a trainer class keeps), a few assignments deep; and the models handed to a function of
    the module (or of the unit) that takes their parameters (`AdamW(param_groups(model, wd))`, or
    `groups = param_groups(model, wd)` then `AdamW(groups)`)."""
    owners: list[str] = []
    finder = _ParametersFinder()
    values = _argument_values(home, call)
    for value in values:
        walk(value, finder)
        finder.owners.extend(_helper_owners(roles, home, value))
    if not finder.owners:
        finder.owners.extend(_sorted_parameter_owners(home, values))
    for owner in finder.owners:
        if owner not in owners:
            owners.append(owner)
    return owners


def _argument_values(home: Scope, call: cst.Call) -> list[cst.BaseExpression]:
    """An optimizer's arguments, and the values of the names or `self.` attributes of home they
    pass on, a few assignments deep."""
    pending = [(arg.value, 0) for arg in call.args]
    values: list[cst.BaseExpression] = []
    seen: set[str] = set()
    while pending:
        value, depth = pending.pop(0)
        values.append(value)
        if depth >= _HELD_DEPTH:
            continue
        for held in _held_names(value):
            if held in seen:
                continue
            seen.add(held)
            pending.extend((b.value, depth + 1) for b in home.bindings.get(held, []) if b.value is not None)
    return values


class _Calls(cst.CSTVisitor):
    def __init__(self) -> None:
        self.calls: list[cst.Call] = []

    def visit_Call(self, node: cst.Call) -> None:
        self.calls.append(node)


def _helper_calls(value: cst.BaseExpression) -> list[cst.Call]:
    """The calls inside `value` (`param_groups(model, wd)`, `utils.get_params_groups(model)`)."""
    finder = _Calls()
    walk(value, finder)
    return finder.calls


def _helper_owners(roles: Roles, home: Scope, value: cst.BaseExpression) -> list[str]:
    """The models `value` hands to a function of the module or of the unit that takes their
    `.parameters()` / `.named_parameters()` (`param_groups(model, wd)` returning
    `[{"params": decay, ...}, ...]`): the arguments passed for those parameters, as
    `_factory_owners` finds them for a factory. A function of a module outside the run
    (`utils.get_params_groups(student)`) cannot be read: the arguments home uses as models are
    the models (`model_use`)."""
    owners: list[str] = []
    for call in _helper_calls(value):
        if unread_function(roles, home, call):
            owners.extend(o for o in model_arguments(roles, home, call) if o not in owners)
            continue
        if type(call.func) is not cst.Name:
            continue
        helper = roles.facts.resolve(call.func.value, home)
        if helper is None or helper.is_method:
            continue
        for param in _optimized_parameters(roles, helper):
            arg = call_argument(call, helper.params.index(param), param)
            owner = None if arg is None else instance_attribute(arg) or root_name(arg)
            if owner is not None and owner not in owners:
                owners.append(owner)
    return owners


def _unfollowed(home: Scope, call: cst.Call) -> str:
    """What an optimizer's parameters come from, for the diagnostic: its first argument, and the
    call a name passed there is bound to (`groups`, from `timm_groups(model, wd)`)."""
    code = cst.Module([]).code_for_node
    if not call.args:
        return f"what `{_short(code(call))}` is given"
    first = call.args[0].value
    text = f"`{_short(code(first))}`"
    if type(first) is not cst.Call:
        origin = next((v for v in _argument_values(home, call)[1:] if type(v) is cst.Call), None)
        if origin is not None:
            text += f" (from `{_short(code(origin))}`)"
    return text


def _short(text: str, limit: int = 60) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 5] + "...)"


def _sorted_parameter_owners(home: Scope, values: list[cst.BaseExpression]) -> list[str]:
    """Parameter groups filled by a loop over a model's parameters:
    `weights, biases = [], []`, a `for p in model.parameters():` whose body appends to them
    (`biases.append(p)` / `weights.append(p)`), then `LARS([{"params": weights}, {"params": biases}])`:
    the owner is `model`."""
    lists: set[str] = set()

    class Names(cst.CSTVisitor):
        def visit_Name(self, node: cst.Name) -> None:
            lists.add(node.value)

    for value in values:
        walk(value, Names())
    empty = {n for n in lists if any(_starts_empty(b) for b in home.bindings.get(n, []))}
    if not empty:
        return []
    owners: list[str] = []

    class Loops(cst.CSTVisitor):
        def visit_For(self, node: cst.For) -> None:
            source = _ParametersFinder()
            walk(node.iter, source)
            if not source.owners:
                return
            appended: list[str] = []

            class Appends(cst.CSTVisitor):
                def visit_Call(self, call: cst.Call) -> None:
                    func = call.func
                    if type(func) is cst.Attribute and func.attr.value == "append" and type(func.value) is cst.Name:
                        appended.append(func.value.value)

            walk(node.body, Appends())
            if empty & set(appended):
                owners.extend(o for o in source.owners if o not in owners)

    walk(home.node, Loops())
    return owners


def _starts_empty(binding: Binding) -> bool:
    """`weights = []`, or `weights, biases = [], []`."""
    stmt = binding.where.stmt
    small = stmt.body[0] if type(stmt) is cst.SimpleStatementLine and len(stmt.body) == 1 else None
    if type(small) is not cst.Assign:
        return False
    value = small.value
    values = [e.value for e in value.elements] if type(value) is cst.Tuple else [value]
    return all(type(v) is cst.List and not v.elements for v in values)


def _held_names(value: cst.BaseExpression) -> list[str]:
    """The names and `self.` attributes an argument passes on: itself, the arguments of the call
    it is (`list(params)`, `make_master_params(self.model_params)`), or the values of the
    parameter groups it lists (`[{"params": params, "lr": lr}]`, after `params = [p for _, p in
    model.named_parameters() if p.requires_grad]`), and what a comprehension there iterates
    (`{"params": [p for n, p in param_optimizer if ...]}` after `param_optimizer =
    list(model.named_parameters())`)."""
    name = value.value if type(value) is cst.Name else instance_attribute(value)
    if name is not None:
        return [name]
    if type(value) in (cst.ListComp, cst.GeneratorExp, cst.SetComp):
        held: list[str] = []
        loop: cst.CompFor | None = value.for_in
        while loop is not None:
            held.extend(_held_names(loop.iter))
            loop = loop.inner_for_in
        return held
    if type(value) is cst.Call:
        return [n for arg in value.args for n in _held_names(arg.value)]
    if type(value) in (cst.List, cst.Tuple):
        return [n for e in value.elements for n in _held_names(e.value)]
    if type(value) is cst.Dict:
        return [n for e in value.elements if type(e) is cst.DictElement for n in _held_names(e.value)]
    return []


class _ParametersFinder(cst.CSTVisitor):
    def __init__(self) -> None:
        self.owners: list[str] = []

    def visit_Call(self, node: cst.Call) -> None:
        func = node.func
        if type(func) is cst.Attribute and func.attr.value in ("parameters", "named_parameters"):
            owner = instance_attribute(func.value) or root_name(func.value)
            if owner is not None:
                self.owners.append(owner)


def _bound_in_class(roles: Roles, home: Scope, name: str) -> bool:
    return home.binds(name)


def refuse_retrained_objects(roles: Roles) -> None:
    """A second training section that builds its optimizer again after the prepare call (`model =
    Mlp()`, `optimizer = Adam(model.parameters())`, another loop): its model would train unprepared
    (not on the device, not synchronised) while its batches lose their moves. The file is left as
    it is, with the line, rather than half migrated."""
    home, after = roles.home, roles.prepare_after
    if home is None or after is None or roles.refused:
        return
    for name in roles.optimizers:
        later = [b for b in home.bindings.get(name, []) if _runs_after(b.where, after) and b.value is not None]
        if later:
            roles.refused = True
            roles.cannot_prepare(
                later[0].where.stmt,
                f"optimizer `{name}` is built again here, after the training objects were prepared (several "
                "training sections in one scope): the objects of this section would train unprepared, so the file "
                "was left as it is: migrate it by hand, preparing this section's model, optimizer and loader with a "
                "second `accelerator.prepare(...)` after this line",
            )
            return


def _runs_after(where: StmtRef, after: StmtRef) -> bool:
    """`where` runs after the statement `prepare` follows has finished: not inside it. Alternatives
    of one optimizer in `if/elif/else` branches (`if args.opt == "adamw": optimizer = AdamW(...)
    elif ...: optimizer = SGD(...)`) are all inside the `if` that `prepare` follows."""
    return where.order > after.order and where.stmt is not after.stmt and all(
        outer.stmt is not after.stmt for outer in where.path
    )
