"""Turn the analysis facts into roles: who is the model, the optimizer, the training loader.

Names are followed through assignments, function parameters (via the module's own call sites)
and enclosing scopes, so `train(model, loader, optimizer)` called from `main()` is understood as
working on main's prepared objects. Everything the rules decide is derived here once.

Key terms:
- home: the scope that builds the optimizer; `accelerator.prepare(...)` goes there.
- accelerator scope: where `accelerator = Accelerator()` lives (the device choice, or home).
- reach: whether a scope can see `accelerator` (same or nested scope, a module-level accelerator,
  or a function every caller of which can pass it in as a new parameter).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

import libcst as cst

from migrate import hand_sharding
from migrate.analysis import Binding, DeviceBinding, Facts, Loop, Scope, Site, StmtRef, is_device_choice
from migrate.hand_sharding import HandSharding
from migrate.imports import is_docstring
from migrate.names import call_argument, dotted_name, root_name
from migrate.walk import walk

_OPTIMIZER = re.compile(
    r"^torch\.optim\.[A-Z]\w*$|^transformers\.(optimization\.)?(AdamW|Adafactor)$"
    r"|^torch\.distributed\.optim\.(zero_redundancy_optimizer\.)?ZeroRedundancyOptimizer$"  # AM007 unwraps it
)
_SCHEDULER = re.compile(r"^torch\.optim\.lr_scheduler\.\w+$|^transformers\.(optimization\.)?get_\w*schedule\w*$")
_DATALOADER = frozenset({"torch.utils.data.DataLoader", "torch.utils.data.dataloader.DataLoader"})

Origin = tuple[Scope, str]


@dataclass(eq=False)
class Finding:
    """Something a rule must report rather than rewrite."""

    code: str
    node: cst.CSTNode
    message: str


@dataclass(eq=False)
class Roles:
    facts: Facts
    home: Scope | None = None
    models: list[str] = field(default_factory=list)
    optimizers: list[str] = field(default_factory=list)
    loaders: list[str] = field(default_factory=list)
    schedulers: list[str] = field(default_factory=list)
    epoch_schedulers: list[str] = field(default_factory=list)  # stepped per epoch: not prepared
    rank_sampled: dict[str, cst.CSTNode] = field(default_factory=dict)  # loaders with a DistributedSampler
    eval_loops: list[tuple[Scope, Loop, str]] = field(default_factory=list)  # (scope, loop, home loader)
    accelerator_scope: Scope | None = None
    accelerator_exists: bool = False
    device_binding: DeviceBinding | None = None  # replaced by `accelerator.device` (AM001)
    later_device_bindings: list[DeviceBinding] = field(default_factory=list)  # same name, rebound too
    create_before: cst.BaseStatement | None = None  # where `accelerator = Accelerator()` goes otherwise
    prepare_after: StmtRef | None = None
    findings: list[Finding] = field(default_factory=list)
    refused: bool = False  # the file is reported, not rewritten
    spawn: "SpawnLaunch | None" = None  # an understood `mp.spawn` launcher (AM007 converts it)
    sharding: "HandSharding | None" = None  # hand-written FSDP / fully_shard / ZeRO that AM007 converts
    _training_functions: set[str] = field(default_factory=set)

    # -- name resolution ---------------------------------------------------------------------

    def origins(self, scope: Scope, name: str, _seen: frozenset[tuple[int, str]] = frozenset()) -> set[Origin] | None:
        """Bindings `name` can refer to in `scope`, or None when one of them cannot be known."""
        key = (id(scope), name)
        if key in _seen:
            return set()
        seen = _seen | {key}
        if name.startswith("self."):
            return self._attribute_origins(scope, name, seen)
        current: Scope | None = scope
        while current is not None:
            if current.binds(name):
                found: set[Origin] = set()
                for binding in current.bindings.get(name, []):
                    if not _is_self_move(binding):
                        found.add((current, name))
                if not found and name not in current.params:
                    # Bound here by self-moves only (`model = DDP(model)` with no `model = Net()`):
                    # the name is still this scope's, as it is once the wrapper becomes `prepare`.
                    found.add((current, name))
                if name in current.params:
                    from_callers = self._param_origins(current, name, seen)
                    if from_callers is None:
                        return None
                    found |= from_callers
                    if not from_callers and not current.bindings.get(name):
                        found.add((current, name))  # a parameter nobody here passes: itself
                return found
            current = _enclosing_function_or_module(current)
        return None

    def _attribute_origins(self, scope: Scope, name: str, seen: frozenset[tuple[int, str]]) -> set[Origin] | None:
        """`self.model` in a method: bound in some method of the class (usually `__init__`).

        `self.model = model` forwards to what `model` is in that method (a constructor parameter:
        what the callers of the class pass)."""
        methods = self.methods_of(scope)
        if methods is None:
            return None
        found: set[Origin] = set()
        for method in methods:
            for binding in method.bindings.get(name, []):
                if _is_self_move(binding):
                    continue
                value = binding.value
                inner = value.func.value if _is_move_call(value) else value
                # In the function that prepares (home), the attribute itself is what gets prepared.
                if isinstance(inner, cst.Name) and method is not self.home:
                    sub = self.origins(method, inner.value, seen)
                    if sub is None:
                        return None
                    found |= sub
                else:
                    found.add((method, name))
        return found or None

    def methods_of(self, scope: Scope) -> list[Scope] | None:
        """The methods of the class `scope` is a method of (None when it is not a method)."""
        if not scope.is_method or scope.parent is None:
            return None
        owner = scope.parent
        return [s for s in self.facts.scopes if s.parent is owner and s.is_function]

    def _param_origins(self, scope: Scope, name: str, seen: frozenset[tuple[int, str]]) -> set[Origin] | None:
        if not self._is_callable_unit(scope):
            return None
        index = scope.params.index(name)
        if scope.is_method:
            index -= 1  # `self` is not passed by the caller
            if index < 0:
                return None
        found: set[Origin] = set()
        for caller, call in self.call_sites(scope):
            arg = call_argument(call, index, name)
            if not isinstance(arg, cst.Name):
                return None
            sub = self.origins(caller, arg.value, seen)
            if sub is None:
                return None
            found |= sub
        return found

    def call_sites(self, function: Scope) -> list[tuple[Scope, cst.Call]]:
        """Where this module calls `function` (a plain function, or a class's `__init__`)."""
        if self._is_constructor(function):
            assert function.parent is not None
            callee = function.parent.name
        elif self.facts.functions.get(function.name) is function:
            callee = function.name
        elif function.is_method:
            siblings = self.methods_of(function) or []
            callee = f"self.{function.name}"
            return [(s, site.call) for s in siblings for site in s.calls if site.callee == callee]
        else:
            return []
        return [(scope, site.call) for scope in self.facts.scopes for site in scope.calls if site.callee == callee]

    def _is_constructor(self, scope: Scope) -> bool:
        return (
            scope.is_method
            and scope.name == "__init__"
            and scope.parent is not None
            and self.facts.classes.get(scope.parent.name) is scope.parent
        )

    def _is_callable_unit(self, scope: Scope) -> bool:
        return self.facts.functions.get(scope.name) is scope or scope.is_method

    def constructor_of(self, method: Scope) -> Scope | None:
        methods = self.methods_of(method) or []
        return next((m for m in methods if self._is_constructor(m)), None)

    def is_device(self, scope: Scope, expr: cst.BaseExpression) -> bool:
        if is_device_choice(expr, self.facts.aliases) or _is_accelerator_device(expr):
            return True
        if self._held_device(scope, expr):
            return True
        name = expr.value if isinstance(expr, cst.Name) else _self_attribute_name(expr)
        if name is None:
            return False
        found = self.origins(scope, name)
        if not found:
            return False
        return all(_binds_device(s, n) for s, n in found)

    def _held_device(self, scope: Scope, expr: cst.BaseExpression) -> bool:
        """`args.device` where `args` is the namespace on which some function stored the device
        choice (`args.device = torch.device(...)`), passed down unchanged."""
        if not (isinstance(expr, cst.Attribute) and isinstance(expr.value, cst.Name)) or expr.value.value == "self":
            return False
        held = f"{expr.value.value}.{expr.attr.value}"
        here = self.origins(scope, expr.value.value)
        return bool(here) and any(
            d.name == held and self.origins(owner, expr.value.value) == here
            for owner in self.facts.scopes
            for d in owner.devices
        )

    def all_in(self, scope: Scope, name: str, names: list[str]) -> bool:
        """True when every binding `name` may refer to is one of home's `names`."""
        found = self.origins(scope, name)
        return bool(found) and all(s is self.home and n in names for s, n in found)

    # -- reach -----------------------------------------------------------------------------

    def can_reach(self, scope: Scope, _pending: frozenset[int] = frozenset()) -> bool:
        target = self.accelerator_scope
        if target is None:
            return False
        if target is self.facts.module_scope or _nested_in(scope, target):
            return True
        if id(scope) in _pending:
            return True
        if scope.is_method:
            # A method reaches `self.accelerator`: created in a method of its class, or handed to
            # the class's constructor by callers that have it.
            methods = self.methods_of(scope) or []
            if any(_nested_in(target, m) for m in methods):
                return True
            constructor = self.constructor_of(scope)
            if constructor is None:
                return False
            scope = constructor
            if id(scope) in _pending:
                return True  # a method of the class builds an instance of it: already being decided
        if not scope.is_function or not self._is_callable_unit(scope):
            return False
        callers = self.call_sites(scope)
        pending = _pending | {id(scope)}
        return bool(callers) and all(self.can_reach(caller, pending) for caller, _ in callers)

    def needs_parameter(self, scope: Scope) -> bool:
        target = self.accelerator_scope
        if target is None or target is self.facts.module_scope or _nested_in(scope, target):
            return False
        if not scope.is_function:
            return False  # module level of another module (a unit's): no parameter to add
        if scope.is_method and any(_nested_in(target, m) for m in self.methods_of(scope) or []):
            return False  # the class holds it as `self.accelerator`
        return True

    def holds_accelerator(self, scope: Scope) -> bool:
        """True for a method whose class keeps the accelerator as `self.accelerator`."""
        return scope.is_method and (
            any(_nested_in(self.accelerator_scope, m) for m in self.methods_of(scope) or [])  # type: ignore[arg-type]
            or self.needs_parameter(scope)
        )

    # -- training loops --------------------------------------------------------------------

    def is_training_loop(self, loop: Loop) -> bool:
        return loop.has_backward or bool(loop.callees & self._training_functions)


_SPAWNERS = frozenset({"torch.multiprocessing.spawn", "torch.multiprocessing.start_processes"})
_SPAWN_PARAMETERS = ("fn", "args", "nprocs", "join", "daemon", "start_method")
_INIT_PROCESS_GROUP = "torch.distributed.init_process_group"
_MASTER_VARIABLES = frozenset({"MASTER_ADDR", "MASTER_PORT"})
_DEVICE_COUNTS = frozenset({"torch.cuda.device_count", "torch.accelerator.device_count"})


@dataclass(eq=False)
class SpawnLaunch:
    """`mp.spawn(worker, args=(a, b), nprocs=N)` in a shape AM007 converts to `worker(rank, a, b)`.

    Understood only when: the call is a statement of its own (outside loops, `join` left true);
    `worker` is a function of this file called nowhere else, taking the spawn index then exactly
    the written-out `args`; the file initialises its process group once, as a statement directly in
    the worker's body, with `rank=` (if given) the spawn index and `world_size=` (if given) a
    parameter that receives `nprocs`; `nprocs`, when a name, feeds only this call; and
    `MASTER_ADDR` / `MASTER_PORT` are only assigned (`os.environ[...] = ...`) in the worker or the
    spawning scope. Anything else is refused with the reason (`_spawn_launch`).
    """

    call: cst.Call
    stmt: cst.BaseStatement
    worker: Scope
    args: list[cst.BaseExpression]
    world_size_args: set[int]  # indexes of `args` that pass `nprocs` (the number of processes)
    nprocs: cst.BaseExpression
    nprocs_binding: cst.BaseStatement | None  # `world_size = torch.cuda.device_count()`, read only by the spawn
    master_env: list[cst.BaseStatement]  # `os.environ["MASTER_PORT"] = ...`: torchrun sets them
    environ: str | None  # how this file spells `os.environ` (None: it imports neither `os` nor `environ`)


def find_roles(facts: Facts) -> Roles:
    roles = Roles(facts)
    spawn = _spawn_launch(facts)
    if isinstance(spawn, Finding):
        roles.refused = True
        roles.findings.append(spawn)
        return roles
    _find_roles(roles)
    if spawn is not None and not roles.refused:
        _check_spawn_worker(roles, spawn)
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
    roles._training_functions = _training_functions(facts)
    _find_home_and_optimizers(roles)
    _find_existing_accelerator(roles)
    if roles.home is None or _built_in_a_class_body(roles):
        return
    _find_models(roles)
    _find_loaders(roles)
    if _is_library_module(roles):
        return
    _prefer_attributes(roles)
    _report_unsharded_training(roles)
    _report_hidden_training_step(roles)
    _report_library_traps(roles)
    _find_schedulers(roles)
    _find_eval_loops(roles)
    _place_accelerator(roles)
    _place_prepare(roles)
    _refuse_retrained_objects(roles)


def _refuse_retrained_objects(roles: Roles) -> None:
    """A second training section that builds its optimizer again after the prepare call (`model =
    Mlp()`, `optimizer = Adam(model.parameters())`, another loop): its model would train unprepared
    (not on the device, not synchronised) while its batches lose their moves. The file is left as
    it is, with the line, rather than half migrated."""
    home, after = roles.home, roles.prepare_after
    if home is None or after is None or roles.refused:
        return
    for name in roles.optimizers:
        later = [b for b in home.bindings.get(name, []) if b.where.order > after.order and b.value is not None]
        if later:
            roles.refused = True
            roles.findings.append(Finding(
                "AM004", later[0].where.stmt,
                f"optimizer `{name}` is built again here, after the training objects were prepared (several "
                "training sections in one scope): the objects of this section would train unprepared, so the file "
                "was left as it is: migrate it by hand, preparing this section's model, optimizer and loader with a "
                "second `accelerator.prepare(...)` after this line",
            ))
            return


def _built_in_a_class_body(roles: Roles) -> bool:
    """An optimizer or an Accelerator created in a class body refuses a file that trains.

    A class body runs once, when the class is defined, and its names are class attributes that
    neither its methods nor the module's functions can read by their plain name: an `accelerator`
    created there is out of reach of every function that would use it, and a `prepare(...)` there
    would rebind attributes the methods read through `self` or the class. No placement is right
    for every such shape, so the file is reported and left as it is.
    """
    home, scope = roles.home, roles.accelerator_scope
    if scope is not None and isinstance(scope.node, cst.ClassDef):
        binding = scope.accelerators[0]
        finding = Finding(
            "AM001",
            binding.where.stmt,
            f"the Accelerator is created in the body of class `{scope.name}`, where the functions and "
            "methods of this file cannot read it as `accelerator`, so the file was left as it is: create it "
            "in the function that trains (or at module level) and run accel-migrate again",
        )
    elif home is not None and isinstance(home.node, cst.ClassDef):
        binding = home.bindings[roles.optimizers[0]][0]
        finding = Finding(
            "AM004",
            binding.where.stmt,
            f"the optimizer `{binding.name}` is built in the body of class `{home.name}`, which runs once "
            "when the class is defined and whose names its methods cannot read, so `accelerator.prepare(...)` "
            "has no safe place and the file was left as it is: build the training objects in a function "
            "(or in `__init__` as `self.` attributes) and run accel-migrate again",
        )
    else:
        return False
    roles.refused = True
    roles.findings = [finding]
    return True


def _training_functions(facts: Facts) -> set[str]:
    """Names of functions (and `self.method`s) that call backward, directly or through others."""
    units = dict(facts.functions)
    for scope in facts.scopes:
        if scope.is_method:
            units.setdefault(f"self.{scope.name}", scope)
    training = {name for name, scope in units.items() if scope.backwards}
    changed = True
    while changed:
        changed = False
        for name, scope in units.items():
            if name not in training and any(site.callee in training for site in scope.calls):
                training.add(name)
                changed = True
    return training


def _is_library_module(roles: Roles) -> bool:
    """A test module, or a module that trains nothing by itself, is reported and left as it is.

    A test module (it imports `unittest` or `pytest`, or defines a `...TestCase` class) exercises
    training code; it is not a training script. A library module has no entry point (no
    `if __name__ == "__main__":` guard, and no module-level code that reaches the function building
    the optimizer through this file's own calls), builds no DataLoader and has no training loop over
    a loader: its models and data are handed in by whoever imports it (a numerical-check helper, a
    test harness), so an Accelerator created in it would own nothing. A script has an entry point; a
    `def main()` excerpt builds its own DataLoader; a trainer class iterates the loader it is given.
    """
    home = roles.home
    assert home is not None
    facts = roles.facts
    if _is_test_module(facts):
        reason = (
            "this is a test module (it imports unittest or pytest, or defines a TestCase): its training "
            "code is a test of training, not a training script, so it was left as it is"
        )
    elif (
        _has_main_guard(facts.module)
        or _runs_from_module_level(roles, home)
        or roles.loaders
        or any(call.qualified in _DATALOADER for scope in facts.scopes for call in scope.library_calls)
    ):
        return False
    else:
        reason = (
            "this module builds an optimizer but has no entry point (`if __name__ == \"__main__\":` or "
            "module-level code that trains) and no DataLoader feeds its training: it looks like a library "
            "module whose models and data come from its caller, so it was left as it is; migrate the script "
            "that builds them"
        )
    binding = home.bindings[roles.optimizers[0]][0] if roles.optimizers else None
    roles.refused = True
    roles.findings = [Finding("AM004", binding.where.stmt if binding is not None else home.node, reason)]
    return True


_TEST_FRAMEWORKS = ("unittest", "pytest")


def _is_test_module(facts: Facts) -> bool:
    """The module imports unittest or pytest at its top level, or defines a class derived from a
    base named `...TestCase` (unittest's TestCase and the harnesses built on it)."""
    for stmt in facts.module.body:
        if not isinstance(stmt, cst.SimpleStatementLine):
            continue
        for small in stmt.body:
            if isinstance(small, cst.Import):
                modules = [dotted_name(alias.name) or "" for alias in small.names]
            elif isinstance(small, cst.ImportFrom) and not small.relative and small.module is not None:
                modules = [dotted_name(small.module) or ""]
            else:
                continue
            if any(m.split(".", 1)[0] in _TEST_FRAMEWORKS for m in modules):
                return True
    for owner in facts.classes.values():
        assert isinstance(owner.node, cst.ClassDef)
        for base in owner.node.bases:
            name = dotted_name(base.value)
            if name is not None and name.rsplit(".", 1)[-1].endswith("TestCase"):
                return True
    return False


def _has_main_guard(module: cst.Module) -> bool:
    """`if __name__ == "__main__":` (either operand order) among the module's top-level statements."""
    for stmt in module.body:
        if not (isinstance(stmt, cst.If) and isinstance(stmt.test, cst.Comparison)):
            continue
        test = stmt.test
        if len(test.comparisons) != 1 or not isinstance(test.comparisons[0].operator, cst.Equal):
            continue
        operands = (test.left, test.comparisons[0].comparator)
        if any(isinstance(o, cst.Name) and o.value == "__name__" for o in operands) and any(
            isinstance(o, cst.SimpleString) and o.evaluated_value == "__main__" for o in operands
        ):
            return True
    return False


def _runs_from_module_level(roles: Roles, target: Scope) -> bool:
    """True when module-level code reaches `target` through calls of this file's functions,
    classes (any method of a class it instantiates) and sibling methods (`self.step()`)."""
    facts = roles.facts
    seen: set[int] = set()
    pending = [facts.module_scope]
    while pending:
        scope = pending.pop()
        if scope is target:
            return True
        if id(scope) in seen:
            continue
        seen.add(id(scope))
        for site in scope.calls:
            function = facts.functions.get(site.callee)
            if function is not None:
                pending.append(function)
            owner = facts.classes.get(site.callee)
            if owner is not None:
                pending.extend(s for s in facts.scopes if s.parent is owner and s.is_function)
            if site.callee.startswith("self.") and scope.is_method:
                pending.extend(roles.methods_of(scope) or [])
    return False


def _find_home_and_optimizers(roles: Roles) -> None:
    found: list[tuple[Scope, Binding]] = []
    classes = _optimizer_classes(roles)
    factories = _optimizer_factories(roles, classes)
    for scope in roles.facts.scopes:
        if scope.name in factories:
            continue  # the optimizer it builds is the one its caller binds
        for bindings in scope.bindings.values():
            for binding in bindings:
                if _builds_optimizer(roles, binding.value, classes, factories):
                    found.append((scope, binding))
    if not found:
        _report_wrapped_optimizers(roles, classes)
        return
    found.sort(key=lambda pair: pair[1].where.order)
    roles.home = found[0][0]
    for scope, binding in found:
        if scope is roles.home:
            if binding.name not in roles.optimizers:
                roles.optimizers.append(binding.name)
        else:
            roles.findings.append(
                Finding(
                    "AM004",
                    binding.where.stmt,
                    f"optimizer `{binding.name}` is built in `{scope.name}`, not in `{roles.home.name}` "
                    "where the other training objects are prepared; pass it to `accelerator.prepare(...)` yourself",
                )
            )


def _report_wrapped_optimizers(roles: Roles, classes: set[str]) -> None:
    """`optimizer = ScheduledOptim(torch.optim.Adam(...), ...)`: the optimizer is never bound, so
    `prepare` has nothing to take; say how to make it visible."""
    for scope in roles.facts.scopes:
        for name, bindings in scope.bindings.items():
            for binding in bindings:
                value = binding.value
                if not isinstance(value, cst.Call):
                    continue
                inner = next((a.value for a in value.args if _builds_optimizer(roles, a.value, classes, set())), None)
                if inner is None:
                    continue
                wrapper = cst.Module([]).code_for_node(value.func)
                roles.findings.append(Finding(
                    "AM004", binding.where.stmt,
                    f"the optimizer is built inside `{wrapper}(...)` and never bound, so it cannot be prepared: "
                    f"bind it first (`base = {cst.Module([]).code_for_node(inner.func)}(...)`, then "  # type: ignore[attr-defined]
                    f"`{name} = {wrapper}(base, ...)`) and run the migration again",
                ))


def _builds_optimizer(
    roles: Roles, value: cst.BaseExpression | None, classes: set[str], factories: set[str]
) -> bool:
    """`torch.optim.AdamW(...)`, a torch.optim.Optimizer subclass of this module (`LARS(...)`), or a
    function/method of this module that returns one (`model.configure_optimizers(...)`)."""
    if _call_name(roles, value, _OPTIMIZER):
        return True
    if not isinstance(value, cst.Call):
        return False
    func = value.func
    if isinstance(func, cst.Name):
        return func.value in classes or func.value in factories
    return isinstance(func, cst.Attribute) and func.attr.value in factories and not (
        isinstance(func.value, cst.Name) and roles.facts.aliases.qualify(func.value) is not None
    )


def _optimizer_classes(roles: Roles) -> set[str]:
    """Classes of this module that subclass a torch optimizer (`class LARS(torch.optim.Optimizer)`)."""
    found: set[str] = set()
    for stmt in roles.facts.module.body:
        if isinstance(stmt, cst.ClassDef) and any(
            (roles.facts.aliases.qualify(base.value) or "").startswith("torch.optim.") for base in stmt.bases
        ):
            found.add(stmt.name.value)
    return found


def _optimizer_factories(roles: Roles, classes: set[str]) -> set[str]:
    """Functions and methods of this module that return an optimizer they build
    (`def configure_optimizers(self): ... return torch.optim.AdamW(groups)`), by name; only those
    called from elsewhere in the module, so the optimizer has a caller to be prepared in."""
    found: set[str] = set()
    for scope in roles.facts.scopes:
        if not scope.is_function:
            continue
        for value in scope.returns:
            built = _builds_optimizer(roles, value, classes, set())
            if not built and isinstance(value, cst.Name):
                built = any(
                    _builds_optimizer(roles, b.value, classes, set()) for b in scope.bindings.get(value.value, [])
                )
            if built:
                found.add(scope.name)
    called = {
        call.callee.removeprefix("self.") for s in roles.facts.scopes for call in s.calls
    } | {
        site.call.func.attr.value
        for s in roles.facts.scopes
        for site in s.method_calls
        if isinstance(site.call.func, cst.Attribute)
    }
    return found & called


def _find_existing_accelerator(roles: Roles) -> None:
    for scope in roles.facts.scopes:
        if scope.accelerators:
            roles.accelerator_scope = scope
            roles.accelerator_exists = True
            return


def _find_models(roles: Roles) -> None:
    home = roles.home
    assert home is not None
    classes = _optimizer_classes(roles)
    factories = _optimizer_factories(roles, classes)
    for name in roles.optimizers:
        for binding in home.bindings[name]:
            if not _builds_optimizer(roles, binding.value, classes, factories):
                continue
            assert isinstance(binding.value, cst.Call)
            owners = (
                _parameter_owners(home, binding.value)
                if _call_name(roles, binding.value, _OPTIMIZER) or _callee(binding.value) in classes
                else _factory_owners(roles, binding.value)
            )
            if not owners and not _call_name(roles, binding.value, _OPTIMIZER):
                # Prepared without its model, the optimizer would step a model that is neither on
                # the device nor synchronised: the file is left as it is.
                roles.refused = True
                roles.findings.append(Finding(
                    "AM004", binding.where.stmt,
                    f"optimizer `{name}` is built by `{_callee(binding.value)}(...)`, and the model whose parameters it "
                    "optimizes was not found (or is another name for a model wrapped by hand, as in `raw_model = "
                    "model.module if ddp else model`), so the file was left as it is: create the Accelerator and pass the "
                    "model and the optimizer to `accelerator.prepare(...)` yourself",
                ))
            for model in owners:
                if model == "self":
                    roles.findings.append(
                        Finding("AM004", binding.where.stmt, "model is an attribute (`self...`); prepare it yourself")
                    )
                elif model.startswith("self.") and not _bound_in_class(roles, home, model):
                    roles.findings.append(
                        Finding("AM004", binding.where.stmt, f"`{model}` is not set in `{home.name}`; prepare it yourself")
                    )
                elif not model.startswith("self.") and not home.binds(model):
                    roles.findings.append(
                        Finding(
                            "AM004",
                            binding.where.stmt,
                            f"model `{model}` is not bound in `{home.name}`; prepare it where it is created",
                        )
                    )
                elif model not in roles.models:
                    roles.models.append(model)


def _callee(call: cst.Call) -> str:
    func = call.func
    if isinstance(func, cst.Attribute):
        return func.attr.value
    return func.value if isinstance(func, cst.Name) else ""


def _factory_owners(roles: Roles, call: cst.Call) -> list[str]:
    """The models an optimizer factory of this module is handed: the receiver of a method
    (`model.configure_optimizers(...)`, whose `self.parameters()` it optimizes), or the arguments
    a function passes on as `X.parameters()` (`create_optimizer(args, model)`)."""
    func = call.func
    if isinstance(func, cst.Attribute):
        if not isinstance(func.value, cst.Name):
            return []
        receiver = func.value.value
        home = roles.home
        assert home is not None
        # `raw_model = model.module if ddp else model`: an alias of a model wrapped by hand, which
        # prepare would wrap a second time; not told apart here.
        if any(_aliases_a_module(b.value) for b in home.bindings.get(receiver, [])):
            return []
        return [receiver]
    assert isinstance(func, cst.Name)
    factory = next(
        (s for s in roles.facts.scopes if s.is_function and not s.is_method and s.name == func.value), None
    )
    if factory is None:
        return []
    finder = _ParametersFinder()
    walk(factory.node, finder)
    owners: list[str] = []
    for owner in finder.owners:
        if owner in factory.params:
            arg = call_argument(call, factory.params.index(owner), owner)
            if isinstance(arg, cst.Name) and arg.value not in owners:
                owners.append(arg.value)
    return owners


def _aliases_a_module(value: cst.BaseExpression | None) -> bool:
    """`other`, `other.module`, `a if c else b`: another name's module, not a model built here."""
    if isinstance(value, cst.IfExp):
        return True
    return isinstance(value, cst.Name) or (isinstance(value, cst.Attribute) and value.attr.value == "module")


def _parameter_owners(home: Scope, call: cst.Call) -> list[str]:
    """Root names of `X.parameters()` inside an optimizer's arguments (one assignment deep)."""
    owners: list[str] = []
    finder = _ParametersFinder()
    for arg in call.args:
        walk(arg.value, finder)
        if isinstance(arg.value, cst.Name):
            for binding in home.bindings.get(arg.value.value, []):
                if binding.value is not None:
                    walk(binding.value, finder)
    for owner in finder.owners:
        if owner not in owners:
            owners.append(owner)
    return owners


class _ParametersFinder(cst.CSTVisitor):
    def __init__(self) -> None:
        self.owners: list[str] = []

    def visit_Call(self, node: cst.Call) -> None:
        func = node.func
        if isinstance(func, cst.Attribute) and func.attr.value in ("parameters", "named_parameters"):
            owner = _self_attribute_name(func.value) or root_name(func.value)
            if owner is not None:
                self.owners.append(owner)


def _find_loaders(roles: Roles) -> None:
    home = roles.home
    assert home is not None
    for scope in roles.facts.scopes:
        for loop in scope.loops:
            if loop.source is None or not roles.is_training_loop(loop):
                continue
            found = roles.origins(scope, loop.source)
            if found is None:
                roles.findings.append(
                    Finding(
                        "AM004",
                        loop.node,
                        f"training loop iterates `{loop.source}`, but not every caller passes a named loader "
                        "from this file; it is not prepared, so every process would see all the data: "
                        "prepare the loader where it is built",
                    )
                )
            for origin_scope, name in found or ():
                if origin_scope is not home:
                    roles.findings.append(
                        Finding(
                            "AM004",
                            loop.node,
                            f"training loop iterates `{loop.source}`, which is not bound in `{home.name}` "
                            "(where the model and optimizer are prepared); prepare it yourself",
                        )
                    )
                elif name in roles.loaders:
                    continue
                elif _shards_by_rank(roles, home, name):
                    roles.loaders.append(name)
                    roles.rank_sampled[name] = loop.node
                elif name in home.params or any(
                    _call_name(roles, b.value, _DATALOADER)
                    or _is_parameter_value(home, b.value)
                    or _built_by_helper(roles, b.value)
                    for b in home.bindings.get(name, [])
                ):
                    roles.loaders.append(name)
                else:
                    roles.findings.append(
                        Finding(
                            "AM004",
                            loop.node,
                            f"training loop iterates `{name}`, which is not a recognised DataLoader; "
                            "it is not prepared, so every process would see all the data: "
                            "build it with torch.utils.data.DataLoader or prepare it yourself",
                        )
                    )


_DISTRIBUTED_SAMPLER = frozenset({"torch.utils.data.DistributedSampler", "torch.utils.data.distributed.DistributedSampler"})


def _shards_by_rank(roles: Roles, home: Scope, loader: str) -> bool:
    """A DataLoader built with a DistributedSampler (inline or through a name) shards itself, also
    when a helper function of this file builds it (`loader = build_loader(dataset)`)."""
    return any(
        any(_call_name(roles, v, _DISTRIBUTED_SAMPLER) for v in sampler_values(roles, scope, call))
        for scope, call in loader_calls(roles, home, loader)
    )


def loader_calls(roles: Roles, home: Scope, loader: str) -> list[tuple[Scope, cst.Call]]:
    """The `DataLoader(...)` calls that build `loader` of home, with the scope each sits in: home's
    own, or those a same-file helper returns (`return DataLoader(...)`, or a name bound to one)."""
    found: list[tuple[Scope, cst.Call]] = []
    for binding in home.bindings.get(loader, []):
        value = binding.value
        if not isinstance(value, cst.Call):
            continue
        if _call_name(roles, value, _DATALOADER):
            found.append((home, value))
        elif _built_by_helper(roles, value):
            assert isinstance(value.func, cst.Name)
            helper = roles.facts.functions[value.func.value]
            for returned in helper.returns:
                values = (
                    [b.value for b in helper.bindings.get(returned.value, [])]
                    if isinstance(returned, cst.Name)
                    else [returned]
                )
                found.extend((helper, v) for v in values if isinstance(v, cst.Call) and _call_name(roles, v, _DATALOADER))
    return found


def sampler_values(roles: Roles, scope: Scope, call: cst.Call) -> list[cst.BaseExpression | None]:
    """What the `sampler=` / `batch_sampler=` argument of a DataLoader call is bound to in `scope`."""
    for arg in call.args:
        if arg.keyword is None or arg.keyword.value not in ("sampler", "batch_sampler"):
            continue
        if isinstance(arg.value, cst.Name):
            return [b.value for b in scope.bindings.get(arg.value.value, [])]
        return [arg.value]
    return []


def _prefer_attributes(roles: Roles) -> None:
    """In a method, an object kept as `self.model = model` is prepared (and known) as `self.model`:
    the methods that train use the attribute, not the constructor's local name."""
    home = roles.home
    assert home is not None
    if not home.is_method:
        return
    for group in (roles.models, roles.loaders):
        group[:] = [kept_as_attribute(home, name) or name for name in group]


def kept_as_attribute(home: Scope, name: str) -> str | None:
    """`self.model` when `home` stores the local `model` as `self.model = model`."""
    if name.startswith("self."):
        return None
    for attribute, bindings in home.bindings.items():
        if not attribute.startswith("self."):
            continue
        for binding in bindings:
            value = binding.value
            if _is_move_call(value):  # `self.model = model.to(device)`
                assert isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute)
                value = value.func.value
            if isinstance(value, cst.Name) and value.value == name:
                return attribute
    return None


