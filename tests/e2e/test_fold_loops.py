"""K-fold cross-validation, the Kaggle shape: every fold builds its loaders, model, optimizer and
scheduler anew, trains, evaluates and saves `fold<k>.pt`; once in the body of `for fold in range(K)`
(`nprocess_scripts/fold_loop.py`), once in a function called per fold (`fold_function.py`). The
migration prepares inside each iteration (after `accelerator.free_memory()`). Migrated with the CLI
and run on 1 process: identical to the original; on 2 gloo processes under `accel launch`: every
fold trains a new DDP model over its half of the fold's data, so the ranks end each fold with equal
weights and equal gathered accuracy (unequal if a fold trained an unprepared or stale wrapper), and
each fold's checkpoint is written once, with the user's keys and that fold's final weights."""

from __future__ import annotations

import math
import sys
from functools import lru_cache
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from original_and_migrated import RankFileScript  # noqa: E402

SCRIPTS = Path(__file__).resolve().parent / "nprocess_scripts"
TIMEOUT = 180
NAMES = ["fold_loop", "fold_function"]
K = 3


@lru_cache(maxsize=None)
def _script(name: str) -> RankFileScript:
    return RankFileScript(SCRIPTS / f"{name}.py", TIMEOUT)


def _flat(weights: list[list[float]]) -> list[float]:
    return [v for layer in weights for v in layer]


@pytest.mark.parametrize("name", NAMES)
def test_prepared_in_every_fold(name: str) -> None:
    work, report = _script(name).migrated
    text = (work / "migrated" / f"{name}.py").read_text()
    assert "0 diagnostics" in report and "1 migrated" in report, report
    assert text.count("accelerator.prepare(") == 1 and text.count("accelerator.free_memory()") == 1
    assert text.index("accelerator.free_memory()") < text.index("accelerator.prepare(")


@pytest.mark.parametrize("name", NAMES)
def test_one_process_identical_to_original(name: str) -> None:
    original = _script(name).run("original")
    assert _script(name).run("one") == original
    assert len(original[0]["acc"]) == K


@pytest.mark.parametrize("name", NAMES)
def test_two_processes_agree_in_every_fold(name: str) -> None:
    ranks = _script(name).run("two")
    single = _script(name).run("original")[0]
    assert len(ranks) == 2
    first, second = ranks
    assert first["acc"] == second["acc"] and len(first["acc"]) == K
    for fold in range(K):
        a, b = _flat(first["weights"][fold]), _flat(second["weights"][fold])
        assert all(math.isclose(x, y, rel_tol=1e-6, abs_tol=1e-7) for x, y in zip(a, b)), fold
        assert a != _flat(single["weights"][fold])  # each rank trained on its half of the fold
    work, _ = _script(name).migrated
    for fold in range(K):
        state = torch.load(work / "two" / f"fold{fold}.pt")
        assert sorted(state) == ["0.bias", "0.weight", "2.bias", "2.weight"]
        saved = [v for key in ("0.weight", "0.bias", "2.weight", "2.bias") for v in state[key].flatten().tolist()]
        assert all(math.isclose(x, y, rel_tol=1e-6, abs_tol=1e-7)
                   for x, y in zip(saved, _flat(first["weights"][fold])))
