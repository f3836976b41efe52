"""Notebooks: migrated as one script, split back into cells, magics kept, JSON formatting kept."""

from __future__ import annotations

import json
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from migrate import notebooks
from migrate.cli import app

IMPORTS = "%matplotlib inline\n!pip install tqdm\nimport torch\nimport torch.nn as nn\nfrom torch.utils.data import DataLoader, TensorDataset"
DATA = 'device = torch.device("cuda" if torch.cuda.is_available() else "cpu")\nloader = DataLoader(TensorDataset(torch.randn(64, 8), torch.randn(64, 1)), batch_size=16)'
MODEL = "model = nn.Linear(8, 1).to(device)\noptimizer = torch.optim.SGD(model.parameters(), lr=0.1)"
TRAIN = (
    "for x, y in loader:\n"
    "    x, y = x.to(device), y.to(device)\n"
    "    loss = nn.functional.mse_loss(model(x), y)\n"
    "    optimizer.zero_grad()\n"
    "    loss.backward()\n"
    "    optimizer.step()"
)


def notebook_json(
    code_cells: list[str], indent: int | None = 1, ensure_ascii: bool = False, newline: bool = True
) -> str:
    cells = [{"cell_type": "markdown", "metadata": {"tags": ["intro"]}, "source": ["# Tr\u00e4ining\n", "text"]}]
    for i, source in enumerate(code_cells):
        cells.append(
            {
                "cell_type": "code",
                "execution_count": i + 1,
                "id": f"cell-{i}",
                "metadata": {"scrolled": True},
                "outputs": [{"name": "stdout", "output_type": "stream", "text": ["loss 0.5 \u2713\n"]}],
                "source": source.splitlines(keepends=True),
            }
        )
    document = {
        "cells": cells,
        "metadata": {"kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"}},
        "nbformat": 4,
        "nbformat_minor": 5,
    }
    return json.dumps(document, indent=indent, ensure_ascii=ensure_ascii) + ("\n" if newline else "")


def invoke(*args: str):  # type: ignore[no-untyped-def]
    return CliRunner().invoke(app, list(args), env={"NO_COLOR": "1"})


def sources(raw: str) -> list[str]:
    return ["".join(c["source"]) for c in json.loads(raw)["cells"]]


def test_notebook_is_migrated_across_cells_keeping_everything_else(tmp_path: Path) -> None:
    path = tmp_path / "train.ipynb"
    original = notebook_json([IMPORTS, "%%bash\necho torch", DATA, MODEL, TRAIN])
    path.write_text(original)
    result = invoke("-v", str(path))
    assert result.exit_code == 0, result.output
    new = path.read_text()
    cells = sources(new)
    assert cells[0] == "# Tr\u00e4ining\ntext"  # markdown untouched
    assert "from runtime import Accelerator" in cells[1]
    assert "%matplotlib inline\n!pip install tqdm\n" in cells[1]  # magics kept
    assert cells[2] == "%%bash\necho torch"  # cell magic untouched
    assert "accelerator = Accelerator()" in cells[3] and "torch.device(" not in cells[3]
    # the model is built in one cell and trained in another: the analysis saw both
    assert "accelerator.prepare(model, optimizer, loader)" in cells[4]
    assert ".to(device)" not in cells[4]
    assert "accelerator.backward(loss)" in cells[5] and "x.to(device)" not in cells[5]
    assert not cells[5].endswith("\n")  # cells keep their (absent) final newline
    old_doc, new_doc = json.loads(original), json.loads(new)
    for old_cell, new_cell in zip(old_doc["cells"], new_doc["cells"], strict=True):
        assert {k: v for k, v in old_cell.items() if k != "source"} == {
            k: v for k, v in new_cell.items() if k != "source"
        }
    assert old_doc["metadata"] == new_doc["metadata"]
    # JSON formatting kept: every line that differs is a line of a source list
    old_lines, new_lines = set(original.splitlines()), set(new.splitlines())
    for line in old_lines ^ new_lines:
        assert line.startswith('    "') and line.rstrip(",").endswith('"'), line
    assert new.endswith("}\n") and "\u2713" in new  # trailing newline and non-ASCII kept
    assert f"{path}:cell 5:2: AM004" in result.output and f"{path}:cell 6:5: AM003" in result.output
    assert invoke("--check", str(path)).exit_code == 0  # stable


def test_notebook_diff_shows_cell_numbers_and_writes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "train.ipynb"
    path.write_text(notebook_json([IMPORTS, DATA, MODEL, TRAIN]))
    before = path.read_bytes()
    result = invoke("--diff", str(path))
    assert result.exit_code == 1
    assert f"--- {path}:cell 5\t(original)" in result.stdout
    assert "-    loss.backward()" in result.stdout
    assert f"{path}:cell 1" not in result.stdout  # the markdown cell is not in the diff
    assert path.read_bytes() == before


def test_notebook_formatting_variants_round_trip(tmp_path: Path) -> None:
    for indent, ensure_ascii, newline in ((2, True, False), (4, False, True), (None, False, False)):
        path = tmp_path / f"nb{indent}.ipynb"
        raw = notebook_json([IMPORTS, DATA, MODEL, TRAIN], indent, ensure_ascii, newline)
        path.write_text(raw)
        assert invoke(str(path)).exit_code == 0
        new = path.read_text()
        expected = json.loads(new)
        assert new == json.dumps(expected, indent=indent, ensure_ascii=ensure_ascii) + ("\n" if newline else "")


