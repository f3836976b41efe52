"""The training loaders, the evaluation loops, and what is left unsharded.

A loader is a training loader when a training loop iterates it (a `for` loop, or `next(...)` on
its iterator in a `for` or `while` loop that trains) and every name it may refer to is bound in
home: a `DataLoader(...)`, a same-file helper returning one, a constructor argument, a parameter,
or a call of a function the migration cannot read (`roles.unread_loaders`: prepared, the runtime
decides at run time; see `_loader_by_use`). A loader built with a DistributedSampler is recorded in
`rank_sampled` (AM007 decides whether its sampler goes); one an unread factory is told to shard
(`distributed=...`) in `self_sharded`. A loop over what the code shows is no DataLoader, and a
training step that no DataLoader feeds, are reported (AM004) with what to prepare or which batch
function must take the rank."""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst

from migrate.analysis import Binding, CallSite, Loop, Scope, Site
from migrate.roles.calls import DATALOADER, DISTRIBUTED_SAMPLER, RNG_DRAWS, RNG_SEEDS, call_name, is_move_call
from migrate.roles.full_batch import full_batch_rows, full_batch_selection
from migrate.roles.sequence_streams import sequence_streams
from migrate.roles.model import PREPARE, Finding, InstanceFed, Roles
from migrate.roles.streams import yields, training_stream
from migrate.roles.rng import TORCH, draw_generator, drawn_from, seeded_generators
from migrate.names import call_argument, dotted_name, instance_attribute
from migrate.walk import Visitor, walk


def find_loaders(roles: Roles) -> None:
    home = roles.home
    assert home is not None
    for scope in roles.facts.scopes:
        for node, source in training_sources(roles, scope):
            held = held_by_the_class(roles, scope, source)
            if held is not None:
                roles.loaders.extend(a for a in held if a not in roles.loaders)
                constructor = roles.constructor_of(home)
                for attribute in held:
                    for binding in constructor.bindings.get(attribute, []) if constructor is not None else ():
                        built = unread_factory(roles, constructor, binding)
                        if built is not None:
                            roles.unread_loaders.setdefault(attribute, built)
                continue
            found = roles.origins(scope, source)
            handed = source if scope is home else home_parameter_passed(roles, home, scope, source)
            if found and handed is not None and _handed_to_home_once(roles, home, handed, found):
                if handed not in roles.loaders:
                    roles.loaders.append(handed)
                continue
            if found is None:
                roles.cannot_prepare(
                    node,
                    f"training loop iterates `{source}`, but not every caller passes a named loader "
                        "from this file; it is not prepared, so every process would see all the data: "
                        f"every call that hands `{source}` in must pass a name bound where the optimizer is built "
                        f"(`{source.removeprefix('self.')} = DataLoader(...)`, not an expression or an attribute); "
                        "pass such a name, and run again: it is then prepared with the model and the optimizer",
                )
            if found and _received_once(roles, scope, source, found):
                if (scope, source) not in roles.received_loaders:
                    roles.received_loaders.append((scope, source))
                continue
            for origin_scope, name in sorted(found or (), key=_binding_order):
                if origin_scope is not home and _hands_back_objects(roles, home):
                    # `model, optimizer = build()` indexed or passed on whole: preparing in `build`
                    # would leave this loader out, and the class using them would never see the
                    # accelerator; one precise refusal instead of a half migration
                    roles.refused = True
                    roles.findings = [Finding(PREPARE, node, (
                        f"training loop iterates `{source}`, built in `{origin_scope.qualname}`, while the model "
                        f"and the optimizer are built in `{home.qualname}`, which returns them: no one function holds "
                        "all three to prepare them together, so the file was left as it is: unpack what "
                        f"`{home.name}()` returns into plain names where the loader is built (`model, optimizer = "
                        f"{home.name}()`) and run again, or create the Accelerator there and pass the model, the "
                        "optimizer and the loader to `accelerator.prepare(...)` by hand"), unconverted=True)]
                    return
                if origin_scope is not home:
                    # Reported where the loader is bound (another function, or another module of
                    # the run), the line to change, with the loop it feeds.
                    bound = [b for b in origin_scope.bindings.get(name, []) if b.value is not None]
                    bound = bound or origin_scope.bindings.get(name, [])  # `a, loader = build()`
                    where = "a parameter nobody in this run passes" if not bound else f"bound here in `{origin_scope.qualname}`"
                    if scope is home and source in home.params and not home.bindings.get(source):
                        # handed to home itself, but not by one call outside loops
                        roles.cannot_prepare(
                            bound[-1].where.stmt if bound else node,
                            f"`{name}` ({where}) is the loader the training loop of `{home.qualname}` iterates "
                                f"(as `{source}`), and `{home.qualname}` builds the optimizer, but it is called more "
                                "than once, or in a loop, or handed something else than a DataLoader by a caller: "
                                "preparing the parameter there would make a fresh prepared loader each call, so it "
                                "is not prepared and every process would see all the data: build the loader in "
                                f"`{home.qualname}`, or call it once, outside loops, with a name bound to a "
                                "`DataLoader(...)`, and run again",
                        )
                        continue
                    own = _own_optimizer(roles, scope)
                    if own is not None and scope is not home:
                        # a second training function (train a teacher, then distil a student): it
                        # builds its own optimizer, so handing its loader to home changes nothing
                        roles.cannot_prepare(
                            bound[-1].where.stmt if bound else node,
                            f"`{name}` ({where}) is the loader the training loop of `{scope.qualname}` iterates "
                                f"(as `{source}`), and `{scope.qualname}` trains with an optimizer of its own "
                                f"(`{own}`), while the Accelerator prepares the training objects of "
                                f"`{home.qualname}` only: nothing `{scope.qualname}` trains is prepared, so every "
                                "process would train it on all of the data, its gradients never averaged. Create "
                                f"the Accelerator once where both functions reach it (at the module level, or passed "
                                f"in) and, in `{scope.qualname}`, prepare the model it trains, `{own}` and "
                                f"`{source}` together (`model, {own}, {source} = accelerator.prepare(model, {own}, "
                                f"{source})`) and call `accelerator.backward`, as in `{home.qualname}`, then run again",
                        )
                        continue
                    roles.cannot_prepare(
                        bound[-1].where.stmt if bound else node,
                        f"`{name}` ({where}) is the loader the training loop of `{scope.qualname}` iterates "
                            f"(as `{source}`), but the model and the optimizer are prepared in `{home.qualname}`, "
                            "which it does not pass through; it is not prepared, so every process would see all the "
                            f"data: hand it to `{home.qualname}` instead (kept as an attribute of the instance when that is "
                            "a constructor), so that it is prepared with them, and run again",
                    )
                elif name in roles.loaders:
                    continue
                elif _shards_by_rank(roles, home, name):
                    roles.loaders.append(name)
                    roles.rank_sampled[name] = node
                elif name in home.params or any(
                    call_name(roles, b.value, DATALOADER)
                    or _is_parameter_value(home, b.value)
                    or built_by_helper(roles, b.value)
                    or _returned_element(roles, b) is not None
                    for b in home.bindings.get(name, [])
                ):
                    roles.loaders.append(name)
                else:
                    _loader_by_use(roles, home, node, source, name)


def _handed_to_home_once(roles: Roles, home: Scope, source: str, found: set[tuple[Scope, str]]) -> bool:
    """`source` is a parameter of home (the function that builds the optimizer and prepares) that
    its training loop iterates as it is (`def train(model, loader): optimizer = ...; for x, y in
    loader:`), filled by the one call of home, outside any loop (`train(model, train_loader)` in
    `main`), with a name every binding of which is a DataLoader (`DataLoader(...)`, a helper of this
    file returning one, or its element of a tuple a helper returns): it is prepared in home with the
    model and the optimizer, as a loader home builds itself would be. Not when home may be called
    again (each call would prepare a fresh loader), nor when a caller passes anything else."""
    if source not in home.params or home.bindings.get(source) or (home.is_method and source == home.params[0]):
        return False
    sites = roles.call_sites(home)
    if home.is_method and not roles._is_constructor(home):
        sites = [*sites, *roles.instance_calls(home)]
    if len(sites) != 1:
        return False
    caller, call = sites[0]
    if any(site.call is call and site.loops for site in (*caller.calls, *caller.method_calls)):
        return False
    for origin_scope, name in found:
        bindings = origin_scope.bindings.get(name, [])
        if not bindings or not all(
            call_name(roles, b.value, DATALOADER) or built_by_helper(roles, b.value) or _returned_element(roles, b)
            for b in bindings
        ):
            return False
    return True


def home_parameter_passed(roles: Roles, home: Scope, scope: Scope, source: str) -> str | None:
    """The parameter of home that every call of `scope` (a function home calls: `train_epoch(
    train_dataloader, ...)` in `train`, which builds the optimizers) passes as `source`, when only
    home calls `scope` and `scope` iterates `source` as it is; None otherwise."""
    if source not in scope.params or scope.bindings.get(source) or not roles._is_callable_unit(scope):
        return None
    index = scope.params.index(source) - (1 if scope.is_method else 0)
    if index < 0:
        return None
    sites = [*roles.call_sites(scope), *(roles.instance_calls(scope) if scope.is_method else [])]
    names = set()
    for caller, call in sites:
        arg = call_argument(call, index, source)
        if caller is not home or not isinstance(arg, cst.Name):
            return None
        names.add(arg.value)
    if len(names) != 1:
        return None
    (name,) = names
    return name if name in home.params else None


def _binding_order(origin: tuple[Scope, str]) -> tuple[int, str]:
    """Where a name is first bound, then the name: origins come as a set, the loaders in this order."""
    scope, name = origin
    return min((b.where.order for b in scope.bindings.get(name, [])), default=1 << 60), name


