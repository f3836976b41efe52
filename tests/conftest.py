"""Shared pytest configuration: the --update-fixtures flag for golden files."""

from __future__ import annotations

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--update-fixtures",
        action="store_true",
        help="Rewrite the golden .out.py/.diagnostics files from the current code (the run then fails; "
        "review `git diff fixtures/`).",
    )