def test_notebook_without_torch_or_not_python_is_untouched(tmp_path: Path) -> None:
    plain = tmp_path / "plain.ipynb"
    plain.write_text(notebook_json(["x = 1"]))
    r_nb = tmp_path / "r.ipynb"
    data = json.loads(notebook_json([TRAIN]))
    data["metadata"]["kernelspec"]["language"] = "R"
    r_nb.write_text(json.dumps(data))
    before = plain.read_bytes(), r_nb.read_bytes()
    assert invoke(str(tmp_path)).exit_code == 0
    assert (plain.read_bytes(), r_nb.read_bytes()) == before


def test_broken_notebook_is_reported_and_untouched(tmp_path: Path) -> None:
    bad_json = tmp_path / "bad.ipynb"
    bad_json.write_text('{"cells": [torch.optim')  # mentions training code: the JSON is read
    syntax = tmp_path / "syntax.ipynb"
    syntax.write_text(notebook_json([IMPORTS, "def f(:\n    loss.backward()"]))  # training code: parsed
    before = bad_json.read_bytes(), syntax.read_bytes()
    result = invoke(str(tmp_path))
    assert result.exit_code == 2
    assert "bad.ipynb: error: invalid notebook JSON" in result.output
    assert f"{syntax}:cell 3:1:" in result.output  # position mapped to the cell
    assert (bad_json.read_bytes(), syntax.read_bytes()) == before


def test_indented_magic_follows_a_rewrite_into_a_block() -> None:
    text = notebook_json([IMPORTS, DATA, MODEL, TRAIN.replace("    loss.backward()", "    %time loss.backward()")])
    notebook = notebooks.load(text)
    assert "%time" not in notebook.script and notebooks.MAGIC_MARKER in notebook.script
    back = notebooks.split(notebook, notebook.script)
    assert all(back[i] == notebook.texts[i] for i in notebook.code_cells)


_LINE = st.one_of(
    st.sampled_from(["%time x = 1", "!ls -la", "files = !ls", "y = %env HOME", "obj?", "    %debug", "x != y", "",
                     "from __future__ import annotations", "from __future__ import (division,", "  print_function)"]),
    st.text(alphabet="abc =()#:+\t'", max_size=20),
)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(_LINE, max_size=6).map("\n".join), min_size=1, max_size=5), st.booleans())
def test_join_and_split_is_the_identity(cells: list[str], trailing: bool) -> None:
    """Any cells (magics, empty cells, with or without a final newline) come back exactly."""
    cells = [c + ("\n" if trailing and c else "") for c in cells]
    notebook = notebooks.load(notebook_json(cells))
    back = notebooks.split(notebook, notebook.script)
    assert [back[i] for i in notebook.code_cells] == cells
    assert notebooks.dump(notebook, back) == notebook_json(cells)


def _compiles_alone(cell: str) -> bool:
    try:
        compile(cell, "<cell>", "exec", dont_inherit=True)
    except SyntaxError:
        return False
    return True


def test_future_import_in_a_later_cell_is_migrated(tmp_path: Path) -> None:
    """A kernel compiles each cell on its own: `from __future__` at the top of cell 3 is legal, and
    the joined script must not put it after other cells' code (it used to be an internal error)."""
    path = tmp_path / "train.ipynb"
    train = "from __future__ import annotations\n\n" + TRAIN
    path.write_text(notebook_json(["import torch\nimport torch.nn as nn\nfrom torch.utils.data import DataLoader, TensorDataset",
                                   DATA + "\n" + MODEL, train]))
    result = invoke(str(path))
    assert result.exit_code == 0, result.output
    cells = sources(path.read_text())
    assert cells[3].startswith("from __future__ import annotations\n\n")
    assert "accelerator.backward(loss)" in cells[3]
    assert "accelerator.prepare(model, optimizer, loader)" in cells[2]
    assert all(_compiles_alone(cell) for cell in cells[1:])


def test_imports_added_to_the_first_cell_go_after_its_future_imports(tmp_path: Path) -> None:
    path = tmp_path / "train.ipynb"
    first = "# setup\nfrom __future__ import (annotations,\n    division)\nimport torch\nimport torch.nn as nn\nfrom torch.utils.data import DataLoader, TensorDataset"
    path.write_text(notebook_json([first, DATA, MODEL, TRAIN]))
    result = invoke(str(path))
    assert result.exit_code == 0, result.output
    cells = sources(path.read_text())
    assert cells[1].startswith("# setup\nfrom __future__ import (annotations,\n    division)\n")
    assert "from runtime import Accelerator" in cells[1]
    assert all(_compiles_alone(cell) for cell in cells[1:])


def test_a_rewrite_that_puts_code_above_a_cells_future_import_leaves_the_notebook(tmp_path: Path) -> None:
    """The per-cell check: a changed cell that would no longer compile on its own is an error, never written."""
    notebook = notebooks.load(notebook_json(["import torch", "from __future__ import annotations\nx = 1"]))
    script = notebook.script.replace(f"{notebooks.CELL_MARKER}(2)\n", f"{notebooks.CELL_MARKER}(2)\ny = 2\n")
    try:
        notebooks.split(notebook, script)
    except notebooks.NotebookError as error:
        assert "cell 3 would not run on its own" in str(error)
    else:
        raise AssertionError("the misplaced __future__ import was not caught")
