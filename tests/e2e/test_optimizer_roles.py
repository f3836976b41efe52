"""Optimizers found from use, run at 1 and 2 processes: whole scripts migrated with the CLI.

- `optimizer_role_scripts/alternatives.py`: one optimizer chosen among `if/elif` alternatives
  (AdamW, SGD, and `grouptools.Lars`, a class of a module outside the run), over parameter groups
  that module's helper builds from the model (`grouptools.decay_groups(model, wd)`, DINO's shape).
  The alternatives are one optimizer, prepared once after the chain with the model (the argument
  the code uses as a model), so on 2 processes both ranks end with the same weights.
- `optimizer_role_scripts/factory.py`: the optimizer comes from a package's factory
  (`create_optimizer(args, model)`, timm's shape), stepped after backward in a function of the
  script: the factory's result is the optimizer, its model argument the model.

- `optimizer_role_scripts/trainer_project/`: a library trainer class (`minilm/trainer.py`, minGPT's
  shape) whose `run()` builds `self.optimizer = model.configure_optimizers(config)` and steps it
  after backward, the model's class in `minilm/model.py`. Given alone, the trainer module is
  migrated in place: the Accelerator is created in `run()`, which prepares the model, the optimizer
  and the loader it builds; the script that runs it is unchanged.

The modules standing in for what the run does not hold live in `optimizer_role_scripts/installed/`,
put on PYTHONPATH for the runs only (the migration is given the script alone). The 1-process run
of each migrated script must record exactly the original's losses; on 2 processes the ranks must
end with identical weights (the model was prepared with its optimizer) and the loss must fall.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from functools import lru_cache
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))
from rt_helpers import run_cmd  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = Path(__file__).resolve().parent / "optimizer_role_scripts"
INSTALLED = SCRIPTS / "installed"
TIMEOUT = 180


def _accel() -> str:
    found = shutil.which("accel", path=str(Path(sys.executable).parent)) or shutil.which("accel")
    assert found, "the `accel` console script is not installed"
    return found


@lru_cache(maxsize=None)
def _workdir(name: str) -> Path:
    work = Path(tempfile.mkdtemp(prefix=f"optroles-{name}-"))
    result = subprocess.run(
        [sys.executable, "-m", "migrate", "--output-dir", str(work / "migrated"), str(SCRIPTS / f"{name}.py")],
        cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return work


def _migrated(name: str) -> Path:
    return _workdir(name) / "migrated" / f"{name}.py"


@lru_cache(maxsize=None)
def _run(name: str, how: str, *args: str) -> list[dict]:
    """Run the original or the migrated script; every rank's recorded losses and weights."""
    out = _workdir(name) / "-".join((how, *args))
    out.mkdir()
    script = SCRIPTS / f"{name}.py" if how == "original" else _migrated(name)
    env = ["env", f"PYTHONPATH={INSTALLED}"]
    if how in ("original", "one"):
        cmd = [*env, sys.executable, str(script), str(out), *args]
    else:
        cmd = [*env, _accel(), "launch", "--nproc-per-node", "2", str(script), str(out), *args]
    result = run_cmd(cmd, cwd=out, timeout=TIMEOUT)
    assert result.returncode == 0, f"{cmd} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return [json.loads(p.read_text()) for p in sorted(out.glob("rank*.json"))]


def test_alternatives_are_prepared_once_with_the_model() -> None:
    migrated = _migrated("alternatives").read_text()
    prepare = "    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)\n"
    assert migrated.count("accelerator.prepare(") == 1
    # after the whole chain (the last alternative), not after its first branch
    assert migrated.index(prepare) > migrated.index("optimizer = grouptools.Lars(groups, lr=args.lr)")


def test_alternatives_one_process_identical_to_original() -> None:
    (original,) = _run("alternatives", "original", "--opt", "lars")
    (migrated,) = _run("alternatives", "one", "--opt", "lars")
    assert original["losses"], "no loss was recorded"
    assert migrated == original


def test_alternatives_two_processes_stay_in_sync() -> None:
    for opt in ("lars", "adamw"):
        ranks = _run("alternatives", "two", "--opt", opt)
        assert len(ranks) == 2
        assert ranks[0]["weights"] == ranks[1]["weights"], opt
        losses = ranks[0]["losses"]
        assert len(losses) == 12  # 3 epochs of 4 batches: half of the 8 batches per rank
        assert sum(losses[-4:]) < sum(losses[:4]), opt


def test_factory_optimizer_is_prepared_with_its_model() -> None:
    migrated = _migrated("factory").read_text()
    assert "model, optimizer, loader = accelerator.prepare(model, optimizer, loader)" in migrated
    assert "accelerator.backward(loss)" in migrated


def test_factory_one_process_identical_to_original() -> None:
    (original,) = _run("factory", "original")
    (migrated,) = _run("factory", "one")
    assert original["losses"], "no loss was recorded"
    assert migrated == original


def test_factory_two_processes_stay_in_sync() -> None:
    ranks = _run("factory", "two")
    assert len(ranks) == 2
    assert ranks[0]["weights"] == ranks[1]["weights"]
    losses = ranks[0]["losses"]
    assert len(losses) == 18  # 3 epochs of 6 batches: half of the 12 per rank
    assert sum(losses[-6:]) < sum(losses[:6])


PROJECT = SCRIPTS / "trainer_project"


@lru_cache(maxsize=None)
def _project() -> Path:
    """A copy of the trainer project whose `minilm/trainer.py` alone was migrated in place."""
    work = Path(tempfile.mkdtemp(prefix="optroles-trainer-"))
    shutil.copytree(PROJECT, work / "migrated", ignore=shutil.ignore_patterns("__pycache__"))
    result = subprocess.run(
        [sys.executable, "-m", "migrate", str(work / "migrated" / "minilm" / "trainer.py")],
        cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return work


@lru_cache(maxsize=None)
def _run_project(how: str) -> list[dict]:
    out = _project() / how
    out.mkdir()
    root = PROJECT if how == "original" else _project() / "migrated"
    if how in ("original", "one"):
        cmd = [sys.executable, str(root / "train.py"), str(out)]
    else:
        cmd = [_accel(), "launch", "--nproc-per-node", "2", str(root / "train.py"), str(out)]
    result = run_cmd(cmd, cwd=root, timeout=TIMEOUT)
    assert result.returncode == 0, f"{cmd} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return [json.loads(p.read_text()) for p in sorted(out.glob("rank*.json"))]


def test_trainer_class_given_alone_prepares_in_the_method_that_builds_the_loop_objects() -> None:
    trainer = (_project() / "migrated" / "minilm" / "trainer.py").read_text()
    assert "        self.accelerator = Accelerator()\n" in trainer
    assert "model, self.optimizer, train_loader = self.accelerator.prepare(" in trainer
    assert "self.accelerator.backward(self.loss)" in trainer
    assert (_project() / "migrated" / "train.py").read_text() == (PROJECT / "train.py").read_text()


def test_trainer_class_one_process_identical_to_original() -> None:
    (original,) = _run_project("original")
    (migrated,) = _run_project("one")
    assert original["losses"], "no loss was recorded"
    assert migrated == original


def test_trainer_class_two_processes_stay_in_sync() -> None:
    ranks = _run_project("two")
    assert len(ranks) == 2
    assert ranks[0]["weights"] == ranks[1]["weights"]
    assert len(ranks[0]["losses"]) == 6  # 2 epochs of 3 batches: half of the 6 per rank
