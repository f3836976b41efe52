"""Make a value that decides the course of training the same on every process before it is used.

What it does:
    Finds values each process computes from its own share of the training data: sums kept across
    a training loop over a prepared loader (`train_loss += loss.item()`), what is computed from
    them afterwards (`avg = train_loss / len(loader)`), and what a function returns from them
    (`train_loss = train_epoch(...)`). Where such a value decides something, namely
    `scheduler.step(value)` (ReduceLROnPlateau), an `if`/`while` on it (best-model choice, early
    stopping, `break`), it inserts, right after the value is bound,
    `value = accelerator.reduce(torch.tensor(value, dtype=torch.float64, device=accelerator.device),
    "mean").item()` (`"sum"` for the running sum itself).
    A step's own loss that leaves a training loop, `value = loss.item()` (or `float(loss)`) of
    the tensor the loop calls `backward` on, then `if value < tol: break` (or `return`) in that
    loop's body, is reduced with `"mean"` right after its binding, whatever feeds the step (a
    prepared loader, or batches each process draws apart): one all-reduce of a number per step.
    A test on `loss.item()` itself is reported, saying to bind it first and run again.
    A running sum that is read after its loop only divided by the size of the whole dataset
    (`train_loss / len(train_loader.dataset)` in a print, or `train_loss /= len(train_loader.dataset)`
    and then any use; also `len(train_set)` when every call building the loader wraps that same
    `train_set`: `loss_all / len(train_dataset)` in PyG's examples) is reduced with `"sum"` right after the loop, whatever it then feeds: the
    division already counts every process's samples.
    A mean computed by an evaluation loop over a loader that a function the migration cannot read
    builds and that is left unprepared (`train_dl, valid_dl = get_data(opts)` of a module not
    given; `losses += loss.item()` in `validate`, which returns `losses / len(valid_dl)`) is reduced
    with `"mean"` where it decides (`val_loss = validate(...)` before `if val_loss < best:`; a sum
    made a mean in place after its loop, `val_loss /= len(val_loader)`, after that line): such a
    loader may give each process a share of its samples (a DistributedSampler inside the factory; a
    DataLoader over a datapipe ending in a sharding filter, which torch shards by itself once a
    process group exists) or all of them, and the mean over the processes is right either way.

Why:
    Each process sees 1/N of the data, so each one's loss sum differs. A plateau scheduler fed
    with it lowers the LR on some processes only, and an early stop fed with it ends the loop on
    some processes while the others wait in the next all-reduce until the timeout: replicas drift
    apart or hang. Reduced, every process takes the same decision, from the value over all data.
    A sum over one process's share divided by `len(loader.dataset)` is about 1/N of the
    one-process average: a printed or logged epoch loss that looks N times better than it is.

Example:
    train_loss = train_epoch(model, train_loader, optimizer)
    +train_loss = accelerator.reduce(
    +    torch.tensor(train_loss, dtype=torch.float64, device=accelerator.device), "mean"
    +).item()
    scheduler.step(train_loss)
    if train_loss < best: ...

Leaves alone:
    Values from evaluation (gathered with `gather_for_metrics`, or over an unprepared loader built
    in the file: the same on every process already), sums over an unread evaluation loader and what
    is computed from them other than by a division (`correct`, not `correct / total`: its value
    grows with the share each process sees, so no reduction is right both ways), evaluations run
    under a rank check (`if rank == 0: acc = accuracy(...)`: a reduction there would wait for
    processes that never come), counters incremented by a number or by a name the loop never
    binds (`iteration += 1`, `batches_done += opt.n_critic`: every process runs the same number of
    batches), values only printed or logged, and decisions on a per-rank
    value it cannot reduce where it is bound (bound inside a nested block, a tuple element, a
    function that cannot reach the accelerator): reported with the line to add. A running sum started once before an enclosing loop
    (`total = 0.0` above `for epoch ...:`) that decides after each pass of its training loop is
    reported with the lines that reduce each pass's own sum: reduced itself after every pass, it
    would add the earlier passes once per process. A sum divided by the
    dataset size that is also read otherwise after its loop (`return total`: the caller would get
    the sum over all processes), bound again, not started from a number, fed by something that may
    be a tensor, or whose loop may `return` before the reduction (which every process must reach)
    is reported with the line to add.

Fix safety:
    Changes no value on one process (a reduction over one process returns its input; float64
    holds a Python float exactly, so `.item()` gives back the same float). float64 is not
    available on Apple's MPS devices. On N processes the reduced value is the mean of the processes' values, which equals the
    one-process value up to float summation order when every process runs the same number of
    batches (the prepared loader evens them out). A sum reduced before its division by the dataset
    size is the one-process sum over the epoch's samples (the model's path aside) when the dataset
    divides into whole rounds of N batches; otherwise it also counts the samples the prepared loader
    repeats to even out the last round (fewer than N batches' worth): reported with the reduction
    (the exact value needs per-sample values gathered with `gather_for_metrics`, which drops them),
    unless the loader drops its last partial batch (`drop_last=True`).
    A mean over an unread evaluation loader reduced with `"mean"` returns, on N processes, the value
    every process computed when each sees all of the loader (up to the rounding of N equal float64
    numbers summed and divided by N); when each sees a share, it is the mean of the processes' means,
    which equals the one-process mean when the shares hold equal numbers of full batches and each
    batch's value is a plain mean over its samples; otherwise (a loss averaged over tokens, padding
    ignored, over batches composed otherwise than on one process) it is close to it, not equal.
"""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst

