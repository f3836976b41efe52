"""`start_lines(module, wanted)` stops early yet gives each wanted node the line the full pass gives it."""

from __future__ import annotations

import random
from pathlib import Path

import libcst as cst
import pytest

from migrate.positions import start_lines

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
SOURCES = sorted(FIXTURES.rglob("*.py"))


@pytest.mark.parametrize("path", SOURCES, ids=[str(p.relative_to(FIXTURES)) for p in SOURCES])
def test_wanted_nodes_get_the_full_pass_line(path: Path) -> None:
    module = cst.parse_module(path.read_text())
    full = start_lines(module)
    nodes = list(full)  # every node, in the order the pass finishes them
    rng = random.Random(path.name)
    for size in (1, 3, 12):
        wanted = rng.sample(nodes, min(size, len(nodes)))
        partial = start_lines(module, wanted)
        assert {n: partial.get(n) for n in wanted} == {n: full[n] for n in wanted}


def test_the_pass_stops_after_the_last_wanted_node() -> None:
    module = cst.parse_module("a = 1\nif a:\n    b = 2\nc = 3\nd = 4\n")
    first = module.body[0]
    partial = start_lines(module, [first])
    assert partial[first] == 1 and module.body[-1] not in partial
    assert start_lines(module, [module.body[-1]])[module.body[-1]] == 5
