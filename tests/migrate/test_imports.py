"""`imports.add_imports` builds each `from <module> import <name>` line as the parser would."""

from __future__ import annotations

import libcst as cst
import pytest

from migrate.imports import _import_from, add_imports


@pytest.mark.parametrize(("source", "name"), [("runtime", "Accelerator"), ("accelerate.utils", "set_seed"), ("a.b.c", "d")])
def test_import_line_is_the_parsed_line(source: str, name: str) -> None:
    assert _import_from(source, name).deep_equals(cst.parse_statement(f"from {source} import {name}\n"))


def test_imports_go_after_the_leading_imports_once() -> None:
    module = cst.parse_module('"""doc"""\nimport os\nfrom runtime import Accelerator\nx = 1\n')
    new = add_imports(module, {("runtime", "Accelerator"), ("accelerate.utils", "set_seed")})
    assert new.code == '"""doc"""\nimport os\nfrom runtime import Accelerator\nfrom accelerate.utils import set_seed\n\nx = 1\n'
