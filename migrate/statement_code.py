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

from migrate.positions import statement_texts


class StatementCode:
    """`Module.code`, with the code of each top-level statement generated once for all the modules
    it is given: a module with imports added (`add_imports`) shares all but a few statements with
    the module it was made from, so its code costs those few statements. The code of a module is
    the code of its header, statements and footer one after the other (at the top level nothing is
    indented); in a module without a trailing newline, the last token (a newline) is dropped, as
    libcst does.

    Given the module the rewrite started from and its source text, the statements the rewrite kept
    (the same node objects) are not generated at all: their code is cut from the source
    (`migrate.positions.statement_texts`)."""

    def __init__(self, original: cst.Module | None = None, text: str | None = None,
                 counts: dict[int, int] | None = None) -> None:
        self._done: dict[int, tuple[cst.CSTNode, str]] = {}  # the node is kept: its id stays its own
        # the code of a module's last item without its last token (a newline), for modules without
        # a trailing newline (libcst drops that token from the module's code)
        self._last: dict[int, tuple[cst.CSTNode, str]] = {}
        self._settings: tuple[str, str] | None = None  # the modules whose code the source gives
        # `counts`: line counts of `original`'s top-level items, from `start_lines` (by `id`)
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
            state = CodegenState(default_indent=module.default_indent, default_newline=module.default_newline)
            node._codegen(state)
            state.pop_trailing_newline()
            done = self._last[id(node)] = (node, "".join(state.tokens))
        return done[1]

    def _code(self, module: cst.Module, node: cst.CSTNode) -> str:
        done = self._done.get(id(node))
        if done is None:
            done = self._done[id(node)] = (node, module.code_for_node(node))
        return done[1]