from migrate.analysis import Loop, Scope, Site
from migrate.edits import EditPlan
from migrate.names import dotted_name, root_name, target_names
from migrate.roles import Roles
from migrate.roles.loaders import loader_calls
from migrate.rules.base import names_read, prepared_loaders
from migrate.rules.guard_file_operations import rank_guarded
from migrate.walk import walk

CODE = "AM011"
NAME = "reduce-per-rank-decisions"


@dataclass(eq=False)
class _Value:
    """A per-rank value: the statement after which it is final, and how to reduce it."""

    name: str
    after: cst.BaseStatement | None  # None: bound where a reduction cannot be inserted
    reduction: str
    carried: bool = False  # a running sum carried over from one pass of an enclosing loop to the next
    # computed over a loader that may or may not give each process a share (`_unread_evaluations`)
    unread: bool = False
    # such a sum: its value grows with the share, so no reduction makes it right both ways (its ratio
    # to a count, a mean, is the same either way)
    extensive: bool = False


def apply(roles: Roles, plan: EditPlan) -> None:
    if roles.home is None or not roles.models or roles.refused:
        return
    torch_names = roles.facts.aliases.local_names_for("torch")
    _step_losses(roles, plan, torch_names)
    loaders = prepared_loaders(roles, plan)
    unread = _unread_evaluations(roles)
    if not loaders and not unread:
        return
    # functions that return a per-rank value -> whether it is computed over unread loaders only
    returning: dict[str, bool] = {}
    per_scope: dict[int, dict[str, _Value]] = {}
    for scope in roles.facts.scopes:
        values = _accumulators(roles, scope, loaders, plan, torch_names) if loaders else {}
        values.update(_evaluation_means(scope, unread.get(id(scope), [])))
        if values:
            per_scope[id(scope)] = values
            if scope.is_function and not scope.is_method and _returns_any(scope, values):
                returning[scope.name] = all(v.unread for v in values.values())
    for scope in roles.facts.scopes:
        values = per_scope.setdefault(id(scope), {})
        _results_of_calls(scope, returning, values)
        for name in [n for n in values if _already_reduced(scope, n)]:
            del values[name]
        if not values:
            continue
        done: set[str] = set()
        for stmt, block, name in _decisions(scope, values):
            if name in done or values[name].extensive:
                continue
            done.add(name)
            value = values[name]
            fixable = (
                value.after is not None
                and _before_in(block, value.after, stmt)
                and torch_names
                and roles.can_reach(scope)
            )
            torch_name = torch_names[0] if torch_names else "torch"
            # float64: a Python float goes through the reduction unrounded (one process: unchanged).
            line = (
                f"{name} = accelerator.reduce(\n    {torch_name}.tensor({name}, dtype={torch_name}.float64, "
                f'device=accelerator.device), "{value.reduction}"\n).item()'
            )
            if value.carried:
                plan.report(
                    CODE,
                    stmt,
                    f"`{name}` differs per process (each sums its own share of the training data) and decides "
                    f"here, so processes would take different decisions (LR, early stop, best model) or hang; it "
                    f"is not started again before each pass of its training loop, so reducing it after that loop "
                    f"would add the earlier passes' totals once per process: sum each pass into a name started at "
                    f"0 right before the loop (`pass_{name} = 0.0`, `pass_{name} += ...` in the loop), add "
                    f"`pass_{name} = accelerator.reduce({torch_name}.tensor(pass_{name}, dtype={torch_name}.float64, "
                    f'device=accelerator.device), "sum").item()` right after the loop, then `{name} += pass_{name}`',
                    unconverted=True,
                )
                continue
            if not fixable and value.unread:
                continue  # it may be the same on every process: nothing to report for sure
            if not fixable:
                plan.report(
                    CODE,
                    stmt,
                    f"`{name}` differs per process (each sums its own share of the training data) and decides "
                    f"here, so processes would take different decisions (LR, early stop, best model) or hang: "
                    f"add `{' '.join(line.split())}` where it is computed", unconverted=True,
                )
                continue
            assert value.after is not None
            plan.insert_after.setdefault(value.after, []).append(cst.parse_statement(line + "\n"))
            plan.use_accelerator(scope)
            plan.change(CODE, value.after, f"`{name}` reduced across processes before it decides" + (
                " (computed over a loader built by a function the migration cannot read, which may give each "
                "process a share of it: the mean over the processes is right either way)" if value.unread else ""))


