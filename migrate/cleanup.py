"""Remove what the rewrite left unused: rank bindings it rebound, imports whose uses it removed.

Runs on the rewritten module, only when a rule scheduled something. Only names the rewrite made
unused go: an import the original script never used stays (it is not ours to remove).
"""

from __future__ import annotations

from collections import Counter

import libcst as cst

from migrate.names import dotted_name

# Imports whose uses the rules remove (distributed and AMP boilerplate).
_BOILERPLATE_PREFIXES = (
    "os",
    "torch.distributed",
    "torch.nn.parallel",
    "torch.utils.data.distributed",
    "torch.utils.data.DistributedSampler",
    "torch.cuda.amp",
    "torch.amp",
    "torch.multiprocessing",
)


class _NameCounter(cst.CSTVisitor):
    """Counts names as they are read or bound in code (not attribute names, keywords or imports)."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()

    def visit_Name(self, node: cst.Name) -> None:
        self.counts[node.value] += 1

    def visit_Attribute(self, node: cst.Attribute) -> bool:
        node.value.visit(self)
        return False

    def visit_Arg(self, node: cst.Arg) -> bool:
        node.value.visit(self)
        return False

    def visit_Import(self, node: cst.Import) -> bool:
        return False

    def visit_ImportFrom(self, node: cst.ImportFrom) -> bool:
        return False


def _counts(node: cst.CSTNode) -> Counter[str]:
    counter = _NameCounter()
    node.visit(counter)
    return counter.counts


def remove_unused(original: cst.Module, new: cst.Module, rebound: dict[cst.BaseStatement, str]) -> cst.Module:
    before = _counts(original)
    after = _counts(new)
    dead_statements = {id(stmt) for stmt, name in rebound.items() if after[name] <= 1}
    if dead_statements:
        new = new.visit(_StatementRemover(dead_statements))
        after = _counts(new)
    new = new.visit(_ImportRemover(before, after))
    return _keep_file_start(original, new)


def _keep_file_start(original: cst.Module, new: cst.Module) -> cst.Module:
    """A removed first statement must not leave the file starting with blank lines."""
    if not (original.body and new.body) or original.body[0].leading_lines:
        return new
    first = new.body[0]
    lines = list(first.leading_lines)
    while lines and lines[0].comment is None:
        lines.pop(0)
    if len(lines) == len(first.leading_lines):
        return new
    return new.with_changes(body=[first.with_changes(leading_lines=lines), *new.body[1:]])


class _StatementRemover(cst.CSTTransformer):
    def __init__(self, dead: set[int]) -> None:
        super().__init__()
        self.dead = dead

    def on_leave(self, original_node: cst.CSTNode, updated_node: cst.CSTNode):  # type: ignore[no-untyped-def]
        if id(original_node) in self.dead:
            return cst.RemoveFromParent()
        return updated_node


class _ImportRemover(cst.CSTTransformer):
    def __init__(self, before: Counter[str], after: Counter[str]) -> None:
        super().__init__()
        self.before = before
        self.after = after

    def _made_unused(self, local: str) -> bool:
        return self.before[local] > 0 and self.after[local] == 0

    def leave_Import(self, original_node: cst.Import, updated_node: cst.Import):  # type: ignore[no-untyped-def]
        kept = []
        for alias in updated_node.names:
            dotted = dotted_name(alias.name) or ""
            local = alias.asname.name.value if alias.asname and isinstance(alias.asname.name, cst.Name) else dotted.split(".")[0]
            if _is_boilerplate(dotted) and self._made_unused(local):
                continue
            kept.append(alias)
        return self._rebuild(updated_node, kept)

    def leave_ImportFrom(self, original_node: cst.ImportFrom, updated_node: cst.ImportFrom):  # type: ignore[no-untyped-def]
        if isinstance(updated_node.names, cst.ImportStar) or updated_node.module is None:
            return updated_node
        module = dotted_name(updated_node.module) or ""
        kept = []
        for alias in updated_node.names:
            name = alias.name.value if isinstance(alias.name, cst.Name) else ""
            local = alias.asname.name.value if alias.asname and isinstance(alias.asname.name, cst.Name) else name
            if _is_boilerplate(f"{module}.{name}") and self._made_unused(local):
                continue
            kept.append(alias)
        return self._rebuild(updated_node, kept)

    @staticmethod
    def _rebuild(node, kept):  # type: ignore[no-untyped-def]
        if len(kept) == len(node.names):
            return node
        if not kept:
            return cst.RemoveFromParent()
        kept[-1] = kept[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
        if isinstance(node, cst.ImportFrom) and node.rpar is not None and len(kept) == 1:
            return node.with_changes(names=kept, lpar=None, rpar=None)
        return node.with_changes(names=kept)


def _is_boilerplate(qualified: str) -> bool:
    return any(qualified == p or qualified.startswith(p + ".") for p in _BOILERPLATE_PREFIXES)
