"""The whole-script golden files of fixtures/pipeline, run: original and migrated, one process.

fixtures/scripts (run in depth by test_migrate_and_train.py) are skipped here. For every other
pipeline script whose original runs on this CPU-only machine, the migrated output must run too and
print the same losses. An original that cannot run here (it needs CUDA, torchrun, a package we do
not install) is skipped with its own error as the reason.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PIPELINE = ROOT / "fixtures" / "pipeline"
CORPUS = {p.stem for p in (ROOT / "fixtures" / "scripts").glob("*.py")}
CASES = sorted(
    p
    for p in PIPELINE.glob("*.in.py")
    if p.name.removesuffix(".in.py") not in CORPUS
    and p.with_name(p.name.replace(".in.py", ".out.py")).exists()
    and not p.read_text().startswith("# flags:")
)
LOSS = re.compile(r"loss[ =:]+(-?[0-9]+\.[0-9]+)")
TIMEOUT = 120


def _run(script: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    env.pop("PYTHONPATH", None)
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    return subprocess.run(
        [sys.executable, script.name], cwd=cwd, env=env, capture_output=True, text=True, timeout=TIMEOUT
    )


@pytest.mark.parametrize("case", CASES, ids=lambda p: p.name.removesuffix(".in.py"))
def test_migrated_pipeline_script_runs_like_the_original(case: Path, tmp_path: Path) -> None:
    original_dir, migrated_dir = tmp_path / "original", tmp_path / "migrated"
    original_dir.mkdir()
    migrated_dir.mkdir()
    shutil.copy(case, original_dir / "script.py")
    shutil.copy(case.with_name(case.name.replace(".in.py", ".out.py")), migrated_dir / "script.py")

    before = _run(original_dir / "script.py", original_dir)
    if before.returncode != 0:
        reason = (before.stderr.strip().splitlines() or ["no output"])[-1]
        pytest.skip(f"the original cannot run on this machine: {reason}")
    after = _run(migrated_dir / "script.py", migrated_dir)
    assert after.returncode == 0, after.stderr[-3000:]
    assert LOSS.findall(after.stdout) == LOSS.findall(before.stdout)
