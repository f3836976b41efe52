"""AM004's report on noise drawn in the training loop from a seed every process shares, checked on
2 real processes (`nprocess_scripts/gan_noise.py`, migrated with the CLI, run under `accel launch`).

- The report is printed at the draw, and what it says holds: migrated as it is, both processes
  draw the same noise at every step (N copies of one batch of noise).
- What it tells to do works: with `torch.manual_seed(SEED + accelerator.process_index)` added
  after the prepare call, the processes draw different noise, the `random_split` drawn before it is
  the same on both, and the prepared loader still gives each process its own half of every epoch
  (it shuffles from rank 0's seed, whatever each process's global RNG holds).

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
PER_RANK_SEED = "    torch.manual_seed(SEED + accelerator.process_index)\n"


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
def _two_processes(per_rank_seed: bool) -> list[dict]:
    migrated, _ = _migrated()
    script = migrated
    if per_rank_seed:
        lines = migrated.read_text().splitlines(keepends=True)
        prepare = next(i for i, line in enumerate(lines) if "= accelerator.prepare(" in line)
        end = next(i for i in range(prepare, len(lines)) if lines[i].rstrip().endswith(")"))
        script = migrated.with_name("gan_noise_seeded.py")
        script.write_text("".join(lines[: end + 1] + [PER_RANK_SEED] + lines[end + 1:]))
    out = migrated.parent / ("seeded" if per_rank_seed else "as_migrated")
    out.mkdir()
    cmd = [_accel(), "launch", "--nproc-per-node", "2", str(script), str(out)]
    result = run_cmd(cmd, cwd=out, timeout=TIMEOUT)
    assert result.returncode == 0, f"{cmd} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    ranks = [json.loads(p.read_text()) for p in sorted(out.glob("rank*.json"))]
    assert len(ranks) == 2
    return ranks


def test_the_draw_is_reported() -> None:
    _, output = _migrated()
    line = next(i for i, text in enumerate(SCRIPT.read_text().splitlines(), 1) if "noise = torch.randn(" in text)
    assert f"{SCRIPT.name}:{line}: AM004 warning: `torch.randn(real.size(0), LATENT, device=device)` is the whole " \
           "input of `generator(...)`" in output
    assert "`torch.manual_seed(seed + accelerator.process_index)`" in output


def test_as_migrated_both_processes_draw_the_same_noise() -> None:
    first, second = _two_processes(per_rank_seed=False)
    assert len(first["noise"]) == 10  # 2 epochs of 5 batches: half of the 40 training points each
    assert first["noise"] == second["noise"]


def test_a_per_rank_seed_after_prepare_draws_apart_and_keeps_the_split_and_the_shards() -> None:
    first, second = _two_processes(per_rank_seed=True)
    assert all(a != b for a, b in zip(first["noise"], second["noise"], strict=True))
    assert first["val"] == second["val"]  # drawn before the per-rank seed
    train = set(range(48)) - set(first["val"])
    for epoch in range(2):
        halves = [set(rank["seen"][epoch * 20:(epoch + 1) * 20]) for rank in (first, second)]
        assert len(halves[0]) == len(halves[1]) == 20
        assert not halves[0] & halves[1]
        assert halves[0] | halves[1] == train
