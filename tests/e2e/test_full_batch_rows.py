"""Full-batch training over every row of fixed tensors (`nprocess_scripts/full_batch_rows_lbfgs.py`:
an LBFGS closure over a recurrent forecaster's rows at the module level; `full_batch_rows_adam.py`:
Adam with a hand-written mean squared error in a function), migrated with the CLI and run on 1 and
2 processes.

- The migration reports nothing, binds this process's rows once before the loop
  (`accelerator.share_selection(len(...))`) and selects them in the statements that feed the loss;
  the closure returns the loss averaged over the processes; evaluations keep every row.
- On 1 process the migrated script is the original: the same losses and weights, bit for bit.
- On 2 processes each rank's loss covers half the rows (even counts: no padding), the ranks end
  with identical weights and take the same number of closure calls (no hang: each has a timeout),
  the loss falls, and the mean of the two halves' losses is the 1-process loss, so the weights
  follow the 1-process run (up to float rounding).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))
from original_and_migrated import RankFileScript  # noqa: E402

SCRIPTS = Path(__file__).resolve().parent / "nprocess_scripts"
TIMEOUT = 180

RUNS = {
    "lbfgs": RankFileScript(SCRIPTS / "full_batch_rows_lbfgs.py", TIMEOUT),
    "adam": RankFileScript(SCRIPTS / "full_batch_rows_adam.py", TIMEOUT),
}
SHARED = {
    "lbfgs": ("train_in_rows = accelerator.share_selection(len(train_in))",
              "forecast = model(train_in[train_in_rows])",
              "loss = criterion(forecast, train_out[train_in_rows])",
              'return accelerator.reduce(loss.detach(), "mean")',
              "held = criterion(model(held_in), held_out).item()"),
    "adam": ("features_rows = accelerator.share_selection(len(features))",
             "pred = model(features[features_rows])",
             "loss = ((pred - labels[features_rows]) ** 2).mean()",
             "error = (model(features) - labels).pow(2).mean().item()"),
}


@pytest.mark.parametrize("shape", ["lbfgs", "adam"])
def test_migrated_with_the_rows_shared(shape: str) -> None:
    work, report = RUNS[shape].migrated
    migrated = (work / "migrated" / RUNS[shape].script.name).read_text()
    for line in SHARED[shape]:
        assert line in migrated, migrated
    assert "0 diagnostics" in report and "1 migrated" in report, report


@pytest.mark.parametrize("shape", ["lbfgs", "adam"])
def test_one_process_is_the_original(shape: str) -> None:
    (original,) = RUNS[shape].run("original")
    (one,) = RUNS[shape].run("one")
    assert one["losses"] == original["losses"] and one["weights"] == original["weights"]
    assert one.get("returned") == original.get("returned") and one.get("calls") == original.get("calls")
    assert one["rows"] == [original["selected"]] * len(original["rows"])
    assert original["losses"][-1] < original["losses"][0] / 2


@pytest.mark.parametrize("shape", ["lbfgs", "adam"])
def test_two_processes_share_the_rows_and_agree(shape: str) -> None:
    (original,) = RUNS[shape].run("original")
    first, second = RUNS[shape].run("two")
    assert [first["rank"], second["rank"]] == [0, 1]
    assert original["selected"] % 2 == 0
    for rank in (first, second):
        assert rank["rows"] == [original["selected"] // 2] * len(rank["rows"])
        assert rank["losses"][-1] < rank["losses"][0] / 2
    assert first["weights"] == second["weights"]
    assert first["losses"] != second["losses"]  # each rank's loss is over its own rows
    assert len(first["losses"]) == len(second["losses"])  # as many closure calls (backwards) on both
    # equal halves: the averaged gradient is the whole data's
    assert (first["losses"][0] + second["losses"][0]) / 2 == pytest.approx(original["losses"][0], rel=1e-6)
    if shape == "lbfgs":
        # the closure's returned loss is the processes' mean: both ranks decide alike
        assert first["calls"] == second["calls"] and first["returned"] == second["returned"]
        assert first["returned"][0] == pytest.approx(original["returned"][0], rel=1e-6)
        assert first["held"] == second["held"]
    assert first["weights"] == pytest.approx(original["weights"], rel=1e-3, abs=1e-4)
