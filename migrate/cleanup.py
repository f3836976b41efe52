"""Remove what the rewrite left unused: rank and device bindings it rebound, imports whose uses it
removed.

Runs on the rewritten module only when a rule scheduled something. Only names the rewrite made
unused go: an import the original script never used stays (it is not ours to remove). Uses are
counted as code tokens (names in strings and comments do not count). A removed line's comments
and blank lines go to the next statement kept (`carry.py`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import libcst as cst

from migrate import carry
from migrate.names import dotted_name
from migrate.transform import Transformer
from migrate.walk import children

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
    "functools",  # `functools.partial(...)` that built a wrap policy for a removed `FSDP(...)`
    # a spawn launcher's rendezvous: `subprocess` asked SLURM for the host, `random` drew the port
    "subprocess",
    "random",
    # loggers whose calls AM012 turned into the tracker API
    "torch.utils.tensorboard",
    "tensorboardX",
    "wandb",
)


def name_uses(*roots: cst.CSTNode) -> Counter[str]:
    """How often each name occurs in code under `roots`: a read, a binding, an import, a keyword
    argument; not an attribute after a dot, not inside strings (f-string fields are code) or comments."""
    counts: Counter[str] = Counter()
    stack = list(roots)
    while stack:
        node = stack.pop()
        node_type = type(node)
        if node_type is cst.Name:
            counts[node.value] += 1
        elif node_type is cst.Attribute:
            stack.append(node.value)
        else:
            stack.extend(children(node))
    return counts


def _on_namespace(name: str) -> bool:
    return "." in name and not name.startswith("self.")


def remove_unused(original: cst.Module, new: cst.Module, rebound: dict[cst.BaseStatement, str]) -> cst.Module:
    dead, unused_imports = removals(original, new, rebound)
    if not dead and not unused_imports:
        return new
    return new.visit(_Remover(dead, unused_imports, _paths_to_removals(new, dead, bool(unused_imports))))


def removals(
    original: cst.Module, new: cst.Module, rebound: dict[cst.BaseStatement, str]
) -> tuple[set[int], set[str]]:
    """What `remove_unused` drops from `new`: the ids of the dead statements, the unused import names."""
    uses = name_uses(new)
    # `args.device = accelerator.device` stays: the namespace carries it to code this module may
    # not see (another module, a `getattr`).
    dead = [stmt for stmt, name in rebound.items() if uses[name] <= 1 and not _on_namespace(name)]
    dead_uses = name_uses(*dead)
    imports = [stmt for stmt in new.body if _is_import_line(stmt)]
    import_uses = name_uses(*imports)
    original_uses: Counter[str] | None = None  # counted only for an import the output no longer uses
    unused_imports = set()
    for local in _boilerplate_locals(imports):
        in_imports = import_uses[local]
        if uses[local] - in_imports - dead_uses[local] > 0:
            continue  # still used
        if original_uses is None:
            original_uses = name_uses(original)
        if original_uses[local] > in_imports:  # used before the rewrite
            unused_imports.add(local)
    return {id(stmt) for stmt in dead}, unused_imports


def _paths_to_removals(module: cst.Module, dead: set[int], imports: bool) -> set[cst.CSTNode]:
    """The nodes `_Remover` descends into: the module and every node on the way down to a dead
    statement line or (when aliases go) an import statement. Everything else is kept as it is, not
    rebuilt. Statements never sit inside expressions, so the search does not enter them."""
    touched: set[cst.CSTNode] = {module}
    path: list[cst.CSTNode] = []

    def visit(node: cst.CSTNode) -> None:
        node_type = type(node)
        if (node_type is cst.SimpleStatementLine and id(node) in dead) or (
            imports and node_type in (cst.Import, cst.ImportFrom)
        ):
            touched.update(path)  # the node itself needs no descent: its `leave_` runs all the same
            return
        path.append(node)
        for child in children(node):
            if not _is_expression(type(child)):
                visit(child)
        path.pop()

    visit(module)
    return touched


_EXPRESSION_TYPES: dict[type, bool] = {}


def _is_expression(node_type: type) -> bool:
    """Cached per type (isinstance against libcst's abstract classes is slow)."""
    found = _EXPRESSION_TYPES.get(node_type)
    if found is None:
        found = _EXPRESSION_TYPES[node_type] = issubclass(node_type, cst.BaseExpression)
    return found


def _is_import_line(stmt: cst.BaseStatement) -> bool:
    return type(stmt) is cst.SimpleStatementLine and all(
        type(small) in (cst.Import, cst.ImportFrom) for small in stmt.body
    )


def _boilerplate_locals(imports: list[cst.BaseStatement]) -> set[str]:
    found: set[str] = set()
    for stmt in imports:
        assert type(stmt) is cst.SimpleStatementLine
        for small in stmt.body:
            for qualified, local in _aliases(small):
                if _is_boilerplate(qualified):
                    found.add(local)
    return found


def _aliases(small: cst.BaseSmallStatement) -> list[tuple[str, str]]:
    """(qualified name, local name) for each alias of an import statement."""
    pairs: list[tuple[str, str]] = []
    if type(small) is cst.Import:
        for alias in small.names:
            dotted = dotted_name(alias.name) or ""
            local = _asname(alias) or dotted.split(".")[0]
            pairs.append((dotted, local))
    elif type(small) is cst.ImportFrom and small.module is not None and type(small.names) is not cst.ImportStar:
        module = dotted_name(small.module) or ""
        for alias in small.names:
            name = alias.name.value if type(alias.name) is cst.Name else ""
            pairs.append((f"{module}.{name}", _asname(alias) or name))
    return pairs


def _asname(alias: cst.ImportAlias) -> str | None:
    if alias.asname is not None and type(alias.asname.name) is cst.Name:
        return alias.asname.name.value
    return None


def _is_boilerplate(qualified: str) -> bool:
    return any(qualified == p or qualified.startswith(p + ".") for p in _BOILERPLATE_PREFIXES)


class _Remover(Transformer):
    """Drops the dead statements and the unused import aliases (and emptied import lines).
    Descends only into `touched` (`_paths_to_removals`): the rest of the module is not rebuilt."""

    def __init__(self, dead: set[int], unused_imports: set[str], touched: set[cst.CSTNode]) -> None:
        super().__init__()
        self.dead = dead
        self.unused = unused_imports
        self.touched = touched
        self.gone: dict[int, list[cst.EmptyLine]] = {}  # removed statement line -> its lines (carry.py)

    def on_visit(self, node: cst.CSTNode) -> bool:
        return node in self.touched

    def leave_Module(self, original_node: cst.Module, updated_node: cst.Module) -> cst.Module:
        body, footer = self._carry(original_node.body, updated_node.body)
        if body is None:
            return updated_node
        return updated_node.with_changes(body=body, footer=[*footer, *updated_node.footer])

    def leave_IndentedBlock(self, original_node: cst.IndentedBlock, updated_node: cst.IndentedBlock) -> cst.IndentedBlock:
        body, footer = self._carry(original_node.body, updated_node.body)
        if body is None:
            return updated_node
        if not body:  # not reached: a block keeps a statement that is not a dead binding or an import
            body = [cst.SimpleStatementLine([cst.Pass()], leading_lines=carry.inside(footer))]
            footer = []
        return updated_node.with_changes(body=body, footer=[*footer, *updated_node.footer])

    def _carry(
        self, originals: Sequence[cst.BaseStatement], updated: Sequence[cst.BaseStatement]
    ) -> tuple[list[cst.BaseStatement] | None, list[cst.EmptyLine]]:
        """The lines of the statements removed from this block (`self.gone`) go above the next
        statement kept, or to the footer (`carry.py`). None: nothing was removed here."""
        if not any(id(stmt) in self.gone for stmt in originals):
            return None, []
        kept = iter(updated)
        out: list[cst.BaseStatement] = []
        carried: list[cst.EmptyLine] | None = None
        for original in originals:
            lines = self.gone.pop(id(original), None)
            if lines is not None:
                carried = lines if carried is None else carry.join(carried, lines, at_start=not out)
                continue
            stmt = next(kept)
            if carried is not None:
                stmt = carry.attach(stmt, carried, at_start=not out)
                carried = None
            out.append(stmt)
        return out, carry.footer(carried) if carried is not None else []

    def leave_SimpleStatementLine(self, original_node: cst.SimpleStatementLine, updated_node: cst.SimpleStatementLine):  # type: ignore[no-untyped-def]
        if id(original_node) in self.dead or not updated_node.body:
            # a dead binding, or an import line none of whose names is left
            self.gone[id(original_node)] = carry.lines_of(original_node)
            return cst.RemoveFromParent()
        return updated_node

    def leave_Import(self, original_node: cst.Import, updated_node: cst.Import):  # type: ignore[no-untyped-def]
        kept = [a for a in updated_node.names if (_asname(a) or (dotted_name(a.name) or "").split(".")[0]) not in self.unused
                or not _is_boilerplate(dotted_name(a.name) or "")]
        return _rebuild(updated_node, kept)

    def leave_ImportFrom(self, original_node: cst.ImportFrom, updated_node: cst.ImportFrom):  # type: ignore[no-untyped-def]
        if type(updated_node.names) is cst.ImportStar or updated_node.module is None:
            return updated_node
        module = dotted_name(updated_node.module) or ""
        kept = []
        for alias in updated_node.names:
            name = alias.name.value if type(alias.name) is cst.Name else ""
            if (_asname(alias) or name) in self.unused and _is_boilerplate(f"{module}.{name}"):
                continue
            kept.append(alias)
        return _rebuild(updated_node, kept)


def _rebuild(node, kept):  # type: ignore[no-untyped-def]
    if len(kept) == len(node.names):
        return node
    if not kept:
        return cst.RemoveFromParent()
    kept[-1] = kept[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
    if type(node) is cst.ImportFrom and node.rpar is not None and len(kept) == 1:
        return node.with_changes(names=kept, lpar=None, rpar=None)
    return node.with_changes(names=kept)
