"""The text pre-filter (`migrate.engine.mentions_torch`) is sound: whatever it rejects, the engine
run without it changes nothing and reports nothing. Checked on every fixture, on tricky spellings
of what the rules act on, and on a sample of the installed torch package's own sources.

"Without it" keeps the product's scope: a file that never mentions `torch` is out of scope by
design (fixtures/whole_file/prefiltered_no_torch.in.py), so only that test stays on."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

import migrate.engine
from migrate.engine import Options, mentions_torch, migrate_source
from migrate.results import FileResult
from migrate.runner import migrate_text

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
INPUTS = sorted([*FIXTURES.glob("*/*.in.py"), *FIXTURES.glob("scripts/*.py")])


def unfiltered(text: str, path: str, monkeypatch: pytest.MonkeyPatch) -> FileResult:
    """The engine's result with the pre-filter reduced to its scope test (every text that mentions
    torch is parsed)."""
    with monkeypatch.context() as patch:
        patch.setattr(migrate.engine, "mentions_torch", lambda text: "torch" in text)
        return migrate_text(text, path, Options())


def untouched(result: FileResult) -> bool:
    return result.new_text is None and not result.changes and not result.diagnostics


def assert_sound(text: str, path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    if mentions_torch(text):
        return
    result = unfiltered(text, path, monkeypatch)
    assert result.error is not None or untouched(result), (
        f"{path}: the pre-filter skips it, but unfiltered it gets {result.changes} {result.diagnostics}"
    )


@pytest.mark.parametrize("case", INPUTS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_fixture_rejected_only_when_nothing_to_do(case: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    text = case.read_text()
    assert_sound(text, str(case), monkeypatch)
    if not untouched(migrate_source(text, str(case))):
        assert mentions_torch(text)


# Spellings the engine acts on (each gets a change or a diagnostic unfiltered), written to dodge
# a naive text search: continuation lines, comments inside brackets, aliases, CR line endings.
TRICKY = {
    "continued_backward": "import torch\nloss = torch.ones(1)\nloss.\\\n    backward()\n",
    "comment_before_name": "import torch\nx = (torch.ones(1)  # the loss\n     .  # dot here\n     backward())\n",
    "comment_before_paren": "import torch\nx = (torch.ones(1).backward  # call\n     ())\n",
    "cr_line_endings": "import torch\rloss = torch.ones(1)\r(loss.  # c\r backward())\r",
    "optim_alias": (
        "import torch\nfrom torch import optim as o\nfrom torch.utils.data import DataLoader\n"
        "m = torch.nn.Linear(2, 1)\nopt = o.SGD(m.parameters(), lr=0.1)\n"
        "for x in DataLoader(torch.ones(4, 2)):\n    m(x).sum().backward()\n    opt.step()\n"
    ),
    "optimizer_without_backward": (
        "import torch\nimport torch.optim\n\nif __name__ == '__main__':\n"
        "    model = torch.nn.Linear(2, 1)\n    opt = torch.optim.Adam(model.parameters())\n"
    ),
    "transformers_adamw": (
        "import torch\nfrom transformers import AdamW\n\nif __name__ == '__main__':\n"
        "    model = torch.nn.Linear(2, 1)\n    opt = AdamW(model.parameters())\n"
    ),
    "spawn": (
        "import torch\nfrom torch.multiprocessing import spawn as launch\n\n\ndef work(rank):\n    pass\n\n\n"
        "if __name__ == '__main__':\n    launch(work, nprocs=2)\n"
    ),
}


@pytest.mark.parametrize("name", sorted(TRICKY))
def test_tricky_spellings_pass_the_filter(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    text = TRICKY[name]
    result = unfiltered(text, f"{name}.py", monkeypatch)
    assert result.error is None and not untouched(result), "the case must matter to the engine"
    assert mentions_torch(text)


def notebook(cells: list[str], split_lines: bool) -> str:
    """A minimal notebook; `split_lines=False` stores each cell as one string (escaped newlines)."""
    return json.dumps(
        {
            "cells": [
                {"cell_type": "code", "metadata": {}, "outputs": [], "execution_count": None,
                 "source": cell.splitlines(keepends=True) if split_lines else cell}
                for cell in cells
            ],
            "metadata": {"language_info": {"name": "python"}},
            "nbformat": 4,
            "nbformat_minor": 5,
        }
    )  # fmt: skip


@pytest.mark.parametrize("split_lines", [True, False])
def test_notebook_json_passes_the_filter(split_lines: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    # The dot and `backward` on different lines of a cell: JSON quotes and escapes lie between them.
    text = notebook(["import torch\nloss = torch.ones(1)", "(loss.\nbackward())"], split_lines)
    result = unfiltered(text, "nb.ipynb", monkeypatch)
    assert result.error is None and result.diagnostics, "the case must matter to the engine"
    assert mentions_torch(text)


def test_rejects_torch_code_without_training() -> None:
    assert not mentions_torch("import torch\nx = torch.zeros(3)\n")
    assert not mentions_torch(
        "import torch\n\n\nclass Square(torch.autograd.Function):\n    @staticmethod\n"
        "    def backward(ctx, grad):\n        return 2 * grad  # see torch.optimizer docs\n"
    )
    assert not mentions_torch("import torch\nfrom torch.multiprocessing import Queue\n")
    assert not mentions_torch("from transformers import AdamW\nloss.backward()\n")  # never mentions torch


def _torch_sample(count: int, max_bytes: int) -> list[Path]:
    spec = importlib.util.find_spec("torch")  # located, not imported
    if spec is None or spec.origin is None:
        return []
    files = sorted(p for p in Path(spec.origin).parent.rglob("*.py") if p.stat().st_size <= max_bytes)
    step = max(1, len(files) // count)
    return files[::step][:count]


TORCH_SAMPLE = _torch_sample(count=80, max_bytes=40_000)


@pytest.mark.skipif(not TORCH_SAMPLE, reason="torch is not installed")
def test_torch_sources_rejected_only_when_nothing_to_do(monkeypatch: pytest.MonkeyPatch) -> None:
    rejected = 0
    for path in TORCH_SAMPLE:
        text = path.read_text(encoding="utf-8", errors="replace")
        if "torch" in text and not mentions_torch(text):
            rejected += 1
            assert_sound(text, str(path), monkeypatch)
    assert rejected, "the sample should hold torch sources without training code"
