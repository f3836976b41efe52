"""Add `from <module> import <name>` after the module's leading imports.

A direct insertion: libcst's AddImportsVisitor resolves matchers over the whole tree and cost more
than half of a file's migration time.
"""

from __future__ import annotations

import libcst as cst

from migrate.names import dotted_name


def add_imports(module: cst.Module, wanted: set[tuple[str, str]]) -> cst.Module:
    body = list(module.body)
    missing = sorted(item for item in wanted if not _imported(body, *item))
    if not missing:
        return module
    index = _end_of_leading_imports(body)
    new = [_import_from(source, name) for source, name in missing]
    if index < len(body) and not _is_import(body[index]) and not body[index].leading_lines:
        body[index] = body[index].with_changes(leading_lines=[cst.EmptyLine()])
    return module.with_changes(body=[*body[:index], *new, *body[index:]])


def _import_from(source: str, name: str) -> cst.SimpleStatementLine:
    """`from <source> import <name>`: the statement a parse of that line gives, built directly."""
    module: cst.Attribute | cst.Name = cst.Name(source.split(".")[0])
    for part in source.split(".")[1:]:
        module = cst.Attribute(module, cst.Name(part))
    return cst.SimpleStatementLine([cst.ImportFrom(module=module, names=[cst.ImportAlias(cst.Name(name))])])


def _imported(body: list[cst.BaseStatement], source: str, name: str) -> bool:
    for stmt in body:
        if type(stmt) is not cst.SimpleStatementLine:
            continue
        for small in stmt.body:
            if (
                type(small) is cst.ImportFrom
                and small.module is not None
                and dotted_name(small.module) == source
                and type(small.names) is not cst.ImportStar
                and any(type(a.name) is cst.Name and a.name.value == name and a.asname is None for a in small.names)
            ):
                return True
    return False


def _end_of_leading_imports(body: list[cst.BaseStatement]) -> int:
    """Index just after the docstring, `__future__` imports and imports at the top of the module."""
    end = 0
    for index, stmt in enumerate(body):
        if _is_import(stmt) or (index == 0 and is_docstring(stmt)):
            end = index + 1
        else:
            break
    return end


def _is_import(stmt: cst.BaseStatement) -> bool:
    return isinstance(stmt, cst.SimpleStatementLine) and all(
        isinstance(small, (cst.Import, cst.ImportFrom)) for small in stmt.body
    )


def is_docstring(stmt: cst.BaseStatement) -> bool:
    """A string expression statement (a module's or function's docstring when it comes first)."""
    return (
        isinstance(stmt, cst.SimpleStatementLine)
        and len(stmt.body) == 1
        and isinstance(stmt.body[0], cst.Expr)
        and isinstance(stmt.body[0].value, (cst.SimpleString, cst.ConcatenatedString))
    )