def _received_once(roles: Roles, scope: Scope, source: str, found: set[tuple[Scope, str]]) -> bool:
    """`source` is a parameter of a method of home's class (`def fit(self, loader, epochs)`) that
    the training loop iterates as it is, filled by one call on an instance, outside any loop
    (`trainer.fit(loader, epochs=2)` in `main`), with loaders bound outside home (`main` builds
    it, the constructor builds and prepares the model): the method prepares it on entry,
    `loader = accelerator.prepare(loader)`. Not when it may be called again (a fresh prepared
    loader each call would restart its shuffling) or be handed a loader home prepares already."""
    home = roles.home
    assert home is not None
    if not (scope.is_method and home.is_method) or scope not in (roles.methods_of(home) or []):
        return False
    if source not in scope.params or scope.bindings.get(source) or source == scope.params[0]:
        return False
    if any(origin is home or name in roles.loaders or name.startswith("self.") for origin, name in found):
        return False
    sites = [*roles.call_sites(scope), *roles.instance_calls(scope)]
    if len(sites) != 1:
        return False
    caller, call = sites[0]
    return not any(site.call is call and site.loops for site in caller.method_calls)


def training_sources(roles: Roles, scope: Scope) -> list[tuple[cst.CSTNode, str]]:
    """What the training loops of `scope` draw their batches from, with the node to report: the
    name a training loop iterates (`for x, y in loader`), and the name handed to `iter(...)` whose
    iterator a training loop advances with `next(...)` (`data_iter = iter(data_loader)` ... `x, y =
    next(data_iter)` inside `for step in range(num_iters)`, or `next(iter(loader))` there)."""
    found: list[tuple[cst.CSTNode, str]] = []
    for loop in scope.loops:
        if loop.source is not None and roles.is_training_loop(loop):
            found.append((loop.node, loop.source))
    if roles.facts.resolve("next", scope) is not None or roles.facts.resolve("iter", scope) is not None:
        return found  # the script's own `next`/`iter`
    for site in scope.calls:
        if site.callee != "next" or not site.call.args:
            continue
        if not any(roles.is_training_loop(l) for l in site.loops) and not _in_training_while(roles, scope, site):
            continue
        drawn = site.call.args[0].value
        iterated = [drawn] if draws_through(roles, drawn) else [
            b.value for b in scope.bindings.get(drawn.value, [])] if isinstance(drawn, cst.Name) else []
        if not iterated or not all(draws_through(roles, v) for v in iterated):
            continue
        for value in iterated:
            assert isinstance(value, cst.Call)
            source = _reference(scope, value.args[0].value)
            if source is not None and all(source != s for _, s in found):
                found.append((site.where.stmt, source))
    return found


def _in_training_while(roles: Roles, scope: Scope, site: CallSite) -> bool:
    """The call sits in a `while` loop of `scope` that trains: one that holds a `.backward()`, or a
    call of a function that does (`while True: try: batch = next(data_iter) except StopIteration:
    data_iter = iter(loader) ...; loss.backward()`)."""
    whiles = [ref.stmt for ref in site.where.path if isinstance(ref.stmt, cst.While)]
    if not whiles:
        return False
    training = [b.where for b in scope.backwards]
    training += [c.where for c in scope.calls if roles.calls_training(c, scope)]
    return any(any(ref.stmt is loop for ref in where.path) for loop in whiles for where in training)


def draws_through(roles: Roles, value: cst.BaseExpression | None) -> bool:
    """`iter(loader)`, or a generator of the module that yields the batches of a `for` over its one
    parameter (`def cycle(dl): while True: for data in dl: yield data`, then `cycle(loader)`)."""
    if _is_iter_call(value):
        return True
    if not (isinstance(value, cst.Call) and len(value.args) == 1 and value.args[0].keyword is None
            and not value.args[0].star):
        return False
    helper = roles.facts.function_called(value)
    if helper is None or helper.is_method or len(helper.params) != 1:
        return False
    param = helper.params[0]
    return any(loop.source == param and _yields(loop.node.body) for loop in helper.loops)


def _yields(node: cst.CSTNode) -> bool:
    class Yields(cst.CSTVisitor):
        found = False

        def visit_Yield(self, node: cst.Yield) -> None:
            self.found = True

        def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
            return False

    finder = Yields()
    walk(node, finder)
    return finder.found


def _is_iter_call(value: cst.BaseExpression | None) -> bool:
    return (isinstance(value, cst.Call) and isinstance(value.func, cst.Name) and value.func.value == "iter"
            and len(value.args) == 1 and value.args[0].keyword is None and not value.args[0].star)


def _reference(scope: Scope, expr: cst.BaseExpression) -> str | None:
    """The name roles track `expr` by: `loader`, or `self.loader` in a method."""
    if isinstance(expr, cst.Name):
        return expr.value
    if scope.is_method and scope.params:
        return instance_attribute(expr, receiver=scope.params[0])
    return None


def held_by_the_class(roles: Roles, scope: Scope, source: str) -> list[str] | None:
    """The attributes (`self.celeba_loader`) a method of home's class trains from, when the class's
    constructor stores them and home is another method of that class: `Solver(celeba_loader,
    rafd_loader, config)` keeps `self.celeba_loader = celeba_loader`, `build_model` (home, called by
    the constructor afterwards) prepares the models, and `train` iterates `data_loader =
    self.celeba_loader`. The attribute is what gets prepared, in home, next to the models: the
    instance holds the prepared loader from then on. None when `source` is not such an attribute
    (or a local name bound only to such attributes), or when an attribute is bound anywhere else
    than the constructor's own body before it calls home (a later rebinding would not be
    prepared)."""
    home = roles.home
    assert home is not None
    methods = roles.methods_of(scope)
    if not home.is_method or not methods or home not in methods:
        return None
    constructor = roles.constructor_of(home)
    if constructor is None or constructor is home:
        return None  # a constructor that prepares sees its own attributes (the origins say so)
    if source.startswith("self."):
        attributes = [source]
    elif source in scope.params or not scope.bindings.get(source):
        return None
    else:
        values = [b.value for b in scope.bindings[source]]
        # `loader = self.train_loader if self.extra_loader is None else self.extra_loader`: either
        while any(isinstance(v, cst.IfExp) for v in values):
            values = [x for v in values for x in ((v.body, v.orelse) if isinstance(v, cst.IfExp) else (v,))]
        attributes = [_reference(scope, v) if v is not None else None for v in values]  # type: ignore[misc]
        if any(a is None or not a.startswith("self.") for a in attributes):
            return None
    calls = [site.where.order for site in constructor.calls if site.callee == f"self.{home.name}"]
    before = min(calls, default=1 << 60)
    held: list[str] = []
    for attribute in attributes:
        assert attribute is not None
        bound = [(m, b) for m in methods for b in m.bindings.get(attribute, [])]
        if not bound or any(m is not constructor or b.where.path or b.where.order > before for m, b in bound):
            return None
        if not all(
            _is_parameter_value(constructor, b.value) or call_name(roles, b.value, DATALOADER)
            or built_by_helper(roles, b.value) or unread_factory(roles, constructor, b) is not None
            for _, b in bound
        ):
            return None
        if attribute not in held:
            held.append(attribute)
    return held


def loaders_for_training_only(roles: Roles) -> None:
    """Loaders the instance holds (`held_by_the_class`: `self.celeba_loader`, stored by the
    constructor) that are prepared with the models in home (`build_model`, which the constructor
    calls in every mode), while a method of the class that does not train iterates them too
    (`test()` translating every image of `self.celeba_loader` and saving one file per batch):
    prepared in home, the instance would hold the sharded loader, and on N processes that method
    would see one share of the data per process. Instead each method that trains from them
    prepares them on entry, into locals (`celeba_loader = self.accelerator.prepare(self.celeba_loader)`,
    its reads of `self.celeba_loader` then read `celeba_loader`), and the instance keeps the
    user's loader for the others, as the original did. Not when a method that reads them also
    trains through another path, nor when the local's name is already used in a training method."""
    home = roles.home
    if home is None or not home.is_method or roles.prepare_after is None:
        return
    methods = roles.methods_of(home) or []
    constructor = roles.constructor_of(home)
    drawn: dict[str, list[Scope]] = {}  # attribute -> the training methods that draw from it
    for scope in methods:
        for _, source in training_sources(roles, scope):
            for attribute in _instance_loaders(scope, source) or ():
                if attribute in roles.loaders and scope not in drawn.setdefault(attribute, []):
                    drawn[attribute].append(scope)
    if not drawn:
        return
    cache: dict[int, dict[str, list[cst.Attribute]]] = {}

    def reads_of(method: Scope) -> dict[str, list[cst.Attribute]]:
        if id(method) not in cache:
            cache[id(method)] = _attribute_reads(method)
        return cache[id(method)]

    chosen: dict[Scope, list[tuple[str, str, list[cst.Attribute]]]] = {}
    for attribute, trainers in drawn.items():
        others = [m for m in methods if m not in trainers and m is not constructor and m is not home
                  and reads_of(m).get(attribute)]
        if not others or any(m in roles._training_functions for m in others):
            continue
        if any(home is t or constructor is t or not roles.can_reach(t) for t in trainers):
            continue
        bound = [b for m in methods for b in m.bindings.get(attribute, [])]
        if not bound or any(b.where.in_loop for b in bound) or any(
                m is not home and m is not constructor for m in methods if m.bindings.get(attribute)):
            continue  # bound again by another method: the training methods could not tell which
        local = attribute.removeprefix("self.")
        if any(t.binds(local) or local in t.params or _reads_name(t, local) for t in trainers):
            continue
        for trainer in trainers:
            chosen.setdefault(trainer, []).append((attribute, local, reads_of(trainer)[attribute]))
    roles.method_loaders = chosen


