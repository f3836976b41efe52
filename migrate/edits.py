"""The edit plan: what the rules want changed, keyed by the original nodes.

Rules never transform the tree themselves. They read the roles and record edits here; the single
rewriter pass (`migrate/rewriter.py`) applies all of them in one traversal. Nodes are keyed by
identity (libcst nodes hash by identity), so two equal-looking statements stay distinct.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any

import libcst as cst

from migrate.analysis import Scope
from migrate.roles import Finding

ExprEdit = Callable[[cst.Call], cst.BaseExpression]


@dataclass(eq=False)
class Record:
    code: str
    node: cst.CSTNode
    message: str


def edits(factory: Callable[[], object]) -> Any:
    """A field of edits keyed by original nodes: part of `targets()` and of `empty`."""
    return field(default_factory=factory, metadata={"edit": True})


@dataclass(eq=False)
class EditPlan:
    target: str = "runtime"  # which package provides Accelerator: runtime or accelerate
    calls: dict[cst.Call, ExprEdit] = edits(dict)
    replace_stmt: dict[cst.BaseStatement, list[cst.BaseStatement]] = edits(dict)
    insert_before: dict[cst.BaseStatement, list[cst.BaseStatement]] = edits(dict)
    insert_after: dict[cst.BaseStatement, list[cst.BaseStatement]] = edits(dict)
    drop_if_trivial: set[cst.BaseStatement] = edits(set)
    # Small statements dropped from their line (`opt = SGD(...); scaler = GradScaler()`): the
    # line's other statements stay, the line goes only when nothing is left of it.
    remove_small: set[cst.BaseSmallStatement] = edits(set)
    # Small statements replaced on their line (`device = torch.device(...); model = Net()`: the
    # device choice becomes `device = accelerator.device`, the line's other statements stay).
    replace_small: dict[cst.BaseSmallStatement, cst.BaseSmallStatement] = edits(dict)
    new_params: dict[cst.FunctionDef, bool] = edits(dict)  # value: keyword-only
    new_args: dict[cst.Call, bool] = edits(dict)  # value: pass by keyword
    wrap_loop_body: dict[cst.For, cst.BaseExpression] = edits(dict)  # `with <expr>:`
    # `with` statements losing some of their items (original `WithItem`s): with none left, the
    # body takes the statement's place, dedented (`with torch.cuda.device(i):` under the Accelerator).
    unwrap_with: dict[cst.BaseStatement, set[cst.WithItem]] = edits(dict)
    accelerator_kwargs: dict[str, str] = field(default_factory=dict)  # Accelerator(name=code)
    # Accelerator(name=...) arguments that read names of the script (`args.amp`): written only
    # where those names are bound when the Accelerator is created.
    kwarg_reads: dict[str, cst.BaseExpression] = field(default_factory=dict)
    # Options of a removed `DistributedDataParallel` wrap (AM007, `migrate.ddp_options`): option ->
    # (its value, the wrap to report at when the names it reads are not bound where the Accelerator
    # is created); written as `kwargs_handlers=[DistributedDataParallelKwargs(...)]`.
    ddp_kwargs: dict[str, tuple[cst.BaseExpression, cst.CSTNode]] = field(default_factory=dict)
    eval_loaders: list[str] = field(default_factory=list)  # prepared because their metrics are gathered
    unsharded_loaders: set[str] = field(default_factory=set)  # DistributedSampler removed (AM007)
    attributes: dict[cst.Attribute, Callable[[cst.Attribute], cst.BaseExpression]] = edits(dict)
    subscripts: dict[cst.Subscript, Callable[[cst.Subscript], cst.BaseExpression]] = edits(dict)
    comparisons: dict[cst.Comparison, cst.BaseExpression] = edits(dict)  # rank-0 checks
    bool_ops: dict[cst.BooleanOperation, cst.BaseExpression] = edits(dict)  # `a or b` replaced whole
    # Reads of a name given another name (AM010: a metric reads the gathered values under new names
    # while the rest of the loop keeps this process's).
    renames: dict[cst.Name, str] = edits(dict)
    # Reads of a name that select rows of it (AM004: a full-batch step's data tensors, `inputs` ->
    # `inputs[inputs_rows]`): the name read -> the index name.
    row_reads: dict[cst.Name, str] = edits(dict)
    create_at: cst.BaseStatement | None = None  # statement replaced by `accelerator = Accelerator()`
    create_at_order: int = 0
    # a module statement below the device choice that the Accelerator's arguments read (`accum = 4`
    # for `gradient_accumulation_steps=accum`): the Accelerator is created after it (AM005 -> AM001)
    create_after: cst.BaseStatement | None = None
    if_tests: dict[cst.If, cst.BaseExpression] = edits(dict)  # new `if` conditions
    sync_ifs: set[cst.If] = field(default_factory=set)  # ifs now testing `accelerator.sync_gradients`
    keep_left_operand: set[cst.BinaryOperation] = edits(set)  # `loss / N` -> `loss`
    rebound: dict[cst.BaseStatement, str] = field(default_factory=dict)  # new statement -> name; removed if unused
    # Statements run by the main process only: wrapped in `if accelerator.is_main_process:` (with
    # their own edits applied; neighbours of one block share one `if`).
    main_process_only: set[cst.BaseStatement] = edits(set)
    # Statements run by the main process first, then by the others: wrapped in
    # `with accelerator.main_process_first():` (their own edits applied; neighbours share one `with`).
    main_process_first: set[cst.BaseStatement] = edits(set)
    # Statements of a scope no Accelerator reaches, run on the launcher's rank 0 only: wrapped in
    # `if <test>:` (the value: `int(os.environ.get("RANK", "0")) == 0`), with their own edits
    # applied; neighbours of one block share one `if`.
    launcher_rank_only: dict[cst.BaseStatement, cst.BaseExpression] = edits(dict)
    removes_boilerplate: bool = False  # imports may have been left unused (cleanup runs)
    annotations: dict[cst.BaseStatement, list[str]] = edits(dict)  # --annotate comments
    self_accelerator: set[cst.FunctionDef] = edits(set)  # methods using `self.accelerator`
    stores_accelerator: set[cst.FunctionDef] = edits(set)  # `__init__`s given `accelerator`
    imports: set[tuple[str, str]] = field(default_factory=set)
    uses_accelerator: list[Scope] = field(default_factory=list)
    changes: list[Record] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)

    def change(self, code: str, node: cst.CSTNode, message: str) -> None:
        self.changes.append(Record(code, node, message))

    def report(self, code: str, node: cst.CSTNode, message: str, *, unconverted: bool = False) -> None:
        """A diagnostic of `code` at `node`; `unconverted`: training code left unconverted (see `Finding`)."""
        self.findings.append(Finding(code, node, message, unconverted))

    def use_accelerator(self, scope: Scope) -> None:
        if scope not in self.uses_accelerator:
            self.uses_accelerator.append(scope)

    def targets(self) -> set[cst.CSTNode]:
        """Every original node an edit is keyed by (the rewriter only descends towards these)."""
        found: set[cst.CSTNode] = set()
        for name in EDIT_FIELDS:
            found.update(getattr(self, name))
        return found

    @property
    def empty(self) -> bool:
        """No edit at all: the file is left byte-identical."""
        return self.create_at is None and not any(getattr(self, name) for name in EDIT_FIELDS)


# Derived from the fields, so a new kind of edit cannot be forgotten by `targets()` or `empty`.
EDIT_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(EditPlan) if f.metadata.get("edit"))
# The edit fields keyed by statements (or small statements): the rewriter keeps any other statement
# the descent left as it was without looking it up in each of them. Derived from the annotations,
# so a new statement-keyed field cannot be forgotten either.
STATEMENT_FIELDS: tuple[str, ...] = tuple(
    f.name for f in fields(EditPlan)
    if str(f.type).startswith(("dict[cst.BaseStatement", "set[cst.BaseStatement", "dict[cst.BaseSmallStatement",
                               "set[cst.BaseSmallStatement"))
)