def _step_losses(roles: Roles, plan: EditPlan, torch_names: list[str]) -> None:
    """`loss = output.item()` of the value a training loop calls `backward` on, then, in the same
    loop, `if loss < tol: break` (or `return`): each process tests its own step's loss, so the
    processes would leave the loop at different steps and the others wait in the next all-reduce.
    The loss is reduced ("mean") right after its binding. A test on `output.item()` itself is
    reported with the lines to write."""
    torch_name = torch_names[0] if torch_names else "torch"
    line = (
        f"{{name}} = accelerator.reduce(\n    {torch_name}.tensor({{name}}, dtype={torch_name}.float64, "
        'device=accelerator.device), "mean"\n).item()'
    )
    for scope in roles.facts.scopes:
        seen: set[int] = set()
        for site in scope.backwards:
            for stmt, bound, name in stop_tests(site):
                if id(stmt) in seen:
                    continue
                seen.add(id(stmt))
                if bound is None:
                    plan.report(CODE, stmt, (
                        f"`{name}.item()`, this process's loss of the step, decides here to leave the training "
                        "loop: on N processes each would leave at its own step and the others wait in the next "
                        f"all-reduce. Bind it before the test, `step_loss = {name}.item()`, test `step_loss`, and "
                        "run the migration again: it is then reduced across processes before it decides"),
                        unconverted=True)
                    continue
                if _already_reduced(scope, name):
                    continue
                if torch_names and roles.can_reach(scope):
                    plan.insert_after.setdefault(bound, []).append(cst.parse_statement(line.format(name=name) + "\n"))
                    plan.use_accelerator(scope)
                    plan.change(CODE, bound, (
                        f"`{name}`, this process's loss of the step, reduced across processes before it decides "
                        "to leave the training loop"))
                    continue
                plan.report(CODE, stmt, (
                    f"`{name}` is this process's loss of the step and decides here to leave the training loop: "
                    "on N processes each would leave at its own step and the others wait in the next "
                    f"all-reduce. Add `{' '.join(line.format(name=name).split())}` right after it is bound"),
                    unconverted=True)


def stop_tests(site: Site) -> list[tuple[cst.If, cst.BaseStatement | None, str]]:
    """The early stops of the training loop of the backward `site` (`output.backward()`) that read
    this process's loss of the step: `if loss < tol: break` (or `return`) in the loop's body, with
    the statement binding `loss = output.item()` before it in that body and not bound again after
    it, and the name; `if output.item() < tol: break` with None and the tensor's name."""
    if not site.loops or type(site.receiver) is not cst.Name:
        return []
    loop = site.loops[-1]
    if not isinstance(loop.node.body, cst.IndentedBlock):
        return []
    block = list(loop.node.body.body)
    tensor = site.receiver.value
    found: list[tuple[cst.If, cst.BaseStatement | None, str]] = []
    for index, stmt in enumerate(block):
        if not isinstance(stmt, cst.If) or not _leaves(stmt.body):
            continue
        read = names_read(stmt.test)
        bound = [(earlier, name) for earlier in block[:index] for name in _item_of(earlier, tensor) if name in read]
        if bound and not _rebound_after(block, bound[-1][0], bound[-1][1]):
            found.append((stmt, bound[-1][0], bound[-1][1]))
        elif not bound and _reads_item(stmt.test, tensor):
            found.append((stmt, None, tensor))
    return found


def _leaves(suite: cst.BaseSuite) -> bool:
    """The block `break`s or `return`s (not from a nested loop or function)."""
    found: list[cst.CSTNode] = []

    class Visitor(cst.CSTVisitor):
        def visit_Break(self, node: cst.Break) -> None:
            found.append(node)

        def visit_Return(self, node: cst.Return) -> None:
            found.append(node)

        def visit_For(self, node: cst.For) -> bool:
            return False

        def visit_While(self, node: cst.While) -> bool:
            return False

        def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
            return False

    walk(suite, Visitor())
    return bool(found)


def _item_of(stmt: cst.BaseStatement, tensor: str) -> list[str]:
    """`name = tensor.item()` / `name = float(tensor)`: the name bound to the step's loss as a number."""
    if not isinstance(stmt, cst.SimpleStatementLine) or len(stmt.body) != 1:
        return []
    small = stmt.body[0]
    if not (isinstance(small, cst.Assign) and len(small.targets) == 1 and isinstance(small.targets[0].target, cst.Name)):
        return []
    value = small.value
    if not isinstance(value, cst.Call):
        return []
    func = value.func
    if (isinstance(func, cst.Attribute) and func.attr.value == "item" and not value.args
            and isinstance(func.value, cst.Name) and func.value.value == tensor):
        return [small.targets[0].target.value]
    if (isinstance(func, cst.Name) and func.value == "float" and len(value.args) == 1
            and isinstance(value.args[0].value, cst.Name) and value.args[0].value.value == tensor):
        return [small.targets[0].target.value]
    return []


def _reads_item(test: cst.BaseExpression, tensor: str) -> bool:
    found: list[cst.Call] = []

    class Visitor(cst.CSTVisitor):
        def visit_Call(self, node: cst.Call) -> None:
            func = node.func
            if (isinstance(func, cst.Attribute) and func.attr.value == "item"
                    and isinstance(func.value, cst.Name) and func.value.value == tensor):
                found.append(node)

    walk(test, Visitor())
    return bool(found)


def _rebound_after(block: list[cst.BaseStatement], stmt: cst.BaseStatement, name: str) -> bool:
    """`name` is bound again in the loop's block after `stmt` (in any nested block)."""
    after = block[_index(block, stmt) + 1:]
    return any(name in _assigned_names(s) for s in _simple_statements(after))


def _accumulators(
    roles: Roles, scope: Scope, loaders: list[str], plan: EditPlan, torch_names: list[str]
) -> dict[str, _Value]:
    """Running sums of the training loops of `scope` over prepared loaders, and what is computed
    from them after the loop in the same block. A running sum only ever divided by the size of the
    whole dataset after its loop is reduced there (`_over_the_dataset`) and is per-rank no more."""
    body = _body(scope.node)
    if body is None:
        return {}
    found: dict[str, _Value] = {}
    for loop in scope.loops:
        if loop.source is None or not roles.is_training_loop(loop) or not roles.all_in(scope, loop.source, loaders):
            continue
        for name in _summed_in(loop.node):
            if scope.binds(name) and not name.startswith("self."):
                if not _already_reduced(scope, name) and _over_the_dataset(
                    roles, scope, body, loop.node, loop.source, name, plan, torch_names
                ):
                    continue
                if _carried_over(body, loop.node, name):
                    found[name] = _Value(name, None, "sum", carried=True)
                else:
                    found[name] = _Value(name, loop.node, "sum")
    if not found:
        return found
    _derived(body, found)
    return found


