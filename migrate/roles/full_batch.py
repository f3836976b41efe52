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

Found here too (`full_batch_rows`): a step over every row of fixed tensors, no selection at all
(`loss = criterion(model(inputs), targets)` in the loop, or in a closure the optimizer steps).
Its feeding statements hold one call of the model, with one tensor argument (a graph's features
and edges are not independent rows), and a loss that is a mean over the output's rows: a torch
criterion left to its mean reduction (no `weight=`), or `.mean()` / `torch.mean` of values
computed row by row (elementwise operations, `out[:, :-1]`) from the output and plain names, the
targets, read where they pair with the output (a criterion's operand, `out - y`; `w * err` keeps
the report), plus terms without the output (`+ 1e-3 * penalty`: alike on every process). The input
and the targets are read only there (an autoencoder's `criterion(model(x), x)` twice), bound once
before the loop (never in it) to a tensor (a torch call, a tensor method's result, a subscript of
one), or parameters of the training function every caller fills with such a name. The values the
step computes from the output are read nowhere else but for their shape (an accuracy over the
output against every label would meet a share of the rows). A closure must return the loss it
backpropagates and be stepped by its own scope; the share is bound before the outermost loop that
runs the step, or before the statement stepping a closure outside any loop. A model class holding
an RNN/LSTM/GRU or attention module without `batch_first=True` keeps the report: its first axis is
time, not the rows.
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

    def _operands(self, call: cst.Call, depth: int = 0) -> list[cst.BaseExpression]:
        # keywords too (`target=y`, a per-sample `weight=w`); a method's receiver unless it is
        # unrelated (`F.nll_loss`, `model.weight.pow(2)`). `depth` is the caller's, so that a name
        # rebound from itself (`returns = (returns - returns.mean()) / returns.std()`) ends.
        operands = [a.value for a in call.args if not a.star]
        if type(call.func) is cst.Attribute and self._kind(call.func.value, depth) != "other":
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
            inner = {self._kind(o, depth + 1) for o in self._operands(operand, depth + 1)}
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
        callers = _handed_arguments(roles, scope, name)
        if not callers:
            return False
        for caller, call, arg in callers:
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


# -- a full-batch step over every row of fixed tensors ---------------------------------------------

_ROWWISE_METHODS = frozenset({
    "squeeze", "unsqueeze", "view", "reshape", "flatten", "float", "double", "half", "contiguous", "abs",
    "pow", "exp", "log", "sigmoid", "tanh", "relu", "sqrt", "square", "clamp", "neg", "to", "type",
})
_ROWWISE_FUNCTIONS = frozenset({"abs", "pow", "exp", "log", "sigmoid", "tanh", "sqrt", "square", "squeeze", "flatten"})
# modules that take (sequence, batch, ...) inputs unless built with `batch_first=True`
_SEQUENCE_FIRST = frozenset({"RNN", "LSTM", "GRU", "Transformer", "TransformerEncoder", "TransformerDecoder",
                             "TransformerEncoderLayer", "TransformerDecoderLayer", "MultiheadAttention"})
_NOT_TENSORS = ("torch.load", "torch.nn.", "torch.optim.", "torch.utils.", "torch.device", "torch.cuda.",
                "torch.distributed.", "torch.manual_seed")


@dataclass(eq=False)
class SharedRows:
    scope: Scope  # the step's scope, where the loss is taken
    data: list[str]  # the fixed tensors the step's loss reads as data (`input`, `target`)
    reads: list[cst.Name]  # their reads in the statements that feed the loss: each gets `[rows]`
    before: cst.BaseStatement  # the training loop: the share is bound right before it
    name: str  # the local the share is bound to (`input_rows`)
    closure_return: cst.Return | None  # the returned loss of a closure stepped by the optimizer
    loss: str  # the loss the closure returns
    finding: Finding  # the report of a step no DataLoader feeds, when the share cannot be written


def full_batch_rows(roles: Roles, scope: Scope, site: Site, finding: Finding, closure: str | None) -> SharedRows | None:
    """A step that trains on every row of fixed tensors at once, with no DataLoader (`loss =
    criterion(model(inputs), targets)` in a loop, or in a closure stepped by LBFGS), whose loss is a
    mean over those rows: the tensors, the reads to select, and where to bind the share; or None."""
    if scope.is_method or sum(len(s.backwards) for s in roles.facts.scopes) != 1 or not roles.models:
        return None
    if closure is not None:
        parent = scope.parent
        if parent is None or site.loops:
            return None
        holder = scope.node
        loops = [loop for loop in parent.loops if contains(loop.node, holder)]
        stepped = [s for s in parent.method_calls if type(s.call.func) is cst.Attribute
                   and s.call.func.attr.value == "step" and any(
            type(a.value) is cst.Name and a.value.value == scope.name for a in s.call.args)]
        if not stepped:
            return None  # the closure is stepped elsewhere (handed to another function)
        if not loops:  # `def closure(): ...` once, stepped in a loop below (or once, LBFGS's max_iter)
            loops = [loop for s in stepped for loop in s.loops]
        returns = _returns(scope)
        if len(returns) != 1 or type(returns[0].value) is not cst.Name or type(site.receiver) is not cst.Name:
            return None
        if returns[0].value.value != site.receiver.value:  # type: ignore[union-attr]
            return None  # the closure returns something else than the loss it backpropagates
        outer = parent
        first = min(stepped, key=lambda s: s.where.order).where
    else:
        if not site.loops or scope.parent is not None and not scope.is_function:
            return None
        loops = list(site.loops)
        returns = [None]  # type: ignore[list-item]
        outer = scope
        first = site.where
    loop = min(loops, key=lambda lp: lp.where.order) if loops else None  # the outermost loop running the step
    where = loop.where if loop is not None else first
    feeding = _feeding(scope, site)
    if not feeding:
        return None
    bound = {name for _, _, name in feeding if name}
    values = {name: value for value, _, name in feeding if name}
    calls = _ModelCalls(roles, scope)
    for value, _, _ in feeding:
        walk(value, calls)
    if len(calls.found) != 1:
        return None  # no model call, or several (inputs of different first axes, a second model)
    call = calls.found[0]
    inputs = [a.value for a in call.args]
    if not inputs or any(a.star or a.keyword is not None for a in call.args) or any(type(v) is not cst.Name for v in inputs):
        return None
    if len(inputs) != 1:
        return None  # a graph's features and edges: its rows are not independent samples
    root = feeding[0][0]
    kind = _MeanLoss(roles, values, call, bound)
    if not kind.mean(root) or kind.refused:
        return None
    read = [inputs[0].value, *kind.targets]  # type: ignore[attr-defined]
    data = list(dict.fromkeys(read))  # an autoencoder's `criterion(model(x), x)` reads `x` twice
    if any(name in bound for name in data):
        return None
    reads = [inputs[0], *kind.target_reads]
    for name in data:
        uses = _Uses(name)
        for value, _, _ in feeding:
            walk(value, uses)
        if uses.count != read.count(name):
            return None  # read otherwise too (`torch.autograd.grad(u, x)`): all the rows are meant there
        if not _fixed_tensor(roles, outer, name, loop, where.order):
            return None
    if _sequence_first(roles, call):
        return None
    loss = site.receiver.value if type(site.receiver) is cst.Name else None
    if _read_elsewhere(scope, {name for name in bound if name != loss}, [where.stmt for _, where, _ in feeding]):
        return None  # `acc = (out.argmax(1) == y)...`: a share of the rows would meet all of them there
    taken = {n for s in roles.facts.scopes for n in (*s.bindings, *s.params)}
    rows, n = f"{data[0]}_rows", 2
    while rows in taken:
        rows, n = f"{data[0]}_rows{n}", n + 1
    return SharedRows(scope, data, reads, where.stmt, rows, returns[0], site.receiver.value if closure else "",  # type: ignore[union-attr]
                      finding)


def _read_elsewhere(scope: Scope, names: set[str], feeding: list[cst.BaseStatement]) -> bool:
    """One of `names` (values computed row by row in the step: `out = model(x)`) is read outside
    the statements that feed the loss, other than for its shape (`out.shape[0]`, `out.size(0)`)."""
    found = False
    skipped = set(map(id, feeding))

    class Reads(Visitor):
        def on_visit(self, node: cst.CSTNode) -> bool:
            nonlocal found
            if found or id(node) in skipped:
                return False
            if node is not scope.node and isinstance(node, (cst.FunctionDef, cst.ClassDef, cst.Lambda)):
                return False
            if type(node) is cst.Attribute and type(node.value) is cst.Name and node.value.value in names:
                if node.attr.value not in ("shape", "size", "dtype", "device"):
                    found = True
                return False
            if type(node) is cst.Name and node.value in names:
                found = True
            return True

    walk(scope.node, Reads())
    return found


def _returns(scope: Scope) -> list[cst.Return]:
    found: list[cst.Return] = []

    class Returns(Visitor):
        def on_visit(self, node: cst.CSTNode) -> bool:
            if node is not scope.node and isinstance(node, (cst.FunctionDef, cst.Lambda, cst.ClassDef)):
                return False
            if type(node) is cst.Return:
                found.append(node)
            return True

    walk(scope.node, Returns())
    return found


class _ModelCalls(Visitor):
    """Calls of a prepared model (`seq(input)`, `model.forward(x)`)."""

    def __init__(self, roles: Roles, scope: Scope) -> None:
        self.roles = roles
        self.scope = scope
        self.found: list[cst.Call] = []

    def on_visit(self, node: cst.CSTNode) -> bool:
        if isinstance(node, cst.Lambda):
            return False
        if type(node) is cst.Call:
            func = node.func
            if type(func) is cst.Attribute and func.attr.value == "forward":
                func = func.value
            name = dotted_name(func)
            if name is not None and (name in self.roles.models or self.roles.all_in(self.scope, name, self.roles.models)):
                self.found.append(node)
        return True


class _MeanLoss:
    """Whether a loss is a mean over the rows of the model's output: a torch criterion left to its
    mean reduction over the output (taken through row-wise operations) and data targets, or `.mean()`
    / `torch.mean(...)` of row-wise values. The targets (plain names) are collected."""

    def __init__(self, roles: Roles, values: dict[str, cst.BaseExpression], call: cst.Call, bound: set[str]) -> None:
        self.roles = roles
        self.values = values
        self.call = call
        self.bound = bound
        self.targets: list[str] = []
        self.target_reads: list[cst.Name] = []
        self.refused = False

    def _resolve(self, node: cst.BaseExpression) -> cst.BaseExpression:
        for _ in range(8):
            if type(node) is cst.Name and node.value in self.values:
                node = self.values[node.value]
            else:
                break
        return node

    def mean(self, node: cst.BaseExpression, depth: int = 0) -> bool:
        node = self._resolve(node)
        if type(node) is cst.BinaryOperation and depth < 4 and type(node.operator) in (
                cst.Add, cst.Subtract, cst.Multiply):
            # `criterion(out, y) + lam * penalty`: a term without the output is alike on every process
            left, right = self._has_output(node.left), self._has_output(node.right)
            if type(node.operator) is cst.Multiply and left and right:
                return False
            return (left or right) and all(self.mean(side, depth + 1) for side, has in (
                (node.left, left), (node.right, right)) if has)
        if type(node) is not cst.Call:
            return False
        func = node.func
        if type(func) is cst.Attribute and func.attr.value == "mean" and not node.args:
            return self.rowwise(func.value, False) and self._has_output(func.value)
        qualified = self.roles.facts.aliases.qualify(func) or ""
        if qualified == "torch.mean" and len(node.args) == 1 and node.args[0].keyword is None:
            return self.rowwise(node.args[0].value, False) and self._has_output(node.args[0].value)
        if not self._mean_criterion(node):
            return False
        operands = [a.value for a in node.args if a.keyword is None and not a.star]
        if len(operands) != 2 or any(a.star for a in node.args):
            return False
        return all(self.rowwise(o, True) for o in operands) and self.targets_or_output(operands)

    def targets_or_output(self, operands: list[cst.BaseExpression]) -> bool:
        return self._has_output(operands[0]) or self._has_output(operands[1])

    def _has_output(self, node: cst.BaseExpression) -> bool:
        node = self._resolve(node)
        return contains(node, self.call) or any(
            type(n) is cst.Name and n.value in self.values and self._has_output(n) for n in _names(node))

    def _mean_criterion(self, call: cst.Call) -> bool:
        """`criterion(...)` bound to `nn.MSELoss()` or `F.mse_loss(...)`, reduced by its mean,
        without per-class or per-row weights."""
        if any(a.keyword is not None and a.keyword.value in ("reduction", "weight", "size_average", "reduce")
               for a in call.args):
            return False
        qualified = self.roles.facts.aliases.qualify(call.func) or ""
        head, _, last = qualified.rpartition(".")
        if head == "torch.nn.functional":
            return last.endswith("loss") or last in _LOSSES
        if type(call.func) is not cst.Name:
            return False
        bindings = self.roles.facts.module_scope.bindings.get(call.func.value, [])
        for scope in self.roles.facts.scopes:
            if scope is not self.roles.facts.module_scope and call.func.value in scope.bindings:
                bindings = bindings + scope.bindings[call.func.value]
        if len(bindings) != 1 or type(bindings[0].value) is not cst.Call:
            return False
        built = bindings[0].value
        qualified = self.roles.facts.aliases.qualify(built.func) or ""
        head, _, last = qualified.rpartition(".")
        if head not in ("torch.nn", "torch.nn.modules.loss") or not last.endswith("Loss"):
            return False
        return not any(a.keyword is not None and a.keyword.value in ("reduction", "weight", "size_average", "reduce")
                       or a.keyword is None for a in built.args)

    def rowwise(self, node: cst.BaseExpression, pair: bool) -> bool:
        """`node` holds one value per row of the model's output. A plain name is a target read whole
        only where it is paired with the output (`pair`: an operand of the criterion, or of a
        subtraction, `out - y`); elsewhere (`w * err`, a per-row or per-feature weight) it is not."""
        if type(node) is cst.UnaryOperation:
            return self.rowwise(node.expression, pair)
        if isinstance(node, (cst.Integer, cst.Float)):
            return True
        if type(node) is cst.Name:
            if node.value in self.values:
                return self.rowwise(self.values[node.value], pair)
            if not pair or node.value in self.bound:
                return False
            self.targets.append(node.value)
            self.target_reads.append(node)
            return True
        if node is self.call:
            return True
        if type(node) is cst.BinaryOperation:
            paired = type(node.operator) is cst.Subtract
            if type(node.operator) is cst.Power and not isinstance(node.right, (cst.Integer, cst.Float)):
                return False
            return self.rowwise(node.left, paired) and self.rowwise(node.right, paired)
        if type(node) is cst.Subscript:
            first = node.slice[0].slice if node.slice else None
            whole = type(first) is cst.Slice and first.lower is None and first.upper is None and first.step is None
            return whole and self.rowwise(node.value, pair)  # `out[:, :-1]`: every row
        if type(node) is cst.Call:
            func = node.func
            literal = all(isinstance(a.value, (cst.Integer, cst.Float, cst.UnaryOperation, cst.Attribute))
                          or type(a.value) is cst.Name and a.value.value in ("True", "False", "None")
                          for a in node.args)
            if type(func) is cst.Attribute and func.attr.value in _ROWWISE_METHODS and literal:
                return self.rowwise(func.value, pair)
            qualified = self.roles.facts.aliases.qualify(func) or ""
            head, _, last = qualified.rpartition(".")
            if head == "torch" and last in _ROWWISE_FUNCTIONS and node.args and all(
                    isinstance(a.value, (cst.Integer, cst.Float)) for a in node.args[1:]):
                return self.rowwise(node.args[0].value, pair)
        return False


def _fixed_tensor(roles: Roles, scope: Scope, name: str, loop: Loop | None, before: int) -> bool:
    """`name`, read by a step run in `loop` of `scope` (or by a closure stepped at statement order
    `before`), is one tensor bound before it and never again (in `scope`, or at the module level)."""
    if name in scope.params:
        # `def fit(model, inputs, targets): for ...`: a tensor every caller hands in, never rebound here
        return name not in scope.bindings and _handed_tensor(roles, scope, name)
    owner = scope if name in scope.bindings else roles.facts.module_scope
    bindings = owner.bindings.get(name, [])
    if len(bindings) != 1:
        return False
    binding = bindings[0]
    if binding.value is None or binding.where.in_loop and owner is not scope:
        return False
    if loop is not None and _in_loop(binding, loop):
        return False
    if owner is scope and (binding.where.order > before or binding.where.in_loop and loop is None):
        return False
    return _tensor_value(roles, owner, binding.value, 0)


def _handed_arguments(roles: Roles, scope: Scope, name: str) -> list:
    """Every call of the plain function `scope` in this file, with what it passes for the
    parameter `name` (None when it passes nothing for it); empty when `scope` is no plain function
    or `name` is `*args`/`**kwargs`."""
    if scope.is_method or scope.parent is None or not isinstance(scope.node, cst.FunctionDef):
        return []
    params = scope.node.params
    positional = [p.name.value for p in (*params.posonly_params, *params.params)]
    position = positional.index(name) if name in positional else -1
    if position < 0 and name not in [p.name.value for p in params.kwonly_params]:
        return []
    return [(caller, call, _argument(call.call, name, position)) for caller in roles.facts.scopes
            for call in caller.calls
            if call.callee == scope.name and roles.facts.resolve(call.callee, caller) is scope]


def _handed_tensor(roles: Roles, scope: Scope, name: str) -> bool:
    """The parameter `name` of the plain function `scope` is filled by every caller of this file
    with a name bound once to a tensor."""
    callers = _handed_arguments(roles, scope, name)
    if not callers:
        return False
    for caller, call, arg in callers:
        if type(arg) is not cst.Name:
            return False
        owner = caller if arg.value in caller.bindings else roles.facts.module_scope
        bindings = owner.bindings.get(arg.value, [])
        if len(bindings) != 1 or bindings[0].value is None or not _tensor_value(roles, owner, bindings[0].value, 0):
            return False
    return True


def _tensor_value(roles: Roles, scope: Scope, value: cst.BaseExpression, depth: int) -> bool:
    """`value` is a tensor: a torch function's result, a tensor method's, a subscript of one."""
    if depth > 6:
        return False
    if type(value) is cst.Call:
        qualified = roles.facts.aliases.qualify(value.func) or ""
        if qualified.startswith("torch.") and not qualified.startswith(_NOT_TENSORS):
            return True
        if type(value.func) is cst.Attribute and value.func.attr.value not in (
                "item", "tolist", "numpy", "size", "dim", "numel", "nelement", "split", "chunk", "unbind"):
            return _tensor_value(roles, scope, value.func.value, depth + 1)  # a tensor method's result
        return False
    if type(value) is cst.Subscript:
        return _tensor_value(roles, scope, value.value, depth + 1)
    if type(value) is cst.BinaryOperation:
        return _tensor_value(roles, scope, value.left, depth + 1) or _tensor_value(roles, scope, value.right, depth + 1)
    if type(value) is cst.Comparison:
        return _tensor_value(roles, scope, value.left, depth + 1)  # `(x > 0)`: a mask of the rows
    if type(value) is cst.UnaryOperation:
        return _tensor_value(roles, scope, value.expression, depth + 1)
    if type(value) is cst.Name:
        owner = scope if value.value in scope.bindings else roles.facts.module_scope
        bindings = owner.bindings.get(value.value, [])
        return len(bindings) == 1 and bindings[0].value is not None and _tensor_value(
            roles, owner, bindings[0].value, depth + 1)
    return False


def _sequence_first(roles: Roles, call: cst.Call) -> bool:
    """The model called is built from a class of this file holding a recurrent or attention module
    that takes the sequence first (no `batch_first=True`): the first axis is time, not the rows."""
    found = False

    class Modules(Visitor):
        def visit_Call(self, node: cst.Call) -> None:
            nonlocal found
            qualified = roles.facts.aliases.qualify(node.func) or dotted_name(node.func) or ""
            if qualified.rpartition(".")[2] in _SEQUENCE_FIRST and not any(
                    a.keyword is not None and a.keyword.value == "batch_first"
                    and type(a.value) is cst.Name and a.value.value == "True" for a in node.args):
                found = True

    walk(roles.facts.module, Modules())
    return found
