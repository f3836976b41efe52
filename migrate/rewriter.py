"""Apply an EditPlan to a module in one traversal.

Statement-level edits (remove, replace, insert) are applied where the statement's block is rebuilt,
pairing original and updated statements, so edits keyed by original nodes find their statement
even after its children were rewritten. Comments of a removed statement move to the next statement
of its block (or the block's footer), with their blank lines (`carry.py`); the comments of a
replaced statement that its replacement does not keep go above the replacement: the rewrite never
deletes a comment (but a trailing pragma, `# noqa`, of a removed line).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence

import libcst as cst

from migrate import carry
from migrate.edits import STATEMENT_FIELDS, EditPlan
from migrate.imports import is_docstring
from migrate.transform import Transformer
from migrate.walk import children, walk

ACCELERATOR = "accelerator"


class Rewriter(Transformer):
    """Descends only into the nodes on a path to an edited node (`touched`): subtrees without an
    edit are kept as they are, not rebuilt."""

    def __init__(self, plan: EditPlan, touched: set[cst.CSTNode]) -> None:
        super().__init__()
        self.plan = plan
        self.touched = {id(node) for node in touched}  # ids: a node's own hash is a Python call
        # Statements (and small statements) with an edit of their own: any other statement the
        # descent left as it was is kept without looking it up in each of the plan's fields.
        self.statement_edits = {id(stmt) for name in STATEMENT_FIELDS for stmt in getattr(plan, name)}
        # Statements of the output that may be removed if their name ends up unused (cleanup.py).
        self.rebound: dict[cst.BaseStatement, str] = {}

    def on_visit(self, node: cst.CSTNode) -> bool:
        return id(node) in self.touched

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        if original_node in self.plan.new_args:
            updated_node = _append_argument(updated_node, keyword=self.plan.new_args[original_node])
        edit = self.plan.calls.get(original_node)
        return edit(updated_node) if edit is not None else updated_node

    def leave_Attribute(self, original_node: cst.Attribute, updated_node: cst.Attribute) -> cst.BaseExpression:
        edit = self.plan.attributes.get(original_node)
        return edit(updated_node) if edit is not None else updated_node

    def leave_Subscript(self, original_node: cst.Subscript, updated_node: cst.Subscript) -> cst.BaseExpression:
        edit = self.plan.subscripts.get(original_node)
        return edit(updated_node) if edit is not None else updated_node

    def leave_Name(self, original_node: cst.Name, updated_node: cst.Name) -> cst.BaseExpression:
        name = self.plan.renames.get(original_node)
        if name is not None:
            updated_node = updated_node.with_changes(value=name)
        rows = self.plan.row_reads.get(original_node)
        if rows is not None:
            return cst.Subscript(value=updated_node, slice=[cst.SubscriptElement(slice=cst.Index(cst.Name(rows)))])
        return updated_node

    def leave_If(self, original_node: cst.If, updated_node: cst.If) -> cst.If:
        test = self.plan.if_tests.get(original_node)
        return updated_node.with_changes(test=test) if test is not None else updated_node

    def leave_BinaryOperation(
        self, original_node: cst.BinaryOperation, updated_node: cst.BinaryOperation
    ) -> cst.BaseExpression:
        if original_node not in self.plan.keep_left_operand:
            return updated_node
        left = updated_node.left
        if updated_node.lpar and not getattr(left, "lpar", None):
            left = left.with_changes(lpar=updated_node.lpar, rpar=updated_node.rpar)
        return left

    def leave_Comparison(self, original_node: cst.Comparison, updated_node: cst.Comparison) -> cst.BaseExpression:
        return self.plan.comparisons.get(original_node, updated_node)

    def leave_BooleanOperation(
        self, original_node: cst.BooleanOperation, updated_node: cst.BooleanOperation
    ) -> cst.BaseExpression:
        return self.plan.bool_ops.get(original_node, updated_node)

    def leave_FunctionDef(self, original_node: cst.FunctionDef, updated_node: cst.FunctionDef) -> cst.FunctionDef:
        if original_node in self.plan.self_accelerator and updated_node.params.params:
            instance = updated_node.params.params[0].name.value
            body = updated_node.body
            updated_node = updated_node.with_changes(body=body.visit(_ToSelfAccelerator(instance, body)))
            if original_node in self.plan.stores_accelerator:
                updated_node = _store_accelerator(updated_node, instance)
        if original_node in self.plan.new_params:
            return updated_node.with_changes(
                params=_append_parameter(updated_node.params, keyword_only=self.plan.new_params[original_node])
            )
        return updated_node

    def leave_For(self, original_node: cst.For, updated_node: cst.For) -> cst.For:
        header = self.plan.wrap_loop_body.get(original_node)
        if header is None or type(updated_node.body) is not cst.IndentedBlock:
            return updated_node
        inner = updated_node.body
        wrapped = cst.With(
            items=[cst.WithItem(item=header)],
            body=cst.IndentedBlock(body=inner.body, footer=inner.footer),
        )
        return updated_node.with_changes(body=inner.with_changes(body=[wrapped], footer=[]))

    def leave_IndentedBlock(self, original_node: cst.IndentedBlock, updated_node: cst.IndentedBlock) -> cst.IndentedBlock:
        body, footer = self._rebuild(original_node.body, updated_node.body)
        if not body:
            # the comments of what was removed stay above the `pass` that fills the block
            body = [cst.SimpleStatementLine([cst.Pass()], leading_lines=carry.inside(footer))]
            footer = []
        return updated_node.with_changes(body=body, footer=[*footer, *updated_node.footer])

    def leave_Module(self, original_node: cst.Module, updated_node: cst.Module) -> cst.Module:
        body, footer = self._rebuild(original_node.body, updated_node.body)
        return updated_node.with_changes(body=body, footer=[*footer, *updated_node.footer])

    def _rebuild(
        self, originals: Sequence[cst.BaseStatement], updated: Sequence[cst.BaseStatement]
    ) -> tuple[list[cst.BaseStatement], list[cst.EmptyLine]]:
        """The block's new statements, and the lines for its footer. A removed statement's lines
        (`carry.lines_of`) go above the next statement put in the block, an inserted one included."""
        plan = self.plan
        out: list[cst.BaseStatement] = []
        carried: list[cst.EmptyLine] | None = None  # None: nothing removed since the last statement put
        opened: cst.BaseStatement | None = None  # the last `if accelerator.is_main_process:` added
        first: cst.BaseStatement | None = None  # the last `with accelerator.main_process_first():` added
        ranked: cst.BaseStatement | None = None  # the last `if int(os.environ.get("RANK", "0")) == 0:` added
        statement_edits = self.statement_edits

        def put(stmts: Sequence[cst.BaseStatement]) -> None:
            nonlocal carried
            stmts = list(stmts)
            if stmts and carried is not None:
                stmts[0] = self._moved(stmts[0], carry.attach(stmts[0], carried, at_start=not out))
                carried = None
            out.extend(stmts)

        for original, new in zip(originals, updated):
            if new is original and id(original) not in statement_edits and (
                type(original) is not cst.SimpleStatementLine
                or not any(id(small) in statement_edits for small in original.body)
            ):
                put([new])  # no edit of its own: kept as it is
                continue
            put(plan.insert_before.get(original, []))
            lost: list[cst.EmptyLine] = []
            if original in plan.replace_stmt:
                replacement = list(plan.replace_stmt[original])
                lost = _lost_comments(new, replacement) if replacement else []
            elif original in plan.drop_if_trivial:
                replacement = _drop_trivial(new)
            elif type(original) is cst.SimpleStatementLine and plan.remove_small.intersection(original.body):
                replacement = _without(original, new, plan.remove_small)
            elif original in plan.unwrap_with and type(original) is cst.With and type(new) is cst.With:
                replacement, lost = _unwrapped(original, new, plan.unwrap_with[original])
            else:
                replacement = [new]
            if type(original) is cst.SimpleStatementLine and any(s in plan.replace_small for s in original.body):
                replacement = [_replaced_small(original, stmt, plan.replace_small) if stmt is new else stmt for stmt in replacement]
            if replacement == [new] and _emptied_guard(original, new):
                replacement = []  # `if use_cuda: model = model.cuda()` once the move went
            if replacement and carried is not None and replacement == [new] and (
                original in plan.main_process_only or original in plan.main_process_first
            ):
                # the lines go on the statement itself, which may join the block put just before
                replacement = [carry.attach(new, carried, at_start=not out)]
                carried = None
                new = replacement[0]
            for stmt in replacement:
                name = plan.rebound.get(stmt) or (plan.rebound.get(original) if stmt is new else None)
                if name is not None:
                    self.rebound[stmt] = name
            if replacement and original in plan.annotations:
                replacement[0] = _with_todo(replacement[0], plan.annotations[original])
            if original in plan.main_process_only and replacement == [new]:
                guard = out[-1] if out and out[-1] is opened else None
                replacement = _main_process_only(new, guard)
                if guard is not None:
                    out.pop()
                opened = replacement[0]
            elif original in plan.launcher_rank_only and replacement == [new]:
                guard = out[-1] if out and out[-1] is ranked else None
                replacement = _main_process_only(new, guard, plan.launcher_rank_only[original])
                if guard is not None:
                    out.pop()
                ranked = replacement[0]
            elif original in plan.main_process_first and replacement == [new]:
                block = out[-1] if out and out[-1] is first else None
                replacement = _main_process_first(new, block)
                if block is not None:
                    out.pop()
                first = replacement[0]
            if replacement:
                put(replacement)
                if lost:
                    carried = lost  # after the replacement, where they were
            else:
                carried = carry.join(carried, carry.lines_of(new), at_start=not out) if carried is not None else carry.lines_of(new)
            put(plan.insert_after.get(original, []))
        return out, carry.footer(carried) if carried is not None else []

    def _moved(self, old: cst.BaseStatement, new: cst.BaseStatement) -> cst.BaseStatement:
        """`new` replaces `old` in the output: a binding cleanup may remove stays known as one."""
        name = self.rebound.pop(old, None)
        if name is not None:
            self.rebound[new] = name
        return new


def _lost_comments(original: cst.BaseStatement, replacement: list[cst.BaseStatement]) -> list[cst.EmptyLine]:
    """The comments of `original` that no statement of `replacement` keeps (those of the statements
    a rule took out of a replaced `if`, say), each on a line of its own."""
    kept = Counter(c for stmt in replacement for c in carry.comments_in(stmt))
    lost = []
    for line in carry.lines_of(original):
        if line.comment is None:
            continue
        if kept[line.comment.value] > 0:
            kept[line.comment.value] -= 1
        else:
            lost.append(line)
    return lost


def _unwrapped(
    original: cst.With, new: cst.With, removed: set[cst.WithItem]
) -> tuple[list[cst.BaseStatement], list[cst.EmptyLine]]:
    """`new` (the rewritten `original`) without the items `removed` names; with none left, its body
    (dedented: libcst indents relative to the block) in its place, the comments of the `with` line
    and of the end of its body kept above and after it."""
    kept = [item for item, before in zip(new.items, original.items) if before not in removed]
    if kept:
        last = kept[-1]
        if last.comma is not cst.MaybeSentinel.DEFAULT:
            kept[-1] = last.with_changes(comma=cst.MaybeSentinel.DEFAULT)
        # comments written beside a removed item (`torch.cuda.device(0),  # the first GPU`) go above
        dropped = [item for item, before in zip(new.items, original.items) if before in removed]
        above = [cst.EmptyLine(comment=c) for item in dropped for c in _comments(item)]
        return [new.with_changes(items=kept, leading_lines=[*new.leading_lines, *above])], []
    body = new.body
    if type(body) is not cst.IndentedBlock:  # `with x: stmt` on one line
        return [cst.SimpleStatementLine(body.body, leading_lines=new.leading_lines)], []
    stmts = list(body.body)
    above = list(new.leading_lines)
    if body.header.comment is not None:  # `with torch.cuda.device(i):  # note`
        above.append(cst.EmptyLine(comment=body.header.comment))
    stmts[0] = stmts[0].with_changes(leading_lines=[*above, *stmts[0].leading_lines])
    footer = [line for line in body.footer if line.comment is not None]
    return stmts, footer


def _comments(node: cst.CSTNode) -> list[cst.Comment]:
    found: list[cst.Comment] = []

    class Comments(cst.CSTVisitor):
        def visit_Comment(self, comment: cst.Comment) -> None:
            found.append(comment)

    node.visit(Comments())
    return found


def _main_process_only(stmt: cst.BaseStatement, guard: cst.BaseStatement | None,
                       test: cst.BaseExpression | None = None) -> list[cst.BaseStatement]:
    """`stmt` inside `if accelerator.is_main_process:` (or `if <test>:`), appended to `guard` (the
    one just before)."""
    if type(guard) is cst.If and type(guard.body) is cst.IndentedBlock:
        body = guard.body
        return [guard.with_changes(body=body.with_changes(body=[*body.body, stmt]))]
    if test is None:
        test = cst.Attribute(cst.Name(ACCELERATOR), cst.Name("is_main_process"))
    inner = stmt.with_changes(leading_lines=[])
    return [cst.If(test=test, body=cst.IndentedBlock([inner]), leading_lines=stmt.leading_lines)]


def _main_process_first(stmt: cst.BaseStatement, block: cst.BaseStatement | None) -> list[cst.BaseStatement]:
    """`stmt` inside `with accelerator.main_process_first():`, appended to `block` (the one just before)."""
    if type(block) is cst.With and type(block.body) is cst.IndentedBlock:
        body = block.body
        # its blank lines stay blank (not indented to the block)
        lines = [line.with_changes(indent=False) if line.comment is None else line for line in stmt.leading_lines]
        stmt = stmt.with_changes(leading_lines=lines)
        return [block.with_changes(body=body.with_changes(body=[*body.body, stmt]))]
    item = cst.Call(cst.Attribute(cst.Name(ACCELERATOR), cst.Name("main_process_first")))
    inner = stmt.with_changes(leading_lines=[])
    return [cst.With(items=[cst.WithItem(item)], body=cst.IndentedBlock([inner]), leading_lines=stmt.leading_lines)]


def _drop_trivial(stmt: cst.BaseStatement) -> list[cst.BaseStatement]:
    """Remove `x` / `x = x` / `a, b = a, b` left behind once a device move was stripped."""
    if type(stmt) is not cst.SimpleStatementLine:
        return [stmt]
    kept = [small for small in stmt.body if not _is_trivial(small)]
    if len(kept) == len(stmt.body):
        return [stmt]
    return _with_body(stmt, kept)


def _emptied_guard(original: cst.BaseStatement, new: cst.BaseStatement) -> bool:
    """An `if` without `else`, testing names and constants only (`if use_cuda:`, `if args.gpu is
    not None:`, `if torch.cuda.is_available():`), whose statements the rewrite all removed (its body is now the `pass` put in their
    place): the test has no effect left, so neither has the `if`."""
    if not (type(original) is cst.If and type(new) is cst.If) or new.orelse is not None:
        return False
    if type(new.body) is not cst.IndentedBlock or not _only_pass(new.body.body):
        return False
    before = original.body.body if type(original.body) is cst.IndentedBlock else ()
    if not before or _only_pass(before):
        return False
    return not _calls_something(original.test)  # last: it generates the code of the test's calls


# Calls that only ask (`if torch.cuda.is_available(): model.cuda()`): a test of them has no effect.
_QUERIES = frozenset({"torch.cuda.is_available", "torch.backends.mps.is_available"})


def _calls_something(test: cst.BaseExpression) -> bool:
    finder = _Effects()
    walk(test, finder)
    return bool(finder.found)


class _Effects(cst.CSTVisitor):
    """Calls (other than `_QUERIES`) and walrus assignments."""

    def __init__(self) -> None:
        self.found: list[cst.CSTNode] = []

    def visit_Call(self, node: cst.Call) -> None:
        if cst.Module([]).code_for_node(node.func) not in _QUERIES or node.args:
            self.found.append(node)

    def visit_NamedExpr(self, node: cst.NamedExpr) -> None:
        self.found.append(node)


def _only_pass(body: Sequence[cst.BaseStatement]) -> bool:
    return all(
        type(stmt) is cst.SimpleStatementLine and all(type(small) is cst.Pass for small in stmt.body)
        for stmt in body
    )


def _without(
    original: cst.SimpleStatementLine, new: cst.BaseStatement, removed: set[cst.BaseSmallStatement]
) -> list[cst.BaseStatement]:
    """`new` (the rewritten `original`) without the small statements `removed` names; [] if none is left."""
    assert type(new) is cst.SimpleStatementLine and len(new.body) == len(original.body)
    kept = [small for small, before in zip(new.body, original.body) if before not in removed]
    return _with_body(new, kept)


def _replaced_small(
    original: cst.SimpleStatementLine,
    new: cst.BaseStatement,
    replaced: dict[cst.BaseSmallStatement, cst.BaseSmallStatement],
) -> cst.BaseStatement:
    """`new` (the rewritten `original`) with the small statements `replaced` names swapped, each
    keeping its semicolon."""
    assert type(new) is cst.SimpleStatementLine and len(new.body) == len(original.body)
    body = [
        replaced[before].with_changes(semicolon=small.semicolon) if before in replaced else small  # type: ignore[attr-defined]
        for small, before in zip(new.body, original.body)
    ]
    return new.with_changes(body=body)


def _with_body(stmt: cst.SimpleStatementLine, kept: list[cst.BaseSmallStatement]) -> list[cst.BaseStatement]:
    if not kept:
        return []
    last = kept[-1]
    if last.semicolon is not cst.MaybeSentinel.DEFAULT:  # type: ignore[attr-defined]
        kept[-1] = last.with_changes(semicolon=cst.MaybeSentinel.DEFAULT)
    return [stmt.with_changes(body=kept)]


def _is_trivial(small: cst.BaseSmallStatement) -> bool:
    module = cst.Module(body=[])
    if type(small) is cst.Expr:
        return type(small.value) in (cst.Name, cst.Attribute)
    if type(small) is cst.Assign and len(small.targets) == 1:
        target = module.code_for_node(small.targets[0].target).replace(" ", "").strip("()")
        value = module.code_for_node(small.value).replace(" ", "").strip("()")
        return target == value
    return False


def _append_argument(call: cst.Call, keyword: bool) -> cst.Call:
    value = cst.Name(ACCELERATOR)
    arg = cst.Arg(value=value, keyword=cst.Name(ACCELERATOR), equal=cst.AssignEqual(
        whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace("")
    )) if keyword else cst.Arg(value=value)
    args = list(call.args)
    if args:
        last = args[-1]
        if last.comma is cst.MaybeSentinel.DEFAULT:
            args[-1] = last.with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
        else:
            arg = arg.with_changes(comma=last.comma)
            args[-1] = last.with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
    return call.with_changes(args=[*args, arg])


def _append_parameter(params: cst.Parameters, keyword_only: bool) -> cst.Parameters:
    new = cst.Param(name=cst.Name(ACCELERATOR))
    if keyword_only:
        star = params.star_arg
        if star is cst.MaybeSentinel.DEFAULT:
            star = cst.ParamStar()
            if not params.kwonly_params:
                # `a: int,\n)` one parameter a line: `a: int,\n*, accelerator,\n)`
                positional, closing = _split_closing(list(params.params))
                return params.with_changes(
                    params=positional, star_arg=star, kwonly_params=[new.with_changes(comma=closing)]
                )
        before = star.comma if isinstance(star, cst.ParamStar) else cst.MaybeSentinel.DEFAULT
        kwonly, closing = _split_closing(list(params.kwonly_params), before)
        return params.with_changes(star_arg=star, kwonly_params=[*kwonly, new.with_changes(comma=closing)])
    positional, closing = _split_closing(list(params.params))
    return params.with_changes(params=[*positional, new.with_changes(comma=closing)])


def _split_closing(
    params: list[cst.Param], before: cst.Comma | cst.MaybeSentinel = cst.MaybeSentinel.DEFAULT
) -> tuple[list[cst.Param], cst.Comma | cst.MaybeSentinel]:
    """The parameters with a comma after the last one, and the comma the appended parameter takes:
    in a list written one parameter a line with a trailing comma (`a: int,\n    b: int,\n)`), the
    last comma (its newline leads to the closing parenthesis) moves to the appended parameter and
    the last one takes its neighbour's, so the new parameter gets a line of its own."""
    if not params:
        return params, cst.MaybeSentinel.DEFAULT
    last = params[-1]
    if isinstance(last.comma, cst.Comma) and isinstance(last.comma.whitespace_after, cst.ParenthesizedWhitespace):
        neighbour = params[-2].comma if len(params) > 1 else before  # `*,` before a lone keyword-only one
        if isinstance(neighbour, cst.Comma) and isinstance(neighbour.whitespace_after, cst.ParenthesizedWhitespace):
            return [*params[:-1], last.with_changes(comma=neighbour)], last.comma
        return params, cst.MaybeSentinel.DEFAULT
    if last.comma is cst.MaybeSentinel.DEFAULT:
        params = [*params[:-1], last.with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))]
    return params, cst.MaybeSentinel.DEFAULT


