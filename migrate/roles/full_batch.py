"""A full-batch training step whose loss selects its samples with a fixed index or mask.

A graph network computes its output for every node at once (`output = model(features, adj)`) and
takes the loss over the training nodes only: `criterion(output[idx_train], labels[idx_train])`
(an index tensor) or `F.cross_entropy(out[data.train_mask], data.y[data.train_mask])` (a boolean
mask). No DataLoader feeds such a step, so every process would train on the same nodes. The
samples of that step are the selected positions: when the selection is fixed across steps (bound
once before the training loop, or handed to the step function by a caller that binds it outside
its loop), each process can take its own share of them, as a prepared DataLoader shares a dataset
(`Accelerator.share_selection`, AM004 writes the edit).

Found here (`full_batch_selection`): the statements that feed the loss of the backward (its
binding, and the bindings of the names it reads, in the step's scope), the subscripts there whose
index is one plain name or attribute chain (`output[idx_train]`), all with the same selection,
at least one of them over a computed output, and every operation pairing a selected tensor (or
one computed per selected sample) with another pairs it with one selected alike
(`criterion(out[m], y[m])`, never `criterion(out[m], y_train)` or `(per_node * w).mean()`); a
reduction of them pairs with anything (`F.cross_entropy(out[m], y[m]) + 0.01 * l2`). The selection must not appear in those statements otherwise (`/ mask.sum()` counts the
whole selection), must not be rebound by the step or by the loop that runs it (an attribute chain, `data.train_mask`,
must not be assigned in a loop of the file or in the step function), and must not be
computed from a draw of a global generator the file never seeds (`idx = torch.randperm(n)`: each
process would draw a split of its own). The file must have one training step (a second one would
stay whole) and a model to prepare (the averaged gradients make the shares one step).
"""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst

from migrate.analysis import Binding, Loop, Scope, Site, StmtRef
from migrate.names import dotted_name
from migrate.roles.model import Finding, Roles
from migrate.roles.rng import draw_generator, seeded_generators
from migrate.walk import Visitor, contains, walk


@dataclass(eq=False)
class SharedSelection:
    scope: Scope  # the step's scope, where the loss is taken
    shown: str  # the selection as written (`idx_train`, `data.train_mask`)
    subscripts: list[cst.Subscript]  # the selecting subscripts feeding the loss (`output[idx_train]`)
    before: cst.BaseStatement  # the first statement holding one: the share is bound right before it
    name: str  # the local the share is bound to
    finding: Finding  # the report of a step no DataLoader feeds, when the share cannot be written


def full_batch_selection(roles: Roles, scope: Scope, site: Site, finding: Finding) -> SharedSelection | None:
    """The fixed selection the loss of `site` is taken over (see the module docstring), or None."""
    if scope.is_method or (scope.parent is not None and not scope.is_function):
        return None
    if sum(len(s.backwards) for s in roles.facts.scopes) != 1 or not roles.models:
        return None  # another training step would stay whole, or no prepared model averages the gradients
    feeding = _feeding(scope, site)
    if not feeding:
        return None
    found = _Selections(roles, {name: value for value, _, name in feeding if name})
    for value, _, _ in feeding:
        walk(value, found)
    shown = {dotted_name(s.slice[0].slice.value) for s in found.subscripts}  # type: ignore[attr-defined]
    if len(shown) != 1 or found.unpaired or len(found.subscripts) < 2:
        return None
    selection = next(iter(shown))
    assert selection is not None
    uses = _Uses(selection)
    for value, _, _ in feeding:
        walk(value, uses)
    if uses.count != len(found.subscripts):
        return None  # read otherwise too (`loss.sum() / mask.sum()`): the whole selection is meant there
    computed = {name for value, _, name in feeding if name and _calls(value)}
    if not any(_calls(s.value) or dotted_name(s.value) in computed for s in found.subscripts):
        return None  # selects from inputs, not from a full-batch output
    base = selection.split(".")[0]
    origins: list[tuple[Scope, str]] = []
    if not _fixed(roles, scope, base, site.loops, 0, origins):
        return None
    if "." in selection and _attribute_reassigned(roles, scope, selection, bool(site.loops)):
        return None  # `data.train_mask = ...` in a loop, or in the step function: not fixed
    seeded = seeded_generators(roles.facts)
    if any(_drawn_unseeded(roles, origin, name, None, seeded, 0) for origin, name in origins):
        return None  # each process would draw a selection of its own (torch seeds each at random)
    holding = [(where.order, where.stmt) for value, where, _ in feeding
               if any(contains(value, s) for s in found.subscripts)]
    before = min(holding, key=lambda pair: pair[0])[1]
    return SharedSelection(scope, selection, found.subscripts, before, _fresh(roles, selection), finding)


