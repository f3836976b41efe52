"""A test loss summed over samples, over an evaluation loader the 2 processes cannot split evenly
(`nprocess_scripts/padded_eval_sum.py`: 37 samples, batches of 8, a variational autoencoder's
loss over the reconstruction, mu and logvar), migrated with the CLI and run on 1 and 2 processes.

- The 1-process run of the migrated script gives exactly what the original gives.
- On 2 processes the test loss equals the 1-process one on both ranks (evaluated before training,
  from the same weights): the loss is computed from the values `gather_for_metrics` returns, which
  drop the samples the prepared loader repeats to pad the last round (counted, the sum would hold
  48 samples' losses divided by 37). The first batch's preview keeps this process's 8 samples.
- The training-loss sum divided by the dataset size is reduced across processes (the same value
  on both ranks), and the migration reports that this sum, unlike the gathered test loss, holds
  the repeated samples' losses too.

Every run has a timeout.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))
from original_and_migrated import RankFileScript  # noqa: E402

SCRIPT = Path(__file__).resolve().parent / "nprocess_scripts" / "padded_eval_sum.py"
TIMEOUT = 180


RUNS = RankFileScript(SCRIPT, TIMEOUT)


def _migrated() -> tuple[Path, str]:
    return RUNS.migrated


def _run(how: str) -> list[dict]:
    return RUNS.run(how)


def test_the_loss_is_computed_from_gathered_values_and_the_padding_reported() -> None:
    work, report = _migrated()
    migrated = (work / "migrated" / SCRIPT.name).read_text()
    assert "gathered_recon, gathered_x, gathered_mu, gathered_logvar = accelerator.gather_for_metrics(" in migrated
    assert "vae_loss(gathered_recon, gathered_x, gathered_mu, gathered_logvar).item()" in migrated
    assert "recon.view(BATCH, 6)" in migrated
    assert 'torch.tensor(train_loss, dtype=torch.float64, device=accelerator.device), "sum"' in migrated
    assert "AM011" in report and "repeats some of the epoch's first samples" in report


def test_one_process_identical_to_original() -> None:
    assert _run("one") == _run("original")


def test_test_loss_on_two_processes_equals_one_process() -> None:
    (single,) = _run("one")
    ranks = _run("two")
    assert len(ranks) == 2
    loss, preview = single["before"]
    for rank in ranks:
        got_loss, got_preview = rank["before"]
        assert math.isclose(got_loss, loss, rel_tol=1e-6), (got_loss, loss)
        assert got_preview == preview == [8, 6]  # this process's first batch
    assert ranks[0]["before"] == ranks[1]["before"]
    assert ranks[0]["train"] == ranks[1]["train"]  # reduced: one value on every rank
    assert ranks[0]["after"] == ranks[1]["after"]
