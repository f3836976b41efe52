"""A training object the step reaches through a second name bound before `prepare`
(migrate/roles/step_aliases.py): `net = model` then `net(x)`; a trainer's `self.ddp_model =
self.model` and `self.optimizer = opt` bound in its constructor before its loader; and the
reverse, `model_without_ddp = model` building the optimizer and saved while the step calls
`model`. Each script is migrated with the CLI and run on 1 process (identical to the original) and
on 2 gloo processes under `accel launch`: each rank trains on its half of every epoch, so the ranks
end with equal weights only when the object the step uses is the prepared one (before the fix the
step trained the unprepared module: no gradient all-reduce, and the ranks' weights differed)."""

from __future__ import annotations

import math
import sys
from functools import lru_cache
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from original_and_migrated import RankFileScript  # noqa: E402

SCRIPTS = Path(__file__).resolve().parent / "nprocess_scripts"
TIMEOUT = 180
NAMES = ["step_alias_model", "step_alias_trainer", "step_alias_unwrapped_kept"]


@lru_cache(maxsize=None)
def _script(name: str) -> RankFileScript:
    return RankFileScript(SCRIPTS / f"{name}.py", TIMEOUT)


@pytest.mark.parametrize("name", NAMES)
def test_one_process_identical_to_original(name: str) -> None:
    assert _script(name).run("one") == _script(name).run("original")


@pytest.mark.parametrize("name", NAMES)
def test_two_processes_train_one_model(name: str) -> None:
    ranks = _script(name).run("two")
    assert len(ranks) == 2
    (single,) = _script(name).run("one")
    first, second = (sum(rank["weights"], []) for rank in ranks)
    assert all(math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-7) for a, b in zip(first, second)), (first, second)
    assert first != sum(single["weights"], [])  # each rank trained on its own half: not the 1-process run
    if "keys" in single:  # `model_without_ddp` stays the user's module: its own keys, no `module.`
        assert ranks[0]["keys"] == ranks[1]["keys"] == single["keys"] == ["bias", "weight"]