def _over_the_dataset(
    roles: Roles,
    scope: Scope,
    body: list[cst.BaseStatement],
    loop: cst.For,
    loader: str,
    name: str,
    plan: EditPlan,
    torch_names: list[str],
) -> bool:
    """`train_loss += loss.item()` in the loop, then `train_loss / len(loader.dataset)` (or
    `train_loss /= len(loader.dataset)`) after it: a sum over this process's share divided by the
    size of the whole dataset, about 1/N of the one-process value. When every read after the loop
    is that division, the sum is reduced right after the loop (True: handled). Reported when it is
    divided so but cannot be reduced there. False: not such a sum."""
    block = _block_of(body, loop)
    assert block is not None
    after = block[_index(block, loop) + 1:]
    divisions, other_reads = _reads_after(after, name, loader, _wrapped_datasets(roles, scope, loader))
    if not divisions:
        return False
    torch_name = torch_names[0] if torch_names else "torch"
    line = (
        f"{name} = accelerator.reduce(\n    {torch_name}.tensor({name}, dtype={torch_name}.float64, "
        f'device=accelerator.device), "sum"\n).item()'
    )
    why = _not_reducible(roles, scope, body, block, loop, name, other_reads, torch_names)
    if why is not None:
        plan.report(
            CODE,
            divisions[0],
            f"`{name}` adds up this process's share of the training data only, and `{_code(divisions[0])}` "
            f"divides it by the size of the whole dataset: on N processes the value is about 1/N of the "
            f"one-process one. It was not reduced ({why}): add `{name} = accelerator.reduce({torch_name}.tensor({name}, "
            f'dtype={torch_name}.float64, device=accelerator.device), "sum").item()` right after the loop', unconverted=True,
        )
        return False
    plan.insert_after.setdefault(loop, []).append(cst.parse_statement(line + "\n"))
    plan.use_accelerator(scope)
    plan.change(CODE, loop, f"`{name}` summed across processes before it is divided by the dataset size")
    if not _drops_last(roles, scope, loader):
        plan.report(
            CODE,
            divisions[0],
            f"`{name}` is summed across processes before `{_code(divisions[0])}`; on N processes, when the dataset "
            "does not divide into whole rounds of N batches, the prepared loader repeats some of the epoch's first "
            "samples to even out the last round (as HF Accelerate does: every process then steps equally often), "
            "and the sum holds their values too (up to N times the batch size minus one more samples than the "
            "dataset has), so it is not the one-process average over the dataset; training is not affected. For "
            "the exact value, add up per-sample values gathered with `accelerator.gather_for_metrics(...)`, which "
            "drops the repeated samples, or give the loader `drop_last=True`",
        )
    return True


def _drops_last(roles: Roles, scope: Scope, loader: str) -> bool:
    """Every DataLoader call `loader` may come from passes `drop_last=True`: no padded last round."""
    origins = roles.origins(scope, loader)
    if not origins:
        return False
    calls = [call for home, name in origins for _, call in loader_calls(roles, home, name)]
    return bool(calls) and all(
        any(a.keyword is not None and a.keyword.value == "drop_last" and isinstance(a.value, cst.Name)
            and a.value.value == "True" for a in call.args)
        for call in calls
    )


def _not_reducible(
    roles: Roles,
    scope: Scope,
    body: list[cst.BaseStatement],
    block: list[cst.BaseStatement],
    loop: cst.For,
    name: str,
    other_reads: list[cst.CSTNode],
    torch_names: list[str],
) -> str | None:
    """Why the running sum cannot be reduced right after its loop; None: it can."""
    if other_reads:
        return f"`{_first_line(other_reads[0])}` also reads it after the loop, and would read the sum over all processes"
    if not torch_names:
        return "`torch` is not imported as a module here"
    if not roles.can_reach(scope):
        return "this function cannot reach the accelerator"
    if _returns_in(loop.body):
        return "the loop may `return` before the reduction, which every process must reach"
    index = _index(block, loop)
    inits = [
        stmt for stmt in block[:index]
        if isinstance(stmt, cst.SimpleStatementLine) and name in _assigned_names(stmt)
    ]
    if not inits or not _numeric_init(inits[-1], name):
        return f"`{name}` does not start from a number in the loop's block"
    for stmt in _simple_statements(body):
        if name in _assigned_names(stmt) and stmt is not inits[-1] and not _inside(loop, stmt):
            if not any(isinstance(s, cst.AugAssign) and isinstance(s.operator, cst.DivideAssign) for s in stmt.body):
                return f"`{_code(stmt)}` binds it again"
    for augassign in _augassigns(loop.body, name):
        if not isinstance(augassign.operator, cst.AddAssign) or not _is_number(augassign.value):
            return f"`{_code(augassign)}` may add a tensor, not a number"
    return None


