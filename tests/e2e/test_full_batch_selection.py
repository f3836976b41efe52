"""Full-batch graph networks whose loss selects the training nodes (`nprocess_scripts/
full_batch_node_index.py`: an index tensor handed to a step function, dense adjacency;
`full_batch_node_mask.py`: a PyG-style `data.train_mask` at the module level, sparse adjacency),
migrated with the CLI and run on 1 and 2 processes.

- The migration reports nothing and shares the selection right before the loss
  (`accelerator.share_selection`), leaving the evaluations over the selection whole.
- On 1 process the migrated script is the original: the same losses and weights, bit for bit.
- On 2 processes each rank's loss covers half the selected nodes (the selections have an even
  count: no padding), the ranks end with identical weights, the loss falls, and since the mean of
  two equal halves' mean losses is the whole selection's mean, the weights follow the 1-process
  run (up to float rounding) and the evaluation is the same.

Every run has a timeout.
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
    "index": RankFileScript(SCRIPTS / "full_batch_node_index.py", TIMEOUT),
    "mask": RankFileScript(SCRIPTS / "full_batch_node_mask.py", TIMEOUT),
}
SHARED = {
    "index": ("train_idx_share = accelerator.share_selection(train_idx)",
              "loss = F.nll_loss(picked, labels[train_idx_share])"),
    "mask": ("train_mask_share = accelerator.share_selection(data.train_mask)",
             "loss = F.cross_entropy(chosen, data.y[train_mask_share])"),
}


@pytest.mark.parametrize("shape", ["index", "mask"])
def test_migrated_with_the_selection_shared(shape: str) -> None:
    work, report = RUNS[shape].migrated
    migrated = (work / "migrated" / RUNS[shape].script.name).read_text()
    for line in SHARED[shape]:
        assert line in migrated, migrated
    assert "0 diagnostics" in report and "1 migrated" in report, report


@pytest.mark.parametrize("shape", ["index", "mask"])
def test_one_process_is_the_original(shape: str) -> None:
    (original,) = RUNS[shape].run("original")
    (one,) = RUNS[shape].run("one")
    assert one["losses"] == original["losses"] and one["weights"] == original["weights"]
    assert one["rows"] == [original["selected"]] * len(original["rows"])
    assert original["losses"][-1] < original["losses"][0] / 4


@pytest.mark.parametrize("shape", ["index", "mask"])
def test_two_processes_share_the_nodes_and_agree(shape: str) -> None:
    (original,) = RUNS[shape].run("original")
    first, second = RUNS[shape].run("two")
    assert [first["rank"], second["rank"]] == [0, 1]
    assert original["selected"] % 2 == 0
    for rank in (first, second):
        assert rank["selected"] == original["selected"]
        assert rank["rows"] == [original["selected"] // 2] * len(original["rows"])
        assert rank["losses"][-1] < rank["losses"][0] / 4
    assert first["weights"] == second["weights"]
    assert first["losses"] != second["losses"]  # each rank's loss is over its own nodes
    # equal halves: the averaged gradient is the whole selection's
    assert (first["losses"][0] + second["losses"][0]) / 2 == pytest.approx(original["losses"][0], rel=1e-5)
    assert first["weights"] == pytest.approx(original["weights"], rel=1e-3, abs=1e-4)
    for key in ("test_accuracy", "accuracies"):
        if key in original:
            assert first[key] == second[key] == original[key]