def _instance_loaders(scope: Scope, source: str) -> list[str] | None:
    """The attributes `source` is in a method: itself (`self.loader`), or those every binding of
    a local name reads (`loader = self.train_loader if ... else self.extra_loader`)."""
    if source.startswith("self."):
        return [source]
    if not scope.is_method or source in scope.params or not scope.bindings.get(source):
        return None
    values = [b.value for b in scope.bindings[source]]
    while any(isinstance(v, cst.IfExp) for v in values):
        values = [x for v in values for x in ((v.body, v.orelse) if isinstance(v, cst.IfExp) else (v,))]
    found = [_reference(scope, v) if v is not None else None for v in values]
    if any(a is None or not a.startswith("self.") for a in found):
        return None
    return list(dict.fromkeys(a for a in found if a is not None))


def _attribute_reads(method: Scope) -> dict[str, list[cst.Attribute]]:
    """`self.x` expressions of a method's own body (not of functions nested in it), by attribute."""
    receiver = method.params[0] if method.params else "self"
    found: dict[str, list[cst.Attribute]] = {}

    class Reads(Visitor):
        def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
            return node is method.node

        def visit_Lambda(self, node: cst.Lambda) -> bool:
            return False

        def visit_Attribute(self, node: cst.Attribute) -> bool:
            attribute = instance_attribute(node, receiver=receiver)
            if attribute is not None:
                found.setdefault(attribute, []).append(node)
                return False
            return True

    walk(method.node, Reads())
    return found


def _reads_name(scope: Scope, name: str) -> bool:
    """`name` appears as a plain name in the function (a global it reads, or anything else)."""
    seen = False

    class Names(Visitor):
        def visit_Attribute(self, node: cst.Attribute) -> bool:
            walk(node.value, self)  # `self.name`: the attribute's own name is not a read of `name`
            return False

        def visit_Name(self, node: cst.Name) -> None:
            nonlocal seen
            seen = seen or node.value == name

    walk(scope.node, Names())
    return seen


def _hands_back_objects(roles: Roles, home: Scope) -> bool:
    """Home is a plain function that returns its optimizer (alone, or in a tuple or list): its caller
    trains with what it builds (`return model, optimizer`)."""
    if not home.is_function or home.is_method:
        return False
    for value in home.returns:
        elements = [e.value for e in value.elements] if isinstance(value, (cst.Tuple, cst.List)) else [value]
        if any(isinstance(e, cst.Name) and e.value in roles.optimizers for e in elements):
            return True
    return False


def _shards_by_rank(roles: Roles, home: Scope, loader: str) -> bool:
    """A DataLoader built with a DistributedSampler (inline or through a name) shards itself, also
    when a helper function of this file builds it (`loader = build_loader(dataset)`)."""
    return any(
        any(call_name(roles, v, DISTRIBUTED_SAMPLER) for v in sampler_values(roles, scope, call))
        for scope, call in loader_calls(roles, home, loader)
    )


def loader_calls(roles: Roles, home: Scope, loader: str) -> list[tuple[Scope, cst.Call]]:
    """The `DataLoader(...)` calls that build `loader` of home, with the scope each sits in: home's
    own, or those a same-file helper returns (`return DataLoader(...)`, or a name bound to one)."""
    found: list[tuple[Scope, cst.Call]] = []
    for binding in home.bindings.get(loader, []):
        value = binding.value
        if not isinstance(value, cst.Call):
            found.extend(_returned_element(roles, binding) or ())
            continue
        if call_name(roles, value, DATALOADER):
            found.append((home, value))
        elif built_by_helper(roles, value):
            assert isinstance(value.func, cst.Name)
            helper = roles.facts.function_called(value)
            assert helper is not None
            for returned in helper.returns:
                values = (
                    [b.value for b in helper.bindings.get(returned.value, [])]
                    if isinstance(returned, cst.Name)
                    else [returned]
                )
                found.extend((helper, v) for v in values if isinstance(v, cst.Call) and call_name(roles, v, DATALOADER))
    return found


def _returned_element(roles: Roles, binding: Binding) -> list[tuple[Scope, cst.Call]] | None:
    """`datasets, train_loader, val_loader = build_loader(config)` where every `return` of that
    function (of this module, or of another module of the unit) is a tuple whose element at the
    name's position is a `DataLoader(...)` or a name bound to one: those calls, with the helper's
    scope; None for anything else."""
    unpacked = unpacked_call(binding)
    if unpacked is None:
        return None
    call, index = unpacked
    helper = roles.facts.function_called(call)
    if helper is None or helper.is_method or not helper.returns:
        return None
    found: list[tuple[Scope, cst.Call]] = []
    for returned in helper.returns:
        if not isinstance(returned, cst.Tuple) or index >= len(returned.elements):
            return None
        element = returned.elements[index]
        if isinstance(element, cst.StarredElement):
            return None
        value = element.value
        values = [b.value for b in helper.bindings.get(value.value, [])] if isinstance(value, cst.Name) else [value]
        calls = [v for v in values if isinstance(v, cst.Call) and call_name(roles, v, DATALOADER)]
        if not calls or len(calls) != len(values):
            return None
        found.extend((helper, c) for c in calls)
    return found


def unpacked_call(binding: Binding) -> tuple[cst.Call, int] | None:
    """(call, position) for a name bound by unpacking a call: `a, loader = f(...)` -> (f(...), 1)."""
    stmt = binding.where.stmt
    if binding.value is not None or binding.is_loop_target or not isinstance(stmt, cst.SimpleStatementLine):
        return None
    assign = stmt.body[0] if len(stmt.body) == 1 else None
    if not (isinstance(assign, cst.Assign) and len(assign.targets) == 1 and isinstance(assign.value, cst.Call)):
        return None
    target = assign.targets[0].target
    if not isinstance(target, (cst.Tuple, cst.List)):
        return None
    for index, element in enumerate(target.elements):
        if isinstance(element, cst.StarredElement):
            return None
        if isinstance(element.value, cst.Name) and element.value.value == binding.name:
            return assign.value, index
    return None


def sampler_values(roles: Roles, scope: Scope, call: cst.Call) -> list[cst.BaseExpression | None]:
    """What the `sampler=` / `batch_sampler=` argument of a DataLoader call is bound to in `scope`."""
    for arg in call.args:
        if arg.keyword is None or arg.keyword.value not in ("sampler", "batch_sampler"):
            continue
        if isinstance(arg.value, cst.Name):
            return [b.value for b in scope.bindings.get(arg.value.value, [])]
        return [arg.value]
    return []


def built_by_helper(roles: Roles, value: cst.BaseExpression | None) -> bool:
    """`loader = make_loader(...)` where that function of this file returns a DataLoader."""
    if not (isinstance(value, cst.Call) and isinstance(value.func, cst.Name)):
        return False
    helper = roles.facts.function_called(value)
    if helper is None or not helper.returns:
        return False
    for returned in helper.returns:
        if call_name(roles, returned, DATALOADER):
            continue
        if isinstance(returned, cst.Name) and any(
            call_name(roles, b.value, DATALOADER) for b in helper.bindings.get(returned.value, [])
        ):
            continue
        return False
    return True


def _is_parameter_value(home: Scope, value: cst.BaseExpression | None) -> bool:
    """`self.loader = loader` where `loader` is a parameter of home (a constructor argument)."""
    return isinstance(value, cst.Name) and value.value in home.params


def prefer_attributes(roles: Roles) -> None:
    """In a method, an object kept as `self.model = model` is prepared (and known) as `self.model`:
    the methods that train use the attribute, not the constructor's local name."""
    home = roles.home
    assert home is not None
    if not home.is_method:
        return
    for group in (roles.models, roles.loaders):
        group[:] = [kept_as_attribute(home, name) or name for name in group]
    roles.unread_loaders = {kept_as_attribute(home, n) or n: shown for n, shown in roles.unread_loaders.items()}
    roles.iterable_loaders = {kept_as_attribute(home, n) or n: why for n, why in roles.iterable_loaders.items()}


def kept_as_attribute(home: Scope, name: str) -> str | None:
    """`self.model` when `home` stores the local `model` as `self.model = model`."""
    if name.startswith("self."):
        return None
    for attribute, bindings in home.bindings.items():
        if not attribute.startswith("self."):
            continue
        for binding in bindings:
            value = binding.value
            if is_move_call(value):  # `self.model = model.to(device)`
                assert isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute)
                value = value.func.value
            if isinstance(value, cst.Name) and value.value == name:
                return attribute
    return None


def find_eval_loops(roles: Roles) -> None:
    """Loops without backward over DataLoaders built in home (evaluation loaders, or the training
    loader itself): candidates for gather_for_metrics. Those over loaders that functions the
    migration cannot read build (`roles.unread_eval_loops`) are kept apart: whether such a loader
    gives each process a share is decided at run time, so nothing is gathered there (AM011 reduces
    a mean over them where it decides)."""
    home = roles.home
    assert home is not None
    trained = _loader_makers(roles, home)
    for scope in roles.facts.scopes:
        for loop in scope.loops:
            if loop.source is None or roles.is_training_loop(loop):
                continue
            found = roles.origins(scope, loop.source)
            if not found or any(origin_scope is not home for origin_scope, _ in found):
                continue
            names = sorted(name for _, name in found)
            # every loader the loop can iterate is one of home's (a function evaluating both the
            # training loader and a test loader): the loop is decided once, for all of them
            if all(_builds_loader(roles, home, n, trained) for n in names):
                roles.eval_loops.extend((scope, loop, name) for name in names)
            elif all(_built_unread(roles, home, n) for n in names):
                roles.unread_eval_loops.extend((scope, loop, name) for name in names)