def _calls(node: cst.CSTNode) -> bool:
    """`node` computes something: it holds a call (`model(x)`, `adj @ model(x)`)."""
    found = False

    class Calls(Visitor):
        def on_visit(self, n: cst.CSTNode) -> bool:
            nonlocal found
            found = found or type(n) is cst.Call
            return not found and not isinstance(n, cst.Lambda)

    walk(node, Calls())
    return found


def _feeding(scope: Scope, site: Site) -> list[tuple[cst.BaseExpression, StmtRef, str | None]]:
    """(value, statement, name it binds) of the loss and of the bindings it reads in the step
    (the training loop of `scope` that runs `site`, or all of `scope` when it is a function run per
    step), latest before the reading statement (at most 8, 3 levels)."""
    found: list[tuple[cst.BaseExpression, StmtRef, str | None]] = []
    receiver = site.receiver
    loop = site.loops[0] if site.loops else None
    if type(receiver) is cst.Name:
        latest = _latest(scope, receiver.value, site.where.order, loop)
        if latest is None or latest.value is None:
            return []
        found.append((latest.value, latest.where, receiver.value))
    else:
        found.append((receiver, site.where, None))
    level = list(found)
    for _ in range(3):
        following = []
        for value, where, _ in level:
            for name in {n.value for n in _names(value)}:
                if any(name == bound for _, _, bound in found):
                    continue
                latest = _latest(scope, name, where.order, loop)
                if latest is not None and latest.value is not None and not latest.is_loop_target:
                    following.append((latest.value, latest.where, name))
                    found.append(following[-1])
        level = following
        if len(found) > 8:
            return []
    return found


def _latest(scope: Scope, name: str, order: int, loop: Loop | None) -> Binding | None:
    before = [b for b in scope.bindings.get(name, []) if b.where.order < order]
    if loop is not None:
        before = [b for b in before if _in_loop(b, loop)]  # the step's own statements
    return max(before, key=lambda b: b.where.order) if before else None


def _names(node: cst.CSTNode) -> list[cst.Name]:
    found: list[cst.Name] = []

    class Names(Visitor):
        def on_visit(self, n: cst.CSTNode) -> bool:
            if isinstance(n, cst.Lambda):
                return False
            if type(n) is cst.Attribute:
                walk(n.value, self)
                return False
            if type(n) is cst.Name:
                found.append(n)
            return True

    walk(node, Names())
    return found


def _selection_of(node: cst.CSTNode) -> str | None:
    """`x[s]` with `s` one plain name or attribute chain: `s` as written."""
    if type(node) is not cst.Subscript or len(node.slice) != 1 or type(node.slice[0].slice) is not cst.Index:
        return None
    return dotted_name(node.slice[0].slice.value)


