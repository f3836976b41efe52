"""The line each node starts on, as libcst's PositionProvider would report it, at a fraction of its cost.

Changes and diagnostics name the line of the original file they concern. libcst's
`MetadataWrapper(...).resolve(PositionProvider)` computes full ranges (lines and columns) and also
re-walks the whole tree for batchable providers we never ask for. Here a code-generation pass
records start lines only: a node's syntactic start (where libcst records one: after its leading
comments and blank lines, at its first token) and otherwise the line where its code begins.
tests/migrate/test_walk.py checks that every node gets PositionProvider's start line.

Reports name a handful of nodes (`wanted`), and generating the code of the whole file to place
them cost a tenth of the run. So with `wanted` the statements are placed by structure, in one
forward walk:

- a statement with nothing wanted inside only moves the line on by the newlines of its code,
  counted from its tokens (`_line_count`: a plain walk over its fields, a third of a
  code-generation pass, which also tells whether a wanted node is inside);
- a compound statement (and each clause, and an indented block) is opened: its leading lines and
  decorators, then its header (every other field but its blocks), then its blocks (body, handlers,
  orelse, finalbody, cases, footer), in the order libcst generates them;
- a simple statement line with wanted nodes inside is placed by its counts too when it can be: it
  starts after its leading lines, and when its code from there is one line, so does every node in
  it (`_Placer.place_one_line`);
- only a simple statement line spanning lines with a wanted node inside (or a one-line suite), or
  a compound statement's header holding one, goes through the line-counting code generation,
  started at the line the statement begins on (a header's pass stops where the body begins).

A code-generation pass does not depend on where it starts (its tokens are the node's own, plus the
module's default newline and indentation), so a statement's pass started at its line gives each
node inside it the line the whole-file pass gives it. The walk stops once every wanted node has its
line. Calls without `wanted` (a whole-module table), and wanted nodes the walk does not place (a
formatting node), get the whole-file pass, which stops as soon as the last wanted node is done: a node's start line is final once its own code is
generated, and what comes later in the file cannot change it.

The same line counts cut a parsed module's source into the code of its top-level statements
(`statement_texts`): the code of a statement a rewrite kept is then a slice of the input, not a
code-generation pass (`migrate.statement_code.StatementCode`).

tests/migrate/test_positions_wanted.py checks, on every fixture and on layout edge cases, that the
placed lines equal the whole-file pass's (and PositionProvider's) for every statement, every code
node and random sets of nodes, and that `_line_count` equals the newlines of each node's code.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import libcst as cst
from libcst._nodes.internal import CodegenState

from migrate.walk import NOT_NODES, fields_getter

_NEWLINES = re.compile(r"\r\n?|\n")


@dataclass(frozen=False)
class _StartLines(CodegenState):
    """A codegen state that only counts lines (no tokens are kept: the code itself is not needed)."""

    line: int = 1
    starts: dict[cst.CSTNode, int] = field(default_factory=dict)
    stack: list[int] = field(default_factory=list)
    wanted: set[cst.CSTNode] | None = None  # None: every node; else stop once all of them are done
    stop_at: cst.CSTNode | None = None  # stop when this node's code is about to begin

    def add_indent_tokens(self) -> None:
        pass  # indentation never contains a newline

    def add_token(self, value: str) -> None:
        if "\n" in value or "\r" in value:
            self.line += len(_NEWLINES.findall(value))

    def before_codegen(self, node: cst.CSTNode) -> None:
        if node is self.stop_at:
            raise _HeaderDone
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
    __slots__ = ("state", "node", "start_node")

    def __init__(self, state: _StartLines, node: cst.CSTNode, start_node: cst.CSTNode | None) -> None:
        self.state, self.node, self.start_node = state, node, start_node

    def __enter__(self) -> None:
        if self.start_node is None:  # known now: a header's pass may stop before the node ends
            self.state.starts[self.node] = self.state.line

    def __exit__(self, error: type[BaseException] | None, *exc: object) -> None:
        if self.start_node is not None and error is None:  # a stopped pass never reached it
            starts = self.state.starts
            starts[self.node] = starts[self.start_node]


class _Done(Exception):
    """Every wanted node has its start line: the rest of the pass is not needed."""


class _HeaderDone(Exception):
    """A compound statement's header pass reached the statement's body."""


def start_lines(module: cst.Module, wanted: Iterable[cst.CSTNode] | None = None,
                counts: dict[int, int] | None = None) -> dict[cst.CSTNode, int]:
    """Map every node of `module` to the (1-based) line its code starts on. With `wanted`, only
    those nodes are guaranteed to be in the map. `counts`, when given, receives the newlines in
    the code of each top-level item and each statement of an indented block the walk went past
    (by `id`), for `statement_texts` and `inner_statement_texts`."""
    if wanted is None:
        return _whole_pass(module, None)
    left = set(wanted)
    if not left:
        return {}
    if any(type(node) is cst.SimpleWhitespace or type(node) is cst.Newline for node in left):
        return _whole_pass(module, left)  # tokens `_line_count` counts without looking them up
    placer = _Placer(module, left)
    placer.counts = counts
    try:
        placer.place(module, 1)
    except _Done:
        pass
    return placer.starts


def _whole_pass(module: cst.Module, wanted: set[cst.CSTNode] | None) -> dict[cst.CSTNode, int]:
    """The code-generation pass over the whole module (until the last wanted node is done)."""
    state = _StartLines(default_indent=module.default_indent, default_newline=module.default_newline)
    state.wanted = wanted
    try:
        module._codegen(state)  # the hook PositionProvider itself uses
    except _Done:
        pass
    return state.starts


# Compound statements and their clauses, opened by `_Placer`: their fields before the syntactic
# start, then (the header: every other field), then the blocks, in the order libcst generates them.
_LEADING = ("leading_lines", "decorators", "lines_after_decorators")
_BLOCKS = ("body", "handlers", "orelse", "finalbody", "cases", "footer")
_OPENED = (
    cst.If, cst.Else, cst.For, cst.While, cst.With, cst.Try, cst.TryStar, cst.ExceptHandler,
    cst.ExceptStarHandler, cst.Finally, cst.FunctionDef, cst.ClassDef, cst.Match, cst.MatchCase,
)
_Parts = tuple[Callable[[cst.CSTNode], tuple[object, ...]], ...]  # leading, header, blocks getters
_PARTS: dict[type, _Parts] = {}


for _kind in _OPENED:
    _names = [f.name for f in dataclasses.fields(_kind)]
    _PARTS[_kind] = (
        fields_getter(tuple(n for n in _LEADING if n in _names)),
        fields_getter(tuple(n for n in _names if n not in _LEADING and n not in _BLOCKS)),
        fields_getter(tuple(n for n in _BLOCKS if n in _names)),
    )


class _Placer:
    """Places the wanted nodes by the structure of the statements around them (module docstring)."""

    def __init__(self, module: cst.Module, wanted: set[cst.CSTNode]) -> None:
        self.module = module
        self.wanted = wanted  # those not placed yet
        self.ids = frozenset(map(id, wanted))  # id() tests: a node's own __hash__ is Python code
        self.starts: dict[cst.CSTNode, int] = {}
        self.counts: dict[int, int] | None = None  # newlines of each statement passed (`start_lines`)

    def record(self, node: cst.CSTNode, line: int) -> None:
        if id(node) in self.ids:
            self.starts[node] = line
            wanted = self.wanted
            wanted.discard(node)
            if not wanted:
                raise _Done

    def place(self, node: object, line: int) -> int:
        """Place what is wanted in `node` (a node, a sequence of nodes or None) whose code begins
        on `line`; return the line its code ends on (where the next node's code begins)."""
        kind = type(node)
        if kind is tuple or kind is list:
            for item in node:  # type: ignore[attr-defined]
                line = self.place(item, line)
            return line
        if node is None:
            return line
        if kind is cst.IndentedBlock:
            return self.place_block(node, line)  # type: ignore[arg-type]
        if kind is cst.Module:
            self.record(node, line)  # type: ignore[arg-type]
            counts = self.counts
            for item in (*node.header, *node.body, *node.footer):  # type: ignore[attr-defined]
                end = self.place(item, line)
                if counts is not None:
                    counts[id(item)] = end - line
                line = end
            return line
        parts = _PARTS.get(kind)
        if parts is None:  # a simple statement line, a one-line suite, a formatting node
            count = _line_count(node, self.ids)
            if count >= 0:
                return line + count
            if kind is cst.SimpleStatementLine:
                end = self.place_one_line(node, line)  # type: ignore[arg-type]
                if end >= 0:
                    return end
            return self.generate(node, line)  # type: ignore[arg-type]
        leading_of, header_of, blocks_of = parts
        blocks = blocks_of(node)  # type: ignore[arg-type]
        leading = _line_count(leading_of(node), self.ids)  # type: ignore[arg-type]
        header = _line_count(header_of(node), self.ids) if leading >= 0 else -1  # type: ignore[arg-type]
        if header < 0:  # something wanted before the body: generate up to it
            line = self.generate(node, line, stop_at=_first_node(blocks))  # type: ignore[arg-type]
            self.record(node, self.starts[node])  # type: ignore[arg-type]
        else:
            self.record(node, line + leading)  # type: ignore[arg-type]
            line += leading + header
        for block in blocks:
            line = self.place(block, line)
        return line

    def place_block(self, block: cst.IndentedBlock, line: int) -> int:
        count = _line_count(block.header, self.ids)
        if count < 0:
            return self.generate(block, line)
        line += count
        body = block.body
        if body:
            first = body[0]
            if id(block) in self.ids:  # libcst gives a block its first statement's syntactic start
                parts = _PARTS.get(type(first))
                leading = parts[0](first) if parts is not None else first.leading_lines  # type: ignore[attr-defined]
                self.record(block, line + _line_count(leading))
            counts = self.counts
            if counts is None:
                line = self.place(body, line)
            else:  # for `inner_statement_texts`, as for the top-level items
                for stmt in body:
                    end = self.place(stmt, line)
                    counts[id(stmt)] = end - line
                    line = end
        else:
            self.record(block, line)  # a generated `pass`
            line += 1
        return self.place(block.footer, line)

    def place_one_line(self, stmt: cst.SimpleStatementLine, line: int) -> int:
        """A simple statement line holding wanted nodes, placed without generating its code: the
        statement starts after its leading lines, and when its code from there is one line (no
        newline before the one that ends it), so does every node inside it. -1 for any other: a
        wanted node among its leading lines, or inside a statement spanning lines (each node's
        line is then generated)."""
        leading = _line_count(stmt.leading_lines, self.ids)
        if leading < 0:
            return -1
        found: list[cst.CSTNode] = []
        count = _line_count((stmt.body, stmt.trailing_whitespace), self.ids, found)
        if found and count != 1:
            return -1
        start = line + leading
        for node in found:
            self.starts[node] = start
        if id(stmt) in self.ids:
            found.append(stmt)
            self.starts[stmt] = start
        wanted = self.wanted
        for node in found:
            wanted.discard(node)
        if not wanted:
            raise _Done
        return start + count

    def generate(self, node: cst.CSTNode, line: int, stop_at: cst.CSTNode | None = None) -> int:
        """The line-counting code generation of `node` alone, from `line`."""
        state = _StartLines(
            default_indent=self.module.default_indent, default_newline=self.module.default_newline,
            line=line, starts=self.starts, wanted=self.wanted, stop_at=stop_at,
        )
        try:
            node._codegen(state)
        except _HeaderDone:
            pass
        return state.line


def _first_node(blocks: tuple[object, ...]) -> cst.CSTNode | None:
    for block in blocks:
        if type(block) is tuple or type(block) is list:
            if block:
                return block[0]  # type: ignore[index,no-any-return]
        elif block is not None:
            return block  # type: ignore[return-value]
    return None


def statement_texts(module: cst.Module, text: str, counts: dict[int, int] | None = None) -> dict[int, str] | None:
    """The code of each top-level item of `module` (its header lines, statements and footer
    lines), by `id`, cut from `text`, the source `module` was parsed from. At the top level
    nothing is indented and every item ends with its newline, so an item's code is the run of
    whole lines of `text` that `_line_count` counts in it, starting where the previous item's
    ends (libcst prints a parsed module back as its source, byte for byte). A slice costs a
    third of generating the item's code. Without a trailing newline in `text`, the last item's
    code ends with the module's default newline, as libcst generates it (and then drops from the
    module's code). None when `text` cannot be cut so: a byte-order mark, or counts that do not
    add up to its lines. `counts`: the line counts of items `start_lines` already went past."""
    if text.startswith("\ufeff"):
        return None
    if not module.has_trailing_newline:
        if not text or text.endswith(("\n", "\r")):
            return None
        text += module.default_newline
    ends = [match.end() for match in _NEWLINES.finditer(text)]
    if not ends or ends[-1] != len(text):
        return None
    out: dict[int, str] = {}
    line, start = 0, 0
    known = counts or {}
    for item in (*module.header, *module.body, *module.footer):
        count = known.get(id(item))
        line += _line_count(item) if count is None else count
        if line > len(ends):
            return None
        end = ends[line - 1] if line else 0
        out[id(item)] = text[start:end]
        start = end
    return out if line == len(ends) else None


def inner_statement_texts(item: cst.CSTNode, text: str, wanted: set[int], opened: set[int],
                          default_indent: str, counts: dict[int, int] | None = None,
                          ) -> dict[int, tuple[cst.CSTNode, str, str]] | None:
    """The code of some statements inside the top-level compound statement `item`, cut from
    `text` (the code of `item`, as `statement_texts` cuts it), with the indentation each is
    generated at there: {id: (statement, code, indentation)} for the statements of an indented
    block whose `id` is in `wanted`. `opened`: the ids of `item` and of every statement or clause
    between it and a wanted statement (the others are passed by their line counts alone). A
    statement in an indented block spans whole lines: its leading lines, its own lines, and the
    newline that ends it. None when the counts do not add up to the lines of `text`. `counts`:
    the line counts of statements `start_lines` already went past."""
    ends = [match.end() for match in _NEWLINES.finditer(text)]
    out: dict[int, tuple[cst.CSTNode, str, str]] = {}
    known = counts or {}

    def place(node: object, line: int, indent: str) -> int:
        kind = type(node)
        if kind is tuple or kind is list:
            for each in node:  # type: ignore[attr-defined]
                line = place(each, line, indent)
            return line
        if node is None:
            return line
        if kind is cst.IndentedBlock:
            line += _line_count(node.header)  # type: ignore[attr-defined]
            inner = indent + (default_indent if node.indent is None else node.indent)  # type: ignore[attr-defined]
            body = node.body  # type: ignore[attr-defined]
            for stmt in body:
                count = known.get(id(stmt))
                if id(stmt) in wanted:
                    end = line + (_line_count(stmt) if count is None else count)
                    if not line < end <= len(ends):
                        raise _Uncut
                    out[id(stmt)] = (stmt, text[ends[line - 1] if line else 0:ends[end - 1]], inner)
                    line = end
                else:
                    line = line + count if count is not None and id(stmt) not in opened else place(stmt, line, inner)
            return place(node.footer, line + (0 if body else 1), indent)  # type: ignore[attr-defined]
        parts = _PARTS.get(kind)
        if parts is None or id(node) not in opened:
            return line + _line_count(node)
        leading_of, header_of, blocks_of = parts
        line += _line_count(leading_of(node)) + _line_count(header_of(node))  # type: ignore[arg-type]
        for block in blocks_of(node):  # type: ignore[arg-type]
            line = place(block, line, indent)
        return line

    try:
        if place(item, 0, "") != len(ends) or not ends or ends[-1] != len(text):
            return None
    except _Uncut:
        return None
    return out


class _Uncut(Exception):
    """A statement's lines run past the text it is cut from."""


# Per node type: a getter of every field (formatting included) but the module's settings.
_ALL_FIELDS: dict[type, Callable[[cst.CSTNode], tuple[object, ...]]] = {}
_SETTINGS = frozenset({"default_indent", "default_newline", "encoding"})


def _all_fields(kind: type) -> Callable[[cst.CSTNode], tuple[object, ...]]:
    getter = _ALL_FIELDS[kind] = fields_getter(tuple(f.name for f in dataclasses.fields(kind) if f.name not in _SETTINGS))
    return getter


def _line_count(value: object, stop: frozenset[int] = frozenset(), found: list[cst.CSTNode] | None = None) -> int:
    """The newlines in the code of `value` (a node, None, or a sequence of field values): the
    Newline tokens, the newlines inside strings and backslash continuations, and an empty
    indented block's generated `pass` line. -1 if it holds a node whose id is in `stop`
    (never a whitespace or newline token: those are counted without looking them up), unless
    `found` is given: it then receives those nodes, and the count goes on."""
    count = 0
    stack: list[cst.CSTNode] = []
    values = value if type(value) is tuple or type(value) is list else (value,)
    space, newline, name, block = cst.SimpleWhitespace, cst.Newline, cst.Name, cst.IndentedBlock
    getters, not_nodes = _ALL_FIELDS, NOT_NODES
    while True:
        # The commonest nodes (whitespace is two in five, names one in eight) are done in place.
        for value in values:  # type: ignore[attr-defined]
            kind = type(value)
            if kind is space:
                text = value.value  # type: ignore[attr-defined]
                if "\n" in text or "\r" in text:  # a backslash continuation
                    count += len(_NEWLINES.findall(text))
            elif kind is name:
                if id(value) in stop:
                    if found is None:
                        return -1
                    found.append(value)  # type: ignore[arg-type]
                if value.lpar:  # type: ignore[attr-defined]
                    stack.extend(value.lpar)  # type: ignore[attr-defined]
                    stack.extend(value.rpar)  # type: ignore[attr-defined]
            elif kind is newline:
                count += 1
            elif kind is str:
                if "\n" in value or "\r" in value:  # type: ignore[operator]
                    count += len(_NEWLINES.findall(value))  # type: ignore[arg-type]
            elif kind is tuple or kind is list:
                stack.extend(value)  # type: ignore[arg-type]
            elif kind not in not_nodes:
                stack.append(value)  # type: ignore[arg-type]
        if not stack:
            return count
        node = stack.pop()
        if id(node) in stop:
            if found is None:
                return -1
            found.append(node)
        kind = type(node)
        if kind is newline:
            count += 1
            values = ()
            continue
        if kind is block and not node.body:  # type: ignore[attr-defined]
            count += 1
        values = (getters.get(kind) or _all_fields(kind))(node)


