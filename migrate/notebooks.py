"""Jupyter notebooks: the code cells are migrated as ONE script, then split back into their cells.

The model may be built in one cell and trained in another, so the analysis must see the whole
notebook. The code cells are joined into one script, each preceded by a marker statement
(`__accel_migrate_cell__(N)`: a statement, not a comment, so no rule can delete it together with
the statement it would be attached to). IPython syntax is replaced by placeholder statements before
parsing and restored afterwards: line magics (`%time ...`, `x = %env ...`), shell lines (`!pip ...`,
`files = !ls`), help lines (`obj?`), and whole cell-magic cells (`%%bash ...`, never migrated).

`from __future__ import ...` is hidden the same way: a kernel compiles each cell on its own, so it
is legal at the top of any cell, but in the joined script it would follow the markers and other
cells' code (Python accepts it only at the top of a file). No rule needs it. Imports the rewrite adds
at the top of the script go into the first cell after that cell's own `__future__` imports, and a
changed cell that no longer compiles on its own (a `__future__` import no longer first) leaves the
notebook untouched with that reason.

Only the changed cells' `source` is replaced; outputs, metadata and the rest are kept, and the JSON
is written back in the formatting it was read in (indent, key order, ASCII escaping, final newline),
so the git diff of a migrated notebook is only the changed cells.
"""

from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass, field
from typing import Any

CELL_MARKER = "__accel_migrate_cell__"
MAGIC_MARKER = "__accel_migrate_magic__"
_CELL_LINE = re.compile(rf"^{CELL_MARKER}\((\d+)\)\r?\n?$")
_MAGIC_LINE = re.compile(rf"^([ \t]*){MAGIC_MARKER}\((\d+)\)([ \t]*)(\r?\n)?$")
# `x = %magic`, `x = !cmd`, `%magic`, `!cmd`, `obj?` / `obj??`
_MAGIC_START = r"(?:%%?[A-Za-z_]|![^=])"
_IPYTHON_LINE = re.compile(rf"^[ \t]*(?:{_MAGIC_START}|[\w.\[\], ]+=[ \t]*{_MAGIC_START})|^[ \t]*[\w.]+\?\??[ \t]*$")
# `from __future__ import ...` at the top level of a cell (a cell's statement, never indented)
_FUTURE_LINE = re.compile(r"^from[ \t]+__future__[ \t]+import\b")


class NotebookError(Exception):
    """The notebook cannot be read or mapped back; it is left untouched."""


class NotPython(NotebookError):
    """A notebook of another language: nothing to migrate."""


@dataclass
class Notebook:
    data: dict[str, Any]
    code_cells: list[int]  # indices (into data["cells"]) of the code cells migrated
    texts: dict[int, str]  # cell index -> source text as in the file
    script: str  # the joined script
    magics: list[str] = field(default_factory=list)  # placeholder number -> original line(s)
    futures: set[int] = field(default_factory=set)  # placeholder numbers of `from __future__` imports
    cell_starts: dict[int, int] = field(default_factory=dict)  # cell index -> first script line of its code
    cell_lengths: dict[int, int] = field(default_factory=dict)
    bodies: dict[int, str] = field(default_factory=dict)  # cell index -> its code as joined (IPython hidden)
    formatting: dict[str, Any] = field(default_factory=dict)


def _source_text(source: Any) -> str:
    if isinstance(source, list):
        return "".join(source)
    if isinstance(source, str):
        return source
    raise NotebookError("a cell's source is neither a string nor a list of strings")


def detect_formatting(raw: str, data: Any) -> dict[str, Any] | None:
    """The json.dumps arguments (and final newline) that reproduce `raw` exactly, or None."""
    newline = raw.endswith("\n")
    for indent in (1, 2, 4, 3, None, 0, "\t"):
        for ensure_ascii in (False, True):
            kwargs: dict[str, Any] = {"indent": indent, "ensure_ascii": ensure_ascii}
            if indent is None:
                kwargs["separators"] = (", ", ": ")
            text = json.dumps(data, **kwargs) + ("\n" if newline else "")
            if text == raw:
                return {**kwargs, "newline": newline}
    return None


