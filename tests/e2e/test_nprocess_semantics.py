"""What only N processes show: whole scripts migrated with the CLI, run on 1 and on 2 processes.

- `nprocess_scripts/eval_metrics.py`: a summed loss computed before the metric line, accuracy
  counts, a batch mean weighted by the batch size and predictions collected from a model call, on
  an evaluation set (37 samples, batches of 5) that 2 processes cannot split evenly. Evaluated
  before training (the same weights everywhere), the 2-process values must equal the 1-process
  ones on both ranks: gather_for_metrics drops the padding, the loss is computed from the
  gathered samples, not gathered as a 0-d tensor.
- `nprocess_scripts/plateau_early_stop.py`: ReduceLROnPlateau and an early stop fed with the
  epoch's training loss, on data whose halves (each rank's batches on 2 processes) learn
  differently. Both ranks must take the same LR at every epoch and stop at the same epoch (without
  the reduction inserted by AM011 rank 1 stops at epoch 6 while rank 0 trains on and waits for it
  in the next all-reduce). With split_batches the 2 processes follow the 1-process trajectory, so
  they must also take the 1-process decisions.
- `nprocess_scripts/eval_outputs_per_process.py`: an autoencoder whose evaluation loop also uses
  the outputs and the batch for something else (`recon.view(BATCH, ...)` on the first batch), and
  a loop counting `x.size(0)` next to a model call gathered in place. The metric must read the
  gathered values under new names while the loop keeps this process's (rebound in place, the
  reshape fails on 2 processes: "shape invalid"), and the wrapped model call must run on this
  process's inputs (on the gathered ones, every prediction would be counted twice).
- `nprocess_scripts/param_groups_helper.py`: an optimizer over parameter groups a helper of the
  script builds from the model (`AdamW(param_groups(model, wd))`). The model must be prepared with
  the optimizer: each rank sees half of the batches, so unprepared (not synchronised) the two ranks
  end with different weights.
- `nprocess_scripts/dataset_average.py`: a training loss summed over each batch's samples and
  divided by `len(loader.dataset)` after the epoch. Each process sums its own share, so AM011
  reduces the sum across processes before the division: with split_batches (the 1-process
  trajectory) every rank's averages equal the 1-process ones (unreduced: half of them).

The 1-process run of each migrated script must give exactly what the original gives. Every run has
a timeout, so a hang (ranks stopping at different epochs) fails instead of stalling.
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))
from rt_helpers import run_cmd  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = Path(__file__).resolve().parent / "nprocess_scripts"
TIMEOUT = 180


def _accel() -> str:
    found = shutil.which("accel", path=str(Path(sys.executable).parent)) or shutil.which("accel")
    assert found, "the `accel` console script is not installed"
    return found


@lru_cache(maxsize=None)
def _workdir(name: str) -> Path:
    work = Path(__import__("tempfile").mkdtemp(prefix=f"nproc-{name}-"))
    result = subprocess.run(
        [sys.executable, "-m", "migrate", "--output-dir", str(work / "migrated"), str(SCRIPTS / f"{name}.py")],
        cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return work


def _migrated(name: str) -> Path:
    return _workdir(name) / "migrated" / f"{name}.py"


@lru_cache(maxsize=None)
def _run(name: str, how: str) -> list[dict]:
    """Run the original or the migrated script; return every rank's JSON result."""
    out = _workdir(name) / how
    out.mkdir()
    script = SCRIPTS / f"{name}.py" if how == "original" else _migrated(name)
    if how in ("original", "one"):
        cmd = [sys.executable, str(script), str(out)]
    else:
        env = ["env", "ACCEL_SPLIT_BATCHES=1"] if how == "split" else []
        cmd = [*env, _accel(), "launch", "--nproc-per-node", "2", str(script), str(out)]
    result = run_cmd(cmd, cwd=out, timeout=TIMEOUT)
    assert result.returncode == 0, f"{cmd} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    ranks = sorted(out.glob("rank*.json"))
    return [json.loads(p.read_text()) for p in ranks]


