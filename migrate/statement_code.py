"""The code of a rewritten module without generating the statements the rewrite kept.

A rewrite returns a new module that shares most of its top-level statements (the same node objects)
with the module it was made from. `Module.code` generates every one of them again; `StatementCode`
generates only the new ones, and cuts the kept ones from the source text
(`migrate.positions.statement_texts`). Used for every output: a single file's (`migrate.engine`)
and each rewritten module of a unit (`migrate.crossmodule.unit`, which also codes a module again
after adding its imports: only the import lines are new then).

tests/migrate/test_crossmodule_reuse.py checks, on every fixture, that it equals `Module.code`.
"""

from __future__ import annotations

import libcst as cst
from libcst._nodes.internal import CodegenState

from migrate.positions import _BLOCKS, _OPENED, _PARTS, inner_statement_texts, statement_texts

# The fields of a compound statement or clause that hold its blocks or clauses (positions' order).
_BLOCK_FIELDS = {kind: tuple(n for n in _BLOCKS if n in kind.__dataclass_fields__) for kind in _OPENED}


class StatementCode:
    """`Module.code`, with the code of each top-level statement generated once for all the modules
    it is given: a module with imports added (`add_imports`) shares all but a few statements with
    the module it was made from, so its code costs those few statements. The code of a module is
    the code of its header, statements and footer one after the other (at the top level nothing is
    indented); in a module without a trailing newline, the last token (a newline) is dropped, as
    libcst does.

    Given the module the rewrite started from and its source text, the statements the rewrite kept
    (the same node objects) are not generated at all: their code is cut from the source
    (`migrate.positions.statement_texts`). Nor are the statements it kept inside a new compound
    statement (a function with one line changed): where such a statement is generated at the
    indentation it had in the source, its code is a slice of the source too
    (`migrate.positions.inner_statement_texts`); elsewhere (moved into a new block) it is
    generated."""

    def __init__(self, original: cst.Module | None = None, text: str | None = None,
                 counts: dict[int, int] | None = None) -> None:
        self._done: dict[int, tuple[cst.CSTNode, str]] = {}  # the node is kept: its id stays its own
        # the code of a module's last item without its last token (a newline), for modules without
        # a trailing newline (libcst drops that token from the module's code)
        self._last: dict[int, tuple[cst.CSTNode, str]] = {}
        self._settings: tuple[str, str] | None = None  # the modules whose code the source gives
        # the statements and clauses inside the original's compound statements, by id: (the
        # top-level item they are in, the statement or clause they are directly in); made on demand
        self._owners: dict[int, tuple[cst.CSTNode, cst.CSTNode]] | None = None
        self._original = original
        self._counts = counts
        # `counts`: line counts of `original`'s statements, from `start_lines` (by `id`)
        texts = statement_texts(original, text, counts) if original is not None and text is not None else None
        if texts is not None and original is not None:
            self._settings = (original.default_indent, original.default_newline)
            items = (*original.header, *original.body, *original.footer)
            for item in items:
                self._done[id(item)] = (item, texts[id(item)])
            if not original.has_trailing_newline and items:
                # the source is the items' code less that last newline (libcst round-trips it)
                last = texts[id(items[-1])]
                self._last[id(items[-1])] = (items[-1], last[: len(last) - len(original.default_newline)])

    def __call__(self, module: cst.Module) -> str:
        if self._settings is not None and self._settings != (module.default_indent, module.default_newline):
            return module.code
        items = (*module.header, *module.body, *module.footer)
        if module.has_trailing_newline:
            text = "".join(self._code(module, node) for node in items)
            return text or module.code  # an empty module is one newline
        if not items:
            return module.code
        return "".join(self._code(module, node) for node in items[:-1]) + self._last_code(module, items[-1])

    def _last_code(self, module: cst.Module, node: cst.CSTNode) -> str:
        """What `Module.code` does at the end of a module without a trailing newline: the last
        token of its last item (a newline) is dropped."""
        done = self._last.get(id(node))
        if done is None:
            generated, cuts = self._with_cuts(node)
            state = CodegenState(default_indent=module.default_indent, default_newline=module.default_newline)
            generated._codegen(state)
            tokens = state.tokens
            last = next((cut for cut in cuts.values() if tokens and tokens[-1] is cut[1]), None)
            if last is not None:  # a cut statement ends the item: its own last token is the one to drop
                tokens.pop()
                again = CodegenState(default_indent=module.default_indent, default_newline=module.default_newline)
                again.indent_tokens = [last[2]]
                last[0]._codegen(again)
                tokens.extend(again.tokens)
            state.pop_trailing_newline()
            done = self._last[id(node)] = (node, "".join(tokens))
        return done[1]

    def _code(self, module: cst.Module, node: cst.CSTNode) -> str:
        done = self._done.get(id(node))
        if done is None:
            done = self._done[id(node)] = (node, self._generate(module, node))
        return done[1]

    def _generate(self, module: cst.Module, node: cst.CSTNode) -> str:
        """The code of a new top-level item, with the statements it kept from the original (inside
        its blocks) cut from the source (`inner_statement_texts`)."""
        return module.code_for_node(self._with_cuts(node)[0])

    def _with_cuts(self, node: cst.CSTNode) -> tuple[cst.CSTNode, dict[int, tuple[cst.CSTNode, str, str]]]:
        """`node` with the statements it kept from the original standing as `_Cut`s, and those
        statements' (statement, code, indentation) by id."""
        cuts: dict[int, tuple[cst.CSTNode, str, str]] = {}
        if self._settings is None or type(node) not in _PARTS:
            return node, cuts
        owners = self._owners
        if owners is None:
            owners = self._owners = {}
            for item in self._original.body:  # type: ignore[union-attr]
                if type(item) in _PARTS:
                    _index(item, item, owners)
        kept: dict[int, list[cst.CSTNode]] = {}  # by the id of the original top-level item they are in
        _kept(node, owners, kept)
        for key, statements in kept.items():
            item, text = self._done[key]
            opened = {key}
            for stmt in statements:
                parent = owners[id(stmt)][1]
                while id(parent) not in opened:
                    opened.add(id(parent))
                    parent = owners[id(parent)][1]
            texts = inner_statement_texts(item, text, {id(stmt) for stmt in statements}, opened, self._settings[0],
                                          self._counts)
            if texts:
                cuts.update(texts)
        return (_with_cuts(node, cuts) if cuts else node), cuts


