"""Whole repositories: fixtures/repos/<name>/in is migrated as one unit by the CLI, compared with
fixtures/repos/<name>/out, and the migrated repository trains like the original.

- factory (tests/e2e/test_repos_factory.py): the loop in main.py, only the optimizer from a factory.
- train_step: main.py builds model and loader and calls `train_one_epoch` from engine.py
  (through a `MetricLogger.log_every(loader)` of utils.py) and `save_on_master` from utils.py: the
  accelerator reaches engine.py and utils.py as a parameter, the loader is prepared in main.py;
  one process gives bit-identical losses, two processes each train on half of every epoch and only
  the main process prints.
  The optimizer comes from `create_optimizer(args, model)` of optim_factory.py (an optimizer
  factory: prepared in main.py, the factory itself unchanged); `utils.init_distributed_mode(args)`
  sets up the process group under torchrun (kept: the runtime reuses it), and main.py's
  DistributedSampler and DistributedDataParallel give way to the prepared loader and model.
- Refusals: a training step called through the module object, and an optimizer built inside a
  trainer class that another module (not the script) builds, each give the entry a precise AM013
  diagnostic and change no file (a trainer class the script builds is migrated:
  tests/e2e/test_repos_trainloop.py).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.runtime.rt_helpers import child_env, run_cmd, torchrun

ROOT = Path(__file__).resolve().parents[2]
REPOS = ROOT / "fixtures" / "repos"
LOSS = re.compile(r"^epoch (\d+) step (\d+) loss ([0-9.]+)$", re.M)
TIMEOUT = 180


def migrate(repo: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    """The CLI on a folder, in place (as on a checkout: the unchanged modules stay beside it)."""
    return subprocess.run([sys.executable, "-m", "migrate", *extra, str(repo)],
                          capture_output=True, text=True, env=child_env(), cwd=ROOT, timeout=TIMEOUT)


def migrated_copy(name: str, tmp_path: Path, rewritten: list[str]) -> tuple[Path, subprocess.CompletedProcess[str]]:
    """fixtures/repos/<name>/in copied to tmp_path/migrated and migrated in place by the CLI (exit
    0): out/ holds exactly the `rewritten` files (relative paths), each one equal to it, and every
    other file is left as in/."""
    case = REPOS / name
    migrated = tmp_path / "migrated"
    shutil.copytree(case / "in", migrated)
    result = migrate(migrated)
    assert result.returncode == 0, result.stdout + result.stderr
    assert sorted(str(p.relative_to(case / "out")) for p in (case / "out").rglob("*.py")) == sorted(rewritten)
    for path in sorted((case / "in").rglob("*.py")):
        relative = str(path.relative_to(case / "in"))
        expected = case / ("out" if relative in rewritten else "in") / relative
        assert (migrated / relative).read_text() == expected.read_text(), relative
    return migrated, result


def test_train_step_repository_migrates_as_one_unit_and_trains_the_same(tmp_path: Path) -> None:
    case = REPOS / "train_step"
    migrated, result = migrated_copy("train_step", tmp_path, ["engine.py", "main.py", "utils.py"])
    # the edits landed in the module that trains, and the accelerator reaches it as a parameter
    engine = (migrated / "engine.py").read_text()
    assert "accelerator.backward(loss)" in engine and "*, accelerator)" in engine
    main = (migrated / "main.py").read_text()
    assert "accelerator=accelerator" in main and "DistributedSampler" not in main and "DistributedDataParallel" not in main
    assert "AM007" in result.stdout + result.stderr  # the kept init helper is reported

    original = run_cmd([sys.executable, "main.py"], cwd=case / "in", timeout=TIMEOUT)
    one = run_cmd([sys.executable, "main.py", "--output", str(tmp_path / "w.pt")], cwd=migrated, timeout=TIMEOUT)
    assert original.returncode == 0 and one.returncode == 0, original.stderr + one.stderr
    losses = LOSS.findall(original.stdout)
    assert len(losses) == 12  # 2 epochs x 6 batches
    assert LOSS.findall(one.stdout) == losses  # bit-identical at one process
    assert (tmp_path / "w.pt").exists()

    two = torchrun(migrated / "main.py", "--output", str(tmp_path / "w2.pt"), cwd=migrated, timeout=TIMEOUT)
    assert two.returncode == 0, two.stdout + two.stderr
    # each rank trains on half of every epoch; only the main process prints
    steps = [(int(e), int(s)) for e, s, _ in LOSS.findall(two.stdout)]
    assert steps == [(e, s) for e in range(2) for s in range(3)], two.stdout
    assert (tmp_path / "w2.pt").exists()


TRAINER = """

