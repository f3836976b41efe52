"""The README's promise: every comment is kept. Over every golden fixture and end-to-end script, no
comment of the input disappears from the output, unless a rule says why: the one exception is a
trailing pragma (`# noqa`, `# type: ignore`, ...) of a removed line, which applied to that line only
(`migrate/carry.py`). Also the blank-line structure a removed statement leaves (carry.join)."""

from __future__ import annotations

import io
import shlex
import tokenize
from collections import Counter
from pathlib import Path

import pytest

from migrate.carry import is_pragma
from migrate.cli import options_from_flags
from migrate.engine import Options, migrate_source

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
CASES = sorted([*FIXTURES.glob("*/*.in.py"), *FIXTURES.glob("scripts/*.py")])


def _comments(text: str) -> Counter[str]:
    tokens = tokenize.generate_tokens(io.StringIO(text).readline)
    return Counter(t.string.strip() for t in tokens if t.type == tokenize.COMMENT)


def _options(text: str) -> Options:
    first = text.splitlines()[0] if text else ""
    if first.startswith("# flags:"):
        return options_from_flags(shlex.split(first.removeprefix("# flags:")))
    return Options()


@pytest.mark.parametrize("case", CASES, ids=lambda p: f"{p.parent.name}/{p.name.removesuffix('.py')}")
def test_no_comment_disappears(case: Path) -> None:
    text = case.read_text()
    result = migrate_source(text, str(case), _options(text))
    output = result.new_text if result.new_text is not None else text
    lost = _comments(text) - _comments(output)
    unexplained = {c: n for c, n in lost.items() if not is_pragma(c)}
    assert not unexplained, f"comments deleted by the rewrite: {unexplained}"


def test_the_pragma_exception_is_used_by_a_case() -> None:
    """The exception is not vacuous: a `# noqa` on a device line the cleanup removes goes with it."""
    case = FIXTURES / "create_accelerator" / "device_ifexp_module_level.in.py"
    text = case.read_text()
    output = migrate_source(text, str(case), Options()).new_text
    assert output is not None
    assert _comments(text) - _comments(output) == Counter({"# noqa: E501": 1})


def _migrate(text: str) -> str:
    result = migrate_source(text, "t.py", Options())
    assert result.error is None and result.new_text is not None
    return result.new_text


HEAD = "import torch\nimport torch.nn as nn\nfrom torch.utils.data import DataLoader, TensorDataset\n"
LOOP = (
    "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
    "loader = DataLoader(TensorDataset(torch.randn(8, 4), torch.randn(8, 1)), batch_size=4)\n"
    "for x, y in loader:\n"
    "    x, y = x.to(device), y.to(device)\n"
    "    loss = nn.functional.mse_loss(model(x), y)\n"
    "    optimizer.zero_grad()\n"
    "    loss.backward()\n"
    "    optimizer.step()\n"
)


def test_removed_statement_set_apart_leaves_one_gap_not_two() -> None:
    out = _migrate(HEAD + 'device = "cuda"\nmodel = nn.Linear(4, 1)\n\nmodel.to(device)\n\n' + LOOP)
    assert "model = nn.Linear(4, 1)\n\noptimizer = " in out


def test_removed_statement_keeps_its_comment_paragraphs() -> None:
    out = _migrate(
        HEAD + 'device = "cuda"\nmodel = nn.Linear(4, 1)\n\n# first note\n\n# move it\nmodel.to(device)  # to the GPU\n' + LOOP
    )
    assert "model = nn.Linear(4, 1)\n\n# first note\n\n# move it\n# to the GPU\noptimizer = " in out


def test_block_does_not_start_with_a_blank_line_the_removed_statement_lacked() -> None:
    loop = LOOP.replace("    x, y = x.to(device), y.to(device)\n", "    x, y = x.to(device), y.to(device)\n\n")
    out = _migrate(HEAD + 'device = "cuda"\nmodel = nn.Linear(4, 1).to(device)\n' + loop)
    assert "with accelerator.accumulate(model):\n        loss = " in out


def test_comments_of_an_emptied_block_stay_above_its_pass() -> None:
    src = HEAD + (
        'device = "cuda"\nmodel = nn.Linear(4, 1)\nuse_gpu = True\n'
        "try:\n    # the move\n    model.to(device)\nexcept RuntimeError:\n    raise\n"
    ) + LOOP
    out = _migrate(src)
    assert "try:\n    # the move\n    pass\nexcept RuntimeError:" in out


def test_comments_are_read_in_libcsts_own_child_order_on_every_fixture_node() -> None:
    """`carry` reads a node's fields in the order libcst's `children` lists them (without the
    rebuild `children` costs): equal on every node of every fixture input."""
    import libcst as cst

    from migrate.carry import children_in_order

    seen_types: set[type] = set()
    for path in CASES:
        stack: list[cst.CSTNode] = [cst.parse_module(path.read_text())]
        while stack:
            node = stack.pop()
            expected = list(node.children)
            assert children_in_order(node) == expected, (path, type(node).__name__)
            seen_types.add(type(node))
            stack.extend(expected)
    assert {cst.FunctionDef, cst.Call, cst.Comment, cst.TrailingWhitespace, cst.ParenthesizedWhitespace} <= seen_types