def _wrapped_datasets(roles: Roles, scope: Scope, loader: str) -> frozenset[str]:
    """The name of the dataset every call building `loader` wraps (`DataLoader(train_set, ...)`),
    when it reads the same binding in `scope`: `len(train_set)` is then `len(loader.dataset)`."""
    origins = roles.origins(scope, loader)
    names: set[str] = set()
    for home, bound in origins or ():
        for binding in home.bindings.get(bound, []):
            value = binding.value
            if not isinstance(value, cst.Call):
                return frozenset()
            data = next((a.value for a in value.args if a.keyword is not None and a.keyword.value == "dataset"), None)
            if data is None and value.args and value.args[0].keyword is None and not value.args[0].star:
                data = value.args[0].value
            if not isinstance(data, cst.Name):
                return frozenset()
            here, there = roles.origins(scope, data.value), roles.origins(home, data.value)
            if not here or here != there:
                return frozenset()
            names.add(data.value)
    return frozenset(names) if len(names) == 1 else frozenset()


def _reads_after(
    after: list[cst.BaseStatement], name: str, loader: str, datasets: frozenset[str] = frozenset()
) -> tuple[list[cst.CSTNode], list[cst.CSTNode]]:
    """Statements after the loop: (the divisions of `name` by `len(loader.dataset)`, the other
    reads and bindings of `name`). After `name /= len(loader.dataset)` the name holds the mean,
    and reads of it are divisions too."""
    divisions: list[cst.CSTNode] = []
    others: list[cst.CSTNode] = []
    divided = False
    for stmt in after:
        if (
            not divided
            and isinstance(stmt, cst.SimpleStatementLine)
            and len(stmt.body) == 1
            and isinstance(stmt.body[0], cst.AugAssign)
            and isinstance(stmt.body[0].operator, cst.DivideAssign)
            and _code(stmt.body[0].target) == name
            and _is_dataset_size(stmt.body[0].value, loader, datasets)
        ):
            divided = True
            divisions.append(stmt.body[0])
            continue
        finder = _NameUses(name, loader, datasets)
        walk(stmt, finder)
        if divided:
            others.extend([stmt] if finder.bindings else [])
        else:
            divisions.extend(finder.divisions)
            others.extend([stmt] if finder.reads or finder.bindings else [])
    return divisions, others


class _NameUses(cst.CSTVisitor):
    """Reads of `name` inside `name / len(loader.dataset)`, other reads, bindings."""

    def __init__(self, name: str, loader: str, datasets: frozenset[str] = frozenset()) -> None:
        self.name = name
        self.loader = loader
        self.datasets = datasets
        self.divisions: list[cst.CSTNode] = []
        self.reads: list[cst.CSTNode] = []
        self.bindings: list[cst.CSTNode] = []
        self._inside: set[int] = set()

    def visit_BinaryOperation(self, node: cst.BinaryOperation) -> None:
        if (
            isinstance(node.operator, cst.Divide)
            and isinstance(node.left, cst.Name)
            and node.left.value == self.name
            and _is_dataset_size(node.right, self.loader, self.datasets)
        ):
            self.divisions.append(node)
            self._inside.add(id(node.left))

    def visit_AssignTarget(self, node: cst.AssignTarget) -> None:
        if self.name in target_names(node.target):
            self.bindings.append(node)

    def visit_AugAssign(self, node: cst.AugAssign) -> None:
        if self.name in target_names(node.target):
            self.bindings.append(node)

    def visit_Name(self, node: cst.Name) -> None:
        if node.value == self.name and id(node) not in self._inside:
            self.reads.append(node)

    def visit_Attribute(self, node: cst.Attribute) -> bool:
        walk(node.value, self)
        return False

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        return False


def _is_dataset_size(expr: cst.BaseExpression, loader: str, datasets: frozenset[str] = frozenset()) -> bool:
    """`len(loader.dataset)`, or `len(train_set)` for the dataset the loader wraps (`datasets`)."""
    if not (isinstance(expr, cst.Call) and isinstance(expr.func, cst.Name) and expr.func.value == "len"
            and len(expr.args) == 1):
        return False
    measured = expr.args[0].value
    if isinstance(measured, cst.Name):
        return measured.value in datasets
    return (
        isinstance(measured, cst.Attribute)
        and measured.attr.value == "dataset"
        and _code(measured.value) == loader
    )


def _is_number(expr: cst.BaseExpression) -> bool:
    """A Python number: `loss.item()`, `float(...)`, a literal, `len(x)`, `x.size(0)`, and their
    arithmetic."""
    if isinstance(expr, (cst.Integer, cst.Float)):
        return True
    if isinstance(expr, cst.BinaryOperation):
        return _is_number(expr.left) and _is_number(expr.right)
    if isinstance(expr, cst.UnaryOperation):
        return _is_number(expr.expression)
    if isinstance(expr, cst.Call):
        func = expr.func
        if isinstance(func, cst.Name):
            return func.value in ("float", "int", "len")
        if isinstance(func, cst.Attribute):
            return (func.attr.value == "item" and not expr.args) or (
                func.attr.value in ("size", "numel") and (bool(expr.args) or func.attr.value == "numel")
            )
    return False


def _numeric_init(stmt: cst.SimpleStatementLine, name: str) -> bool:
    for small in stmt.body:
        if isinstance(small, cst.Assign):
            for target in small.targets:
                if isinstance(target.target, cst.Name) and target.target.value == name:
                    return isinstance(small.value, (cst.Integer, cst.Float))
    return False