class Trainer:
    def __init__(self, model, loader, lr):
        self.model = model
        self.loader = loader
        self.optimizer = torch.optim.SGD(model.parameters(), lr=lr)

    def run(self):
        for samples, targets in self.loader:
            loss = torch.nn.functional.cross_entropy(self.model(samples), targets)
            self.optimizer.zero_grad()
            loss.backward()
            self.optimizer.step()
"""


def line(path: Path, text: str) -> int:
    return next(i for i, source in enumerate(path.read_text().splitlines(), 1) if text in source)


def _module_attribute_call(repo: Path) -> None:
    main = (repo / "main.py").read_text()
    main = main.replace("from engine import evaluate, train_one_epoch", "import engine\nfrom engine import evaluate")
    (repo / "main.py").write_text(main.replace("        train_one_epoch(", "        engine.train_one_epoch("))


def _trainer_class(repo: Path) -> None:
    """A trainer class that another module, not the script, builds (`fit()` of engine.py)."""
    fit = "\n\ndef fit(model, loader, lr):\n    Trainer(model, loader, lr).run()\n"
    (repo / "engine.py").write_text((repo / "engine.py").read_text() + TRAINER + fit)
    main = (repo / "main.py").read_text().replace("from engine import evaluate, train_one_epoch", "from engine import fit")
    main = main.replace("    optimizer = create_optimizer(args, model)\n", "")
    main = main.replace("        train_one_epoch(model, criterion, train_loader, optimizer, device, epoch, args.clip_grad)",
                        "        fit(model, train_loader, args.lr)")
    (repo / "main.py").write_text(main)


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        (_module_attribute_call, "through the module object"),
        (_trainer_class, "built in `Trainer.__init__` ("),
    ],
    ids=["module-attribute-call", "trainer-class"],
)
def test_what_cannot_be_followed_is_said_on_the_entry(tmp_path: Path, edit, expected: str) -> None:  # type: ignore[no-untyped-def]
    repo = tmp_path / "repo"
    shutil.copytree(REPOS / "train_step" / "in", repo)
    edit(repo)
    before = {p.name: p.read_text() for p in repo.glob("*.py")}
    result = subprocess.run([sys.executable, "-m", "migrate", "--output-format", "json", str(repo)],
                            capture_output=True, text=True, env=child_env(), cwd=ROOT, timeout=TIMEOUT)
    assert {p.name: p.read_text() for p in repo.glob("*.py")} == before  # the unit: all or nothing
    import json

    report = json.loads(result.stdout)
    files = {Path(f["path"]).name: f for f in report["files"]}
    entry = [d for d in files["main.py"]["diagnostics"] if d["code"] == "AM013"]
    assert entry and expected in entry[0]["message"], files["main.py"]
    if edit is _trainer_class:
        assert "that this script does not build itself" in entry[0]["message"]
    assert entry[0]["line"] == line(repo / "main.py", "engine.train_one_epoch(" if edit is _module_attribute_call
                                    else "from engine import fit")  # the line of the script it is about
    # the module the entry imports is not called "a library module"
    for name in ("engine.py", "utils.py"):
        assert not any("library module" in d["message"] and d["code"] != "AM013" for d in files[name]["diagnostics"])
    if edit is _module_attribute_call:  # engine.py alone: "backward ... (a library module?)"
        assert any(d["code"] == "AM013" and "imported by" in d["message"] for d in files["engine.py"]["diagnostics"])
