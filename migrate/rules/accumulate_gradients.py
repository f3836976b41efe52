"""Wrap the body of each training loop in `with accelerator.accumulate(model):`.

What it does:
    The loop over a prepared training loader whose body calls `backward` gets its whole body
    wrapped in `with accelerator.accumulate(<models>):`, naming the prepared models the body uses.
    Hand-written accumulation (`loss = loss / N`, `if (step + 1) % N == 0: optimizer.step()`)
    becomes `Accelerator(gradient_accumulation_steps=N)` with `if accelerator.sync_gradients:`
    (the division goes, since the Accelerator divides: `loss = loss / N` as a whole line, and so
    does a compensating `* N` in a log line such as `loss.item() * N`), and a
    `model.require_backward_grad_sync = <that condition>` toggle goes with it. N is a literal or a
    module constant; one bound right below the module's device choice by lines that only bind names
    (`device = ...`, `accum = 4`) moves the Accelerator below it (AM001).
    `with model.no_sync():` on a prepared model becomes `with accelerator.no_sync(model):`.

Why:
    Inside `accumulate`, the Accelerator skips the gradient all-reduce and the optimizer step on
    micro-steps that only accumulate, and syncs at every N-th step and at the end of the loader.
    With `gradient_accumulation_steps=1` (the default) every step syncs, so the numbers are the
    same as without it; the block is what lets accumulation be switched on from the command line.

Example:
    for x, y in loader:                        for x, y in loader:
        loss = criterion(model(x), y)              with accelerator.accumulate(model):
        accelerator.backward(loss)                     loss = criterion(model(x), y)
        optimizer.step()                               accelerator.backward(loss)
                                                       optimizer.step()

    with model.no_sync():                   ->  with accelerator.no_sync(model):
        accelerator.backward(loss)                  accelerator.backward(loss)

    (on one process the prepared model is the bare module, which has no `no_sync`)

Leaves alone:
    A loop whose body names no prepared model, neither itself nor in the methods of its class it
    calls (`loss = self.step(x, y)` running `self.model`): reported, never wrapped in a bare `accumulate()`,
    which would still all-reduce every micro-step. A model handed to a trainer class through
    `**kwargs` (`self.model = kwargs['model']`, `SimCLR(model=model, ...)`) is traced to what the
    callers pass, and named.
    A step that updates the model's parameters by hand, with no optimizer (`migrate/roles/hand_update.py`):
    inside `accumulate` the update would run on every micro-step from gradients not yet averaged,
    so the loop is not wrapped (every backward all-reduces, hand-written accumulation included).
    Loops already inside `accelerator.accumulate(...)`, loops over data that is not a prepared
    loader, and loops whose backward sits in a helper function (the helper's own loop, if any, is
    wrapped instead). A `require_backward_grad_sync` toggle on another condition is kept and
    reported (it works while the prepared model is a DDP). Accumulation over a module constant
    bound below the device choice after code that runs something or uses the device is reported
    (move the constant above the device choice) and kept.

Fix safety:
    Safe: with one accumulation step the block changes nothing numerically.
"""

from __future__ import annotations

import libcst as cst

from migrate.analysis import Loop, Scope
from migrate.edits import EditPlan
from migrate.names import instance_attribute
from migrate.roles import Roles
from migrate.roles.placement import creation_can_follow
from migrate.rules.base import accelerator_call, names_read, prepared_loaders, references_in
from migrate.walk import walk

CODE = "AM005"
NAME = "accumulate-gradients"


