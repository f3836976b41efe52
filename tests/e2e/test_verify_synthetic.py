"""`accel-migrate verify --synthetic`: its interception (migrate/verify_synthetic.txt) on small
scripts of our own, one per data source (torchvision datasets, datasets.load_dataset, absent
np.load / np.memmap / torch.load files, pretrained weights from torchvision, timm and
from_pretrained, a tiktoken encoding, `.cuda()` and tensors created on CUDA without CUDA), each run by the CLI as the original and the migrated copy
on 1 process and the migrated copy on 2 gloo processes; deliberately broken migrations (a rename on
every rank, an unprepared loader, a changed loss) are caught; a script whose data --synthetic
cannot replace is reported as such. torchvision, timm, datasets, transformers and tiktoken are stand-ins
(tests/e2e/synthetic_scripts/standins) that fail as the real ones do without data or network.
Every run is bounded: verify's --timeout and a subprocess timeout."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import migrate.verify as verify_module
from migrate.verify import COULD_NOT_RUN, DIFFERS, VERIFIED, verify

SCRIPTS = Path(__file__).resolve().parent / "synthetic_scripts"
TIMEOUT = 400


@pytest.fixture
def scripts(tmp_path: Path) -> Path:
    folder = tmp_path / "project"
    shutil.copytree(SCRIPTS / "standins", folder)
    for script in SCRIPTS.glob("*.py"):
        shutil.copy(script, folder / script.name)
    return folder


def _cli(script: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, OMP_NUM_THREADS="1", NO_COLOR="1")
    env.pop("PYTHONPATH", None)
    return subprocess.run(
        [sys.executable, "-m", "migrate", "verify", str(script), "--synthetic", "--nproc-per-node", "2",
         "--timeout", "150"],
        cwd=script.parent, env=env, capture_output=True, text=True, timeout=TIMEOUT,
    )


@pytest.mark.parametrize(
    "name, replaced",
    [
        ("vision_datasets", ["torchvision.datasets.MNIST('./data'): 60000 synthetic 1x28x28 images, 10 classes",
                             "torchvision.datasets.FashionMNIST('./data'): 10000",
                             "torchvision.datasets.CIFAR10('./data'): 10000 synthetic 3x32x32",
                             "torchvision.datasets.ImageFolder('./images/val'): 1000 synthetic 3x64x64",
                             "torchvision.datasets.Flowers102('./data'): 200 synthetic 3x32x32",
                             "`.cuda()`: CUDA is not available here"]),
        ("token_files", ["np.memmap('data/train.bin'): the file is absent", "np.load('data/val.npy')",
                         "torch.load('data/extra.pt')"]),
        ("hub_dataset", ["datasets.load_dataset('someone/reviews') (ConnectionError"]),
        ("pretrained", ["torchvision.models.small_cnn: pretrained weights replaced",
                        "timm.create_model('tiny'): pretrained weights replaced",
                        "TinyModel.from_pretrained('someone/tiny') (OSError: not available offline): TinyModel(TinyConfig())"]),
        ("dataset_arrays", ["torchvision.datasets.MNIST.data / .targets: 60000 synthetic images and labels",
                            "torchvision.datasets.CIFAR10.data / .targets: 50000 synthetic images and labels"]),
        ("tokenizer_on_gpu", ["tiktoken.get_encoding('gpt2') (ConnectionError: not available offline): a byte-level "
                              "encoding (one token per byte, ids in [0, 256), <|endoftext|> = 50256, n_vocab 50257)",
                              "`device='cuda'`: CUDA is not available here, tensors created on it are on the CPU"]),
    ],
)
def test_each_data_source_verified_at_1_and_2_processes(scripts: Path, name: str, replaced: list[str]) -> None:
    before = {p: p.read_bytes() for p in scripts.rglob("*") if p.is_file()}
    result = _cli(scripts / f"{name}.py")
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    for text in replaced:
        assert f"synthetic: {text}" in out
    assert "verdict: identical (4 losses over 3 optimizer steps, bit for bit)" in out
    assert "replicas: in sync" in out and "samples: each training sample on one rank" in out
    assert out.rstrip().endswith("verdict: verified")
    # the user's folder is untouched: nothing written (no data, no model.pt), nothing changed
    assert {p: p.read_bytes() for p in scripts.rglob("*") if p.is_file() and "__pycache__" not in p.parts} == {
        p: b for p, b in before.items() if "__pycache__" not in p.parts
    }


def _broken(monkeypatch: pytest.MonkeyPatch, old: str, new: str) -> None:
    """Make verify's migration write a broken copy: the real migration with `old` replaced."""
    real = verify_module.migrate_copy

    def migrate_copy(script: Path, folder: Path, target: str, mixed_precision: str = "no"):
        path, notes = real(script, folder, target, mixed_precision)
        text = path.read_text(encoding="utf-8")
        assert old in text
        path.write_text("import os\n" + text.replace(old, new), encoding="utf-8")
        return path, notes

    monkeypatch.setattr(verify_module, "migrate_copy", migrate_copy)


