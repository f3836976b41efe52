"""Remove `.to(device)` / `.cuda()` moves that the Accelerator now does.

What it does:
    Drops the device move of every prepared model (`model.to(device)`, `model.cuda()`,
    `model = Net().to(device)` -> `model = Net()`) and of the batches that come out of a prepared
    loader (`x, y = x.to(device), y.to(device)` disappears; `batch["x"].to(device)` becomes
    `batch["x"]`), including in helpers of this file that receive them as parameters. A model
    moved to the chosen device by the function that prepares it, after the optimizer is built
    (`self.G.to(self.device)` at the end of `build_model`), has `prepare` placed after that move,
    which is then dropped: never a move of a prepared model after `prepare`. A move that
    also converts (`x.to(device, torch.float16)`) keeps its conversion.

Why:
    `accelerator.prepare` puts the model on the right device for each process, and a prepared
    loader yields batches already on it; a hard-coded move would be redundant at best.

Example:
    model = Net().to(device)           ->  model = Net()
    criterion = nn.CrossEntropyLoss().cuda()  ->  criterion = nn.CrossEntropyLoss().to(accelerator.device)
    for x, y in loader:                    for x, y in loader:
        x, y = x.to(device), y.to(device)      (removed)

    Any other `.cuda(...)` (a criterion, a fresh tensor, `x.cuda(args.gpu, non_blocking=True)`)
    becomes `.to(accelerator.device, ...)`: the current CUDA device, or a GPU index read from the
    command line, is this process's device under the Accelerator, and the script runs without CUDA.

Leaves alone:
    Moves of freshly created tensors (`torch.zeros(3).to(device)`): `device` is now
    `accelerator.device`, so they stay correct. Moves of evaluation batches, of frozen models and
    of anything whose device is not known to be the chosen device. The batch moves of a helper
    that loops over its loader parameter when a call of it runs before the loader is prepared
    (`targets = teacher_logits(teacher, loader, device)` before the student and its optimizer are
    built): that call draws from the unprepared loader, whose batches are still on the CPU. So do
    the batch moves of a loop of the training function over the loader placed above the prepare
    point (a frozen encoder's features collected before the head and its optimizer are built).
    A model's move when the model (or a name bound to it: `model_without_ddp = model`) is read
    between the move and the prepare call for something else than building the optimizer from its
    parameters: passed to a constructor or a function (`ema = ModelEma(model)`,
    `teacher = copy.deepcopy(model)`), or its state read (`model.state_dict()`). Such a copy was
    made on the device and must stay there (an EMA copy left on the CPU would mix CPU and CUDA
    tensors in `ema.update(model)`). The kept move is harmless: `prepare` moves the model again, to
    the same `accelerator.device`. So is a move nested in such a call
    (`ema = ModelEma(model.to(device))`, `copy.deepcopy(model.cuda() if cuda else model)`): the call
    receives the moved model (a kept `.cuda()` becomes `.to(accelerator.device)`); nested in a
    hand-written DDP wrapper, `torch.compile` or `print(...)` it goes. Reads that copy nothing do not keep it: `.parameters()`,
    `.named_parameters()`, the optimizer's own statement (a factory or parameter-group helper
    given the model), `.train()` / `.eval()` / `.apply(init)` / `.load_state_dict(...)`, in-place
    tensor operations (`model.fc.weight.data.normal_(...)`, `nn.init.*_`), `torch.compile`,
    `convert_sync_batchnorm`, a hand-written DDP wrapper and `print(model)` (not a call inside
    the print: `print("start", accuracy(model, x))` runs the model). A forward pass before
    the prepare call keeps the move too (`model(x.to(device))` to write reference outputs, a warm-up
    step): its inputs are on the device, and the bare model must be there as well.

Fix safety:
    Safe: a removed move only ever targeted the device the Accelerator uses.
"""

from __future__ import annotations

import libcst as cst

from migrate.analysis import Move, Scope, StmtRef
from migrate.edits import EditPlan
from migrate.names import root_name
from migrate.roles import Roles, kept_as_attribute
from migrate.rules.base import early_prepare, loader_calls, placed_loaders, reference, references_in, runs_before_prepare
from migrate.walk import Visitor, children, walk

CODE = "AM002"
NAME = "remove-device-moves"