def apply(roles: Roles, plan: EditPlan) -> None:
    if roles.home is None or not roles.models:
        return
    _convert_no_sync(roles, plan)
    if roles.hand_updated:
        return  # no optimizer step for `accumulate` to skip: the hand update runs every step, synchronised
    done: set[int] = set()
    for scope in roles.facts.scopes:
        if not roles.can_reach(scope):
            continue
        for site in scope.backwards:
            loop = _training_loop(roles, scope, site.loops, prepared_loaders(roles, plan))
            if loop is None or id(loop) in done or loop.accumulating:
                continue
            done.add(id(loop))
            prepared = [*roles.models, *roles.model_aliases, *(a for a, n in roles.step_aliases.items() if n in roles.models)]  # an alias is what prepare binds the model to
            models = _step_models(roles, scope, loop, prepared)
            if not models:
                # `accumulate()` without the model would skip the optimizer step on micro-steps but
                # still all-reduce every one of them: no half-measure, the loop is left as it is.
                plan.report(CODE, loop.node, (
                    "loop body not wrapped in `accelerator.accumulate(...)`: the prepared model this step "
                    "trains is named neither in the loop nor in the methods of its class it calls (it is reached "
                    "through another function, or through a value the migration does not trace to the prepared one), and `accumulate` needs it to skip the gradient "
                    "all-reduce on micro-steps. It trains as before with one accumulation step; for "
                    "`--gradient-accumulation-steps`, wrap the loop body in `with accelerator.accumulate(model):` "
                    "with the prepared model"))
                continue
            plan.wrap_loop_body[loop.node] = accelerator_call(
                "accumulate", [cst.Arg(cst.parse_expression(m)) for m in models]
            )
            plan.use_accelerator(scope)
            plan.change(CODE, loop.node, f"loop body wrapped in `accelerator.accumulate({', '.join(models)})`")
            gate = _manual_accumulation(roles, plan, scope, loop)
            _sync_toggles(roles, plan, scope, loop, gate)


def _step_models(roles: Roles, scope: Scope, loop: Loop, prepared: list[str]) -> list[str]:
    """The prepared models the loop body uses: named in it, or (`self.model`) in the methods of
    its class that it calls (`loss = self.step(x, y)`), in first-seen order."""
    def is_model(where: Scope, name: str) -> bool:
        # in the function that prepares, the name prepare rebinds (also a parameter of it)
        return roles.all_in(where, name, prepared) or (where is roles.home and name in prepared)

    models: list[str] = []
    called = {site.callee for site in scope.calls if loop in site.loops}
    for name in references_in(loop.node.body):
        found = [name] if is_model(scope, name) else []
        bound = scope.bindings.get(name, [])
        if not found and name in called and len(bound) == 1 and type(bound[0].value) is cst.Call:
            # `runner = Wrapper(model)` called in the loop (`runner(x)`): the prepared model inside it
            found = [a.value.value for a in bound[0].value.args
                     if type(a.value) is cst.Name and is_model(scope, a.value.value)]
        models += [n for n in found if n not in models]
    methods = {m.name: m for m in roles.methods_of(scope) or []}
    seen: set[str] = set()
    pending = [site.callee for site in scope.calls if loop in site.loops]
    while pending:
        callee = pending.pop(0)
        method = methods.get(callee.removeprefix("self.")) if callee.startswith("self.") else None
        if method is None or callee in seen:
            continue
        seen.add(callee)
        for name in references_in(method.node.body):
            if name.startswith("self.") and name not in models and is_model(method, name):
                models.append(name)
        pending.extend(site.callee for site in method.calls)
    return models


def _training_loop(roles: Roles, scope: Scope, loops: tuple[Loop, ...], loaders: list[str]) -> Loop | None:
    """The innermost enclosing loop that iterates a prepared training loader."""
    for loop in reversed(loops):
        if loop.source is not None and roles.all_in(scope, loop.source, loaders):
            return loop
    return None


def wrapped_or_accumulating(plan: EditPlan, loops: tuple[Loop, ...]) -> bool:
    """True when a statement inside `loops` runs under `accelerator.accumulate` after the rewrite."""
    return any(loop.node in plan.wrap_loop_body or loop.accumulating for loop in loops)


# -- hand-written accumulation --------------------------------------------------------------


def _convert_no_sync(roles: Roles, plan: EditPlan) -> None:
    """`model.no_sync()` -> `accelerator.no_sync(model)`: on one process the prepared model is the
    bare module, which has no `no_sync`."""
    for scope in roles.facts.scopes:
        for site in scope.method_calls:
            assert type(site.receiver) is cst.Name and type(site.call.func) is cst.Attribute
            if site.call.func.attr.value != "no_sync" or site.call.args:
                continue
            name = site.receiver.value
            if not roles.all_in(scope, name, roles.models) or not roles.can_reach(scope):
                continue
            plan.calls[site.call] = lambda updated, name=name: accelerator_call("no_sync", [cst.Arg(cst.Name(name))])
            plan.use_accelerator(scope)
            plan.change(CODE, site.call, f"`{name}.no_sync()` -> `accelerator.no_sync({name})`")
    _convert_attribute_no_sync(roles, plan)


