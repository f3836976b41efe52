"""A training step that updates a module's parameters by hand, with no optimizer.

Tutorials often write the update step themselves: after `loss.backward()`, a loop over a module's
parameters changes each one from its own gradient (`for p in model.parameters(): p.data.add_(-lr *
p.grad)`, `with torch.no_grad(): for p in model.parameters(): p -= lr * p.grad`, `for name, p in
model.named_parameters(): p.data -= lr * p.grad`), then `model.zero_grad()` or `p.grad.zero_()`.
There is no optimizer to prepare, but the module is what trains: found from use, not from names,
it is the module whose `.parameters()` / `.named_parameters()` the loop iterates, whose loop
variable is changed in place (an augmented assignment, an in-place method `x_(...)` of it or of its
`.data`, or `x.data = ...`) from a `.grad` read in the same loop (also a loop over a parameter of a
function every caller hands `M.parameters()`: `def sgd(params, lr): for p in params: p -= lr *
p.grad` called as `sgd(model.parameters(), lr)`), in a function that calls
`backward` or one those call, and which the training step calls (the loss comes from its output).
That module is home's model and is prepared alone (`model = accelerator.prepare(model)`; beside an
optimizer's models, when the same scope binds it, it is prepared with them, and reported otherwise): on N
processes the prepared module (DDP) averages the gradients in `backward`, so the hand update sees
averaged gradients on every process, as a prepared optimizer would, and the copies stay equal.

Left alone (AM003 reports the file as it was): under `--mixed-precision fp16` (the loss is
scaled in `accelerator.backward`, and with no optimizer step nothing unscales the gradients before
the hand update) or a sharding `--strategy` (the update would see the shards); an update of tensors that are no module's
parameters (`w = torch.randn(3, requires_grad=True)`; `w -= lr * w.grad`): there is nothing to
prepare, and nothing would average their gradients; also a file where any update by hand is not
over such a loop (one module trained by hand beside raw tensors), or whose module cannot be told
(bound in more than one place, or not called by the training step); an update whose loop draws
random values (Langevin noise, `p.data.add_(-lr * p.grad + torch.randn_like(p) * s)`): each process
would draw its own after the prepare call and the copies would drift apart.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import libcst as cst

from migrate.analysis import Scope
from migrate.names import instance_attribute
from migrate.roles.calls import RNG_DRAWS
from migrate.roles.model import BACKWARD, Finding, Roles
from migrate.roles.model_use import _training_step_scopes as training_step_scopes, called_in_training_step
from migrate.walk import Visitor, walk

_PARAMETER_METHODS = ("parameters", "named_parameters")


@dataclass(eq=False)
class HandUpdate:
    """One update statement, the module whose parameters it changes (None: not a module's
    parameters), and the scope that binds that module."""

    stmt: cst.BaseSmallStatement
    shown: str
    model: str | None = None
    home: Scope | None = None
    draws: bool = False  # its loop draws random values (`p.data.add_(-lr * p.grad + torch.randn_like(p))`)


def update_statements(node: cst.CSTNode) -> list[tuple[cst.BaseSmallStatement, str]]:
    """Statements that change a tensor in place from a `.grad` they read (`param.data.add_(-0.1 *
    param.grad)`, `p -= lr * p.grad`, `p.data = p.data - lr * p.grad`): with the changed name."""
    finder = _UpdateFinder(nested=True)
    walk(node, finder)
    return finder.found


class _UpdateFinder(Visitor):
    """The update statements of the lines walked (also of nested functions and classes with
    `nested`)."""

    def __init__(self, nested: bool) -> None:
        self.found: list[tuple[cst.BaseSmallStatement, str]] = []
        self.nested = nested

    def visit_SimpleStatementLine(self, line: cst.SimpleStatementLine) -> bool:
        for small in line.body:
            changed = _changed_name(small)
            if changed is not None and reads_grad(small):
                self.found.append((small, changed))
        return False

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        return self.nested

    def visit_ClassDef(self, node: cst.ClassDef) -> bool:
        return self.nested


def _changed_name(small: cst.BaseSmallStatement) -> str | None:
    """`p` for `p -= ...`, `p.data -= ...`, `p.data.add_(...)`, `p.sub_(...)`, `p.data = ...`."""
    target: cst.BaseExpression | None = None
    if type(small) is cst.AugAssign:
        target = small.target
    elif type(small) is cst.Assign and len(small.targets) == 1 and type(small.targets[0].target) is cst.Attribute \
            and small.targets[0].target.attr.value == "data":
        target = small.targets[0].target
    elif type(small) is cst.Expr and type(small.value) is cst.Call and type(small.value.func) is cst.Attribute \
            and small.value.func.attr.value.endswith("_") and not small.value.func.attr.value.startswith("_"):
        target = small.value.func.value
    else:
        return None
    if type(target) is cst.Attribute and target.attr.value == "data":
        target = target.value
    return target.value if type(target) is cst.Name else None


class _GradReader(Visitor):
    def __init__(self) -> None:
        self.found = False

    def visit_Attribute(self, attribute: cst.Attribute) -> bool:
        self.found = self.found or attribute.attr.value == "grad"
        return not self.found


def reads_grad(node: cst.CSTNode) -> bool:
    """`node` reads a `.grad` attribute."""
    reader = _GradReader()
    walk(node, reader)
    return reader.found


class _ParameterLoops(Visitor):
    """`for p in M.parameters():` / `for name, p in M.named_parameters():` (also over `list(...)`
    of those): the loop, the module's name M and the parameter's name p."""

    def __init__(self) -> None:
        self.found: list[tuple[cst.For, str, str]] = []

    def visit_For(self, loop: cst.For) -> None:
        source = loop.iter
        if type(source) is cst.Name and type(loop.target) is cst.Name:
            # `for p in params:` over a parameter of the function: followed to its callers
            self.found.append((loop, f"*{source.value}", loop.target.value))
            return
        if type(source) is cst.Call and type(source.func) is cst.Name and source.func.value == "list" \
                and len(source.args) == 1:
            source = source.args[0].value
        if not (type(source) is cst.Call and type(source.func) is cst.Attribute and not source.args
                and source.func.attr.value in _PARAMETER_METHODS):
            return
        owner = source.func.value
        module = owner.value if type(owner) is cst.Name else instance_attribute(owner)  # `self.model`
        if module is None:
            return
        target = loop.target
        if source.func.attr.value == "named_parameters":
            if not (type(target) is cst.Tuple and len(target.elements) == 2):
                return
            target = target.elements[1].value
        if type(target) is cst.Name:
            self.found.append((loop, module, target.value))

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        return False

    def visit_ClassDef(self, node: cst.ClassDef) -> bool:
        return False


def _parameter_loops(node: cst.CSTNode) -> list[tuple[cst.For, str, str]]:
    """The parameter loops of a scope's own body (see `_ParameterLoops`)."""
    finder = _ParameterLoops()
    walk(node.body if isinstance(node, cst.FunctionDef) else node, finder)
    return finder.found