def apply(roles: Roles, plan: EditPlan) -> None:
    if roles.home is None or not (roles.models or roles.loaders or plan.eval_loaders):
        return
    for scope in roles.facts.scopes:
        for move in scope.moves:
            if move.device_arg is not None and not roles.is_device(scope, move.device_arg):
                continue
            what = _moved_object(roles, scope, move, placed_loaders(roles, plan), plan.eval_loaders,
                                 early_prepare(roles, plan))
            if what is None:
                _retarget_cuda(roles, plan, scope, move)
                continue
            kept = [i for i, arg in enumerate(move.call.args) if arg in move.kept_args]
            plan.calls[move.call] = lambda call, kept=kept: _strip(call, kept)
            plan.drop_if_trivial.add(move.where.stmt)
            plan.change(CODE, move.call, f"removed device move of {what}")


def _moved_object(
    roles: Roles, scope: Scope, move: Move, plan_loaders: list[str], plan_eval_loaders: list[str],
    early: tuple[StmtRef, list[str]] | None = None,
) -> str | None:
    """'model `m`' / 'batch `x`' when the move is one the Accelerator now makes, else None."""
    receiver = move.receiver
    ref = reference(receiver)
    if ref is not None and scope is roles.home and scope.is_method:
        # `self.model = model.to(device)` in a constructor that prepares `self.model`.
        ref = kept_as_attribute(scope, ref) or ref
    if ref is not None and roles.all_in(scope, ref, roles.models):
        # After `prepare` the model is on its device; a later move in the same function undoes
        # something the script did in between (`model.cpu()` to save a checkpoint): keep it.
        prepared_at = roles.prepare_after.order if roles.prepare_after is not None else 0
        if scope is roles.home and move.where.order > prepared_at:
            return None
        if _handed_on(roles, move) or _used_before_prepare(roles, scope, move, {ref}, early):
            return None
        return f"model `{ref}`"
    if isinstance(receiver, cst.Call) and scope is roles.home:
        target = _assigned_name(roles, move)
        if target is not None and target in roles.models:
            if _used_before_prepare(roles, scope, move, {target}, early):
                return None
            return f"model `{target}`"
    root = root_name(receiver)
    if root is None:
        return None
    loaders = [*plan_loaders, *plan_eval_loaders]
    if scope not in roles.method_loaders:  # prepared on entry to the training methods only
        loaders = [n for n in loaders if n not in roles.training_only_loaders]
    for loop in move.loops:
        if root in loop.batch_names and loop.source is not None and roles.all_in(scope, loop.source, loaders):
            if loop.source in scope.params and loader_calls(roles, scope, loop.source, early)[0]:
                return None  # `outputs = precompute(teacher, loader)` before the loader is prepared
            if scope is roles.home and runs_before_prepare(roles, scope, loop, early):
                return None  # a loop of home over the loader before it is prepared: CPU batches
            return f"batch `{root}`"
    if root in scope.params and _batch_parameter(roles, scope, root, loaders):
        return f"batch `{root}`"
    return None


def _retarget_cuda(roles: Roles, plan: EditPlan, scope: Scope, move: Move) -> None:
    """`criterion.cuda()`, `torch.zeros(3).cuda()`, `x.cuda(args.gpu, non_blocking=True)` that stay:
    `.to(accelerator.device, ...)`, which is this process's GPU and also runs without CUDA."""
    func = move.call.func
    if not (isinstance(func, cst.Attribute) and func.attr.value == "cuda") or not roles.can_reach(scope):
        return
    if scope is roles.accelerator_scope and not _after_creation(roles, move):
        return
    device = cst.Attribute(cst.Name("accelerator"), cst.Name("device"))
    plan.calls[move.call] = lambda call, device=device: _to_device(call, device)
    plan.use_accelerator(scope)
    plan.change(CODE, move.call, "`.cuda()` -> `.to(accelerator.device)`: this process's device")


def _after_creation(roles: Roles, move: Move) -> bool:
    """The move runs after the Accelerator is created in its own scope (at the device choice, or at
    the top of the scope when there is none)."""
    if roles.device_binding is None:
        return roles.create_before is not None
    return move.where.order > roles.device_binding.where.order


def _to_device(call: cst.Call, device: cst.BaseExpression) -> cst.Call:
    assert isinstance(call.func, cst.Attribute)
    kept = [a.with_changes(comma=cst.MaybeSentinel.DEFAULT) for a in call.args if a.keyword is not None]
    return call.with_changes(func=call.func.with_changes(attr=cst.Name("to")), args=[cst.Arg(device), *kept])