def _convert_attribute_no_sync(roles: Roles, plan: EditPlan) -> None:
    """`self.ddp_model.no_sync()` in a trainer class, on the prepared model or the alias prepare
    binds (`roles.model_aliases`): `self.accelerator.no_sync(self.ddp_model)`."""
    prepared = {*roles.model_aliases, *(m for m in roles.models if m.startswith("self."))}
    if not prepared:
        return
    for scope in roles.facts.scopes:
        if not scope.is_method or not roles.can_reach(scope):
            continue
        for call in _calls_in(scope.node):
            func = call.func
            if not (type(func) is cst.Attribute and func.attr.value == "no_sync" and not call.args):
                continue
            name = instance_attribute(func.value)
            if name not in prepared or call in plan.calls:
                continue
            plan.calls[call] = lambda updated, value=func.value: accelerator_call("no_sync", [cst.Arg(value)])
            plan.use_accelerator(scope)
            plan.change(CODE, call, f"`{name}.no_sync()` -> `accelerator.no_sync({name})`")


def _calls_in(node: cst.CSTNode) -> list[cst.Call]:
    finder = _Calls()
    walk(node, finder)
    return finder.found


class _Calls(cst.CSTVisitor):
    def __init__(self) -> None:
        self.found: list[cst.Call] = []

    def visit_Call(self, call: cst.Call) -> None:
        self.found.append(call)


_SYNC_FLAG = "require_backward_grad_sync"


def _sync_toggles(roles: Roles, plan: EditPlan, scope: Scope, loop: Loop, gate: cst.If | None) -> None:
    """`model.require_backward_grad_sync = <cond>` in a training loop: DDP's own switch.

    When the hand-written accumulation became `gradient_accumulation_steps` and the toggle tests
    the same condition as the step, `accelerator.accumulate` already skips those all-reduces: the
    toggle goes. Any other toggle is kept (it still works while the prepared model is a DDP, and
    is a plain attribute of the bare module on one process) and reported."""
    finder = _SyncToggles()
    walk(loop.node.body, finder)
    for stmt, assign in finder.toggles:
        if gate is not None and len(stmt.body) == 1 and _code(assign.value) == _code(gate.test):
            plan.replace_stmt[stmt] = []
            plan.change(CODE, stmt, f"`{_SYNC_FLAG}` toggle removed: `accelerator.accumulate` skips the same all-reduces")
            continue
        plan.report(CODE, stmt, (
            f"`{_code(assign.targets[0].target)} = ...` switches DDP's gradient all-reduce by hand; it was kept "
            "(it works while the prepared model is a DDP): prefer `with accelerator.no_sync(model):` around the "
            "backward passes that must not synchronise, or `Accelerator(gradient_accumulation_steps=N)`"
        ))


class _SyncToggles(cst.CSTVisitor):
    """`<anything>.require_backward_grad_sync = ...` lines, with their assignment."""

    def __init__(self) -> None:
        self.toggles: list[tuple[cst.SimpleStatementLine, cst.Assign]] = []

    def visit_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> None:
        for small in node.body:
            if type(small) is cst.Assign and any(
                type(t.target) is cst.Attribute and t.target.attr.value == _SYNC_FLAG for t in small.targets
            ):
                self.toggles.append((node, small))