# An update by hand reads `.grad`: a module whose text has no such read has none (a cheap test
# before the walks; `zero_grad`, `no_grad` and `grad_fn` do not match).
_GRAD_READ = re.compile(r"\.[\s\\]*grad\b")


def find_hand_updates(roles: Roles) -> list[HandUpdate]:
    """Every update by hand in the functions of the training step (see the module docstring), each
    with its module and that module's home when they are found."""
    found: list[HandUpdate] = []
    facts = roles.facts
    if not any(scope.backwards for scope in facts.scopes):
        return found
    if facts.text is not None and _GRAD_READ.search(facts.text) is None:
        return found
    for scope in training_step_scopes(roles):
        node = scope.node.body if isinstance(scope.node, cst.FunctionDef) else scope.node
        covered: dict[int, tuple[str, cst.For]] = {}
        drawing: set[int] = set()  # updates in a loop that draws random values
        for loop, module, parameter in _parameter_loops(scope.node):
            updates = update_statements(loop.body)
            if _draws_random(roles, loop):
                drawing.update(id(small) for small, _ in updates)
                continue  # each process would draw its own values: the copies would drift apart
            for small, changed in updates:
                if changed == parameter:
                    covered[id(small)] = (module, loop)
        own = _UpdateFinder(nested=False)
        walk(node, own)
        for small, _changed in own.found:
            shown = " ".join(cst.Module([]).code_for_node(small).split())
            update = HandUpdate(small, shown, draws=id(small) in drawing)
            if id(small) in covered:
                module, _ = covered[id(small)]
                origins = _handed_modules(roles, scope, module[1:]) if module.startswith("*") \
                    else roles.origins(scope, module) or set()
                if len(origins) == 1:
                    home, name = next(iter(origins))
                    if called_in_training_step(roles, home, name):
                        update.model, update.home = name, home
            found.append(update)
    return found


_RANDOM_METHODS = frozenset({"normal_", "uniform_", "bernoulli_", "random_", "exponential_", "geometric_",
                             "cauchy_", "log_normal_"})