def _batch_parameter(roles: Roles, scope: Scope, name: str, loaders: list[str]) -> bool:
    """A parameter every caller fills with batch data of a prepared loader (`self.train_step(x, y)`
    inside `for x, y in self.loader`)."""
    index = scope.params.index(name) - (1 if scope.is_method else 0)
    callers = roles.call_sites(scope)
    if not callers or index < 0:
        return False
    for caller, call in callers:
        positional = [a for a in call.args if a.keyword is None and not a.star]
        keyword = {a.keyword.value: a.value for a in call.args if a.keyword is not None}
        arg = positional[index].value if index < len(positional) else keyword.get(name)
        if not isinstance(arg, cst.Name):
            return False
        loops = [site.loops for site in caller.calls if site.call is call]
        if not loops or not any(
            arg.value in loop.batch_names and loop.source is not None and roles.all_in(caller, loop.source, loaders)
            for loop in loops[0]
        ):
            return False
    return True


_WRAPPERS = frozenset({
    "torch.nn.parallel.DistributedDataParallel", "torch.nn.DataParallel", "torch.nn.parallel.DataParallel",
    # the defining modules, as `from torch.nn.parallel.distributed import DistributedDataParallel` names them
    "torch.nn.parallel.distributed.DistributedDataParallel", "torch.nn.parallel.data_parallel.DataParallel",
})


def _assigned_name(roles: Roles, move: Move) -> str | None:
    """`model = Net().to(device)`, or `model = DDP(Net().to(device), ...)` (AM007 unwraps it): `model`."""
    stmt = move.where.stmt
    if not isinstance(stmt, cst.SimpleStatementLine):
        return None
    for small in stmt.body:
        if not (isinstance(small, cst.Assign) and len(small.targets) == 1):
            continue
        value = small.value
        if (
            isinstance(value, cst.Call)
            and value.args
            and value.args[0].value is move.call
            and roles.facts.aliases.qualify(value.func) in _WRAPPERS
        ):
            value = move.call
        if value is move.call:
            return reference(small.targets[0].target)
    return None


def _handed_on(roles: Roles, move: Move) -> bool:
    """The moved model is an argument of another call in the same statement (`ema =
    ModelEma(model.to(device))`, `copy.deepcopy(model.cuda())`): that call copies it (or may), on
    the device, before the prepare call, as `ModelEma(model)` on the next line would: the move is
    kept. Not a hand-written DDP wrapper (the prepare call wraps instead), `torch.compile` or
    `convert_sync_batchnorm` (the same parameters), nor `print(...)`-like calls."""
    outer = _outer_call(move.where.stmt, move.call)
    if outer is None:
        return False
    func = outer.func
    if isinstance(func, cst.Name) and func.value in _INERT_FUNCTIONS:
        return False
    return roles.facts.aliases.qualify(func) not in (_WRAPPERS | _SAME_PARAMETERS)


def _outer_call(stmt: cst.CSTNode, call: cst.Call) -> cst.Call | None:
    """The call `call` is passed to as an argument (`f(call)`, `f(x, key=call)`, `f(call if c
    else x)`), else None."""
    found: list[cst.Call] = []

    def passes(value: cst.BaseExpression) -> bool:
        if isinstance(value, cst.IfExp):
            return passes(value.body) or passes(value.orelse)
        return value is call

    class Finder(cst.CSTVisitor):
        def visit_Call(self, node: cst.Call) -> bool:
            if not found and any(passes(arg.value) for arg in node.args):
                found.append(node)
            return not found

    walk(stmt, Finder())
    return found[0] if found else None


# Methods of the model (or of one of its submodules) that hand its parameters to an optimizer, or
# change it in place (its mode, its initial or loaded weights): they copy nothing off its device.
_IN_PLACE_METHODS = frozenset({
    "parameters", "named_parameters", "train", "eval", "apply", "load_state_dict", "requires_grad_", "zero_grad",
})
# Functions that only show or test the model.
_INERT_FUNCTIONS = frozenset({"print", "str", "repr", "isinstance", "type", "hasattr", "id"})
# Functions that return the model itself, or a module around its own parameters (no copy).
_SAME_PARAMETERS = frozenset({"torch.compile", "torch.nn.SyncBatchNorm.convert_sync_batchnorm"})