def load(raw: str) -> Notebook:
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as error:
        raise NotebookError(f"invalid notebook JSON: {error}") from None
    if not isinstance(data, dict) or not isinstance(data.get("cells"), list):
        raise NotebookError("not a notebook (no 'cells' list)")
    language = (
        data.get("metadata", {}).get("kernelspec", {}).get("language")
        or data.get("metadata", {}).get("language_info", {}).get("name")
        or "python"
    )
    if str(language).lower() != "python":
        raise NotPython(f"not a Python notebook (language {language!r})")
    formatting = detect_formatting(raw, data)
    notebook = Notebook(data=data, code_cells=[], texts={}, script="", formatting=formatting or {})
    parts: list[str] = []
    line = 1
    for index, cell in enumerate(data["cells"]):
        if not isinstance(cell, dict) or cell.get("cell_type") != "code":
            continue
        text = _source_text(cell.get("source", ""))
        notebook.code_cells.append(index)
        notebook.texts[index] = text
        parts.append(f"{CELL_MARKER}({index})\n")
        line += 1
        body = _hide_ipython(text, notebook.magics, notebook.futures)
        if body and not body.endswith("\n"):
            body += "\n"
        notebook.cell_starts[index] = line
        notebook.bodies[index] = body
        notebook.cell_lengths[index] = body.count("\n")
        line += body.count("\n")
        parts.append(body)
    notebook.script = "".join(parts)
    return notebook


def _hide_ipython(text: str, magics: list[str], futures: set[int]) -> str:
    lines = text.splitlines(keepends=True)
    if lines and lines[0].lstrip().startswith("%%"):  # a cell magic: the whole cell is not Python
        magics.append(text)
        return f"{MAGIC_MARKER}({len(magics) - 1})\n"
    out = []
    i = 0
    while i < len(lines):
        line = lines[i]
        future = bool(_FUTURE_LINE.match(line))
        if future or _IPYTHON_LINE.match(line):
            group = [line]
            while i + 1 < len(lines) and (
                group[-1].rstrip("\r\n").endswith("\\")  # continued magic or import
                or (future and _open_parenthesis("".join(group)))  # `from __future__ import (a,\n b)`
            ):
                i += 1
                group.append(lines[i])
            if future:
                futures.add(len(magics))
            original = "".join(group)
            magics.append(original)
            indent = line[: len(line) - len(line.lstrip(" \t"))]
            ending = "\n" if original.endswith("\n") else ""
            out.append(f"{indent}{MAGIC_MARKER}({len(magics) - 1}){ending}")
        else:
            out.append(line)
        i += 1
    return "".join(out)


def _open_parenthesis(code: str) -> bool:
    """An import's parenthesised name list is not closed yet (comments aside)."""
    code = re.sub(r"#[^\n]*", "", code)
    return code.count("(") > code.count(")")


def _restore_ipython(text: str, magics: list[str]) -> str:
    out = []
    for line in text.splitlines(keepends=True):
        match = _MAGIC_LINE.match(line)
        if match is None:
            out.append(line)
            continue
        original = magics[int(match.group(2))]
        new_indent = match.group(1)
        first = original.splitlines(keepends=True)[0] if original else ""
        old_indent = first[: len(first) - len(first.lstrip(" \t"))]
        if new_indent != old_indent:  # a rewrite moved it into (or out of) a block: follow it
            original = "".join(
                new_indent + piece[len(old_indent) :] if piece.startswith(old_indent) else piece
                for piece in original.splitlines(keepends=True)
            )
        if match.group(4) and not original.endswith("\n"):
            original += match.group(4)
        out.append(original)
    return "".join(out)


