"""The `--local_rank` flag of `torch.distributed.launch` scripts, for AM007.

Scripts written for the legacy launcher (the transformers-v2 examples and the many research
repositories built on them) declare `parser.add_argument("--local_rank", type=int, default=-1)`:
the launcher passed `--local_rank=K` to each process, and `-1` meant "not distributed". The
Accelerator is launched by `accel launch` / torchrun, which pass no such flag, so in the migrated
script `args.local_rank` stays `-1` on every process:

- `args.local_rank == -1` / `!= -1` branches (choose the device, a `DistributedSampler`, wrap in
  DDP, initialise the group) are left as they are: the `-1` side is the single-device setup the
  prepared objects distribute, which is what the migrated script should run;
- the comparisons that single out processes would then be true (or false) on every process, so
  they become the Accelerator's, with the legacy launcher's meaning:

      args.local_rank in [-1, 0]            ->  accelerator.is_local_main_process
      args.local_rank not in [-1, 0]        ->  not accelerator.is_local_main_process
      args.local_rank == 0                  ->  accelerator.num_processes > 1 and accelerator.is_local_main_process
      args.local_rank == -1 or dist.get_rank() == 0  ->  accelerator.is_main_process

  (`== 0` is true only in a distributed run: it pairs with `not in [-1, 0]` around a barrier, the
  "local main process first" idiom, and both sides must agree or one process waits forever).

Only a flag this file declares with default -1 is followed (`args.X` for any namespace name). A
comparison in a function that cannot reach the accelerator is reported with its line.
"""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst

from migrate.analysis import Facts, Scope
from migrate.walk import walk

_FLAGS = ("--local_rank", "--local-rank")


@dataclass(eq=False)
class FlagCheck:
    """One comparison of the flag and what it becomes."""

    scope: Scope
    node: cst.Comparison | cst.BooleanOperation
    replacement: cst.BaseExpression
    meaning: str


def find(facts: Facts) -> list[FlagCheck]:
    """The comparisons of this file's `--local_rank` flag that single out processes."""
    text = facts.text if facts.text is not None else facts.module.code
    if "local_rank" not in text or not _declares_flag(facts.module):
        return []
    finder = _Finder(facts)
    walk(facts.module, finder)
    return finder.found


def _declares_flag(module: cst.Module) -> bool:
    """`add_argument("--local_rank", ..., default=-1)` somewhere in the file."""

    class Declarations(cst.CSTVisitor):
        found = False

        def visit_Call(self, node: cst.Call) -> None:
            func = node.func
            if not (isinstance(func, cst.Attribute) and func.attr.value == "add_argument" and node.args):
                return
            first = node.args[0].value
            if not (isinstance(first, cst.SimpleString) and first.evaluated_value in _FLAGS):
                return
            default = next((a.value for a in node.args if a.keyword is not None and a.keyword.value == "default"), None)
            if default is not None and _integer(default) == -1:
                Declarations.found = True

    walk(module, Declarations())
    return Declarations.found


def _integer(expr: cst.BaseExpression) -> int | None:
    if isinstance(expr, cst.Integer):
        return int(expr.value)
    if isinstance(expr, cst.UnaryOperation) and isinstance(expr.operator, cst.Minus) and isinstance(expr.expression, cst.Integer):
        return -int(expr.expression.value)
    return None


def _is_flag(expr: cst.BaseExpression) -> bool:
    """`args.local_rank` (any namespace name)."""
    return isinstance(expr, cst.Attribute) and expr.attr.value == "local_rank" and isinstance(expr.value, cst.Name)


def _accelerator(prop: str) -> cst.Attribute:
    return cst.Attribute(cst.Name("accelerator"), cst.Name(prop))


def _single(node: cst.Comparison) -> tuple[cst.BaseExpression, cst.BaseCompOp, cst.BaseExpression] | None:
    if len(node.comparisons) != 1:
        return None
    target = node.comparisons[0]
    return node.left, target.operator, target.comparator