TODO = "# TODO(accel-migrate): "


def _with_todo(stmt: cst.BaseStatement, messages: list[str]) -> cst.BaseStatement:
    present = {line.comment.value for line in stmt.leading_lines if line.comment is not None}
    new = [cst.EmptyLine(comment=cst.Comment(TODO + m)) for m in messages if TODO + m not in present]
    return stmt.with_changes(leading_lines=[*stmt.leading_lines, *new]) if new else stmt


def annotate(module: cst.Module, plan: EditPlan, line_of: Callable[[cst.CSTNode], int]) -> None:
    """Attach each finding to the innermost statement containing it (`--annotate`)."""
    wanted = {id(f.node): f for f in plan.findings}
    if not wanted:
        return

    class Finder(cst.CSTVisitor):
        def __init__(self) -> None:
            self.statements: list[cst.BaseStatement] = []

        def on_visit(self, node: cst.CSTNode) -> bool:
            if isinstance(node, (cst.SimpleStatementLine, cst.BaseCompoundStatement)):
                self.statements.append(node)
            finding = wanted.get(id(node))
            if finding is not None and self.statements:
                message = f"{finding.code} {finding.message}"
                plan.annotations.setdefault(self.statements[-1], []).append(message)
            return True

        def on_leave(self, original_node: cst.CSTNode) -> None:
            if self.statements and self.statements[-1] is original_node:
                self.statements.pop()

    module.visit(Finder())