def _report_hidden_training_step(roles: Roles) -> None:
    """An optimizer and a model but no `.backward()`: the step is hidden in another module."""
    if any(scope.backwards for scope in roles.facts.scopes) or not roles.models:
        return
    if any(loop.has_backward for scope in roles.facts.scopes for loop in scope.loops):
        return  # already migrated: `accelerator.backward(...)`
    home = roles.home
    assert home is not None
    binding = home.bindings[roles.optimizers[0]][0]
    roles.findings.append(
        Finding(
            "AM003",
            binding.where.stmt,
            "an optimizer is built here but no `.backward()` was found in this file: the training step "
            "is hidden in another module (a trainer, a loss-scaler object such as timm's NativeScaler); "
            "call `accelerator.backward(loss)` there, and check that its loader is prepared",
        )
    )


_LIBRARY_TRAPS = {
    "apex.amp.initialize": (
        "AM006",
        "apex AMP is not converted: remove `amp.initialize`/`amp.scale_loss` and use "
        "`Accelerator(mixed_precision=\"fp16\")` with `accelerator.backward(loss)`",
    ),
    "torch.compile": (
        "AM004",
        "`torch.compile` before `accelerator.prepare(...)` compiles the unwrapped model; compile the "
        "prepared model instead (move this line after the prepare call)",
    ),
}


