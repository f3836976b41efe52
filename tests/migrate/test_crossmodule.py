"""The cross-module layer in-process (no launches): the module index (package re-exports
included) and the joined view's renamed imports and name conflicts, on copies of
fixtures/repos/train_step/in, and an Accelerator created at the entry's module level reaching a
function of another module, on small written repositories."""

from __future__ import annotations

import shutil
from pathlib import Path

from migrate.engine import Options
from migrate.project import build_index
from migrate.runner import run

REPOS = Path(__file__).resolve().parents[2] / "fixtures" / "repos"
REPO = REPOS / "train_step" / "in"


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


def test_index_resolves_a_package_only_from_where_the_importer_finds_it(tmp_path: Path) -> None:
    """Two repositories given in one run: `a/main.py`'s `import models` (its own models.py was not
    given) is not `b/models/`, the package beside `b/main.py`, and `c/train.py`'s `from models import
    Encoder` neither: each script is a unit of its own. A package installed from a folder of its own
    (`src/pkg` beside `scripts/train.py`) and one in the project's root are still found."""
    main = "import torch\nimport models\nif __name__ == '__main__':\n    models.build()\n"
    files = {
        tmp_path / "a" / "main.py": main,
        tmp_path / "a" / "engine.py": "import torch\ndef train(): pass\n",
        tmp_path / "b" / "main.py": main,
        tmp_path / "b" / "models" / "__init__.py": "from .build import build\n",
        tmp_path / "b" / "models" / "build.py": "import torch\ndef build(): return torch.nn.Linear(1, 1)\n",
        tmp_path / "c" / "train.py": "import torch\nfrom models import Encoder\nif __name__ == '__main__':\n    Encoder()\n",
        tmp_path / "d" / "scripts" / "train.py": "import torch\nfrom pkg.loop import step\nif __name__ == '__main__':\n    step()\n",
        tmp_path / "d" / "src" / "pkg" / "__init__.py": "",
        tmp_path / "d" / "src" / "pkg" / "loop.py": "import torch\ndef step(): pass\n",
        tmp_path / "e" / "tools" / "train.py": "import torch\nfrom lib.loop import step\nif __name__ == '__main__':\n    step()\n",
        tmp_path / "e" / "lib" / "__init__.py": "",
        tmp_path / "e" / "lib" / "loop.py": "import torch\ndef step(): pass\n",
        tmp_path / "e" / "run.py": "import torch\nfrom lib.loop import step\nif __name__ == '__main__':\n    step()\n",
    }
    for path, text in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    index = build_index(files)
    a, b, c = tmp_path / "a" / "main.py", tmp_path / "b" / "main.py", tmp_path / "c" / "train.py"
    assert index.modules[a].imports == {} and index.modules[c].imports == {}
    assert set(index.modules[b].imports) == {tmp_path / "b" / "models" / "__init__.py"}
    assert [a] in index.units() and [c] in index.units()
    d, loop = tmp_path / "d" / "scripts" / "train.py", tmp_path / "d" / "src" / "pkg" / "loop.py"
    assert [n.name for n in index.modules[d].imports[loop]] == ["step"]
    e_loop = tmp_path / "e" / "lib" / "loop.py"
    for script in (tmp_path / "e" / "tools" / "train.py", tmp_path / "e" / "run.py"):
        assert [n.name for n in index.modules[script].imports[e_loop]] == ["step"]


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


def _write(root: Path, files: dict[str, str]) -> dict[Path, str]:
    written = {}
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        written[path] = text
    return written