class _ToSelfAccelerator(Transformer):
    """In a method, `accelerator` is the instance's: `accelerator.x` -> `self.accelerator.x`.

    Only names in code positions change; an attribute called `accelerator`, a keyword argument or
    a parameter of that name keep their spelling. Descends only towards the `accelerator` names of
    `body` (the method body it transforms): the rest of the body is kept as it is, not rebuilt.
    """

    def __init__(self, instance: str, body: cst.CSTNode) -> None:
        super().__init__()
        self.instance = instance
        self.touched = _paths_to_accelerator(body)

    def on_visit(self, node: cst.CSTNode) -> bool:
        return node in self.touched

    def leave_Name(self, original_node: cst.Name, updated_node: cst.Name) -> cst.BaseExpression:
        if updated_node.value != ACCELERATOR:
            return updated_node
        return cst.Attribute(cst.Name(self.instance), cst.Name(ACCELERATOR))

    def leave_Attribute(self, original_node: cst.Attribute, updated_node: cst.Attribute) -> cst.Attribute:
        if updated_node.attr is original_node.attr:
            return updated_node
        return updated_node.with_changes(attr=original_node.attr)

    def leave_Arg(self, original_node: cst.Arg, updated_node: cst.Arg) -> cst.Arg:
        if updated_node.keyword is original_node.keyword:
            return updated_node
        return updated_node.with_changes(keyword=original_node.keyword)

    def leave_Param(self, original_node: cst.Param, updated_node: cst.Param) -> cst.Param:
        if updated_node.name is original_node.name:
            return updated_node
        return updated_node.with_changes(name=original_node.name)


def _paths_to_accelerator(root: cst.CSTNode) -> set[cst.CSTNode]:
    """The `accelerator` names under `root` and every node on the way down to one of them."""
    found: set[cst.CSTNode] = set()
    path: list[cst.CSTNode] = []

    def visit(node: cst.CSTNode) -> None:
        if type(node) is cst.Name:
            if node.value == ACCELERATOR:
                found.add(node)
                found.update(path)
            return
        path.append(node)
        for child in children(node):
            visit(child)
        path.pop()

    visit(root)
    return found


def _store_accelerator(function: cst.FunctionDef, instance: str) -> cst.FunctionDef:
    """`__init__(..., accelerator)` keeps it: `self.accelerator = accelerator` first thing."""
    body = function.body
    if type(body) is not cst.IndentedBlock:
        return function
    store = cst.parse_statement(f"{instance}.{ACCELERATOR} = {ACCELERATOR}\n")
    statements = list(body.body)
    index = 1 if statements and is_docstring(statements[0]) else 0
    return function.with_changes(body=body.with_changes(body=[*statements[:index], store, *statements[index:]]))