def _built_unread(roles: Roles, home: Scope, name: str) -> bool:
    """Every binding of home's `name` is made by a function the migration cannot read, and it is no
    training loader (those are prepared)."""
    bindings = home.bindings.get(name, [])
    if not bindings or name in roles.loaders:
        return False
    sources = [_binding_source(roles, home, binding, _DEPTH) for binding in bindings]
    return all(source is not None and source.kind == "unread" for source in sources)


def _loader_makers(roles: Roles, home: Scope) -> set[str]:
    """The callables that build the loaders the training step draws its batches from (found from
    use): `DataLoader` of torch_geometric.loader, say, as well as torch's. A loader of home built by
    one of them is a loader of the same kind, wherever its batches go. Not the makers of batch
    iterables that are no DataLoader (`roles.iterable_loaders`): prepared, such a loader completes
    its last round with repeated batches that `gather_for_metrics` cannot drop, so an evaluation
    loader of that kind stays whole on every process, ungathered."""
    makers: set[str] = set()
    for name in roles.loaders:
        if name in roles.iterable_loaders:
            continue
        for binding in home.bindings.get(name, []):
            if type(binding.value) is cst.Call:
                qualified = roles.facts.aliases.qualify(binding.value.func) or dotted_name(binding.value.func)
                if qualified:
                    makers.add(qualified)
    return makers


def _builds_loader(roles: Roles, home: Scope, name: str, makers: set[str]) -> bool:
    for binding in home.bindings.get(name, []):
        if call_name(roles, binding.value, DATALOADER):
            return True
        if type(binding.value) is cst.Call:
            qualified = roles.facts.aliases.qualify(binding.value.func) or dotted_name(binding.value.func)
            if qualified and qualified in makers:
                return True
    return False


def report_unsharded_training(roles: Roles) -> None:
    """A training step that no DataLoader feeds (tensors, a `get_batch()` helper) is not sharded."""
    if roles.loaders or roles.received_loaders or roles.unprepared or roles.self_sharded:  # its own report says more
        return
    found = [(scope, site) for scope in roles.facts.scopes for site in scope.backwards]
    if not found:
        return
    scope, site = found[0]
    stream = training_stream(roles, scope)
    if stream is not None and stream.ranked_by == "torch":
        return  # its shard is this process's: the Accelerator joins the process group it reads
    if stream is not None and stream.ranked_by == "mpi":
        assert stream.rank_read is not None
        roles.findings.append(Finding(PREPARE, stream.rank_read, (
            f"the training batches come from `{stream.function}()`, which takes this process's shard from MPI "
            "here; under `accel launch` (torchrun) MPI does not start the processes, so every process would be "
            "MPI's rank 0 of 1 and train on the same data: take the shard from `torch.distributed.get_rank()` "
            "and `get_world_size()` (the Accelerator's process group)"), unconverted=True))
        return
    if stream is not None and stream.ranked_by == "local":
        assert stream.rank_read is not None
        roles.findings.append(Finding(PREPARE, stream.rank_read, (
            f"the training batches come from `{stream.drawn}`, a `{stream.function}` built with the local rank "
            "(`LOCAL_RANK`), which repeats on every machine: on more than one node the processes of each node "
            f"would train on the same batches. Build `{stream.function}` with the global rank, "
            "`accelerator.process_index` (torchrun's `RANK`), and `accelerator.num_processes`"), unconverted=True))
        return
    if stream is None and (fed := batches_handed_to_instance(roles)) is not None:
        if not _prepared_by_hand(fed):
            roles.instance_fed = fed  # reported once the Accelerator's place is known
        return
    drawn = _drawn_generators(roles, scope, site) if stream is None else None
    seeded = seeded_generators(roles.facts) & drawn if drawn else set()
    if drawn and not seeded:
        return  # each process draws batches of its own, as sharded ones would be
    generic = False
    source = stream.function if stream is not None else _batch_function(roles, scope, site)
    random = random_batches(roles, scope, site) if stream is None else None
    if random is not None:
        function, task = random
        unseeded = [b for b in task if not seeded_before(roles, b)]
        if unseeded:
            # the runtime's Accelerator gives every process rank 0's RNG state when it is created and
            # seeds them apart at the first prepare (runtime/rng.py): AM004 checks the draws follow it
            roles.unseeded_task = (function, unseeded)
            return
        roles.random_batches = random  # seeded apart after the prepare call (AM004)
        return
    if seeded and not _drawn_once(roles, scope, site):
        generic = True  # drawn once before the loop, alike on every process, its rows can be shared
        seed = {"torch": "torch.manual_seed", "numpy": "np.random.seed", "random": "random.seed"}[min(seeded)]
        message = (
            f"no DataLoader feeds this training step: the model's inputs are drawn from {min(seeded)}'s global "
            "generator, which the file seeds with the same value on every process, so every process would draw "
            "the same batches and train on them. Seed each process apart once what must stay alike is done "
            f"(`{seed}(seed + accelerator.process_index)`), or build the batches with a "
            "torch.utils.data.DataLoader (prepared, it shards them)"
        )
    elif source is not None and (inline := _inline_loader(roles, source)) is not None:
        roles.findings.append(Finding(PREPARE, inline.where.stmt, (
            f"the training batches come from `{source}(DataLoader(...))`: `{source}` draws them from the "
            "DataLoader built inside the call, which has no name to prepare, so every process would train on "
            "all of the data: build it under a name of its own (`loader = DataLoader(...)`) and take "
            f"`{inline.name} = {source}(loader)` below the line that builds the optimizer, then run again: the "
            "loader is then prepared with the model and the optimizer"), unconverted=True))
        return
    elif source is not None:
        drawn = stream.drawn if stream is not None and stream.drawn else f"{source}()"
        message = (
            f"no DataLoader feeds this training step: its batches come from `{drawn}`, which every process "
            "would run alike, so all of them would train on the same data. Make "
            f"`{source}` draw this process's share: pass it `accelerator.process_index` and "
            "`accelerator.num_processes` (a per-rank seed for its random offsets, or a strided part of the "
            "data), or build the batches with a torch.utils.data.DataLoader (prepared, it shards them)"
        )
    elif (sliced := _sequence_slices(roles, scope, site)) is not None:
        tensor, shown, binding, carried = sliced
        if binding is None:
            return  # its rows are split by rank already: each process trains on its own sequences
        state = (
            f" `{carried}` carries from one slice to the next (truncated backpropagation through time), so a "
            "prepared DataLoader, which would hand each process every N-th slice, breaks that chain;"
            if carried else ""
        )
        message = (
            f"no DataLoader feeds this training step, so every process would train on the same data: its batches "
            f"are consecutive slices of `{tensor}` along its second axis (`{shown}` in the training loop), whose "
            f"rows are the independent sequences of the batch;{state} split the rows per process instead, right "
            f"after this line: `{tensor} = {tensor}[accelerator.process_index::accelerator.num_processes]` "
            "(each process keeps whole sequences, in order), and size what is built per batch row (initial "
            f"states) to this process's rows, `{tensor}.size(0)`, not the whole batch size"
        )
        finding = Finding(PREPARE, binding.where.stmt, message, unconverted=True)
        shared_streams = sequence_streams(roles, scope, site, tensor, binding, carried, finding)
        if shared_streams is not None:
            roles.shared_streams = shared_streams  # AM004 shares the streams out, or reports `finding`
            return
        roles.findings.append(finding)
        return
    elif (time_first := _time_first_slices(roles, scope, site)) is not None:
        tensor, shown, binding, carried, helper = time_first
        if binding is None:
            return  # its streams are shared by rank already: each process trains on its own
        state = (
            f" `{carried}` carries from one slice to the next (truncated backpropagation through time), so a "
            "prepared DataLoader, which would hand each process every N-th slice, breaks that chain;"
            if carried else ""
        )
        message = (
            f"no DataLoader feeds this training step, so every process would train on the same data: its batches "
            f"are consecutive slices of `{tensor}` along its first axis (`{shown}` in the training loop), whose "
            f"columns are the independent streams of the batch (num_tokens, batch_size);{state} take this "
            f"process's streams instead, right after this line: `{tensor} = accelerator.share_streams({tensor}, "
            "dim=1)` (each process keeps whole streams, in order; not a slice of its rows, which are time steps), "
            f"and size what is built per stream (the initial hidden state) to this process's streams, "
            f"`{tensor}.size(1)`, not the whole batch size"
        )
        finding = Finding(PREPARE, binding.where.stmt, message, unconverted=True)
        shared_streams = sequence_streams(roles, scope, site, tensor, binding, carried, finding, helper)
        if shared_streams is not None:
            roles.shared_streams = shared_streams  # AM004 shares the streams out, or reports `finding`
            return
        roles.findings.append(finding)
        return
    elif _samples_from_model(roles) and TORCH in seeded_generators(roles.facts):
        message = (
            "no DataLoader feeds this training step: it trains on data generated as it runs, from actions "
            "sampled from the model's outputs (`torch.distributions`: `.sample()`, `.log_prob(...)`), an episode "
            "at a time, and the file seeds torch with the same value on every process, so every process would "
            "sample the same actions, play the same episodes and train on them (N times the compute for one "
            "process's worth of data); there are no rows to split. Seed each process apart right after the "
            "prepare call, `torch.manual_seed(torch.initial_seed() + accelerator.process_index)`, and an "
            "environment of the script with a seed of its own too (`env.reset(seed=seed + "
            "accelerator.process_index)`), so that each process plays its own episodes and the averaged "
            "gradient covers N of them"
        )
    else:
        generic = True
        closure = _stepped_closure(scope)
        message = (
            "no DataLoader feeds this training step, so every process would train on the same data (N times "
            "the compute for one process's worth of data). To share it, select this "
            "process's part of the examples the loss is taken over with `accelerator.process_index` / "
            "`accelerator.num_processes`: a strided slice of the data's rows "
            "(`data[accelerator.process_index::accelerator.num_processes]`, which keeps each process's batches "
            "in order, as a loop that carries state from one batch to the next needs), or, where the model needs "
            "all of its inputs at once (a graph's nodes and edges), of the indices the loss is taken at; a mean "
            "loss over equal parts keeps the averaged gradient the whole data's. Or build independent batches "
            "with a torch.utils.data.DataLoader (prepared, it shards them)"
        )
        if closure is not None:
            message += (
                f". The optimizer steps with the closure `{closure}`, whose returned loss it decides from (LBFGS "
                "stops and searches on it): once the data are split, return `accelerator.reduce(loss.detach(), "
                "\"mean\")` from it, so that every process takes the same decisions"
            )
    finding = Finding(PREPARE, site.call, message, unconverted=True)
    if source is None and _stepped_closure(scope) is None:
        # a full-batch step (its data fixed, or drawn alike on every process) whose loss selects its
        # samples with a fixed index or mask: AM004 shares them out, or reports `finding`
        shared = full_batch_selection(roles, scope, site, finding)
        if shared is not None:
            roles.shared_selection = shared
            return
    if source is None and generic:
        # a full-batch step over every row of fixed tensors (`criterion(model(inputs), targets)`,
        # also in an LBFGS closure): AM004 shares the rows out, or reports `finding`
        rows = full_batch_rows(roles, scope, site, finding, _stepped_closure(scope))
        if rows is not None:
            roles.shared_rows = rows
            return
    roles.findings.append(finding)