class _Selections(Visitor):
    """The selecting subscripts, and whether an operation pairs what is computed per selected
    sample with something that is not (`criterion(out[m], y_train)`, `out[m].sub(y)`,
    `(F.cross_entropy(out[m], y[m], reduction="none") * w).mean()`). A reduction over the selected
    samples (`.mean()`, `.sum()`, a torch loss function that reduces) pairs with anything
    (`F.cross_entropy(out[m], y[m]) + 0.01 * l2`)."""

    def __init__(self, roles: Roles, values: dict[str, cst.BaseExpression]) -> None:
        self.roles = roles
        self.values = values  # name -> its value, for the names the feeding statements bind
        self.subscripts: list[cst.Subscript] = []
        self.unpaired = False

    def on_visit(self, node: cst.CSTNode) -> bool:
        if isinstance(node, cst.Lambda):
            return False
        if _selection_of(node) is not None:
            assert isinstance(node, cst.Subscript)
            self.subscripts.append(node)
        elif type(node) is cst.Call:
            self._pair(self._operands(node))
        elif type(node) is cst.BinaryOperation:
            self._pair([node.left, node.right])
        return True

    def _operands(self, call: cst.Call) -> list[cst.BaseExpression]:
        # keywords too (`target=y`, a per-sample `weight=w`); a method's receiver unless it is
        # unrelated (`F.nll_loss`, `model.weight.pow(2)`)
        operands = [a.value for a in call.args if not a.star]
        if type(call.func) is cst.Attribute and self._kind(call.func.value) != "other":
            operands.append(call.func.value)
        return operands

    def _pair(self, operands: list[cst.BaseExpression]) -> None:
        kinds = {self._kind(o) for o in operands}
        if kinds & {"selected", "per-sample"} and "other" in kinds:
            self.unpaired = True

    def _kind(self, operand: cst.BaseExpression, depth: int = 0) -> str:
        """literal, selected (`out[m]`), per-sample (computed from selected samples), reduced (a
        reduction of them) or other."""
        if depth > 12:
            return "per-sample"
        if type(operand) is cst.UnaryOperation:
            operand = operand.expression  # `-100`
        if isinstance(operand, (cst.Integer, cst.Float, cst.SimpleString, cst.Imaginary)) or (
                type(operand) is cst.Name and operand.value in ("True", "False", "None")):
            return "literal"
        if _selection_of(operand) is not None:
            return "selected"
        if type(operand) is cst.Name:
            value = self.values.get(operand.value)
            return self._kind(value, depth + 1) if value is not None else "other"
        if type(operand) is cst.Call:
            inner = {self._kind(o, depth + 1) for o in self._operands(operand)}
            if not inner & {"selected", "per-sample"}:
                return "reduced" if "reduced" in inner else "other"
            return "reduced" if self._reduces(operand) else "per-sample"
        if type(operand) in (cst.BinaryOperation, cst.Comparison, cst.BooleanOperation):
            parts = ([operand.left, operand.right] if type(operand) is not cst.Comparison
                     else [operand.left, *(c.comparator for c in operand.comparisons)])
            inner = {self._kind(o, depth + 1) for o in parts}  # type: ignore[arg-type]
            if inner & {"selected", "per-sample"}:
                return "per-sample"
            return "reduced" if "reduced" in inner else "other"
        return "other"

    def _reduces(self, call: cst.Call) -> bool:
        """`x.mean()`, `x.sum()` (over everything), or a torch loss function left to reduce."""
        func = call.func
        if type(func) is cst.Attribute and func.attr.value in ("mean", "sum") and not call.args:
            return True
        qualified = self.roles.facts.aliases.qualify(func) or ""
        head, _, last = qualified.rpartition(".")
        if head != "torch.nn.functional" or not (last.endswith("loss") or last in _LOSSES):
            return False
        reduction = next((a.value for a in call.args if a.keyword is not None and a.keyword.value == "reduction"), None)
        return reduction is None or (type(reduction) is cst.SimpleString and reduction.evaluated_value in ("mean", "sum"))


_LOSSES = frozenset({"cross_entropy", "binary_cross_entropy", "binary_cross_entropy_with_logits", "kl_div"})


class _Uses(Visitor):
    """How many times `selection` is read (a name, or an attribute chain as written)."""

    def __init__(self, selection: str) -> None:
        self.selection = selection
        self.count = 0

    def on_visit(self, node: cst.CSTNode) -> bool:
        if type(node) is cst.Attribute:
            if dotted_name(node) == self.selection:
                self.count += 1
                return False
            walk(node.value, self)
            return False
        if type(node) is cst.Name and node.value == self.selection:
            self.count += 1
        return True