def test_index_follows_a_package_reexport_to_the_defining_module(tmp_path: Path) -> None:
    files = _write(tmp_path, {
        "main.py": "import torch\nfrom data import build_loader\nfrom models import build_model\n"
                   "if __name__ == '__main__':\n    build_loader(build_model())\n",
        "data/__init__.py": "from .build import build_loader\n",  # no torch: read for its re-exports
        "data/build.py": "import torch\ndef build_loader(model): return torch.utils.data.DataLoader([1])\n",
        "models/__init__.py": "from .build import make as _make\n\ndef build_model():\n    model = _make()\n    return model\n",
        "models/build.py": "import torch\ndef make(): return torch.nn.Linear(1, 1)\n",
    })
    index = build_index(files)
    main, build = tmp_path / "main.py", tmp_path / "data" / "build.py"
    imports = index.modules[main].imports
    # the name is imported from the module that defines it, as Python binds it
    assert [(n.name, n.local, n.line) for n in imports[build]] == [("build_loader", "build_loader", 2)]
    assert tmp_path / "data" / "__init__.py" not in imports
    # a package that defines the name itself (a wrapper doing more than hand the call on) stays
    # the module imported from
    assert [n.name for n in imports[tmp_path / "models" / "__init__.py"]] == ["build_model"]
    # the unit holds the package __init__ too, so that the unit's own index resolves it the same way
    unit = next(u for u in index.units() if main in u)
    assert set(unit) == set(files)
    again = build_index({p: t for p, t in files.items() if p in unit})
    assert build in again.modules[main].imports


def test_an_accelerator_created_at_the_entrys_module_level_is_passed_to_another_module(tmp_path: Path) -> None:
    """The process group and the device set up under `if __name__ == "__main__":` become the
    Accelerator there; a
    function of another module that then reads it (`dist.get_world_size()` ->
    `accelerator.num_processes`) takes it as a parameter: the entry's global does not reach it."""
    _write(tmp_path, {
        "main.py": (
            "import torch\nimport torch.distributed as dist\nfrom utils import mean_over_ranks\n\n\n"
            "def main():\n    model = torch.nn.Linear(2, 1)\n"
            "    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
            "    loader = torch.utils.data.DataLoader(torch.randn(8, 2), batch_size=2)\n"
            "    for x in loader:\n        loss = model(x.to(device)).mean()\n        optimizer.zero_grad()\n"
            "        loss.backward()\n        optimizer.step()\n    print(mean_over_ranks(loss))\n\n\n"
            "if __name__ == '__main__':\n    dist.init_process_group('gloo')\n"
            "    device = torch.device('cuda', dist.get_rank()) if torch.cuda.is_available() else torch.device('cpu')\n"
            "    main()\n"),
        "utils.py": "import torch\nimport torch.distributed as dist\n\n\ndef mean_over_ranks(t):\n    return t / dist.get_world_size()\n",
    })
    results = _results(tmp_path)
    # keyword-only in another module: a caller the unit does not see fails on the missing keyword
    assert "def mean_over_ranks(t, *, accelerator):\n    return t / accelerator.num_processes" in (
        results["utils.py"].new_text or "")
    assert "mean_over_ranks(loss, accelerator=accelerator)" in (results["main.py"].new_text or "")
    assert "if __name__ == '__main__':\n    accelerator = Accelerator()\n    main()\n" in (
        results["main.py"].new_text or "")


def test_a_script_given_alone_reads_its_imports_and_writes_nothing_they_would_need(tmp_path: Path) -> None:
    """main.py alone trains through engine.py and utils.py (not given): they are read, so the
    script is not taken for one without training code, and since they need edits too, nothing is
    written and the script is told which files to give."""
    repo = _copy(tmp_path)
    before = {p.name: p.read_bytes() for p in repo.glob("*.py")}
    report = run([repo / "main.py"], Options(), write=True)
    assert [Path(r.path).name for r in report.results] == ["main.py"]  # the read modules are not reported
    (result,) = report.results
    assert not result.changed
    (diagnostic,) = [d for d in result.diagnostics if d.code == "AM013"]
    assert "engine.py" in diagnostic.message and "utils.py" in diagnostic.message
    assert "were not given" in diagnostic.message and str(repo) in diagnostic.message
    assert {p.name: p.read_bytes() for p in repo.glob("*.py")} == before