def _report_library_traps(roles: Roles) -> None:
    for scope in roles.facts.scopes:
        for call in scope.library_calls:
            trap = _LIBRARY_TRAPS.get(call.qualified)
            if trap is None:
                continue
            if call.qualified == "torch.compile" and not _compiles_a_model(roles, scope, call.call):
                continue
            roles.findings.append(Finding(trap[0], call.call, trap[1]))


def _compiles_a_model(roles: Roles, scope: Scope, call: cst.Call) -> bool:
    if not call.args or scope is not roles.home:
        return False
    arg = call.args[0].value
    return isinstance(arg, cst.Name) and arg.value in roles.models


def _report_unsharded_training(roles: Roles) -> None:
    """A training step that no DataLoader feeds (tensors, a `get_batch()` helper) is not sharded."""
    if roles.loaders or any(f.code == "AM004" for f in roles.findings):
        return
    found = [(scope, site) for scope in roles.facts.scopes for site in scope.backwards]
    if not found:
        return
    scope, site = found[0]
    source = _batch_function(roles, scope, site)
    if source is not None:
        message = (
            f"no DataLoader feeds this training step: its batches come from `{source}()`, which every process "
            "would run alike, so all of them would train on the same data. Make "
            f"`{source}` draw this process's share: pass it `accelerator.process_index` and "
            "`accelerator.num_processes` (a per-rank seed for its random offsets, or a strided part of the "
            "data), or build the batches with a torch.utils.data.DataLoader (prepared, it shards them)"
        )
    else:
        message = (
            "no DataLoader feeds this training step, so every process would train on the same data: build "
            "the batches with a torch.utils.data.DataLoader (prepared, it shards them), or select this "
            "process's share with `accelerator.process_index` / `accelerator.num_processes`"
        )
    roles.findings.append(Finding("AM004", site.call, message))