def split(notebook: Notebook, new_script: str) -> dict[int, str]:
    """Cell index -> new source text, for every code cell (equal to the old text when unchanged)."""
    cells: dict[int, list[str]] = {}
    order: list[int] = []
    current: int | None = None
    head: list[str] = []  # anything a rewrite put before the first marker goes to the first cell
    for line in new_script.splitlines(keepends=True):
        match = _CELL_LINE.match(line)
        if match is not None:
            current = int(match.group(1))
            order.append(current)
            cells[current] = []
            continue
        (cells[current] if current is not None else head).append(line)
    if order != notebook.code_cells:
        raise NotebookError("the cell boundaries were lost in the rewrite; the notebook was left untouched")
    result: dict[int, str] = {}
    for position, index in enumerate(order):
        lines = cells[index]
        if position == 0 and head:
            # after the cell's own `from __future__` imports, which must stay first in their cell
            at = _after_leading_futures(lines, notebook.futures)
            lines = lines[:at] + head + lines[at:]
        body = "".join(lines)
        old = notebook.texts[index]
        text = _restore_ipython(body, notebook.magics)
        if not old.endswith("\n") and text.endswith("\n"):  # load() added the final newline
            text = text[:-1]
        if text != old:
            _check_cell_compiles(notebook, index, body)
        result[index] = text
    return result


def _after_leading_futures(lines: list[str], futures: set[int]) -> int:
    """The index just after the cell's leading `from __future__` placeholders (with the blank and
    comment lines between them); 0 when the cell does not start with one."""
    end = 0
    for at, line in enumerate(lines):
        match = _MAGIC_LINE.match(line)
        if match is not None and int(match.group(2)) in futures:
            end = at + 1
        elif line.strip() and not line.lstrip().startswith("#"):
            break
    return end


def _check_cell_compiles(notebook: Notebook, index: int, body: str) -> None:
    """A changed cell must compile on its own, as a kernel compiles it (IPython syntax still hidden,
    `__future__` imports restored): a rewrite that put code above a cell's `__future__` import
    would otherwise give a notebook whose cell fails when run. A cell that did not compile on its
    own before is not judged, nor a cell without a `__future__` import (the engine compiled the
    joined script)."""
    numbers = (int(match.group(2)) for match in map(_MAGIC_LINE.match, body.splitlines(keepends=True)) if match)
    if not any(number in notebook.futures for number in numbers):
        return
    if _compiles(_with_futures(notebook.bodies[index], notebook)) and not _compiles(_with_futures(body, notebook)):
        raise NotebookError(
            f"cell {index + 1} would not run on its own after the rewrite (a `from __future__` import must stay "
            "first in its cell); the notebook was left untouched, please report this with the notebook"
        )


def _with_futures(body: str, notebook: Notebook) -> str:
    """`body` with its `__future__` placeholders replaced by the imports (other IPython syntax kept hidden)."""
    out = []
    for line in body.splitlines(keepends=True):
        match = _MAGIC_LINE.match(line)
        if match is not None and int(match.group(2)) in notebook.futures:
            line = notebook.magics[int(match.group(2))] + (match.group(4) or "")
            line = line if line.endswith("\n") else line + "\n"
        out.append(line)
    return "".join(out)


def _compiles(code: str) -> bool:
    try:
        # top-level `await` is legal in a notebook cell
        compile(code, "<cell>", "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT, dont_inherit=True)
    except (SyntaxError, ValueError):
        return False
    return True


def dump(notebook: Notebook, new_sources: dict[int, str]) -> str:
    """The notebook's JSON with the changed cells' sources replaced, in its original formatting."""
    for index, text in new_sources.items():
        if text == notebook.texts[index]:
            continue
        cell = notebook.data["cells"][index]
        if isinstance(cell.get("source"), list):
            cell["source"] = text.splitlines(keepends=True)
        else:
            cell["source"] = text
    formatting = dict(notebook.formatting) or {"indent": 1, "ensure_ascii": False, "newline": True}
    newline = formatting.pop("newline")
    return json.dumps(notebook.data, **formatting) + ("\n" if newline else "")


def locate(notebook: Notebook, line: int) -> tuple[int | None, int]:
    """Script line -> (cell number as Jupyter shows it, 1-based; line in that cell)."""
    for index in notebook.code_cells:
        start = notebook.cell_starts[index]
        if start <= line < start + max(1, notebook.cell_lengths[index]):
            return index + 1, line - start + 1
    return None, line