def _fixed(
    roles: Roles, scope: Scope, name: str, loops: tuple[Loop, ...], depth: int, origins: list[tuple[Scope, str]],
) -> bool:
    """`name`, read by the step in `scope` (inside `loops` of it, or, with none, in a function
    called once per step) keeps its value across the steps: bound outside the training loop, or a
    parameter every caller fills with a name it binds outside the loop running the call."""
    if depth > 3:
        return False
    if name in scope.bindings:
        if not loops:
            return False  # the step function binds it itself, on every call
        origins.append((scope, name))
        return not any(_in_loop(b, loops[0]) for b in scope.bindings[name])
    if name in scope.params:
        if loops:
            return True  # fixed for the whole loop of this call
        if scope.is_method or scope.parent is None or not isinstance(scope.node, cst.FunctionDef):
            return False
        params = scope.node.params
        positional = [p.name.value for p in (*params.posonly_params, *params.params)]
        position = positional.index(name) if name in positional else -1
        if position < 0 and name not in [p.name.value for p in params.kwonly_params]:
            return False  # `*args`, `**kwargs`
        callers = [(caller, call) for caller in roles.facts.scopes for call in caller.calls
                   if call.callee == scope.name and roles.facts.resolve(call.callee, caller) is scope]
        if not callers:
            return False
        for caller, call in callers:
            arg = _argument(call.call, name, position)
            handed = dotted_name(arg) if arg is not None else None
            if handed is None or not _fixed(roles, caller, handed.split(".")[0], call.loops, depth + 1, origins):
                return False
        return True
    module = roles.facts.module_scope
    if scope is module or name not in module.bindings:
        return False
    origins.append((module, name))
    return not any(b.where.in_loop for b in module.bindings[name])


def _drawn_unseeded(roles: Roles, scope: Scope, name: str, before: int | None, seeded: set[str], depth: int) -> bool:
    """`name` of `scope` (its bindings before statement `before`, or all of them) is computed from a
    draw of a global generator the file never seeds (`idx = torch.randperm(n)`, then `idx_train =
    idx[:140]`): each process would draw its own."""
    if depth > 4:
        return False
    for binding in scope.bindings.get(name, []):
        if before is not None and binding.where.order >= before:
            continue
        # an unpacking (`idx_val, idx_train = idx[:500], idx[500:]`) has no value of its own: its statement
        value: cst.CSTNode = binding.value if binding.value is not None else binding.where.stmt
        draws = _Draws(roles)
        walk(value, draws)
        if any(generator not in seeded for generator in draws.generators):
            return True
        for read in {n.value for n in _names(value)} - {name}:
            if _drawn_unseeded(roles, scope, read, binding.where.order, seeded, depth + 1):
                return True
    return False


class _Draws(Visitor):
    def __init__(self, roles: Roles) -> None:
        self.roles = roles
        self.generators: set[str] = set()

    def visit_Call(self, node: cst.Call) -> None:
        generator = draw_generator(self.roles.facts, node)
        if generator is not None:
            self.generators.add(generator)


def _attribute_reassigned(roles: Roles, scope: Scope, selection: str, looped: bool) -> bool:
    """An assignment to the attribute chain `selection` inside any loop of the file, or anywhere in
    the step function `scope` when the step is a function called per step (not `looped`)."""
    found = False

    class Stores(Visitor):
        def __init__(self, inside: bool) -> None:
            self.depth = 1 if inside else 0

        def on_visit(self, node: cst.CSTNode) -> bool:
            nonlocal found
            if type(node) in (cst.For, cst.While):
                self.depth += 1
            targets: list[cst.BaseExpression] = []
            if type(node) is cst.AssignTarget:
                targets = [node.target]
            elif type(node) in (cst.AugAssign, cst.AnnAssign):
                targets = [node.target]  # type: ignore[attr-defined]
            for target in targets:
                elements = [e.value for e in target.elements] if type(target) in (cst.Tuple, cst.List) else [target]  # type: ignore[attr-defined]
                if self.depth and any(dotted_name(e) == selection for e in elements):
                    found = True
            return not found

        def on_leave(self, node: cst.CSTNode) -> None:
            if type(node) in (cst.For, cst.While):
                self.depth -= 1

    walk(roles.facts.module, Stores(False))
    if not looped and not found:
        walk(scope.node, Stores(True))
    return found


def _in_loop(binding: Binding, loop: Loop) -> bool:
    return binding.where.stmt is loop.node or any(ref.stmt is loop.node for ref in binding.where.path)


def _argument(call: cst.Call, name: str, position: int) -> cst.BaseExpression | None:
    for arg in call.args:
        if arg.keyword is not None and arg.keyword.value == name:
            return arg.value
    positional = [a for a in call.args if a.keyword is None]
    if position < 0 or any(a.star for a in positional[: position + 1]) or position >= len(positional):
        return None
    return positional[position].value


def _fresh(roles: Roles, selection: str) -> str:
    taken = {n for s in roles.facts.scopes for n in (*s.bindings, *s.params)}
    stem = f"{selection.split('.')[-1]}_share"
    name, n = stem, 2
    while name in taken:
        name, n = f"{stem}{n}", n + 1
    return name