def _batch_function(roles: Roles, scope: Scope, site: Site) -> str | None:
    """The function of this module called in the training loop to produce the batch
    (`X, Y = get_batch("train")`), if there is one."""
    if not site.loops:
        return None
    loop = site.loops[-1]
    functions = {s.name for s in roles.facts.scopes if s.is_function and s.parent is roles.facts.module_scope}
    for call in scope.calls:
        stmt = call.where.stmt
        if call.callee not in functions or loop not in call.loops:
            continue
        if not (isinstance(stmt, cst.SimpleStatementLine) and any(
            isinstance(small, cst.Assign) and small.value is call.call for small in stmt.body
        )):
            continue
        # A source of batches is called with what stays the same across iterations
        # (`get_batch("train")`); `detach(states)` or `fast_adapt(batch, ...)` work on this
        # iteration's values, so they are not where the data comes from.
        read = {n.value for a in call.call.args for n in _names_in(a.value)}
        if not any(_bound_in_loop(b, loop) for n in read for b in scope.bindings.get(n, [])):
            return call.callee
    return None


def _names_in(node: cst.CSTNode) -> list[cst.Name]:
    found: list[cst.Name] = []

    class Finder(cst.CSTVisitor):
        def visit_Name(self, name: cst.Name) -> None:
            found.append(name)

    walk(node, Finder())
    return found


