"""The cross-module layer in-process (no launches): the module index and the joined view's
renamed imports and name conflicts, on copies of fixtures/repos/train_step/in."""

from __future__ import annotations

import shutil
from pathlib import Path

from migrate.engine import Options
from migrate.project import build_index
from migrate.runner import run

REPO = Path(__file__).resolve().parents[2] / "fixtures" / "repos" / "train_step" / "in"


def _copy(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    shutil.copytree(REPO, repo)
    return repo


def _results(repo: Path) -> dict[str, object]:
    report = run([repo], Options(), write=False)
    return {Path(r.path).name: r for r in report.results}


def test_index_resolves_siblings_packages_and_relative_imports(tmp_path: Path) -> None:
    files = {
        tmp_path / "scripts" / "train.py": "import torch\nfrom pkg.loop import step\nif __name__ == '__main__':\n    step()\n",
        tmp_path / "pkg" / "__init__.py": "",
        tmp_path / "pkg" / "loop.py": "import torch\nfrom .helpers import (\n    clip,\n)\ndef step(): clip()\n",
        tmp_path / "pkg" / "helpers.py": "import torch\ndef clip(): pass\n",
        tmp_path / "alone.py": "import torch\nimport os\n",
    }
    for path, text in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    index = build_index({p: t for p, t in files.items()})
    train, loop, helpers = tmp_path / "scripts" / "train.py", tmp_path / "pkg" / "loop.py", tmp_path / "pkg" / "helpers.py"
    assert [n.name for n in index.modules[train].imports[loop]] == ["step"]
    assert [(n.name, n.line) for n in index.modules[loop].imports[helpers]] == [("clip", 2)]
    assert index.reached(train) == [train, loop, helpers]
    assert any(set(u) == {train, loop, helpers} for u in index.units())
    assert [tmp_path / "alone.py"] in index.units()


def test_a_training_step_imported_under_another_name_is_followed(tmp_path: Path) -> None:
    repo = _copy(tmp_path)
    main = (repo / "main.py").read_text()
    main = main.replace("from engine import evaluate, train_one_epoch", "from engine import evaluate, train_one_epoch as run_epoch")
    (repo / "main.py").write_text(main.replace("        train_one_epoch(", "        run_epoch("))
    results = _results(repo)
    engine = results["engine.py"]
    assert engine.changed and "accelerator.backward(loss)" in (engine.new_text or "")
    assert "run_epoch(model, criterion, train_loader, optimizer, device, epoch, args.clip_grad, accelerator=accelerator)" in (
        results["main.py"].new_text or "")


def test_a_name_defined_in_two_modules_and_called_across_is_refused(tmp_path: Path) -> None:
    repo = _copy(tmp_path)
    engine = (repo / "engine.py").read_text()
    engine = engine.replace("        optimizer.step()\n", "        optimizer.step()\n        save_on_master(step)\n")
    (repo / "engine.py").write_text(engine + "\n\ndef save_on_master(step):\n    return step\n")
    results = _results(repo)
    assert not any(r.changed for r in results.values())
    message = next(d.message for d in results["main.py"].diagnostics if d.code == "AM013")
    assert "`save_on_master` is defined in both" in message