def _augassigns(node: cst.CSTNode, name: str) -> list[cst.AugAssign]:
    found: list[cst.AugAssign] = []

    class Visitor(cst.CSTVisitor):
        def visit_AugAssign(self, node: cst.AugAssign) -> None:
            if name in target_names(node.target):
                found.append(node)

        def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
            return False

    walk(node, Visitor())
    return found


def _returns_in(node: cst.CSTNode) -> bool:
    found: list[cst.Return] = []

    class Visitor(cst.CSTVisitor):
        def visit_Return(self, node: cst.Return) -> None:
            found.append(node)

        def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
            return False

    walk(node, Visitor())
    return bool(found)


def _inside(outer: cst.CSTNode, inner: cst.CSTNode) -> bool:
    found: list[bool] = []

    class Visitor(cst.CSTVisitor):
        def on_visit(self, node: cst.CSTNode) -> bool:
            if node is inner:
                found.append(True)
            return not found

    walk(outer, Visitor())
    return bool(found)


def _carried_over(body: list[cst.BaseStatement], loop: cst.For, name: str) -> bool:
    """`total = 0.0` before `for epoch ...:`, then `total += loss.item()` in the training loop inside
    it: the sum carries each pass's total into the next, so a reduction after each pass would add
    the earlier passes once per process. False when a statement binds `name` before the loop in
    its block, or in a block enclosing it inside the innermost loop around it."""
    path = _path_to(body, loop)
    for block, stmt in reversed(path):
        if stmt is not loop and isinstance(stmt, (cst.For, cst.While)):
            return True
        before = block[:_index(block, stmt)]
        if any(isinstance(s, cst.SimpleStatementLine) and name in _assigned_names(s) for s in before):
            return False
    return False


def _path_to(
    body: list[cst.BaseStatement], stmt: cst.BaseStatement
) -> list[tuple[list[cst.BaseStatement], cst.BaseStatement]]:
    """(block, its statement holding `stmt`) from the scope's body down to `stmt`'s own block."""
    for inner in body:
        if inner is stmt:
            return [(body, inner)]
        if isinstance(inner, (cst.FunctionDef, cst.ClassDef)):
            continue
        for child in _child_blocks(inner):
            found = _path_to(child, stmt)
            if found:
                return [(body, inner), *found]
    return []


def _index(block: list[cst.BaseStatement], stmt: cst.BaseStatement) -> int:
    return next(i for i, s in enumerate(block) if s is stmt)


def _block_of(body: list[cst.BaseStatement], stmt: cst.BaseStatement) -> list[cst.BaseStatement] | None:
    """The block (of the scope, not of a nested function) whose statements include `stmt`."""
    if any(s is stmt for s in body):
        return body
    for inner in body:
        if isinstance(inner, (cst.FunctionDef, cst.ClassDef)):
            continue
        for child in _child_blocks(inner):
            found = _block_of(child, stmt)
            if found is not None:
                return found
    return None


def _first_line(stmt: cst.CSTNode) -> str:
    if isinstance(stmt, cst.SimpleStatementLine):
        return "; ".join(_code(small) for small in stmt.body)
    return cst.Module([]).code_for_node(stmt).strip().splitlines()[0]


def _code(node: cst.CSTNode) -> str:
    return " ".join(cst.Module([]).code_for_node(node).split())


def _unread_evaluations(roles: Roles) -> dict[int, list[Loop]]:
    """By scope, the loops without backward over loaders that functions the migration cannot read
    build and that are not prepared (`roles.unread_eval_loops`), where every process runs them."""
    found: dict[int, list[Loop]] = {}
    for scope, loop, _ in roles.unread_eval_loops:
        if rank_guarded(loop.where):
            continue
        loops = found.setdefault(id(scope), [])
        if loop not in loops:
            loops.append(loop)
    return found


def _evaluation_means(scope: Scope, loops: list[Loop]) -> dict[str, _Value]:
    """The running sums of evaluation loops of `scope` over unread loaders (`losses += loss.item()`),
    and what is computed from them after the loop: such a loader may give each process a share
    of its samples (a DistributedSampler inside the factory; a DataLoader over a datapipe, which
    torch shards itself once a process group exists), or all of them. A mean over it reduced with
    `"mean"` is right either way: the same value on every process is returned as it is."""
    body = _body(scope.node)
    if body is None or not loops:
        return {}
    found: dict[str, _Value] = {}
    for loop in loops:
        for name in _summed_in(loop.node):
            if scope.binds(name) and not name.startswith("self.") and not _carried_over(body, loop.node, name):
                divided = _divided_in_place(body, loop.node, name)
                found[name] = _Value(name, divided or loop.node, "mean", unread=True, extensive=divided is None)
    if found:
        _derived(body, found)
    return found


def _divided_in_place(body: list[cst.BaseStatement], loop: cst.For, name: str) -> cst.SimpleStatementLine | None:
    """The one `name /= count` after `loop` (`val_loss /= len(val_loader)`): from there `name` is a
    mean, which a reduction with "mean" makes right whether or not each process saw a share."""
    found = [
        stmt for stmt in _simple_statements(body)
        if len(stmt.body) == 1 and isinstance(stmt.body[0], cst.AugAssign)
        and isinstance(stmt.body[0].operator, cst.DivideAssign)
        and isinstance(stmt.body[0].target, cst.Name) and stmt.body[0].target.value == name
    ]
    if len(found) != 1 or _inside(loop, found[0]):
        return None
    return found[0]