def _used_before_prepare(
    roles: Roles, scope: Scope, move: Move, names: set[str], early: tuple[StmtRef, list[str]] | None = None,
) -> cst.CSTNode | None:
    """The first statement after `move` (and before the prepare call, in the function that
    prepares) that reads the moved model, or a name bound to it, other than to build the
    optimizer from its parameters: `ema = ModelEma(model)`, `copy.deepcopy(model)`,
    `model.state_dict()`. A copy made there must be made of the moved model, as before; the
    move is kept (prepare moves the model again, to the same device)."""
    names = set(names)
    statement = move.where.stmt
    for small in statement.body if isinstance(statement, cst.SimpleStatementLine) else ():
        if isinstance(small, cst.Assign):
            names.update(n for t in small.targets if (n := reference(t.target)) is not None)
    stop = roles.prepare_after.stmt if scope is roles.home and roles.prepare_after is not None else None
    stop_before = None  # the model is prepared before this statement (a load of its state)
    if scope is roles.home and early is not None and names & set(early[1]):
        stop, stop_before = None, early[0].stmt
    optimizer_statements: set[cst.CSTNode] = set()
    feeding: set[str] = set()  # names the optimizer is built from (`param_groups` in `AdamW(param_groups)`)
    for name in roles.optimizers:
        for binding in scope.bindings.get(name, []):
            optimizer_statements.add(binding.where.stmt)
            if binding.value is not None:
                feeding.update(n for n in references_in(binding.value) if n not in names)
    reads = _ReadsAfterMove(roles, scope, statement, stop, names, optimizer_statements, feeding, stop_before)
    walk(scope.node, reads)
    return reads.found[0] if reads.found else None


_NESTED = (cst.FunctionDef, cst.ClassDef, cst.Lambda)
_STATEMENT_TYPES: dict[type, bool] = {}
_EXPRESSION_TYPES: dict[type, bool] = {}


def _is_statement(node_type: type) -> bool:
    """A small or compound statement (cached per type: isinstance against libcst's abstract classes is slow)."""
    found = _STATEMENT_TYPES.get(node_type)
    if found is None:
        found = _STATEMENT_TYPES[node_type] = issubclass(node_type, (cst.BaseSmallStatement, cst.BaseCompoundStatement))
    return found


def _is_expression(node_type: type) -> bool:
    found = _EXPRESSION_TYPES.get(node_type)
    if found is None:
        found = _EXPRESSION_TYPES[node_type] = issubclass(node_type, cst.BaseExpression)
    return found


def _paths_to(root: cst.CSTNode, targets: list[cst.CSTNode]) -> set[int]:
    """The ids of `targets` (statements under `root`) and of every node on the way down to one of
    them. Statements never sit inside expressions, so the search does not enter them."""
    found: set[int] = set()
    path: list[int] = []
    wanted = {id(target) for target in targets}

    def visit(node: cst.CSTNode) -> None:
        if id(node) in wanted:
            found.add(id(node))
            found.update(path)
        if type(node) is cst.SimpleStatementLine:
            return  # its small statements hold no statement
        path.append(id(node))
        for child in children(node):
            if not _is_expression(type(child)):
                visit(child)
        path.pop()

    visit(root)
    return found