def _manual_accumulation(roles: Roles, plan: EditPlan, scope: Scope, loop: Loop) -> cst.If | None:
    """`loss = loss / N` + `if (step + 1) % N == 0: optimizer.step()` -> gradient_accumulation_steps=N.

    The division goes (the Accelerator divides), so does a compensating `* N` in a log line; the
    step condition becomes `if accelerator.sync_gradients:` (true every N-th micro-step and at the
    end of the loader), which keeps whatever else the block does on optimizer steps only.
    Returns the (original) step condition when it was converted.
    """
    body = loop.node.body
    if type(body) is not cst.IndentedBlock:
        return None
    gates = [(stmt, n) for stmt in body.body if type(stmt) is cst.If for n in [_step_gate(stmt)] if n is not None]
    if not gates:
        return None
    steps = {_code(n) for _, n in gates}
    if len(steps) != 1:
        return None
    count = gates[0][1]
    first = _steps_on_first_micro_batch(loop, gates[0][0])
    if first is not None:
        plan.report(CODE, gates[0][0], (
            f"hand-written gradient accumulation over `{_code(count)}` steps the optimizer on micro-batches 0, "
            f"N, 2N, ... (`{first} % {_code(count)} == 0`, `{first}` counted from 0 by `enumerate`): the first step "
            "after one micro-batch, which `accelerator.sync_gradients` (true on the last micro-batch of each group "
            "of N) does not reproduce; it was kept as it is, and trains the same (gradients all-reduced on every "
            f"micro-batch). To convert it, write `({first} + 1) % {_code(count)} == 0` (or `enumerate(..., 1)`) if "
            "that is the grouping meant, and run again"))
        return None
    if not _available_at_creation(roles, plan, count):
        late = _bound_below_device_choice(roles, count)
        if late is not None:
            plan.report(CODE, gates[0][0], (
                f"hand-written gradient accumulation over `{_code(count)}`, a module constant bound below the device "
                "choice that the Accelerator replaces, after statements that run code or use the device, so "
                f"`Accelerator(gradient_accumulation_steps={_code(count)})` cannot read it where it is created; it "
                f"was kept as it is: move `{_code(late.body[0])}` above the device choice and run again"))
            return None
        plan.report(
            CODE,
            gates[0][0],
            f"hand-written gradient accumulation over `{_code(count)}`, which is neither a literal nor a "
            "module constant bound before the Accelerator is created (e.g. it depends on the number of "
            "processes); it was kept as it is: set `Accelerator(gradient_accumulation_steps=...)` yourself "
            "and drop the manual logic",
        )
        return None
    for gate, _ in gates:
        plan.if_tests[gate] = cst.Attribute(cst.Name("accelerator"), cst.Name("sync_gradients"))
        plan.sync_ifs.add(gate)
        plan.change(CODE, gate, "optimizer-step condition -> `if accelerator.sync_gradients:`")
    divided = _remove_divisions(plan, loop.node.body, count)
    if divided:
        _remove_compensation(plan, scope, divided, count)
    plan.accelerator_kwargs["gradient_accumulation_steps"] = _code(count)
    return gates[0][0]


def _steps_on_first_micro_batch(loop: Loop, gate: cst.If) -> str | None:
    """The index name when the gate tests `i % N == 0` on the loop's own `enumerate` index counted
    from 0 (`for i, batch in enumerate(loader):`): true on micro-batch 0, N, 2N, ..., one earlier
    than `(i + 1) % N == 0` and than `sync_gradients`."""
    test = gate.test
    if type(test) is cst.BooleanOperation:
        test = test.left
    if type(test) is not cst.Comparison or type(test.left) is not cst.BinaryOperation:
        return None
    index = test.left.left
    if type(index) is not cst.Name:
        return None
    node = loop.node
    target, it = node.target, node.iter
    if not (type(target) is cst.Tuple and target.elements and type(target.elements[0].value) is cst.Name
            and target.elements[0].value.value == index.value):
        return None
    if not (type(it) is cst.Call and type(it.func) is cst.Name and it.func.value == "enumerate"):
        return None
    start = [a for a in it.args[1:] if a.keyword is None or a.keyword.value == "start"]
    if start and not (type(start[0].value) is cst.Integer and start[0].value.value == "0"):
        return None
    return index.value


def _step_gate(stmt: cst.If) -> cst.BaseExpression | None:
    """N for `if (i + 1) % N == 0:` / `if i % N == 0:` (optionally `... or last`) guarding a step."""
    if stmt.orelse is not None:
        return None
    test = stmt.test
    if type(test) is cst.BooleanOperation and type(test.operator) is cst.Or:
        test = test.left
    if not (type(test) is cst.Comparison and len(test.comparisons) == 1):
        return None
    target = test.comparisons[0]
    if not (type(target.operator) is cst.Equal and type(target.comparator) is cst.Integer):
        return None
    if target.comparator.value != "0":
        return None
    left = test.left
    if type(left) is cst.BinaryOperation and type(left.operator) is cst.Modulo:
        if type(left.right) in (cst.Name, cst.Integer) and "step(" in _code(stmt.body):  # the body's code last: the cost
            return left.right
    return None