def batches_handed_to_instance(roles: Roles) -> InstanceFed | None:
    """A loop over a loader that hands each batch to a method of an instance of a class of this
    file (`model.set_input(data)`, which keeps it in attributes) and trains through a method of the
    same instance (`model.optimize_parameters()`, or the one taking the batch, `model.step(data)`):
    the loader feeds the training step, but only through the instance."""
    for scope in roles.facts.scopes:
        for loop in scope.loops:
            if loop.source is None or not loop.batch_names:
                continue
            sites = [s for s in scope.method_calls if loop in s.loops and type(s.receiver) is cst.Name]
            for train in sites:
                assert isinstance(train.receiver, cst.Name)
                instance = train.receiver.value
                built = _instance_of(roles, scope, instance)
                if built is None:
                    continue
                binding, cls = built
                if _method_of(roles, cls, train.call) not in roles._training_functions:
                    continue
                for feed in sites:
                    if (type(feed.receiver) is cst.Name and feed.receiver.value == instance
                            and any(_reads_any(a.value, loop.batch_names) for a in feed.call.args)):
                        return InstanceFed(scope, loop, loop.source, instance, cls, feed.call, train.call, binding)
    return None


def _instance_of(roles: Roles, scope: Scope, name: str) -> tuple[Binding, Scope] | None:
    """`name = Cls(...)`, its only binding in `scope`, Cls a class of this file."""
    bindings = scope.bindings.get(name, [])
    if len(bindings) != 1 or type(bindings[0].value) is not cst.Call:
        return None
    func = bindings[0].value.func
    cls = roles.facts.classes.get(func.value) if type(func) is cst.Name else None
    return (bindings[0], cls) if cls is not None else None


def _method_of(roles: Roles, cls: Scope, call: cst.Call) -> Scope | None:
    assert isinstance(call.func, cst.Attribute)
    name = call.func.attr.value
    return next((s for s in roles.facts.scopes if s.parent is cls and s.is_function and s.name == name), None)


def _reads_any(expr: cst.BaseExpression, names: set[str]) -> bool:
    """`data`, `data[0]`, `data["A"]`, `batch.x`: the expression reads one of the loop's batch names."""
    while isinstance(expr, (cst.Subscript, cst.Attribute)):
        expr = expr.value
    return type(expr) is cst.Name and expr.value in names


def _prepared_by_hand(fed: InstanceFed) -> bool:
    """`dataset = model.accelerator.prepare(dataset)` (the report's advice, followed): every
    binding of the loop's loader in its scope before the loop is its own prepare call."""
    bindings = [b for b in fed.scope.bindings.get(fed.source, []) if not b.is_loop_target]
    last = bindings[-1].value if bindings else None
    return (type(last) is cst.Call and type(last.func) is cst.Attribute and last.func.attr.value == "prepare"
            and any(_reads_any(a.value, {fed.source}) for a in last.args))


def report_instance_fed(roles: Roles) -> None:
    """The loader of a loop that feeds the training step through an instance (`model.set_input(data)`)
    is not prepared: reported at its binding, with the line that prepares it where both exist."""
    fed = roles.instance_fed
    home = roles.home
    if fed is None or home is None:
        return
    bindings = [b for b in fed.scope.bindings.get(fed.source, []) if not b.is_loop_target and b.value is not None]
    at = bindings[-1].where.stmt if bindings else fed.loop.node
    held = roles.accelerator_scope is not None and any(
        roles.accelerator_scope is m for m in roles.facts.scopes if m.parent is fed.cls and m.is_function)
    if held:
        reference = f"{fed.instance}.accelerator"
    elif roles.accelerator_scope is fed.scope or roles.accelerator_scope is roles.facts.module_scope:
        reference = "accelerator"
    else:
        reference = None
    feed = dotted_name(fed.feed.func)
    train = dotted_name(fed.train.func)
    where = (f"the model and the optimizers are prepared in `{home.qualname}`, which never receives it, so it is not "
             "prepared and every process would train on all of the data (N times the work)")
    if reference is None:
        advice = (f"hand `{fed.source}` to `{home.qualname}` and prepare it there with them, or prepare it with the "
                  f"Accelerator that prepares them, below the line that binds `{fed.instance}`, before the loop")
    else:
        advice = (f"below the lines that bind `{fed.source}` and `{fed.instance}`, before the loop, add "
                  f"`{fed.source} = {reference}.prepare({fed.source})`: each process then draws its own share of "
                  "every epoch's batches")
    how = (f"`{feed}(...)`, a method of the `{fed.cls.name}` instance `{fed.instance}` that trains on it"
           if fed.feed is fed.train else
           f"`{feed}(...)` and trains with `{train}(...)`, methods of the `{fed.cls.name}` instance `{fed.instance}`")
    roles.findings.append(Finding(PREPARE, at, (
        f"`{fed.source}` is the loader the training step draws from: the loop over it hands each batch to {how}; "
        f"{where}: {advice}"), unconverted=True))


def _inline_loader(roles: Roles, function: str) -> Binding | None:
    """`batches = cycle(DataLoader(...))`: a generator of the module that yields a loader's batches,
    handed a DataLoader built in the call (the binding)."""
    for scope in roles.facts.scopes:
        for bindings in scope.bindings.values():
            for binding in bindings:
                value = binding.value
                if (isinstance(value, cst.Call) and isinstance(value.func, cst.Name) and value.func.value == function
                        and draws_through(roles, value) and call_name(roles, value.args[0].value, DATALOADER)):
                    return binding
    return None


def _stepped_closure(scope: Scope) -> str | None:
    """The name of `scope` when it is a function its parent passes to an optimizer's
    `step(closure)` (LBFGS and other closure optimizers), else None."""
    parent = scope.parent
    if not scope.is_function or parent is None:
        return None
    found = False

    class Steps(cst.CSTVisitor):
        def visit_Call(self, node: cst.Call) -> None:
            nonlocal found
            func = node.func
            found = found or (type(func) is cst.Attribute and func.attr.value == "step" and any(
                type(a.value) is cst.Name and a.value.value == scope.name for a in node.args))

    walk(parent.node, Steps())
    return scope.name if found else None


def random_batches(roles: Roles, scope: Scope, site: Site) -> tuple[str, list[Binding]] | None:
    """The function of this file the training loop of `site` draws its batches from (`get_batch()`)
    when it draws them from torch's global RNG, itself or through functions of this file it calls
    (`torch.randn(batch_size)`), with the module-level bindings those functions read that are drawn
    from that RNG too (the task the batches are made from: `W_target = torch.randn(4, 1) * 5`)."""
    source = _batch_function(roles, scope, site)
    function = roles.facts.functions.get(source) if source is not None else None
    if function is None:
        return None
    reached: list[Scope] = []
    todo = [function]
    while todo and len(reached) < 8:
        current = todo.pop()
        if any(current is r for r in reached):
            continue
        reached.append(current)
        todo.extend(f for c in current.calls if (f := roles.facts.functions.get(c.callee)) is not None)
    if not any(call.qualified in RNG_DRAWS for f in reached for call in f.library_calls):
        return None
    read = {n.value for f in reached for n in _names_in(f.node)}
    module = roles.facts.module_scope
    task = [
        binding
        for name in sorted(read)
        if not any(name in f.bindings or name in f.params for f in reached)
        for binding in module.bindings.get(name, [])
        if binding.value is not None and _draws(roles, binding.value)
    ]
    return function.name, sorted(task, key=lambda b: b.where.order)


def _draws(roles: Roles, node: cst.CSTNode) -> bool:
    """`node` calls one of torch's global-RNG draws."""
    found: list[cst.Call] = []

    class Finder(cst.CSTVisitor):
        def visit_Call(self, call: cst.Call) -> None:
            if roles.facts.aliases.qualify(call.func) in RNG_DRAWS:
                found.append(call)

    walk(node, Finder())
    return bool(found)


def seeded_before(roles: Roles, binding: Binding) -> bool:
    """A module-level seed of torch's RNG runs before the module-level `binding`."""
    return any(
        call.qualified in RNG_SEEDS and not call.loops and call.where.order < binding.where.order
        for call in roles.facts.module_scope.library_calls
    )