def _derived(body: list[cst.BaseStatement], values: dict[str, _Value]) -> None:
    """`avg = total / len(loader)`: per-rank too (a mean of the rank's batches). In document order,
    in any block of the scope (not in nested functions)."""
    candidates: dict[str, cst.SimpleStatementLine] = {}
    for stmt in _simple_statements(body):
        if len(stmt.body) != 1:
            continue
        small = stmt.body[0]
        if isinstance(small, cst.Assign) and len(small.targets) == 1 and isinstance(small.targets[0].target, cst.Name):
            name = small.targets[0].target.value
            if name in values or isinstance(small.value, cst.Name):
                continue  # `best = mean_loss` copies a value that is reduced where it decides
            read = [values[n] for n in names_read(small.value) if n in values]
            if read:
                values[name] = _Value(name, stmt, "mean", unread=all(v.unread for v in read),
                                      extensive=not _per_rank(small.value, values))
                candidates[name] = stmt
    for name, stmt in candidates.items():
        # Per-rank only when every binding of the name is computed from per-rank values.
        others = [s for s in _simple_statements(body) if s is not stmt and name in _assigned_names(s)]
        if others:
            del values[name]


def _simple_statements(body: list[cst.BaseStatement]) -> list[cst.SimpleStatementLine]:
    found: list[cst.SimpleStatementLine] = []
    for stmt in body:
        if isinstance(stmt, cst.SimpleStatementLine):
            found.append(stmt)
        elif not isinstance(stmt, (cst.FunctionDef, cst.ClassDef)):
            for child in _child_blocks(stmt):
                found.extend(_simple_statements(child))
    return found


def _assigned_names(stmt: cst.SimpleStatementLine) -> list[str]:
    names: list[str] = []
    for small in stmt.body:
        if isinstance(small, cst.Assign):
            names.extend(n for t in small.targets for n in target_names(t.target))
        elif isinstance(small, (cst.AugAssign, cst.AnnAssign)):
            names.extend(target_names(small.target))
    return names


def _already_reduced(scope: Scope, name: str) -> bool:
    """`name = accelerator.reduce(...)` / `accelerator.gather(...)` somewhere in the scope."""
    for binding in scope.bindings.get(name, []):
        value = binding.value
        if (
            isinstance(value, cst.Call)
            and isinstance(value.func, cst.Attribute)
            and value.func.attr.value == "item"
            and isinstance(value.func.value, cst.Call)
        ):
            value = value.func.value
        if (
            isinstance(value, cst.Call)
            and isinstance(value.func, cst.Attribute)
            and value.func.attr.value in ("reduce", "gather", "gather_for_metrics")
        ):
            return True
    return False


def _results_of_calls(scope: Scope, returning: dict[str, bool], values: dict[str, _Value]) -> None:
    """`train_loss = train_epoch(...)` where `train_epoch` returns a per-rank value. An evaluation's
    over unread loaders that only some processes compute (`if rank == 0: val = validate(...)`) is
    left alone: a reduction there would wait for processes that never come."""
    if not returning:
        return
    for name, bindings in scope.bindings.items():
        for binding in bindings:
            value = binding.value
            if isinstance(value, cst.Call) and isinstance(value.func, cst.Name) and value.func.value in returning:
                unread = returning[value.func.value]
                if unread and rank_guarded(binding.where):
                    continue
                stmt = binding.where.stmt
                simple = isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1 and isinstance(
                    stmt.body[0], cst.Assign
                ) and isinstance(stmt.body[0].targets[0].target, cst.Name)
                values[name] = _Value(name, stmt if simple else None, "mean", unread=unread)


def _returns_any(scope: Scope, values: dict[str, _Value]) -> bool:
    return any(_per_rank(r, values) for r in scope.returns)


def _per_rank(expr: cst.BaseExpression, values: dict[str, _Value]) -> bool:
    """`expr` is computed from per-rank values and is a value a reduction with its kind makes right:
    not a sum over a loader that may or may not be shared out (`losses`), but its mean is
    (`losses / len(loader)`)."""
    read = [values[n] for n in names_read(expr) if n in values]
    if not read:
        return False
    if any(not v.extensive for v in read):
        return True
    return _mean_of(expr, values)


def _mean_of(expr: cst.BaseExpression, values: dict[str, _Value]) -> bool:
    """`total / count`: a sum divided by something; a ratio of a sum over a loader's batches stays
    the same whether each process sees all of the loader or a share of it (up to how the batches fall)."""
    return (
        isinstance(expr, cst.BinaryOperation)
        and isinstance(expr.operator, cst.Divide)
        and any(n in values for n in names_read(expr.left))
    )


def _decisions(scope: Scope, values: dict[str, _Value]) -> list[tuple[cst.BaseStatement, object, str]]:
    """Statements where a per-rank value decides: `x.step(value)`, `if`/`while` tests on it."""
    body = _body(scope.node)
    if body is None:
        return []
    found: list[tuple[cst.BaseStatement, object, str]] = []

    def visit_block(block: list[cst.BaseStatement], owner: object) -> None:
        for stmt in block:
            if isinstance(stmt, (cst.FunctionDef, cst.ClassDef)):
                continue
            if isinstance(stmt, cst.SimpleStatementLine):
                for small in stmt.body:
                    call = small.value if isinstance(small, cst.Expr) else None
                    if (
                        isinstance(call, cst.Call)
                        and isinstance(call.func, cst.Attribute)
                        and call.func.attr.value == "step"
                        and call.args
                    ):
                        found.extend((stmt, owner, n) for n in names_read(call.args[0].value) if n in values)
                continue
            if isinstance(stmt, (cst.If, cst.While)):
                found.extend((stmt, owner, n) for n in names_read(stmt.test) if n in values and not _only_output(stmt))
            for child in _child_blocks(stmt):
                visit_block(child, child)

    visit_block(body, body)
    return found