SAVE = 'accelerator.save(accelerator.unwrap_model(model).state_dict(), "model.pt")'


@pytest.mark.parametrize(
    "old, new, found",
    [
        (SAVE, 'torch.save(model.state_dict(), "model.tmp"); os.replace("model.tmp", "model.pt")',
         ("model.pt written by ranks 0, 1 (os.replace)", "FileNotFoundError")),
        ("model, optimizer, loader = accelerator.prepare(model, optimizer, loader)",
         "model, optimizer = accelerator.prepare(model, optimizer)",
         ("rank 0 and rank 1 both trained on 48 of the same 48 samples of TensorDataset (384 samples)",)),
    ],
    ids=["rename-on-every-rank", "unprepared-loader"],
)
def test_broken_migration_fails_at_2_processes(
    scripts: Path, monkeypatch: pytest.MonkeyPatch, old: str, new: str, found: tuple[str, ...]
) -> None:
    _broken(monkeypatch, old, new)
    result = verify(scripts / "token_files.py", [], steps=3, synthetic=True, nproc=2, timeout=150)
    assert result.status == "fails at 2 processes", result.message
    assert result.exit_code == 1
    assert any(text in result.first_error for text in found), result.first_error
    assert "verdict: identical" in result.message  # 1 process alone cannot see it