def unseeded_task_message(function: str, task: list[Binding]) -> str:
    """What to say of module-level draws the batches are made from, with no seed before them."""
    names = ", ".join(f"`{b.name}`" for b in task)
    return (
        f"{names}, read by `{function}()` (the training batches), {'is' if len(task) == 1 else 'are'} drawn here "
        "from torch's global RNG with no seed before: torch seeds each process at random, so on N processes each "
        "would draw its own and train on a different task. Seed torch's RNG the same on every process before "
        "this line (`torch.manual_seed(0)`, any fixed number) and run the migration again: it then seeds the "
        f"processes apart after the prepare call, so that each draws its own batches from `{function}()` of "
        "the one task"
    )


def _sequence_slices(roles: Roles, scope: Scope, site: Site) -> tuple[str, str, Binding | None, str | None] | None:
    """A training loop `for i in range(...)` whose batch is a slice of one tensor along a later
    axis, `ids[:, i:i + seq_length]`: consecutive chunks of the same rows (truncated BPTT). With
    the tensor, the slice as shown, the tensor's binding and a name carried from one step to the
    next (`outputs, states = model(inputs, states)`), if there is one. The binding is None when
    the tensor's rows are split by rank already (`ids = ids[accelerator.process_index::...]`)."""
    if not site.loops:
        return None
    loop = site.loops[-1]
    if not isinstance(loop.node.target, cst.Name):
        return None
    index = loop.node.target.value
    found: list[cst.Subscript] = []

    class Finder(cst.CSTVisitor):
        def visit_Subscript(self, node: cst.Subscript) -> None:
            if not isinstance(node.value, cst.Name) or len(node.slice) < 2:
                return
            first = node.slice[0].slice
            if not (isinstance(first, cst.Slice) and first.lower is None and first.upper is None):
                return
            if any(isinstance(e.slice, cst.Slice) and index in {
                n.value for part in (e.slice.lower, e.slice.upper) if part is not None for n in _names_in(part)
            } for e in node.slice[1:]):
                found.append(node)

        def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
            return False

    walk(loop.node.body, Finder())
    if not found:
        return None
    subscript = found[0]
    assert isinstance(subscript.value, cst.Name)
    tensor = subscript.value.value
    origin = scope if tensor in scope.bindings else roles.facts.module_scope
    bindings = [b for b in origin.bindings.get(tensor, []) if not _bound_in_loop(b, loop)]
    if not bindings:
        return None
    if any(_split_by_rank(b.value) for b in bindings):
        return tensor, "", None, None
    return tensor, " ".join(cst.Module([]).code_for_node(subscript).split()), bindings[0], _carried(loop)


def _split_by_rank(value: cst.BaseExpression | None) -> bool:
    """`ids[accelerator.process_index::accelerator.num_processes]`, `data[rank::world_size]`,
    `accelerator.share_streams(ids)`."""
    if isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute) and value.func.attr.value == "share_streams":
        return True
    if not isinstance(value, cst.Subscript) or not isinstance(value.slice[0].slice, cst.Slice):
        return False
    code = cst.Module([]).code_for_node(value.slice[0].slice).lower()
    return "process_index" in code or "rank" in code


def _time_first_slices(
    roles: Roles, scope: Scope, site: Site,
) -> tuple[str, str, Binding | None, str | None, Scope | None] | None:
    """A training loop that takes its batch from a function of this module handed one tensor and the
    loop's index (`data, targets = get_batch(train_data, i)`), the function slicing that tensor
    along its first axis from the index (`source[i:i + seq_len]`): a batchified (num_tokens,
    batch_size) corpus whose columns are the streams. With the tensor, the call as shown, the
    tensor's binding (outside the loop, in the step's scope or the module's) and a name carried from
    one step to the next, if there is one. The binding is None when the streams are shared by rank
    already (`train_data = accelerator.share_streams(train_data, dim=1)`)."""
    if not site.loops:
        return None
    loop = site.loops[-1]
    indices = {n.value for n in _names_in(loop.node.target)}
    functions = {s.name: s for s in roles.facts.scopes if s.is_function and s.parent is roles.facts.module_scope}
    for call in scope.calls:
        helper = functions.get(call.callee)
        if helper is None or loop not in call.loops or isinstance(helper.node, cst.Lambda):
            continue
        args = call.call.args
        if len(args) != 2 or any(a.keyword is not None or a.star for a in args) or len(helper.params) != 2:
            continue
        source, index = (a.value for a in args)
        if not (isinstance(source, cst.Name) and isinstance(index, cst.Name) and index.value in indices):
            continue
        if not _slices_first_axis(helper, helper.params[0], helper.params[1]):
            continue
        tensor = source.value
        origin = scope if tensor in scope.bindings else roles.facts.module_scope
        bindings = [b for b in origin.bindings.get(tensor, []) if not _bound_in_loop(b, loop)]
        if any(_split_by_rank(b.value) for b in bindings):
            return tensor, "", None, None, None  # its streams are shared already (the advice applied)
        if len(bindings) != 1:
            return None
        shown = " ".join(cst.Module([]).code_for_node(call.call).split())
        return tensor, shown, bindings[0], _carried_nested(loop), helper
    return None


def _slices_first_axis(helper: Scope, source: str, index: str) -> bool:
    """`source[index:index + n]` (one slice, its start reading `index`) in the function `helper`."""
    found = False

    class Slices(cst.CSTVisitor):
        def visit_Subscript(self, node: cst.Subscript) -> None:
            nonlocal found
            if not (isinstance(node.value, cst.Name) and node.value.value == source and len(node.slice) == 1):
                return
            part = node.slice[0].slice
            if isinstance(part, cst.Slice) and part.lower is not None and index in {
                    n.value for n in _names_in(part.lower)}:
                found = True

    helper.node.visit(Slices())
    return found


def _carried_nested(loop: Loop) -> str | None:
    """`_carried`, also in the blocks of an `if` in the loop's body (`if args.model == ...: ...
    else: output, hidden = model(data, hidden)`)."""
    carried = _carried(loop)
    if carried is not None:
        return carried
    found: list[str] = []

    class Assigns(cst.CSTVisitor):
        def visit_Assign(self, small: cst.Assign) -> None:
            if isinstance(small.value, cst.Call):
                bound = {n.value for t in small.targets for n in _names_in(t.target)}
                read = {n.value for a in small.value.args for n in _names_in(a.value)}
                found.extend(sorted(bound & read))

        def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
            return False

        def visit_For(self, node: cst.For) -> bool:
            return node is loop.node

        def visit_While(self, node: cst.While) -> bool:
            return False

    loop.node.visit(Assigns())
    return found[0] if found else None


def _carried(loop: Loop) -> str | None:
    """A name the loop's body passes to a call and binds from that call's result in one statement
    (`outputs, states = model(inputs, states)`): state carried from one step to the next."""
    for stmt in loop.node.body.body if isinstance(loop.node.body, cst.IndentedBlock) else ():
        if not isinstance(stmt, cst.SimpleStatementLine):
            continue
        for small in stmt.body:
            if isinstance(small, cst.Assign) and isinstance(small.value, cst.Call):
                bound = {n.value for t in small.targets for n in _names_in(t.target)}
                read = {n.value for a in small.value.args for n in _names_in(a.value)}
                carried = sorted(bound & read)
                if carried:
                    return carried[0]
    return None


def _drawn_generators(roles: Roles, scope: Scope, site: Site) -> set[str] | None:
    """The global generators (see `rng`) drawing the whole input of every call of a model in the
    training step (`scope`, within the loops of its backward): `model(torch.randn(20, 10))`,
    `x = torch.from_numpy(np.random.rand(8, 4))`; None when some input is not such a draw (fixed
    data, a draw on a CUDA device or from a `generator=`). Unseeded, each process starts those
    generators from its own seed, so each trains on data of its own, as the original did on its one
    process; seeded (`torch.manual_seed(0)`), every process draws the same."""
    calls = [c for c in scope.calls if c.loops[:len(site.loops)] == site.loops
             and roles.all_in(scope, c.callee, roles.models)]
    if not calls:
        return None
    drawn: set[str] = set()
    for call in calls:
        if not call.call.args or any(a.star for a in call.call.args):
            return None
        for arg in call.call.args:
            generator = drawn_from(roles.facts, scope, arg.value, call.where)
            if generator is None:
                return None
            drawn.add(generator)
    return drawn


def _drawn_once(roles: Roles, scope: Scope, site: Site) -> bool:
    """Every input of the model calls in the training step is a name bound once, outside the loop
    that runs the step (or outside the step function): data drawn once before training (`xs =
    torch.randn(30, 2)` under `torch.manual_seed(0)`), which seeding the processes apart afterwards
    would not change."""
    calls = [c for c in scope.calls if c.loops[:len(site.loops)] == site.loops
             and roles.all_in(scope, c.callee, roles.models)]
    if not calls:
        return False
    for call in calls:
        for arg in call.call.args:
            if type(arg.value) is not cst.Name or arg.keyword is not None:
                return False
            bindings = scope.bindings.get(arg.value.value, [])
            if not site.loops and bindings:
                return False  # bound by the step function itself, on every call
            loop = site.loops[0] if site.loops else None
            if loop is not None and any(b.where.stmt is loop.node or any(r.stmt is loop.node for r in b.where.path)
                                        for b in bindings):
                return False
    return True