def _minus_one_or_zero(expr: cst.BaseExpression) -> bool:
    """`[-1, 0]`, `(0, -1)`: the legacy launcher's "main process of this node, or not distributed"."""
    if not isinstance(expr, (cst.List, cst.Tuple)) or len(expr.elements) != 2:
        return False
    values = {_integer(e.value) for e in expr.elements if not isinstance(e, cst.StarredElement)}
    return values == {-1, 0}


def _is_rank_zero(expr: cst.BaseExpression, facts: Facts) -> bool:
    """`torch.distributed.get_rank() == 0` (either order)."""
    if not isinstance(expr, cst.Comparison):
        return False
    parts = _single(expr)
    if parts is None or not isinstance(parts[1], cst.Equal):
        return False
    left, _, right = parts
    for call, zero in ((left, right), (right, left)):
        if isinstance(call, cst.Call) and _integer(zero) == 0 and facts.aliases.qualify(call.func) == "torch.distributed.get_rank":
            return True
    return False


class _Finder(cst.CSTVisitor):
    def __init__(self, facts: Facts) -> None:
        self.facts = facts
        self.scopes = {id(s.node): s for s in facts.scopes}
        self.stack: list[Scope] = [facts.module_scope]
        self.found: list[FlagCheck] = []
        self.inside: set[int] = set()  # comparisons already covered by a whole `or`
        self.whole_tests: set[int] = set()  # `if <test>:` / `while <test>:`: no parentheses needed

    def visit_If(self, node: cst.If) -> None:
        self.whole_tests.add(id(node.test))

    def visit_While(self, node: cst.While) -> None:
        self.whole_tests.add(id(node.test))

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self.stack.append(self.scopes.get(id(node), self.stack[-1]))

    def leave_FunctionDef(self, original_node: cst.FunctionDef) -> None:
        self.stack.pop()

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        self.stack.append(self.scopes.get(id(node), self.stack[-1]))

    def leave_ClassDef(self, original_node: cst.ClassDef) -> None:
        self.stack.pop()

    def visit_BooleanOperation(self, node: cst.BooleanOperation) -> None:
        if not isinstance(node.operator, cst.Or) or not isinstance(node.left, cst.Comparison):
            return
        parts = _single(node.left)
        if parts is None or not (_is_flag(parts[0]) and isinstance(parts[1], cst.Equal) and _integer(parts[2]) == -1):
            return
        if _is_rank_zero(node.right, self.facts):
            replacement = _accelerator("is_main_process").with_changes(lpar=node.lpar, rpar=node.rpar)
            self.found.append(FlagCheck(self.stack[-1], node, replacement, "`accelerator.is_main_process`"))
            self.inside.update({id(node.left), id(node.right)})

    def visit_Comparison(self, node: cst.Comparison) -> None:
        parts = _single(node)
        if id(node) in self.inside or parts is None:
            return
        left, operator, right = parts
        if not _is_flag(left):
            return
        if isinstance(operator, (cst.In, cst.NotIn)) and _minus_one_or_zero(right):
            test: cst.BaseExpression = _accelerator("is_local_main_process")
            meaning = "`accelerator.is_local_main_process`"
            if isinstance(operator, cst.NotIn):
                test, meaning = cst.UnaryOperation(cst.Not(), test), "`not accelerator.is_local_main_process`"
        elif isinstance(operator, cst.Equal) and _integer(right) == 0:
            test = cst.parse_expression("accelerator.num_processes > 1 and accelerator.is_local_main_process")
            if not node.lpar and id(node) not in self.whole_tests:
                test = test.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
                self.found.append(FlagCheck(self.stack[-1], node, test, "`(accelerator.num_processes > 1 and "
                                            "accelerator.is_local_main_process)` (true only when distributed)"))
                return
            meaning = "`accelerator.num_processes > 1 and accelerator.is_local_main_process` (true only when distributed)"
        else:
            return
        self.found.append(FlagCheck(self.stack[-1], node, test.with_changes(lpar=node.lpar, rpar=node.rpar), meaning))