def test_a_script_given_alone_is_migrated_when_its_imports_need_no_edit(tmp_path: Path) -> None:
    """A local module of models and helpers that the training does not run through is read and
    left as it is; the script itself is migrated and written."""
    (tmp_path / "models.py").write_text(
        "import torch\nfrom torch import nn\n\n\ndef make_model():\n    return nn.Linear(4, 2)\n"
    )
    script = tmp_path / "train.py"
    script.write_text(
        "import torch\nfrom torch.utils.data import DataLoader, TensorDataset\nfrom models import make_model\n\n\n"
        "def main():\n    model = make_model()\n    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "    loader = DataLoader(TensorDataset(torch.randn(8, 4), torch.randn(8, 2)), batch_size=4)\n"
        "    for x, y in loader:\n        optimizer.zero_grad()\n"
        "        loss = torch.nn.functional.mse_loss(model(x), y)\n        loss.backward()\n        optimizer.step()\n\n\n"
        "if __name__ == \"__main__\":\n    main()\n"
    )
    models = (tmp_path / "models.py").read_bytes()
    report = run([script], Options(), write=True)
    (result,) = report.results
    assert result.changed and not [d for d in result.diagnostics if d.code == "AM013"]
    assert "accelerator.backward(loss)" in script.read_text()
    assert (tmp_path / "models.py").read_bytes() == models


def test_an_optimizer_factory_of_another_module_migrates_the_script_alone(tmp_path: Path) -> None:
    """fixtures/repos/factory: the loop is in the script and only the optimizer comes from
    `create_optimizer(args, model)` of optim_factory.py, which needs no edit. Given with the script or
    read beside it, the factory lets the view prepare the optimizer in the script (the script on its
    own sees no optimizer, and a unit with nothing to edit outside its entry used to be refused)."""
    repo = tmp_path / "repo"
    shutil.copytree(REPOS / "factory" / "in", repo)
    expected = (REPOS / "factory" / "out" / "main.py").read_text()
    factory = (repo / "optim_factory.py").read_bytes()
    alone = run([repo / "main.py"], Options(), write=False)
    (result,) = alone.results
    assert result.new_text == expected and not result.diagnostics
    report = run([repo], Options(), write=True)
    assert [Path(r.path).name for r in report.results if r.changed] == ["main.py"]
    assert (repo / "main.py").read_text() == expected
    assert (repo / "optim_factory.py").read_bytes() == factory


def test_a_backward_in_another_module_that_the_view_leaves_keeps_the_unit_refused(tmp_path: Path) -> None:
    """The view edits only the entry, but another module of the unit holds a `.backward()` it did not
    rewrite (a step it did not understand): migrating the entry alone would leave that step as it
    was, so the unit stays refused, with AM013 at the entry."""
    repo = tmp_path / "repo"
    shutil.copytree(REPOS / "factory" / "in", repo)
    with (repo / "optim_factory.py").open("a") as f:
        f.write("\n\ndef warmup(model, batch):\n    model(batch).sum().backward()\n")
    results = _results(repo)
    main = results["main.py"]
    assert not main.changed
    assert any(d.code == "AM013" for d in main.diagnostics)


def test_a_package_wrapper_of_the_loader_builder_is_refused_with_the_import_to_write(tmp_path: Path) -> None:
    """data/__init__.py defines `build_loader` itself, calling the `build_loader` of data/build.py
    imported under another name, on a branch the call does not decide (a config value): what it
    returns depends on its branches, so nothing is written and main.py is told, on its import
    line, which import makes the unit migrate."""
    pkg = REPOS / "pkgloader" / "in"
    repo = tmp_path / "repo"
    shutil.copytree(pkg, repo)
    (repo / "data" / "__init__.py").write_text(
        "from .build import build_loader as _build_loader\n\n\n"
        "def build_loader(config):\n"
        "    if not config.DATA.PRETRAIN:\n        return _build_loader(config)\n    raise NotImplementedError\n")
    results = _results(repo)
    assert not any(r.changed for r in results.values())
    diagnostic = next(d for d in results["main.py"].diagnostics if d.code == "AM013")
    assert diagnostic.line == 12  # `from data import build_loader`
    assert "wraps `build_loader`" in diagnostic.message and "`from data.build import build_loader`" in diagnostic.message
    # the import it names makes the unit migrate
    main = repo / "main.py"
    main.write_text(main.read_text().replace("from data import build_loader", "from data.build import build_loader"))
    assert _results(repo)["main.py"].changed


def _builder_reads_the_rank(repo: Path) -> None:
    """pkgloader's data/build.py printing the rank: the builder then needs the accelerator (the
    print stays after its sampler goes, and the script's process group becomes the Accelerator)."""
    build = repo / "data" / "build.py"
    build.write_text(build.read_text().replace(
        "    config.freeze()\n", "    config.freeze()\n    print(f\"rank {dist.get_rank()} built the training set\")\n"))