def _before_in(block: object, first: cst.BaseStatement, then: cst.BaseStatement) -> bool:
    """`first` and `then` are statements of the same block, `first` before `then`."""
    assert isinstance(block, list)
    index = {id(s): i for i, s in enumerate(block)}
    return id(first) in index and id(then) in index and index[id(first)] < index[id(then)]


def _only_output(stmt: cst.If | cst.While) -> bool:
    """An `if` whose body only prints or logs: not a decision."""
    if not isinstance(stmt, cst.If) or stmt.orelse is not None or not isinstance(stmt.body, cst.IndentedBlock):
        return False
    for inner in stmt.body.body:
        if not (isinstance(inner, cst.SimpleStatementLine) and all(isinstance(s, cst.Expr) for s in inner.body)):
            return False
        for small in inner.body:
            call = small.value if isinstance(small, cst.Expr) else None
            func = call.func if isinstance(call, cst.Call) else None
            name = func.attr.value if isinstance(func, cst.Attribute) else func.value if isinstance(func, cst.Name) else ""
            if name not in ("print", "info", "debug", "warning", "log", "add_scalar", "write"):
                return False
    return True


def _child_blocks(stmt: cst.BaseStatement) -> list[list[cst.BaseStatement]]:
    blocks: list[list[cst.BaseStatement]] = []
    for suite in _suites(stmt):
        if isinstance(suite, cst.IndentedBlock):
            blocks.append(list(suite.body))
    return blocks


def _suites(stmt: cst.BaseStatement) -> list[cst.BaseSuite]:
    suites: list[cst.BaseSuite] = []
    body = getattr(stmt, "body", None)
    if isinstance(body, cst.BaseSuite):
        suites.append(body)
    orelse = getattr(stmt, "orelse", None)
    while orelse is not None:
        if isinstance(orelse, cst.If):
            suites.append(orelse.body)
            orelse = orelse.orelse
        else:
            suites.append(orelse.body)
            orelse = None
    for handler in getattr(stmt, "handlers", ()) or ():
        suites.append(handler.body)
    final = getattr(stmt, "finalbody", None)
    if final is not None:
        suites.append(final.body)
    return suites


def _body(node: cst.CSTNode) -> list[cst.BaseStatement] | None:
    if isinstance(node, cst.Module):
        return list(node.body)
    if isinstance(node, cst.FunctionDef) and isinstance(node.body, cst.IndentedBlock):
        return list(node.body.body)
    return None


def _summed_in(loop: cst.For) -> list[str]:
    """Names the loop adds to. A counter only ever incremented by a number (`iteration += 1`), or
    by a name the loop never binds (`batches_done += opt.n_critic`, `seen += batch_size` with
    `batch_size` set before the loop), is the same on every process: a prepared loader gives each
    one the same number of batches, and the increment is the same at every one of them."""
    sums = _Sums()
    walk(loop.body, sums)
    bound = sums.bound | set(target_names(loop.target))
    counted = set(sums.counted)
    for found, root in sums.by_name:
        if root in bound or root == "self":  # a method the loop calls may set `self.x`
            counted.update(found)
    return [n for n in sums.names if n in counted]


def _single_targets(target: cst.BaseExpression) -> list[cst.BaseExpression]:
    """The single targets of `a, (b.c, d[0])`."""
    if type(target) in (cst.Tuple, cst.List):
        return [t for element in target.elements for t in _single_targets(element.value)]
    if type(target) is cst.StarredElement:
        return _single_targets(target.value)
    return [target]


class _Sums(cst.CSTVisitor):
    def __init__(self) -> None:
        self.names: list[str] = []
        self.counted: set[str] = set()  # incremented by something other than a number or a name
        self.by_name: list[tuple[list[str], str]] = []  # (targets, root of the `a.b` increment)
        self.bound: set[str] = set()  # names the loop body binds

    def _binds(self, target: cst.BaseExpression) -> None:
        """Plain names, and the roots of attributes and items (`stats.loss = ...` binds `stats`)."""
        self.bound.update(target_names(target))
        for element in _single_targets(target):
            if root_name(element) is not None:
                self.bound.add(root_name(element))

    def visit_AugAssign(self, node: cst.AugAssign) -> None:
        found = target_names(node.target)
        self._binds(node.target)
        if isinstance(node.operator, cst.AddAssign):
            self.names.extend(n for n in found if n not in self.names)
            if dotted_name(node.value) is not None:
                self.by_name.append((found, dotted_name(node.value).split(".")[0]))
            elif not isinstance(node.value, (cst.Integer, cst.Float)):
                self.counted.update(found)

    def visit_Assign(self, node: cst.Assign) -> None:
        for target in node.targets:
            self._binds(target.target)

    def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
        self._binds(node.target)

    def visit_For(self, node: cst.For) -> None:
        self._binds(node.target)

    def visit_WithItem(self, node: cst.WithItem) -> None:
        if node.asname is not None:
            self.bound.update(target_names(node.asname.name))

    def visit_NamedExpr(self, node: cst.NamedExpr) -> None:
        self.bound.update(target_names(node.target))

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        return False
