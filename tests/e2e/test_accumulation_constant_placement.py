"""Hand gradient accumulation over `accum = 4` bound at module level right below the device choice
(`nprocess_scripts/accumulation_constant_below_device.py`): the migration creates the Accelerator
below the constant, `Accelerator(gradient_accumulation_steps=accum)`, and turns the hand step gate
into `accelerator.sync_gradients`. Migrated with the CLI: on 1 process the weights and the number
of optimizer steps equal the original's; on 2 gloo processes under `accel launch` each rank runs
half of every epoch, steps every 4th micro-batch, and the ranks end with equal weights."""

from __future__ import annotations

import math
import sys
from functools import lru_cache
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from original_and_migrated import RankFileScript  # noqa: E402

SCRIPT = Path(__file__).resolve().parent / "nprocess_scripts" / "accumulation_constant_below_device.py"
TIMEOUT = 180


@lru_cache(maxsize=None)
def _script() -> RankFileScript:
    return RankFileScript(SCRIPT, TIMEOUT)


def test_accumulation_converted_below_the_constant() -> None:
    work, report = _script().migrated
    text = (work / "migrated" / SCRIPT.name).read_text()
    assert "0 diagnostics" in report, report
    assert text.index("accum = 4") < text.index("accelerator = Accelerator(gradient_accumulation_steps=accum)")
    assert "if accelerator.sync_gradients:" in text and "/ accum" not in text


def test_one_process_identical_to_original() -> None:
    original = _script().run("original")
    assert _script().run("one") == original
    assert original[0]["steps"] == 16  # 2 epochs of 32 micro-batches, a step every 4th


def test_two_processes_agree() -> None:
    ranks = _script().run("two")
    assert len(ranks) == 2
    first, second = ranks
    assert first["steps"] == second["steps"] == 8  # each rank 16 micro-batches per epoch
    a = [v for layer in first["weights"] for v in layer]
    b = [v for layer in second["weights"] for v in layer]
    assert all(math.isclose(x, y, rel_tol=1e-6, abs_tol=1e-7) for x, y in zip(a, b)), (a, b)