def _available_at_creation(roles: Roles, plan: EditPlan, count: cst.BaseExpression) -> bool:
    """N is a literal, or a module constant bound before a module-level Accelerator is created, or
    bound below the module's device choice by statements that only bind names (`accum = 4` right
    after `device = ...`): the Accelerator is then created below it (`plan.create_after`, AM001)."""
    if type(count) is cst.Integer:
        return True
    assert type(count) is cst.Name
    module = roles.facts.module_scope
    bindings = module.bindings.get(count.value, [])
    if len(bindings) != 1:
        return False
    if roles.accelerator_scope is not module:
        return True
    if plan.create_at_order:
        created = plan.create_at_order
    elif roles.device_binding is not None:
        created = roles.device_binding.where.order
    else:
        created = 0  # created before the module's first statement after the imports
    if bindings[0].where.order < created:
        return True
    # `device = ...` (or the imports) then `accum = 4`: the Accelerator goes below the constant instead (AM001)
    if not plan.create_at_order and creation_can_follow(roles, bindings[0].where.stmt):
        plan.create_after = bindings[0].where.stmt
        return True
    return False


def _bound_below_device_choice(roles: Roles, count: cst.BaseExpression) -> cst.SimpleStatementLine | None:
    """The one module-level statement binding N (`accum = 4`), at the top level of the module
    below the device choice a module-level Accelerator replaces; None otherwise."""
    module = roles.facts.module_scope
    binding = roles.device_binding
    if type(count) is not cst.Name or roles.accelerator_scope is not module or binding is None:
        return None
    bindings = module.bindings.get(count.value, [])
    if len(bindings) != 1 or bindings[0].where.path or bindings[0].where.order < binding.where.order:
        return None
    stmt = bindings[0].where.stmt
    return stmt if type(stmt) is cst.SimpleStatementLine and len(stmt.body) == 1 else None


def _remove_divisions(plan: EditPlan, body: cst.BaseSuite, count: cst.BaseExpression) -> set[str]:
    """`x = <expr> / N` -> `x = <expr>`; `x /= N` removed. Returns the divided names."""
    divided: set[str] = set()
    wanted = _code(count)

    class Finder(cst.CSTVisitor):
        def visit_Assign(self, node: cst.Assign) -> None:
            value = node.value
            if (
                type(value) is cst.BinaryOperation
                and type(value.operator) is cst.Divide
                and _code(value.right) == wanted
                and len(node.targets) == 1
                and type(node.targets[0].target) is cst.Name
            ):
                divided.add(node.targets[0].target.value)
                plan.keep_left_operand.add(value)

        def visit_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> None:
            if len(node.body) != 1:
                return
            small = node.body[0]
            if (
                type(small) is cst.Assign
                and len(small.targets) == 1
                and type(small.targets[0].target) is cst.Name
                and type(small.value) is cst.BinaryOperation
                and type(small.value.operator) is cst.Divide
                and _code(small.value.right) == wanted
                and type(small.value.left) is cst.Name
                and small.value.left.value == small.targets[0].target.value
            ):
                # `loss = loss / N` would be left as `loss = loss`: the line goes
                divided.add(small.value.left.value)
                plan.replace_stmt[node] = []
                return
            if (
                type(small) is cst.AugAssign
                and type(small.operator) is cst.DivideAssign
                and _code(small.value) == wanted
                and type(small.target) is cst.Name
            ):
                divided.add(small.target.value)
                plan.replace_stmt[node] = []

    walk(body, Finder())
    return divided


def _remove_compensation(plan: EditPlan, scope: Scope, divided: set[str], count: cst.BaseExpression) -> None:
    """`loss.item() * N` (undoing the division for a log line) -> `loss.item()`."""
    wanted = _code(count)

    class Finder(cst.CSTVisitor):
        def visit_BinaryOperation(self, node: cst.BinaryOperation) -> None:
            if type(node.operator) is cst.Multiply and _code(node.right) == wanted:
                if set(names_read(node.left)) & divided:
                    plan.keep_left_operand.add(node)

    walk(scope.node, Finder())


def _code(node: cst.CSTNode) -> str:
    return cst.Module(body=[]).code_for_node(node)