def test_migration_has_the_n_process_rewrites() -> None:
    evaluated = _migrated("eval_metrics").read_text()
    assert "output, y = accelerator.gather_for_metrics((output, y))" in evaluated
    assert "accelerator.gather_for_metrics(model(x)).argmax(-1)" in evaluated
    assert "gather_for_metrics(loss" not in evaluated
    decided = _migrated("plateau_early_stop").read_text()
    assert "train_loss = accelerator.reduce(" in decided
    assert 'torch.tensor(train_loss, dtype=torch.float64, device=accelerator.device), "mean"' in decided


@pytest.mark.parametrize(
    "name", ["eval_metrics", "plateau_early_stop", "eval_outputs_per_process", "param_groups_helper", "dataset_average"]
)
def test_one_process_identical_to_original(name: str) -> None:
    assert _run(name, "one") == _run(name, "original")


def test_eval_metrics_on_two_processes_equal_one_process() -> None:
    (single,) = _run("eval_metrics", "one")
    ranks = _run("eval_metrics", "two")
    assert len(ranks) == 2
    loss, accuracy, weighted, predictions = single["before"]
    for rank in ranks:
        got_loss, got_accuracy, got_weighted, got_predictions = rank["before"]
        assert math.isclose(got_loss, loss, rel_tol=1e-6), (got_loss, loss)
        assert math.isclose(got_weighted, weighted, rel_tol=1e-6), (got_weighted, weighted)
        assert got_accuracy == accuracy
        assert got_predictions == predictions  # 37 of them: the padding of the last round is dropped
    assert ranks[0]["before"] == ranks[1]["before"]  # every rank computed the same values


def test_eval_outputs_used_per_process_on_two_processes_equal_one_process() -> None:
    migrated = _migrated("eval_outputs_per_process").read_text()
    assert "gathered_recon, gathered_x, gathered_code = accelerator.gather_for_metrics(" in migrated
    assert "reconstruction_loss(gathered_recon, gathered_x, gathered_code)" in migrated
    assert "recon.view(BATCH, 6)" in migrated
    assert "accelerator.gather_for_metrics(model(x))" in migrated
    (single,) = _run("eval_outputs_per_process", "one")
    ranks = _run("eval_outputs_per_process", "two")
    assert len(ranks) == 2
    loss, preview = single["before"]
    seen, codes = single["codes"]
    assert (seen, len(codes)) == (37, 37)
    for rank in ranks:
        got_loss, got_preview = rank["before"]
        assert math.isclose(got_loss, loss, rel_tol=1e-6), (got_loss, loss)
        assert got_preview == preview  # this process's first batch: 5 samples on each rank too
        assert rank["codes"] == [seen, codes]  # 37 codes, each once, in the 1-process order
    assert ranks[0]["before"] == ranks[1]["before"]


def test_decisions_are_the_same_on_every_rank() -> None:
    ranks = _run("plateau_early_stop", "two")
    assert len(ranks) == 2
    assert ranks[0] == ranks[1]
    assert ranks[0]["stopped"] is not None  # the early stop did trigger
    assert len(set(ranks[0]["lrs"])) > 1  # and the plateau did lower the LR


def test_decisions_with_split_batches_follow_one_process() -> None:
    (single,) = _run("plateau_early_stop", "one")
    ranks = _run("plateau_early_stop", "split")
    for rank in ranks:
        assert rank["lrs"] == single["lrs"]
        assert rank["stopped"] == single["stopped"]
        assert math.isclose(rank["best"], single["best"], rel_tol=1e-5)


def test_model_behind_parameter_groups_is_synchronised() -> None:
    migrated = _migrated("param_groups_helper").read_text()
    assert "model, optimizer, loader = accelerator.prepare(model, optimizer, loader)" in migrated
    ranks = _run("param_groups_helper", "two")
    assert len(ranks) == 2
    assert ranks[0]["weights"] == ranks[1]["weights"]


def test_average_over_the_dataset_sums_every_process() -> None:
    migrated = _migrated("dataset_average").read_text()
    assert 'torch.tensor(running, dtype=torch.float64, device=accelerator.device), "sum"' in migrated
    (single,) = _run("dataset_average", "one")
    ranks = _run("dataset_average", "split")
    assert len(ranks) == 2
    for rank in ranks:
        for got, want in zip(rank["averages"], single["averages"], strict=True):
            assert math.isclose(got, want, rel_tol=1e-5), (got, want)