def test_a_dispatching_package_wrapper_migrates_as_a_reexport_does(tmp_path: Path) -> None:
    """fixtures/repos/pkgloader's data/__init__.py wraps the loader builder (swin's shape), and
    main.py's call leaves the branch flag at its default: the unit is written as with a plain
    re-export (`from .build import build_loader`), the wrapper itself untouched, except that main.py
    now imports the builder from data.build when the builder needs the accelerator (here a rank
    it prints, which stays after the sampler goes): its migrated call passes
    `accelerator=accelerator`, which the wrapper does not take."""
    wrapped, reexported = tmp_path / "wrapped", tmp_path / "reexported"
    shutil.copytree(REPOS / "pkgloader" / "in", wrapped)
    shutil.copytree(REPOS / "pkgloader" / "in", reexported)
    (reexported / "data" / "__init__.py").write_text("from .build import build_loader\n")
    for repo in (wrapped, reexported):
        _builder_reads_the_rank(repo)

    def by_path(repo: Path) -> dict[str, object]:
        return {Path(r.path).relative_to(repo).as_posix(): r for r in run([repo], Options(), write=False).results}

    first, second = by_path(wrapped), by_path(reexported)
    assert "build_loader(config, accelerator=accelerator)" in first["main.py"].new_text
    assert "def build_loader(config, *, accelerator):" in first["data/build.py"].new_text
    assert first["main.py"].new_text == second["main.py"].new_text.replace(
        "from data import build_loader", "from data.build import build_loader")
    assert any(c.code == "AM013" and "imported from data.build" in c.message for c in first["main.py"].changes)
    assert {p: r.new_text for p, r in first.items() if p not in ("data/__init__.py", "main.py")} == {
        p: r.new_text for p, r in second.items() if p not in ("data/__init__.py", "main.py")}
    assert not first["data/__init__.py"].changed


def test_a_loader_builder_that_needs_no_accelerator_keeps_the_package_import(tmp_path: Path) -> None:
    """The review of Swin: data/build.py's `build_loader(config)` read the rank only for its
    DistributedSampler. In fixtures/repos/pkgloader the sampler goes (the loader is prepared) and
    its `dist.get_rank()` lines with it; with the script keeping its own process group (Swin:
    `init_process_group` stays) the sampler stays and so do its reads. Either way the builder gets
    no `accelerator` parameter, so main.py keeps `from data import build_loader` (the wrapper's
    dispatch stays in use) and the wrapper's own call `_build_loader(config)` still works."""
    prepared = tmp_path / "prepared"
    shutil.copytree(REPOS / "pkgloader" / "in", prepared)
    results = {Path(r.path).relative_to(prepared).as_posix(): r for r in run([prepared], Options(), write=False).results}
    assert "from data import build_loader\n" in results["main.py"].new_text
    assert "build_loader(config)\n" in results["main.py"].new_text
    assert "def build_loader(config):" in results["data/build.py"].new_text
    assert "dist.get_rank()" not in results["data/build.py"].new_text  # went with the sampler

    kept = tmp_path / "kept"
    shutil.copytree(REPOS / "pkgloader" / "in", kept)
    main = kept / "main.py"
    main.write_text(main.read_text().replace(
        '    config.DEVICE = torch.device("cuda", config.LOCAL_RANK) if torch.cuda.is_available() else torch.device("cpu")\n',
        "").replace(".to(config.DEVICE)", ".cuda()"))
    build = kept / "data" / "build.py"
    build.write_text(build.read_text().replace("shuffle=False\n", "shuffle=False, drop_last=True\n"))
    results = {Path(r.path).relative_to(kept).as_posix(): r for r in run([kept], Options(), write=False).results}
    text = results["main.py"].new_text or ""
    assert "torch.distributed.init_process_group(" in text  # the script keeps its process group
    assert "from data import build_loader\n" in text and "= build_loader(config)\n" in text
    assert not results["data/build.py"].changed and not results["data/__init__.py"].changed
    assert any(d.code == "AM007" and "drop_last" in d.message for d in results["data/build.py"].diagnostics)