def _draws_random(roles: Roles, node: cst.CSTNode) -> bool:
    """`node` draws from torch's RNG (`torch.randn_like(p)`, `noise.normal_()`): on N processes each
    draws its own values after the prepare call."""
    found: list[cst.Call] = []

    class Finder(cst.CSTVisitor):
        def visit_Call(self, call: cst.Call) -> None:
            if any(a.keyword is not None and a.keyword.value == "generator" for a in call.args):
                return  # a generator of the script's own, seeded alike on every process or not: its business
            if roles.facts.aliases.qualify(call.func) in RNG_DRAWS or (
                    type(call.func) is cst.Attribute and call.func.attr.value in _RANDOM_METHODS):
                found.append(call)

    walk(node, Finder())
    return bool(found)


def _handed_modules(roles: Roles, scope: Scope, parameter: str) -> set[tuple[Scope, str]]:
    """The modules whose `.parameters()` every caller of the function `scope` hands it as
    `parameter` (`sgd(net.parameters(), lr)` for `def sgd(params, lr): for p in params: ...`),
    as origins; empty when a caller hands anything else (`sgd([w, b], lr)`: raw tensors)."""
    if not scope.is_function or parameter not in scope.params or parameter in scope.bindings:
        return set()
    position = scope.params.index(parameter)
    sites = roles.call_sites(scope)
    found: set[tuple[Scope, str]] = set()
    for caller, call in sites:
        given = [a.value for a in call.args if a.keyword is not None and a.keyword.value == parameter]
        if not given and position < len(call.args) and call.args[position].keyword is None \
                and not any(a.star for a in call.args[:position + 1]):
            given = [call.args[position].value]
        if len(given) != 1:
            return set()
        value = given[0]
        if not (type(value) is cst.Call and type(value.func) is cst.Attribute and not value.args
                and value.func.attr.value == "parameters" and type(value.func.value) is cst.Name):
            return set()
        origins = roles.origins(caller, value.func.value.value)
        if not origins:
            return set()
        found |= origins
    return found if sites else set()


def hand_trained_home(roles: Roles) -> tuple[Scope, list[str]] | None:
    """Home and its models when every update by hand in the training step changes the parameters
    of a module the step calls, all bound in one scope; None otherwise (no update by hand, or one
    over raw tensors: AM003 reports it)."""
    updates = find_hand_updates(roles)
    if not updates or any(u.home is None for u in updates):
        return None
    homes = {id(u.home): u.home for u in updates}
    if len(homes) != 1:
        return None
    home = next(iter(homes.values()))
    assert home is not None
    if isinstance(home.node, cst.ClassDef):
        return None  # bound in a class body: no place for `prepare` (AM003 reports the file)
    return home, list(dict.fromkeys(u.model for u in updates if u.model is not None))


def raw_update(roles: Roles) -> HandUpdate | None:
    """The first update by hand in the training step that changes no module's parameters (a tensor
    made with `requires_grad=True`, or one not traced to a module the step calls)."""
    return next((u for u in find_hand_updates(roles) if u.home is None), None)


def refuse_for_options(roles: Roles, mixed_precision: str, strategy: str | None) -> None:
    """`--mixed-precision fp16` or a sharding `--strategy` asked of a file whose model is updated by
    hand: fp16 scales the loss in `accelerator.backward` and only an optimizer's step unscales the
    gradients; a sharded model's parameters are shards. The file is left as it is."""
    if not roles.hand_updated or roles.refused:
        return
    asked, why = [], []
    if mixed_precision == "fp16":
        asked.append("`--mixed-precision fp16`")
        why.append("fp16 scales the loss in `accelerator.backward` and only a prepared optimizer's step unscales the "
                   "gradients (the hand update would apply scaled ones)")
    if strategy not in (None, "ddp"):
        asked.append(f"`--strategy {strategy}`")
        why.append("a sharding strategy splits the parameters the update reads into shards")
    if not asked:
        return
    update = next((u for u in find_hand_updates(roles) if u.home is not None), None)
    assert update is not None
    roles.refused = True
    roles.findings = [Finding(BACKWARD, update.stmt, (
        f"the training step updates the parameters of `{update.model}` by hand (`{update.shown}`), not through "
        f"an optimizer, and {' and '.join(asked)} cannot apply to that update, so the file was left as it is: "
        f"{'; '.join(why)}. Run without that option{' (bf16 needs no scaling)' if mixed_precision == 'fp16' else ''}, "
        "or use an optimizer "
        f"(`optimizer = torch.optim.SGD({update.model}.parameters(), lr=...)`, with `optimizer.zero_grad()` and "
        "`optimizer.step()` in place of the update) and run again"
    ), unconverted=True)]