def _batch_function(roles: Roles, scope: Scope, site: Site) -> str | None:
    """The function of this module called in the training loop to produce the batch
    (`X, Y = get_batch("train")`), if there is one."""
    if not site.loops:
        return None
    loop = site.loops[-1]
    functions = {s.name for s in roles.facts.scopes if s.is_function and s.parent is roles.facts.module_scope}
    inputs = _step_inputs(roles, scope, site)
    for call in scope.calls:
        stmt = call.where.stmt
        if call.callee not in functions or loop not in call.loops:
            continue
        assign = next((small for small in stmt.body if isinstance(small, cst.Assign) and small.value is call.call),
                      None) if isinstance(stmt, cst.SimpleStatementLine) else None
        if assign is None:
            continue
        # A source of batches binds names the step's model reads (`X, Y = get_batch("train")`);
        # `val_log[step] = evaluate(model, val_data)` in the same loop records a result, and an
        # evaluation bound to a name the model never reads (`val_loss = evaluate(...)`) is no input.
        bound = {name for target in assign.targets for name in _target_names(target.target)}
        if not bound or (inputs is not None and not bound & inputs):
            continue
        # A source of batches is called with what stays the same across iterations
        # (`get_batch("train")`); `detach(states)` or `fast_adapt(batch, ...)` work on this
        # iteration's values, so they are not where the data comes from.
        read = {n.value for a in call.call.args for n in _names_in(a.value)}
        if not any(_bound_in_loop(b, loop) for n in read for b in scope.bindings.get(n, [])):
            return call.callee
    return None


def _own_optimizer(roles: Roles, scope: Scope) -> str | None:
    """The name `scope` binds to a `torch.optim` optimizer it builds itself (`optimizer =
    optim.Adam(student.parameters(), ...)`), if it does and also calls `backward`: a training
    function of its own."""
    if not scope.backwards:
        return None
    for name, bindings in scope.bindings.items():
        for binding in bindings:
            value = binding.value
            if type(value) is not cst.Call:
                continue
            qualified = roles.facts.aliases.qualify(value.func) or ""
            if qualified.startswith("torch.optim.") and not qualified.startswith("torch.optim.lr_scheduler"):
                return name
    return None


def _samples_from_model(roles: Roles) -> bool:
    """The file builds a `torch.distributions` distribution, and a function of it samples from one
    and scores what it sampled (`m = Categorical(probs); action = m.sample(); m.log_prob(action)`,
    the same name): a policy-gradient step (REINFORCE, actor-critic), whose data are episodes
    played with actions sampled from the model's outputs, not rows of a dataset. A reparameterised
    draw (`q.rsample()`, a VAE's) is not such a sample."""
    if not any(c.qualified.startswith("torch.distributions.") for s in roles.facts.scopes for c in s.library_calls):
        return False
    for scope in roles.facts.scopes:
        by_method: dict[str, set[str]] = {}
        for site in scope.method_calls:
            if type(site.call.func) is cst.Attribute and type(site.receiver) is cst.Name:
                by_method.setdefault(site.call.func.attr.value, set()).add(site.receiver.value)
        if by_method.get("sample", set()) & by_method.get("log_prob", set()):
            return True
    return False


def _target_names(target: cst.BaseExpression) -> list[str]:
    """The names an assignment target binds: `x`, `x, (y, *z)`; none for `d[k]` or `obj.attr`."""
    if isinstance(target, cst.Name):
        return [target.value]
    if isinstance(target, (cst.Tuple, cst.List)):
        return [n for e in target.elements for n in _target_names(e.value)]
    if isinstance(target, cst.StarredElement):
        return _target_names(target.value)
    return []


def _step_inputs(roles: Roles, scope: Scope, site: Site) -> set[str] | None:
    """The names the model calls of the training step (`scope`, within the loops of its backward)
    read, with the names bound in the step's loop that they are made from (`ids =
    torch.stack(batch).to(device)` adds `batch`); None when the step calls no model by name (a
    `compute_loss(model, x)` helper, `model.loss(x)`), where nothing can be told from them."""
    calls = [c for c in scope.calls if c.loops[:len(site.loops)] == site.loops
             and roles.all_in(scope, c.callee, roles.models)]
    if not calls:
        return None
    loop = site.loops[-1]
    todo = [n.value for c in calls for a in c.call.args for n in _names_in(a.value)]
    seen: set[str] = set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        for binding in scope.bindings.get(name, []):
            stmt = binding.where.stmt
            if _bound_in_loop(binding, loop) and isinstance(stmt, cst.SimpleStatementLine):
                todo.extend(n.value for n in _names_in(stmt))
    return seen


def _names_in(node: cst.CSTNode) -> list[cst.Name]:
    finder = _Names()
    walk(node, finder)
    return finder.found


class _Names(cst.CSTVisitor):
    def __init__(self) -> None:
        self.found: list[cst.Name] = []

    def visit_Name(self, name: cst.Name) -> None:
        self.found.append(name)


def _bound_in_loop(binding: Binding, loop: Loop) -> bool:
    return binding.where.stmt is loop.node or any(ref.stmt is loop.node for ref in binding.where.path)


# -- loaders found from use: what the training loop iterates, whatever built it ------------------

# Keywords by which a loader factory is told to shard by rank itself (timm's `create_loader(...,
# distributed=args.distributed)`, `rank=args.rank, world_size=args.world_size`).
_SHARDING_KEYWORDS = frozenset({
    "distributed", "rank", "world_size", "num_replicas", "num_shards", "shard", "process_rank",
    "num_processes", "global_rank",
})
# Builtins that make batches out of other objects: what they return is no DataLoader.
_BUILTIN_ITERABLES = frozenset({
    "zip", "map", "filter", "range", "enumerate", "iter", "list", "tuple", "sorted", "reversed", "chain",
})
# Libraries whose calls return no torch DataLoader (a tensor, a dataset, a torchtext iterator).
_NOT_LOADER_LIBRARIES = ("torch.", "torchtext.", "numpy.", "itertools.", "builtins.")
# ... of which those whose calls make batch iterators (prepared: the runtime shares out their batches)
_BATCH_LIBRARIES = ("torchtext.",)
_DEPTH = 4


@dataclass(frozen=True)
class _Source:
    """What a binding of a training loader is, read from the code that builds it.

    kind: "loader" (a torch DataLoader, or a same-file helper returning one), "not_loader" (the code
    shows it is none: a torchtext iterator, a class of this file, a builtin, a literal), "unread" (a
    call of a function the migration cannot read: another module's `get_loader(...)`)."""

    kind: str
    shown: str  # how the report names it
    call: cst.Call | None = None  # the unread call
    # a "not_loader" that makes batches of its own (an instance of a class of this file, a generator
    # function's generator, an installed package's iterator such as torchtext's): `prepare` shares
    # them out by position; not data (a tensor, a list, `zip(...)`), whose other uses a wrapper would break
    batches: bool = False
    # its `device=` argument when that is not the script's device choice (which becomes
    # `accelerator.device`): `device=torch.device("cuda", 0)`, `device=0`
    fixed_device: str | None = None


def _loader_by_use(roles: Roles, home: Scope, node: cst.CSTNode, source: str, name: str) -> None:
    """`name` of home is what a training loop iterates (as `source`), bound to something that is not
    a DataLoader call home can see: decide from what builds it. The loop is what makes it the loader
    (its constructor is evidence, not a requirement):

    - built by a function the migration cannot read (`data_loader = get_loader(...)` of a module not
      given, `train_dl, valid_dl, ... = get_data(opts)`): prepared (`roles.unread_loaders`); the
      runtime's `prepare` shards it if it is a DataLoader and raises PrepareError on N processes if it
      is not; its batches keep their moves to the device. Given the distributed flag or the rank
      (`create_loader(..., distributed=args.distributed)`), the factory shards by rank itself: kept
      as it is and not prepared (it would be sharded twice), with a note (`roles.self_sharded`);
    - shown not to be a DataLoader but an iterator that makes batches of its own (a torchtext
      `BucketIterator`, also returned by a helper of this file; an instance of a class of this file; a
      generator function's generator; not one of this file whose code draws from a global RNG the
      file never seeds, `torch.randn(...)`: reported): prepared (`roles.iterable_loaders`); the runtime's `prepare`
      gives each process every N-th of its batches (runtime/batch_iterables.py), which keep their
      moves to the device (`device=device` given to the iterator is the Accelerator's device);
      reported instead under `--target accelerate`, whose `prepare` returns it unchanged;
    - shown to be data that is no DataLoader (`zip(...)`, a list, a tensor, a torch Dataset): reported,
      with what it is;
    - anything else: reported as not a recognised DataLoader."""
    sources = [_binding_source(roles, home, b, _DEPTH) for b in home.bindings.get(name, [])]
    known = [s for s in sources if s is not None]
    refused = [s for s in known if s.kind == "not_loader"]
    unread = [s for s in known if s.kind == "unread"]
    fixed = next((s for s in refused if s.fixed_device is not None), None)
    if fixed is not None and all(s.batches for s in refused):
        roles.cannot_prepare(node, (
            f"training loop iterates `{source}`, {_what(fixed.shown)}, which is not a torch DataLoader; it places "
            f"its batches with `device={fixed.fixed_device}`, not the script's device choice, so on N GPUs every "
            "process would put its batches on that one device, away from its model: it was not prepared, and every "
            "process would see all the data. Bind the device choice to a name first (`device = torch.device(...)`, "
            "chosen as the script chooses it), pass `device=device` and run again: the migration makes that name "
            "`accelerator.device`, prepares the iterator, and each process takes its share of its batches"))
        return
    if refused and len(known) == len(sources) and all(s.batches for s in refused) and not unread:
        # What the loop iterates is the loader, whatever built it: prepared, the runtime shares out its
        # batches by position (runtime/batch_iterables.py); they are not moved, so they keep their moves.
        # HF Accelerate's `prepare` returns it as it is: reported instead under --target accelerate.
        roles.iterable_loaders.setdefault(name, (
            f"training loop iterates `{source}`, {_what(refused[0].shown)}, which is not a torch DataLoader: "
            "HF Accelerate's `accelerator.prepare` returns it unchanged, so it was not prepared and every process "
            "would see all the data. Build the training batches with torch.utils.data.DataLoader over the same "
            "data (a `collate_fn` that batches them as it does) and run again: that loader is prepared, and "
            "sharded; or migrate with `--target runtime`, whose `prepare` gives each process its share of the "
            "iterator's batches"))
        if name not in roles.loaders:
            roles.loaders.append(name)
        return
    if refused:
        roles.cannot_prepare(node, (
            f"training loop iterates `{source}`, {_what(refused[0].shown)}, which is not a torch DataLoader: "
            "`accelerator.prepare` cannot shard it, so it was not prepared and every process would see all "
            "the data. Build the training batches with torch.utils.data.DataLoader over the same data (a "
            "`collate_fn` that batches them as it does) and run again: that loader is prepared, and sharded"))
        return
    if unread and len(known) == len(sources):
        sharding = [(s, k) for s in unread if s.call is not None for k in _sharding_keywords(roles, home, s.call)]
        if sharding:
            given: dict[str, list[str]] = {}
            for found, keyword in sharding:
                keywords = given.setdefault(found.shown, [])
                if keyword not in keywords:
                    keywords.append(keyword)
            factories = " or ".join(
                f"`{f}(...)` (given {', '.join(f'`{k}=`' for k in keywords)})" for f, keywords in given.items())
            roles.self_sharded[name] = node
            roles.findings.append(Finding(PREPARE, node, (
                f"training loop iterates `{source}`, built by {factories}, which the migration cannot read: a loader "
                "factory given the distributed flag or the rank and world size shards the data by rank itself, so "
                "the loader was kept as it is and not prepared (preparing it would shard it twice); each process "
                "trains on its own share when those arguments say the run is distributed under `accel launch`. "
                "If the factory does not shard, build the loader without them and add it to `accelerator.prepare(...)`")))
            return
        if name not in roles.unread_loaders:
            roles.unread_loaders[name] = unread[0].shown
        if name not in roles.loaders:
            roles.loaders.append(name)
        return
    if sources and len(known) == len(sources):  # every binding builds a DataLoader (`self.build_loader()`)
        if name not in roles.loaders:
            roles.loaders.append(name)
        return
    values = [b.value for b in home.bindings.get(name, []) if b.value is not None]
    bound = f" (`{name} = {cst.Module([]).code_for_node(values[0])}`)" if values else ""
    roles.cannot_prepare(node, (
        f"training loop iterates `{source}`, which the migration cannot tell to be a DataLoader{bound}; it is not "
        "prepared, so every process would see all the data: bind the torch.utils.data.DataLoader it iterates to "
        f"`{name}` itself (`{name} = DataLoader(...)`, or a function that returns one) and run again: it is then "
        "prepared, and sharded"))