def test_a_forwarded_name_imported_under_another_name_is_refused(tmp_path: Path) -> None:
    """The import line to reroute binds the wrapper under an alias: the unit is refused with the
    import to write, rather than rewritten with a call the wrapper would misread."""
    repo = tmp_path / "repo"
    shutil.copytree(REPOS / "pkgloader" / "in", repo)
    _builder_reads_the_rank(repo)
    main = repo / "main.py"
    text = main.read_text().replace("from data import build_loader", "from data import build_loader as make_loaders")
    main.write_text(text.replace("build_loader(", "make_loaders("))
    results = _results(repo)
    assert not any(r.changed for r in results.values())
    diagnostic = next(d for d in results["main.py"].diagnostics if d.code == "AM013")
    assert "`make_loaders` is reached through the wrapper in" in diagnostic.message
    assert "on a line of its own" in diagnostic.message


def test_a_wrapper_imported_with_other_names_of_its_package_is_refused(tmp_path: Path) -> None:
    """`from data import build_loader, VERSION`: the package module itself is imported, so its
    wrapper and the module's function are two definitions of one name; the refusal names the
    import that makes the unit migrate."""
    repo = tmp_path / "repo"
    shutil.copytree(REPOS / "pkgloader" / "in", repo)
    (repo / "data" / "__init__.py").write_text(
        (repo / "data" / "__init__.py").read_text() + "\n\nVERSION = 1\n")
    main = repo / "main.py"
    main.write_text(main.read_text().replace("from data import build_loader", "from data import build_loader, VERSION"))
    results = _results(repo)
    assert not any(r.changed for r in results.values())
    diagnostic = next(d for d in results["main.py"].diagnostics if d.code == "AM013")
    assert "wraps `build_loader`" in diagnostic.message
    assert "`from data.build import build_loader`" in diagnostic.message


def test_parameter_groups_built_by_another_module_name_the_model(tmp_path: Path) -> None:
    """`AdamW(param_groups(model, wd))` with `param_groups` in another module: followed to `model`
    when the unit is migrated across modules (the training step is another module's); when only
    the entry is rewritten, its single-file result finds the model from use: the argument the
    code uses as a model."""
    groups = ("import torch\n\n\ndef param_groups(net, wd):\n    decay = [p for p in net.parameters() if p.ndim > 1]\n"
              "    rest = [p for p in net.parameters() if p.ndim <= 1]\n"
              "    return [{'params': decay, 'weight_decay': wd}, {'params': rest, 'weight_decay': 0.0}]\n")
    step = ("import torch\n\n\ndef train_one_epoch(model, loader, optimizer):\n    for x, y in loader:\n"
            "        loss = torch.nn.functional.mse_loss(model(x), y)\n        optimizer.zero_grad()\n"
            "        loss.backward()\n        optimizer.step()\n")
    build = ("    model = torch.nn.Linear(4, 1)\n    optimizer = torch.optim.AdamW(param_groups(model, 0.01), lr=1e-3)\n"
             "    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(8, 4), torch.randn(8, 1)))\n")
    across = tmp_path / "across"
    across.mkdir()
    (across / "groups_util.py").write_text(groups)
    (across / "engine.py").write_text(step)
    (across / "main.py").write_text(
        "import torch\nfrom engine import train_one_epoch\nfrom groups_util import param_groups\n\n\ndef main():\n"
        + build + "    train_one_epoch(model, loader, optimizer)\n\n\nif __name__ == '__main__':\n    main()\n")
    main = _results(across)["main.py"]
    assert "model, optimizer, loader = accelerator.prepare(model, optimizer, loader)" in (main.new_text or "")
    assert not main.diagnostics
    alone = tmp_path / "alone"
    alone.mkdir()
    (alone / "groups_util.py").write_text(groups)
    loop = step.split("optimizer):\n")[1]  # the step's loop, in main() itself
    (alone / "main.py").write_text(
        "import torch\nfrom groups_util import param_groups\n\n\ndef main():\n" + build + loop
        + "\n\nif __name__ == '__main__':\n    main()\n")
    main = _results(alone)["main.py"]
    # written alone, the helper is not read: its model is the argument the code uses as a model
    # (built as a torch.nn module, called by the training step), prepared with the optimizer
    assert "model, optimizer, loader = accelerator.prepare(model, optimizer, loader)" in (main.new_text or "")
    assert not main.diagnostics