class _ReadsAfterMove(Visitor):
    """`_used_before_prepare`'s search: the reads of `names` after `statement` (the move), up to
    `stop` (the prepare call's statement), outside nested functions and the optimizer's own
    statements. Before the move nothing is read or bound, so only the nodes on the way to the move
    and to `stop` are entered there."""

    def __init__(
        self, roles: Roles, scope: Scope, statement: cst.BaseStatement, stop: cst.BaseStatement | None,
        names: set[str], optimizer_statements: set[cst.CSTNode], feeding: set[str],
        stop_before: cst.BaseStatement | None = None,
    ) -> None:
        self.root = scope.node
        self.statement = statement
        self.stop = stop
        self.names = names
        self.optimizer_statements = {id(stmt) for stmt in optimizer_statements}
        self.feeding = feeding
        self.aliases = roles.facts.aliases
        self.stop_before = stop_before
        self.before = _paths_to(scope.node, [statement] if stop is None else [statement, stop])
        self.after = False
        self.done = False
        self.found: list[cst.CSTNode] = []
        self.current: list[cst.CSTNode] = []

    def on_visit(self, node: cst.CSTNode) -> bool:
        if self.done or self.found:
            return False
        if node is self.stop_before:
            self.done = True
            return False
        node_type = type(node)
        if node is not self.root and node_type in _NESTED:
            return False
        if self.after:
            if id(node) in self.optimizer_statements:
                return False
        elif id(node) not in self.before:
            return False  # before the move: nothing in it is read or bound
        if _is_statement(node_type):
            self.current.append(node)
        return Visitor.on_visit(self, node)

    def on_leave(self, original_node: cst.CSTNode) -> None:
        Visitor.on_leave(self, original_node)
        if self.current and self.current[-1] is original_node:
            self.current.pop()
        if original_node is self.statement:
            self.after = True
        if original_node is self.stop:
            self.done = True

    def _read(self, node: cst.BaseExpression) -> bool:
        ref = reference(node)
        if ref is not None and ref in self.names and self.after:
            self.found.append(self.current[-1] if self.current else node)
        return ref is None

    def visit_Name(self, node: cst.Name) -> None:
        self._read(node)

    def visit_Attribute(self, node: cst.Attribute) -> bool:
        if not self._read(node):
            return False
        walk(node.value, self)
        return False

    def visit_Arg(self, node: cst.Arg) -> bool:
        walk(node.value, self)
        return False

    def visit_Assign(self, node: cst.Assign) -> bool:
        if not self.after:
            return True
        names = self.names
        targets = [reference(t.target) for t in node.targets]
        if all(targets) and all(t in self.feeding for t in targets):
            return False  # a parameter-group helper the optimizer is built from
        value = node.value
        if isinstance(value, cst.Attribute) and value.attr.value == "module" and reference(value) is None:
            value = value.value  # `model_without_ddp = model.module`: the same module
        if reference(value) in names and all(targets):
            names.update(t for t in targets if t is not None)  # `model_without_ddp = model`
            return False
        walk(node.value, self)
        for target in node.targets:
            if reference(target.target) is None:
                walk(target, self)
        return False

    def visit_Return(self, node: cst.Return) -> bool:
        value = node.value
        returned = [e.value for e in value.elements] if isinstance(value, cst.Tuple) else [value]
        for element in returned:
            if element is not None and reference(element) not in self.names:
                walk(element, self)  # the model itself goes to the caller, who prepares it
        return False

    def visit_Call(self, node: cst.Call) -> bool:
        names = self.names
        func = node.func
        if reference(func) in names:  # a forward pass: its inputs are on the device the model was moved to
            self._read(func)
            return False
        # `model.fc.weight.data.normal_(0, 0.01)`: PyTorch's in-place operations end in `_`
        if isinstance(func, cst.Attribute) and (func.attr.value in _IN_PLACE_METHODS or func.attr.value.endswith("_")):
            inner = func.value
            while isinstance(inner, (cst.Attribute, cst.Subscript)) and reference(inner) is None:
                inner = inner.value  # `model[2].weight.data`: a tensor of the model
            if reference(inner) in names:
                for arg in node.args:
                    walk(arg.value, self)
                return False
        if isinstance(func, cst.Name) and func.value in _INERT_FUNCTIONS:
            for arg in node.args:  # `print(evaluate(model, loader))`: the nested call runs the model
                if reference(arg.value) not in names:
                    walk(arg.value, self)
            return False
        qualified = self.aliases.qualify(func)
        if qualified in _WRAPPERS:
            return False  # `model = DDP(model, ...)`: the prepare call wraps it instead
        if qualified is not None and qualified.startswith("torch.nn.init."):
            return False  # `nn.init.zeros_(model.fc.bias)`: in place
        if qualified in _SAME_PARAMETERS and node.args and reference(node.args[0].value) in names:
            for arg in node.args[1:]:
                walk(arg.value, self)
            return False
        return True


def _strip(call: cst.Call, kept: list[int]) -> cst.BaseExpression:
    assert isinstance(call.func, cst.Attribute)
    if not kept:
        return call.func.value
    args = [call.args[i] for i in kept]
    args[-1] = args[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
    func = call.func if call.func.attr.value == "to" else call.func.with_changes(attr=cst.Name("to"))
    return call.with_changes(func=func, args=args)