def _what(shown: str) -> str:
    """How the report introduces a source: `data.BucketIterator.splits(...)` of torchtext -> "built
    by `data.BucketIterator.splits(...)` of torchtext"; phrases that say it themselves stay."""
    return shown if shown.startswith(("returned by", "an instance", "a `", "made by")) else f"built by {shown}"


def unread_factory(roles: Roles, scope: Scope, binding: Binding) -> str | None:
    """The function the migration cannot read that builds the loader `binding` binds
    (`self.loader = fetch_loader(...)` of a module not given), when it is not told to shard by rank."""
    found = _binding_source(roles, scope, binding, _DEPTH)
    if found is None or found.kind != "unread" or found.call is None or _sharding_keywords(roles, scope, found.call):
        return None
    return found.shown


def _binding_source(roles: Roles, scope: Scope, binding: Binding, depth: int) -> _Source | None:
    if binding.value is not None:
        return _expr_source(roles, scope, binding.value, None, depth)
    unpacked = unpacked_call(binding)
    if unpacked is None:
        return None
    call, index = unpacked
    return _expr_source(roles, scope, call, index, depth)


def _expr_source(
    roles: Roles, scope: Scope, value: cst.BaseExpression, index: int | None, depth: int
) -> _Source | None:
    """What `value` (element `index` of what it returns, when unpacked) is; None when unknown."""
    if depth <= 0:
        return None
    shown = cst.Module([]).code_for_node(value.func) if isinstance(value, cst.Call) else ""
    if isinstance(value, (cst.List, cst.Tuple, cst.ListComp, cst.GeneratorExp, cst.Dict, cst.DictComp,
                          cst.SetComp, cst.Set)) and index is None:
        return _Source("not_loader", f"a `{type(value).__name__}` of this file")
    if isinstance(value, cst.Name):
        bound = scope.bindings.get(value.value, [])
        found = [_binding_source(roles, scope, b, depth - 1) for b in bound]
        return found[0] if bound and all(f is not None and f == found[0] for f in found) else None
    if not isinstance(value, cst.Call):
        return None
    if call_name(roles, value, DATALOADER):
        return _Source("loader", "a DataLoader") if index is None else None
    helper = roles.facts.function_called(value)
    if helper is not None:
        if yields(helper.node):
            return _Source("not_loader", f"made by `{shown}(...)`, a generator function of this file",
                           batches=not _draws_unseeded(roles, helper.node)) if index is None else None
        if not helper.returns:
            return None
        found_in: list[_Source | None] = []
        for returned in helper.returns:
            element: cst.BaseExpression | None = returned
            if index is not None:
                if not isinstance(returned, cst.Tuple) or index >= len(returned.elements):
                    return None
                item = returned.elements[index]
                element = None if isinstance(item, cst.StarredElement) else item.value
            found_in.append(_expr_source(roles, helper, element, None, depth - 1) if element is not None else None)
        first = found_in[0]
        if first is None or any(f != first for f in found_in):
            return None
        if first.kind == "not_loader":
            return _Source("not_loader", f"returned by `{shown}(...)` of this file, which builds it as {first.shown}",
                           batches=first.batches, fixed_device=first.fixed_device)
        return first
    func = value.func
    if isinstance(func, cst.Name) and func.value in roles.facts.classes:
        cls = roles.facts.classes[func.value]
        assert isinstance(cls.node, cst.ClassDef)
        if any(roles.facts.aliases.qualify(base.value) in DATALOADER for base in cls.node.bases):
            return _Source("loader", f"a `{func.value}`") if index is None else None
        return _Source("not_loader", f"an instance of `{func.value}`, a class of this file",
                       batches=not _draws_unseeded(roles, cls.node),
                       fixed_device=_fixed_device(roles, scope, value)) if index is None else None
    qualified = roles.facts.aliases.qualify(func)
    if qualified is None and isinstance(func, cst.Name):
        if func.value in _BUILTIN_ITERABLES and not roles.facts.module_scope.binds(func.value):
            return _Source("not_loader", f"`{func.value}(...)`") if index is None else None
        return None
    if qualified is not None and qualified.startswith(_NOT_LOADER_LIBRARIES):
        library = qualified.split(".", 1)[0]
        batches = qualified.startswith(_BATCH_LIBRARIES)
        return _Source("not_loader", f"`{shown}(...)` of {library}", batches=batches,
                       fixed_device=_fixed_device(roles, scope, value) if batches else None)
    return _Source("unread", shown, value)


def _draws_unseeded(roles: Roles, node: cst.CSTNode) -> bool:
    """The code of a batch iterator of this file (a class, a generator function) draws from a global
    random generator the file never seeds: each process draws its own batches, so sharing them out by
    position is not what the script does (and the runtime would find the processes' batches differ);
    such an iterator is left as it was (reported as no DataLoader)."""
    drawn: set[str] = set()

    class Draws(Visitor):
        def visit_Call(self, call: cst.Call) -> None:
            kind = draw_generator(roles.facts, call)
            if kind is not None:
                drawn.add(kind)

    walk(node, Draws())
    return bool(drawn - seeded_generators(roles.facts))


def _fixed_device(roles: Roles, scope: Scope, call: cst.Call) -> str | None:
    """The `device=` argument of the call building a batch iterator, when it is not the script's
    device choice (a name the migration binds to `accelerator.device`): on N GPUs every process
    would place its batches on that one device."""
    for arg in call.args:
        if arg.keyword is None or arg.keyword.value != "device":
            continue
        value = arg.value
        if isinstance(value, cst.Name) and value.value == "None":
            return None
        if isinstance(value, (cst.Name, cst.Attribute)):
            name = value.value if isinstance(value, cst.Name) else instance_attribute(value)
            # the device choice (made `accelerator.device`), or a name the code does not show the
            # origin of (a parameter no caller of this file passes): left to the caller
            if roles.is_device(scope, value) or name is None:
                return None
            found = roles.origins(scope, name)
            if not found or not any(origin.bindings.get(n) for origin, n in found):
                return None
        return cst.Module([]).code_for_node(value)
    return None


def _sharding_keywords(roles: Roles, scope: Scope, call: cst.Call) -> list[str]:
    """The keywords of `call` that tell a factory to shard by rank: given directly
    (`rank=args.rank`), or in a dict spread into it (`**loader_kwargs` with `loader_kwargs =
    dict(..., distributed=args.distributed)` or `{"distributed": ...}`)."""
    found: list[str] = []
    for arg in call.args:
        if arg.keyword is not None and arg.keyword.value in _SHARDING_KEYWORDS:
            found.append(arg.keyword.value)
        elif arg.star == "**" and isinstance(arg.value, cst.Name):
            for binding in scope.bindings.get(arg.value.value, []):
                value = binding.value
                if isinstance(value, cst.Call) and isinstance(value.func, cst.Name) and value.func.value == "dict":
                    found += [a.keyword.value for a in value.args if a.keyword is not None
                              and a.keyword.value in _SHARDING_KEYWORDS]
                elif isinstance(value, cst.Dict):
                    found += [e.key.evaluated_value for e in value.elements if isinstance(e, cst.DictElement)
                              and isinstance(e.key, cst.SimpleString) and e.key.evaluated_value in _SHARDING_KEYWORDS]
    return found