def test_broken_migration_differs_at_1_process(scripts: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _broken(monkeypatch, "accelerator.backward(loss)", "accelerator.backward(loss * 2)")
    result = verify(scripts / "token_files.py", [], steps=3, synthetic=True, nproc=1, timeout=150)
    assert result.status == DIFFERS and result.exit_code == 1, result.message
    assert result.first_error.startswith("diverged at step 0 (loss #0)")


def test_data_it_cannot_replace_is_named(scripts: Path) -> None:
    result = verify(scripts / "custom_reader.py", [], steps=3, synthetic=True, nproc=2, timeout=150)
    assert result.status == COULD_NOT_RUN and result.exit_code == 2
    assert result.first_error.startswith(
        "custom_reader.py:5: reads data through a loader --synthetic does not replace (FileNotFoundError: "
        "[Errno 2] No such file or directory: 'data/train.bin')"
    ), result.first_error
    assert "make the data exist, or pass the script an argument that points at data that exists" in result.first_error
    assert result.migrated is None  # the migrated copy was not run
    assert VERIFIED != result.status


def test_repository_unit_migrated_whole(tmp_path: Path) -> None:
    """--unit: main.py builds, engine.py trains; the folder is migrated whole (engine.py's backward
    becomes accelerator.backward) and main.py runs from the migrated copy, at 1 and 2 processes.
    Without --unit only main.py would be migrated, and engine.py's plain backward would run."""
    unit = tmp_path / "repo"
    shutil.copytree(SCRIPTS / "repo_unit", unit)
    env = dict(os.environ, OMP_NUM_THREADS="1", NO_COLOR="1")
    env.pop("PYTHONPATH", None)
    result = subprocess.run(
        [sys.executable, "-m", "migrate", "verify", str(unit / "main.py"), "--synthetic", "--unit", str(unit),
         "--nproc-per-node", "2", "--timeout", "150"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=TIMEOUT,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "synthetic: np.load('data/train.npy'): the file is absent" in result.stdout
    assert "writes: each file by one rank (1 files)" in result.stdout
    assert result.stdout.rstrip().endswith("verdict: verified")
    assert sorted(p.name for p in unit.iterdir()) == ["engine.py", "main.py"]


def test_notebook_runs_as_its_code_cells(tmp_path: Path) -> None:
    """A notebook: the original's and the migrated notebook's code cells run as scripts (the
    `!pip` line is not run), the model built in one cell and trained in another."""
    import json

    cells = [
        "!pip install nothing-at-all\nimport torch\nfrom torch import nn\ntorch.manual_seed(0)\n"
        "data = torch.utils.data.TensorDataset(torch.randn(64, 3), torch.randn(64, 1))\n"
        "loader = torch.utils.data.DataLoader(data, batch_size=8, shuffle=True)\n"
        "model = nn.Linear(3, 1)\noptimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n",
        "for epoch in range(2):\n    for x, y in loader:\n        loss = nn.functional.mse_loss(model(x), y)\n"
        "        optimizer.zero_grad()\n        loss.backward()\n        optimizer.step()\n",
    ]
    notebook = {"cells": [{"cell_type": "code", "metadata": {}, "execution_count": None, "outputs": [],
                           "source": text.splitlines(keepends=True)} for text in cells],
                "metadata": {"language_info": {"name": "python"}}, "nbformat": 4, "nbformat_minor": 5}
    path = tmp_path / "train.ipynb"
    path.write_text(json.dumps(notebook, indent=1))
    result = verify(path, [], steps=3, synthetic=True, nproc=2, timeout=150)
    assert result.status == VERIFIED, result.message
    assert "verdict: identical (4 losses over 3 optimizer steps, bit for bit)" in result.message
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train.ipynb"]


def test_missing_module_of_the_project_is_named(tmp_path: Path) -> None:
    """A script whose own module is not in the copy verify was given (a repository trimmed to one
    file): the reason names the module and says it is neither installed nor beside the script."""
    script = tmp_path / "train.py"
    script.write_text("import torch\nfrom my_trimmed_helpers import build_model\n\nmodel = build_model()\n"
                      "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
                      "for x in torch.randn(4, 2, 3):\n    loss = model(x).sum()\n    optimizer.zero_grad()\n"
                      "    loss.backward()\n    optimizer.step()\n")
    result = verify(script, [], steps=3, synthetic=True, nproc=2, timeout=150)
    assert result.status == COULD_NOT_RUN and result.exit_code == 2, result.message
    assert result.first_error.startswith(
        "train.py:2: ModuleNotFoundError: No module named 'my_trimmed_helpers': `my_trimmed_helpers` is neither "
        "installed nor beside the script (no my_trimmed_helpers.py or my_trimmed_helpers/ in "
    ), result.first_error
    assert "a module of the script's own project that this copy lacks" in result.first_error


def test_download_it_cannot_replace_is_named(tmp_path: Path) -> None:
    """A script that downloads its own data (no network here): named as a download, with advice."""
    script = tmp_path / "train.py"
    script.write_text("import urllib.request\nimport torch\n\n"
                      "raw = urllib.request.urlopen('https://example.invalid/graph.tgz').read()\n"
                      "model = torch.nn.Linear(3, 1)\noptimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
                      "loss = model(torch.randn(2, 3)).sum()\nloss.backward()\noptimizer.step()\n")
    result = verify(script, [], steps=3, synthetic=True, nproc=2, timeout=150)
    assert result.status == COULD_NOT_RUN and result.exit_code == 2, result.message
    assert result.first_error.startswith("train.py:4: downloads something --synthetic does not replace (URLError: ")
    assert result.first_error.endswith("download it beforehand and point the script at the local copy (after `--`)")


def test_error_after_a_guessed_structure_names_the_guess(tmp_path: Path) -> None:
    """An absent torch.load file is replaced by 1-D tokens; a script that wanted a 2-D table fails
    on it: the reason names the guess, not only the script's IndexError."""
    script = tmp_path / "train.py"
    script.write_text("import torch\n\ndata = torch.load('table.pt')\n"
                      "inputs = torch.as_tensor(data[3:, :-1], dtype=torch.float32)\n"
                      "model = torch.nn.Linear(inputs.shape[1], 1)\n"
                      "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
                      "loss = model(inputs).sum()\nloss.backward()\noptimizer.step()\n")
    result = verify(script, [], steps=3, synthetic=True, nproc=2, timeout=150)
    assert result.status == COULD_NOT_RUN, result.message
    assert result.first_error.startswith("train.py:4: IndexError: too many indices"), result.first_error
    assert ("it ran after a replacement whose structure is a guess (torch.load('table.pt'): the file is absent; "
            "65536 random tokens in [0, 256) instead)") in result.first_error


def test_folder_the_repository_ships_is_made(tmp_path: Path) -> None:
    """A script that writes into results/ without making it (its repository ships the folder): the
    run's empty working directory gets it, reported, and the write check still holds at 2 processes."""
    script = tmp_path / "train.py"
    script.write_text(
        "import torch\nfrom torch.utils.data import DataLoader, TensorDataset\n\ntorch.manual_seed(0)\n"
        "loader = DataLoader(TensorDataset(torch.randn(64, 3), torch.randn(64, 1)), batch_size=8, shuffle=True)\n"
        "model = torch.nn.Linear(3, 1)\noptimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "for epoch in range(2):\n    for x, y in loader:\n"
        "        loss = torch.nn.functional.mse_loss(model(x), y)\n        optimizer.zero_grad()\n"
        "        loss.backward()\n        optimizer.step()\n"
        "    torch.save(model.state_dict(), 'results/model.pt')\n")
    result = verify(script, [], steps=3, synthetic=True, nproc=2, timeout=150)
    assert result.status == VERIFIED, result.message
    assert ("synthetic: results/: the script writes into it without making it (a folder of its repository): made "
            "in the run's empty working directory") in result.message
    assert "writes: each file by one rank (1 files)" in result.message
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train.py"]


def test_missing_submodule_of_the_project_is_named(tmp_path: Path) -> None:
    """The project's package is there but one of its modules is not (trimmed): named as such."""
    (tmp_path / "nets").mkdir()
    (tmp_path / "nets" / "__init__.py").write_text("")
    script = tmp_path / "train.py"
    script.write_text("import torch\nfrom nets.wide_resnet import build\n\nmodel = build()\n"
                      "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\nloss = model(torch.randn(2, 3)).sum()\n"
                      "loss.backward()\noptimizer.step()\n")
    result = verify(script, [], steps=3, synthetic=True, nproc=2, timeout=150)
    assert result.status == COULD_NOT_RUN, result.message
    assert result.first_error == (
        "train.py:2: ModuleNotFoundError: No module named 'nets.wide_resnet': nets/ is beside the script but has no "
        "wide_resnet(.py): a module of the script's own project that this copy lacks (run verify where the project "
        "is whole, with --unit DIR for a repository)"), result.first_error


def test_module_missing_from_an_installed_library_is_named(tmp_path: Path) -> None:
    """A library that is installed but has no such module (another version): not 'not installed'."""
    script = tmp_path / "train.py"
    script.write_text("import torch\nfrom torch.optim.gone_in_this_version import Old\n\nmodel = torch.nn.Linear(3, 1)\n"
                      "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\nloss = model(torch.randn(2, 3)).sum()\n"
                      "loss.backward()\noptimizer.step()\n")
    result = verify(script, [], steps=3, synthetic=True, nproc=2, timeout=150)
    assert result.status == COULD_NOT_RUN, result.message
    assert result.first_error == (
        "train.py:2: ModuleNotFoundError: No module named 'torch.optim.gone_in_this_version': the installed `torch` "
        "has no `torch.optim.gone_in_this_version`: the script was written for another version of torch (install "
        "that one)"), result.first_error
