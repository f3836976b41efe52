"""The line each node starts on, as libcst's PositionProvider would report it, at a third of its cost.

Changes and diagnostics name the line of the original file they concern. libcst's
`MetadataWrapper(...).resolve(PositionProvider)` computes full ranges (lines and columns) and also
re-walks the whole tree for batchable providers we never ask for. Here one code-generation pass
records start lines only: a node's syntactic start (where libcst records one: after its leading
comments and blank lines, at its first token) and otherwise the line where its code begins.
tests/migrate/test_positions.py checks that every node gets PositionProvider's start line.

Given the nodes it will be asked about (`wanted`), the pass stops as soon as the last of them is
done: a node's start line is final once its own code is generated (whatever a syntactic start
inside it recorded was recorded by then), and what comes later in the file cannot change it.
Reports usually end before the file does, so this saves the tail of the pass.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

import libcst as cst
from libcst._nodes.internal import CodegenState

_NEWLINES = re.compile(r"\r\n?|\n")


@dataclass(frozen=False)
class _StartLines(CodegenState):
    """A codegen state that only counts lines (no tokens are kept: the code itself is not needed)."""

    line: int = 1
    starts: dict[cst.CSTNode, int] = field(default_factory=dict)
    stack: list[int] = field(default_factory=list)
    wanted: set[cst.CSTNode] | None = None  # None: every node; else stop once all of them are done

    def add_indent_tokens(self) -> None:
        pass  # indentation never contains a newline

    def add_token(self, value: str) -> None:
        if "\n" in value or "\r" in value:
            self.line += len(_NEWLINES.findall(value))

    def before_codegen(self, node: cst.CSTNode) -> None:
        self.stack.append(self.line)

    def after_codegen(self, node: cst.CSTNode) -> None:
        start = self.stack.pop()
        if node not in self.starts:  # a syntactic start recorded inside the node wins
            self.starts[node] = start
        wanted = self.wanted
        if wanted is not None and node in wanted:
            wanted.discard(node)
            if not wanted:
                raise _Done

    def record_syntactic_position(  # type: ignore[override]
        self, node: cst.CSTNode, *, start_node: cst.CSTNode | None = None, end_node: cst.CSTNode | None = None
    ) -> "_Recording":
        # A plain context manager object: a generator-based one per node cost a third of the pass.
        return _Recording(self, node, start_node)


class _Recording:
    __slots__ = ("state", "node", "start_node", "start")

    def __init__(self, state: _StartLines, node: cst.CSTNode, start_node: cst.CSTNode | None) -> None:
        self.state, self.node, self.start_node = state, node, start_node

    def __enter__(self) -> None:
        self.start = self.state.line

    def __exit__(self, *exc: object) -> None:
        starts = self.state.starts
        starts[self.node] = starts[self.start_node] if self.start_node is not None else self.start


class _Done(Exception):
    """Every wanted node has its start line: the rest of the pass is not needed."""


def start_lines(module: cst.Module, wanted: Iterable[cst.CSTNode] | None = None) -> dict[cst.CSTNode, int]:
    """Map every node of `module` to the (1-based) line its code starts on. With `wanted`, only
    those nodes are guaranteed to be in the map (others before the last of them are too)."""
    state = _StartLines(default_indent=module.default_indent, default_newline=module.default_newline)
    if wanted is not None:
        state.wanted = set(wanted)
        if not state.wanted:
            return state.starts
    try:
        module._codegen(state)  # the hook PositionProvider itself uses
    except _Done:
        pass
    return state.starts