def _index(node: cst.CSTNode, top: cst.CSTNode, owners: dict[int, tuple[cst.CSTNode, cst.CSTNode]]) -> None:
    """Record the statements of `node`'s blocks and its clauses, at every depth, in `owners`."""
    for block in _PARTS[type(node)][2](node):
        for value in block if type(block) is tuple or type(block) is list else (block,):  # type: ignore[union-attr]
            kind = type(value)
            if kind is cst.IndentedBlock:
                for stmt in value.body:  # type: ignore[union-attr]
                    owners[id(stmt)] = (top, node)
                    if type(stmt) in _PARTS:
                        _index(stmt, top, owners)
            elif kind in _PARTS:
                owners[id(value)] = (top, node)
                _index(value, top, owners)  # type: ignore[arg-type]


def _kept(node: cst.CSTNode, owners: dict[int, tuple[cst.CSTNode, cst.CSTNode]],
          kept: dict[int, list[cst.CSTNode]]) -> None:
    """The statements of `node`'s blocks (at every depth) that are statements of the original's
    blocks, by the id of the original top-level item they are in."""
    for block in _PARTS[type(node)][2](node):
        for value in block if type(block) is tuple or type(block) is list else (block,):  # type: ignore[union-attr]
            kind = type(value)
            if kind is cst.IndentedBlock:
                for stmt in value.body:  # type: ignore[union-attr]
                    owner = owners.get(id(stmt))
                    if owner is not None:
                        kept.setdefault(id(owner[0]), []).append(stmt)
                    elif type(stmt) in _PARTS:
                        _kept(stmt, owners, kept)
            elif kind in _PARTS:
                _kept(value, owners, kept)  # type: ignore[arg-type]


def _with_cuts(node: cst.CSTNode, cuts: dict[int, tuple[cst.CSTNode, str, str]]) -> cst.CSTNode:
    """`node` for code generation only: the statements of its blocks in `cuts` stand as `_Cut`s."""
    changes = {}
    for name in _BLOCK_FIELDS[type(node)]:
        value = getattr(node, name)
        new = _cut_value(value, cuts)
        if new is not value:
            changes[name] = new
    return node.with_changes(**changes) if changes else node


def _cut_value(value: object, cuts: dict[int, tuple[cst.CSTNode, str, str]]) -> object:
    kind = type(value)
    if kind is tuple or kind is list:
        new = [_cut_value(each, cuts) for each in value]  # type: ignore[attr-defined]
        return tuple(new) if any(a is not b for a, b in zip(new, value)) else value  # type: ignore[call-overload]
    if kind is cst.IndentedBlock:
        body = value.body  # type: ignore[attr-defined]
        new = [
            _Cut(*cuts[id(stmt)]) if id(stmt) in cuts else _with_cuts(stmt, cuts) if type(stmt) in _PARTS else stmt
            for stmt in body
        ]
        return value.with_changes(body=new) if any(a is not b for a, b in zip(new, body)) else value  # type: ignore[attr-defined]
    if kind in _PARTS:
        return _with_cuts(value, cuts)  # type: ignore[arg-type]
    return value


class _Cut:
    """Stands for a kept statement in a block rebuilt for code generation: its code is the slice
    of the source where it is generated at the indentation it had there, else generated."""

    __slots__ = ("node", "code", "indent")

    def __init__(self, node: cst.CSTNode, code: str, indent: str) -> None:
        self.node, self.code, self.indent = node, code, indent

    def _codegen(self, state: CodegenState) -> None:
        if "".join(state.indent_tokens) == self.indent:
            state.tokens.append(self.code)
        else:
            self.node._codegen(state)