def _bound_in_loop(binding: Binding, loop: Loop) -> bool:
    return binding.where.stmt is loop.node or any(ref.stmt is loop.node for ref in binding.where.path)


def _find_schedulers(roles: Roles) -> None:
    home = roles.home
    assert home is not None
    candidates = [
        name
        for name, bindings in home.bindings.items()
        if any(_call_name(roles, b.value, _SCHEDULER) for b in bindings)
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


def _find_eval_loops(roles: Roles) -> None:
    """Loops without backward over a DataLoader built in home: candidates for gather_for_metrics."""
    home = roles.home
    assert home is not None
    for scope in roles.facts.scopes:
        for loop in scope.loops:
            if loop.source is None or roles.is_training_loop(loop):
                continue
            found = roles.origins(scope, loop.source)
            if not found or len(found) != 1:
                continue
            (origin_scope, name), = found
            if origin_scope is not home or name in roles.loaders:
                continue
            if any(_call_name(roles, b.value, _DATALOADER) for b in home.bindings.get(name, [])):
                roles.eval_loops.append((scope, loop, name))


def _place_accelerator(roles: Roles) -> None:
    if roles.accelerator_exists:
        return
    home = roles.home
    assert home is not None
    module = roles.facts.module_scope
    local = [d for d in home.devices if not d.where.in_loop]
    globals_ = [d for d in module.devices if not d.where.in_loop and not (home is not module and home.binds(d.name))]
    for scope, candidates in ((home, local), (module, globals_)):
        if candidates:
            roles.device_binding = candidates[0]
            roles.accelerator_scope = scope
            # `DEVICE = "cpu"` ... `if __name__ == "__main__": DEVICE = torch.device("cuda")`: every
            # later choice of the same name must become `accelerator.device` too.
            roles.later_device_bindings = [d for d in candidates[1:] if d.name == candidates[0].name]
            return
    roles.accelerator_scope = home
    roles.create_before = _first_code_statement(roles.facts, home)


def _first_code_statement(facts: Facts, scope: Scope) -> cst.BaseStatement | None:
    """The first statement of `scope` that is not its docstring (module: not an import)."""
    if scope is facts.module_scope:
        return facts.import_block_end.stmt if facts.import_block_end else None
    node = scope.node
    assert isinstance(node, cst.FunctionDef)
    if not isinstance(node.body, cst.IndentedBlock):
        return None
    for index, stmt in enumerate(node.body.body):
        if not (index == 0 and is_docstring(stmt)):
            return stmt
    return None


def _place_prepare(roles: Roles) -> None:
    home = roles.home
    assert home is not None
    names = [n for n in (*roles.models, *roles.optimizers, *roles.loaders, *roles.schedulers) if n not in home.prepared]
    if not names or home.prepared:
        return
    first_use = _first_training_use(roles)
    refs = [r for n in names for r in _setup_bindings(home, n, first_use)]
    # Evaluation loaders and epoch-level schedulers built before training starts belong to the same
    # setup block: prepare after them too. Ones built later (a final test loader) are left out.
    late: set[str] = set()
    for name in (*{loader for _, _, loader in roles.eval_loops}, *roles.epoch_schedulers):
        bound = [b.where for b in home.bindings.get(name, []) if not b.is_loop_target]
        if bound and all(_top(r).order < first_use for r in bound):
            refs.extend(bound)
        else:
            late.add(name)
    roles.eval_loops = [entry for entry in roles.eval_loops if entry[2] not in late]
    creation = roles.device_binding.where if roles.device_binding is not None and roles.accelerator_scope is home else None
    if not refs and creation is not None:
        refs.append(creation)
    if not refs:
        roles.prepare_after = None  # everything is a parameter: prepare right after the accelerator
        return
    inside_loop = [r for r in refs if r.in_loop]
    if inside_loop:
        roles.findings.append(
            Finding(
                "AM004",
                inside_loop[0].stmt,
                "a training object is created inside a loop; `accelerator.prepare(...)` must run once, "
                "so it was not inserted: prepare the objects yourself after they are built",
            )
        )
        roles.models.clear()
        roles.optimizers.clear()
        roles.loaders.clear()
        roles.schedulers.clear()
        return
    point = _common_insertion_point(refs)
    if creation is not None and creation.order > point.order:
        # The Accelerator is created after the objects are bound: prepare after it.
        point = _common_insertion_point([*refs, creation])
    roles.prepare_after = point


def _setup_bindings(home: Scope, name: str, first_use: int) -> list[StmtRef]:
    """Where `name` is bound for training: the bindings before the first training use when there are
    some. A model rebuilt after training (`model = Net()` + `load_state_dict` to run inference, as
    tutorials do) is not what trains: preparing after the rebuild would leave training unprepared."""
    refs = [b.where for b in home.bindings.get(name, []) if not b.is_loop_target]
    before = [r for r in refs if _top(r).order < first_use]
    return before or refs


def _top(ref: StmtRef) -> StmtRef:
    return ref.path[0] if ref.path else ref


def _first_training_use(roles: Roles) -> int:
    """Document order of home's first statement that trains (a training loop or a call into one)."""
    home = roles.home
    assert home is not None
    orders = [_top(loop.where).order for loop in home.loops if roles.is_training_loop(loop)]
    orders += [_top(site.where).order for site in home.calls if site.callee in roles._training_functions]
    return min(orders, default=1 << 60)


def _common_insertion_point(refs: list[StmtRef]) -> StmtRef:
    """The statement after which every ref has been executed, in the deepest shared block."""
    chains = [(*r.path, r) for r in refs]
    depth = 0
    while all(len(c) > depth + 1 for c in chains) and len({id(c[depth]) for c in chains}) == 1:
        depth += 1
    candidates = [c[min(depth, len(c) - 1)] for c in chains]
    if len({id(c.block) for c in candidates}) > 1 and depth > 0:
        candidates = [c[depth - 1] for c in chains]
    return max(candidates, key=lambda r: r.order)


# -- small helpers ------------------------------------------------------------------------------


def _call_name(roles: Roles, value: cst.BaseExpression | None, pattern) -> bool:  # type: ignore[no-untyped-def]
    if not isinstance(value, cst.Call):
        return False
    qualified = roles.facts.aliases.qualify(value.func)
    if qualified is None:
        return False
    if isinstance(pattern, frozenset):
        return qualified in pattern
    return bool(pattern.match(qualified))


def _self_attribute_name(expr: cst.BaseExpression) -> str | None:
    if isinstance(expr, cst.Attribute) and isinstance(expr.value, cst.Name) and expr.value.value == "self":
        return f"self.{expr.attr.value}"
    return None


def _bound_in_class(roles: Roles, home: Scope, name: str) -> bool:
    return home.binds(name)


def _built_by_helper(roles: Roles, value: cst.BaseExpression | None) -> bool:
    """`loader = make_loader(...)` where that function of this file returns a DataLoader."""
    if not (isinstance(value, cst.Call) and isinstance(value.func, cst.Name)):
        return False
    helper = roles.facts.functions.get(value.func.value)
    if helper is None or not helper.returns:
        return False
    for returned in helper.returns:
        if _call_name(roles, returned, _DATALOADER):
            continue
        if isinstance(returned, cst.Name) and any(
            _call_name(roles, b.value, _DATALOADER) for b in helper.bindings.get(returned.value, [])
        ):
            continue
        return False
    return True


def _is_parameter_value(home: Scope, value: cst.BaseExpression | None) -> bool:
    """`self.loader = loader` where `loader` is a parameter of home (a constructor argument)."""
    return isinstance(value, cst.Name) and value.value in home.params


def _is_move_call(value: cst.BaseExpression | None) -> bool:
    return (
        isinstance(value, cst.Call)
        and isinstance(value.func, cst.Attribute)
        and value.func.attr.value in ("to", "cuda")
    )


def _is_self_move(binding: Binding) -> bool:
    """`model = model.to(device)` or `model = DDP(model, ...)` rebinds a name to (a wrapper of)
    itself: it adds no origin of its own."""
    value = binding.value
    if not isinstance(value, cst.Call):
        return False
    if isinstance(value.func, cst.Attribute) and value.func.attr.value in ("to", "cuda"):
        return root_name(value.func.value) == binding.name
    name = value.func.attr.value if isinstance(value.func, cst.Attribute) else getattr(value.func, "value", "")
    return (
        name in ("DDP", "DistributedDataParallel", "DataParallel", "FSDP", "FullyShardedDataParallel")
        and bool(value.args)
        and root_name(value.args[0].value) == binding.name
    )


def _is_accelerator_device(expr: cst.BaseExpression) -> bool:
    return (
        isinstance(expr, cst.Attribute)
        and expr.attr.value == "device"
        and isinstance(expr.value, cst.Name)
        and expr.value.value == "accelerator"
    )


def _binds_device(scope: Scope, name: str) -> bool:
    if any(d.name == name for d in scope.devices):
        return True
    return any(b.value is not None and _is_accelerator_device(b.value) for b in scope.bindings.get(name, []))


def _enclosing_function_or_module(scope: Scope) -> Scope | None:
    parent = scope.parent
    while parent is not None and isinstance(parent.node, cst.ClassDef):
        parent = parent.parent
    return parent


def _nested_in(scope: Scope, target: Scope) -> bool:
    current: Scope | None = scope
    while current is not None:
        if current is target:
            return True
        current = current.parent
    return False


# -- mp.spawn launchers ----------------------------------------------------------------------


def _spawn_refusal(node: cst.CSTNode, why: str) -> Finding:
    return Finding(
        "AM007",
        node,
        f"the script starts its own processes with `mp.spawn`; it was left as it is: {why}. Make the worker "
        "the entry point (take the rank from `LOCAL_RANK`, let `accel launch --nproc-per-node N` start the "
        "processes) and run accel-migrate again",
    )


def _spawn_launch(facts: Facts) -> SpawnLaunch | Finding | None:
    """The file's `mp.spawn` launcher when AM007 can convert it, a refusal saying why not, or None."""
    sites = [(scope, c) for scope in facts.scopes for c in scope.library_calls if c.qualified in _SPAWNERS]
    if not sites:
        return None
    if len(sites) > 1:
        return _spawn_refusal(sites[1][1].call, "it spawns processes more than once")
    scope, site = sites[0]
    call = site.call
    stmt = site.where.stmt
    if site.where.in_loop or not _is_expression_statement(stmt, call):
        return _spawn_refusal(call, "the spawn call is not a statement of its own outside loops (its result is used)")
    given: dict[str, cst.BaseExpression] = {}
    for index, arg in enumerate(call.args):
        if arg.star:
            return _spawn_refusal(call, "its arguments are unpacked with `*`")
        if arg.keyword is not None:
            given[arg.keyword.value] = arg.value
        elif index < len(_SPAWN_PARAMETERS):
            given[_SPAWN_PARAMETERS[index]] = arg.value
    join = given.get("join")
    if join is not None and not (isinstance(join, cst.Name) and join.value == "True"):
        return _spawn_refusal(call, "it does not join its processes (`join=False`)")
    fn = given.get("fn")
    worker = facts.functions.get(fn.value) if isinstance(fn, cst.Name) else None
    if worker is None or worker.parent is not facts.module_scope:
        return _spawn_refusal(call, "the spawned function is not a function defined at the top of this file")
    args_value = given.get("args")
    if args_value is None:
        args: list[cst.BaseExpression] = []
    elif isinstance(args_value, cst.Tuple) and not any(isinstance(e, cst.StarredElement) for e in args_value.elements):
        args = [e.value for e in args_value.elements]
    else:
        return _spawn_refusal(call, "its `args` is not a tuple written out in the call")
    if not worker.simple_signature or len(worker.params) != 1 + len(args):
        return _spawn_refusal(
            call, f"`{worker.name}` does not take exactly the spawn index and the {len(args)} `args` as plain parameters"
        )
    for other in facts.scopes:
        for direct in other.calls:
            if direct.callee == worker.name:
                return _spawn_refusal(
                    direct.call, f"`{worker.name}` is also called directly here, a second launch path next to the spawn"
                )
    nprocs = given.get("nprocs") or cst.Integer("1")
    code = facts.module.code_for_node
    world_size_args = {i for i, a in enumerate(args) if code(a) == code(nprocs)}
    init = _spawn_worker_init(facts, worker, world_size_args, nprocs)
    if isinstance(init, Finding):
        return init
    nprocs_binding: cst.BaseStatement | None = None
    if isinstance(nprocs, cst.Name):
        bindings = scope.bindings.get(nprocs.value, [])
        reads = _own_name_count(scope.node, nprocs.value) - len(bindings)
        in_call = _own_name_count(call, nprocs.value)
        if reads != in_call:
            return _spawn_refusal(call, f"`{nprocs.value}` (the number of processes) is also used for other things")
        others = sum(_own_name_count(a, nprocs.value) for i, a in enumerate(args) if i not in world_size_args)
        if len(bindings) == 1 and not others and _is_process_count(facts, bindings[0]):
            nprocs_binding = bindings[0].where.stmt
    worker_node = worker.node
    assert isinstance(worker_node, cst.FunctionDef) and isinstance(worker_node.body, cst.IndentedBlock)
    master_env = _master_env_statements(facts, (worker_node.body.body, site.where.block.body))
    if isinstance(master_env, Finding):
        return master_env
    os_names = facts.aliases.local_names_for("os")
    environ_names = facts.aliases.local_names_for("os.environ")
    environ = f"{os_names[0]}.environ" if os_names else (environ_names[0] if environ_names else None)
    return SpawnLaunch(call, stmt, worker, args, world_size_args, nprocs, nprocs_binding, master_env, environ)


def _spawn_worker_init(
    facts: Facts, worker: Scope, world_size_args: set[int], nprocs: cst.BaseExpression
) -> Finding | None:
    """The one `init_process_group`: a statement of the worker's body whose rank is the spawn index."""
    inits = [(s, c) for s in facts.scopes for c in s.library_calls if c.qualified == _INIT_PROCESS_GROUP]
    node = worker.node
    assert isinstance(node, cst.FunctionDef)
    if not inits:
        return _spawn_refusal(node, f"`{worker.name}` initialises no process group: its processes are not a "
                              "data-parallel group an Accelerator could replace")
    if len(inits) > 1:
        return _spawn_refusal(inits[1][1].call, "the process group is initialised in more than one place")
    scope, init = inits[0]
    if scope is not worker or init.where.block is not node.body or not _is_expression_statement(init.where.stmt, init.call):
        return _spawn_refusal(
            init.call,
            f"the process group is initialised here, not as a statement of the worker `{worker.name}` itself: "
            f"move this setup into `{worker.name}`",
        )
    expected = {"rank": {worker.params[0]}, "world_size": {worker.params[1 + i] for i in world_size_args}}
    for index, arg in enumerate(init.call.args):
        keyword = arg.keyword.value if arg.keyword is not None else ("backend" if index == 0 else None)
        matches = isinstance(arg.value, cst.Name) and arg.value.value in expected.get(keyword or "", set())
        if keyword == "world_size" and facts.module.code_for_node(arg.value) == facts.module.code_for_node(nprocs):
            matches = True  # `world_size=2` next to `nprocs=2`
        if keyword in expected and not matches:
            what = "the spawn index" if keyword == "rank" else "the number of spawned processes"
            return _spawn_refusal(
                init.call, f"`{keyword}={facts.module.code_for_node(arg.value)}` is not {what}; the Accelerator's "
                f"{keyword} comes from the launcher"
            )
        if keyword is None:
            return _spawn_refusal(init.call, "`init_process_group` takes positional arguments after the backend")
    return None


def _master_env_statements(
    facts: Facts, blocks: tuple[Sequence[cst.BaseStatement], ...]
) -> list[cst.BaseStatement] | Finding:
    """`os.environ["MASTER_ADDR"] = ...` statements of `blocks` (the worker's body, the block that
    spawns); refused when set any other way."""
    found: list[cst.BaseStatement] = []
    assigned: set[int] = set()
    for block in blocks:
        for stmt in block:
            small = stmt.body[0] if isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1 else None
            if not (isinstance(small, cst.Assign) and len(small.targets) == 1):
                continue
            target = small.targets[0].target
            if not (isinstance(target, cst.Subscript) and facts.aliases.qualify(target.value) == "os.environ"):
                continue
            element = target.slice[0].slice
            key = element.value if isinstance(element, cst.Index) else None
            if isinstance(key, cst.SimpleString) and key.evaluated_value in _MASTER_VARIABLES:
                found.append(stmt)
                assigned.add(id(key))

    class Strings(cst.CSTVisitor):
        def visit_SimpleString(self, node: cst.SimpleString) -> None:
            if id(node) not in assigned and node.evaluated_value in _MASTER_VARIABLES:
                others.append(node)

    others: list[cst.SimpleString] = []
    walk(facts.module, Strings())
    if others:
        return _spawn_refusal(others[0], f"`{others[0].evaluated_value}` is used here other than assigned in the "
                              "worker or the spawning code (torchrun sets it)")
    return found


def _check_spawn_worker(roles: Roles, spawn: SpawnLaunch) -> None:
    """The Accelerator must be created in the worker: it replaces the worker's process group."""
    if roles.accelerator_exists:
        why = "the script already creates an Accelerator, which each spawned worker would build on its own"
    elif roles.home is None:
        why = f"no optimizer is built in this file, so the worker `{spawn.worker.name}` has nothing to prepare"
    elif roles.accelerator_scope is not spawn.worker:
        where = roles.accelerator_scope.name if roles.accelerator_scope is not None else "another scope"
        why = (
            f"the Accelerator would be created in `{where}` (where the optimizer is built), not in the worker "
            f"`{spawn.worker.name}` that initialises the process group: build the optimizer in `{spawn.worker.name}`"
        )
    else:
        roles.spawn = spawn
        return
    roles.refused = True
    roles.findings = [_spawn_refusal(spawn.call, why)]


def _is_process_count(facts: Facts, binding: Binding) -> bool:
    """`world_size = 2` or `= torch.cuda.device_count()`: a statement that can go without side effects."""
    value, stmt = binding.value, binding.where.stmt
    if not (isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1 and value is not None):
        return False
    if isinstance(value, cst.Integer):
        return True
    return isinstance(value, cst.Call) and not value.args and facts.aliases.qualify(value.func) in _DEVICE_COUNTS


def _is_expression_statement(stmt: cst.BaseStatement, call: cst.Call) -> bool:
    return (
        isinstance(stmt, cst.SimpleStatementLine)
        and len(stmt.body) == 1
        and isinstance(stmt.body[0], cst.Expr)
        and stmt.body[0].value is call
    )


def _own_name_count(node: cst.CSTNode, name: str) -> int:
    """How often `name` occurs as a name in `node`, outside the functions and classes inside it."""
    count = 0

    class Visitor(cst.CSTVisitor):
        def visit_Name(self, found: cst.Name) -> None:
            nonlocal count
            count += found.value == name

        def visit_Attribute(self, attribute: cst.Attribute) -> bool:
            walk(attribute.value, self)
            return False

        def visit_FunctionDef(self, inner: cst.FunctionDef) -> bool:
            if inner is node:
                return True
            for decorator in inner.decorators:
                walk(decorator, self)
            return False

        def visit_ClassDef(self, inner: cst.ClassDef) -> bool:
            return False

    walk(node, Visitor())
    return count
