"""AM004 on noise drawn in the training loop from a seed every process shares, checked on real
processes (`nprocess_scripts/gan_noise.py`, migrated with the CLI; 2 processes under `accel
launch`).

- The migration seeds the processes apart right after the prepare call (`if
  accelerator.process_index: torch.manual_seed(torch.initial_seed() + accelerator.process_index)`),
  with no report left.
- On 1 process the migrated script gives exactly what the original gives: the main process keeps
  the script's own stream.
- On 2 processes the processes draw different noise at every step, the `random_split` drawn
  before the prepare call is the same on both, and the prepared loader still gives each process
  its own half of every epoch (it shuffles from rank 0's seed, whatever each process's global
  RNG holds).

Every run has a timeout.
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
SCRIPT = Path(__file__).resolve().parent / "nprocess_scripts" / "gan_noise.py"
TIMEOUT = 180
PER_RANK_SEED = (
    "    if accelerator.process_index:\n"
    "        torch.manual_seed(torch.initial_seed() + accelerator.process_index)\n"
)


def _accel() -> str:
    found = shutil.which("accel", path=str(Path(sys.executable).parent)) or shutil.which("accel")
    assert found, "the `accel` console script is not installed"
    return found


@lru_cache(maxsize=None)
def _migrated() -> tuple[Path, str]:
    work = Path(tempfile.mkdtemp(prefix="gan-noise-"))
    result = subprocess.run(
        [sys.executable, "-m", "migrate", "--output-dir", str(work / "migrated"), str(SCRIPT)],
        cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return work / "migrated" / SCRIPT.name, result.stdout + result.stderr


@lru_cache(maxsize=None)
def _run(how: str) -> list[dict]:
    migrated, _ = _migrated()
    out = migrated.parent.parent / how
    out.mkdir()
    if how == "original":
        cmd = [sys.executable, str(SCRIPT), str(out)]
    elif how == "one":
        cmd = [sys.executable, str(migrated), str(out)]
    else:
        cmd = [_accel(), "launch", "--nproc-per-node", "2", str(migrated), str(out)]
    result = run_cmd(cmd, cwd=out, timeout=TIMEOUT)
    assert result.returncode == 0, f"{cmd} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return [json.loads(p.read_text()) for p in sorted(out.glob("rank*.json"))]


def test_the_processes_are_seeded_apart_after_the_prepare_call() -> None:
    migrated, output = _migrated()
    text = migrated.read_text()
    prepare = text.index("= accelerator.prepare(")
    assert text.index(PER_RANK_SEED) > prepare
    assert text.index("random_split(") < prepare
    assert "AM004 warning" not in output and "0 diagnostics" in output


def test_one_process_identical_to_original() -> None:
    assert _run("one") == _run("original")


def test_two_processes_draw_apart_and_keep_the_split_and_the_shards() -> None:
    first, second = _run("two")
    assert len(first["noise"]) == len(second["noise"]) == 10  # 2 epochs of 5 batches: half of 40 points each
    assert all(a != b for a, b in zip(first["noise"], second["noise"], strict=True))
    (single,) = _run("one")
    assert first["val"] == second["val"] == single["val"]  # drawn before the per-rank seed
    train = set(range(48)) - set(first["val"])
    for epoch in range(2):
        halves = [set(rank["seen"][epoch * 20:(epoch + 1) * 20]) for rank in (first, second)]
        assert len(halves[0]) == len(halves[1]) == 20
        assert not halves[0] & halves[1]
        assert halves[0] | halves[1] == train
