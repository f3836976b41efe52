"""Shared by the e2e tests that check which process calls a library: fake modules (written into a
folder put first on PYTHONPATH) record each call in LOG_CALLS_DIR/calls_rank{RANK}.txt; the script
under test is migrated by the CLI into a folder of its own (`migrated_script`)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# The head of every fake module: `_record(name)` appends one line to this process's file.
RECORD_CALLS = '''
import os


def _record(name):
    rank = os.environ.get("RANK", "0")
    with open(os.path.join(os.environ["LOG_CALLS_DIR"], f"calls_rank{rank}.txt"), "a") as f:
        f.write(name + "\\n")
'''


def recorded_calls(out: Path) -> dict[str, list[str]]:
    """Each process's recorded calls, keyed `calls_rank0`, `calls_rank1`..."""
    return {p.stem: p.read_text().splitlines() for p in sorted(out.glob("calls_rank*.txt"))}


def accel_executable() -> str:
    found = shutil.which("accel", path=str(Path(sys.executable).parent)) or shutil.which("accel")
    assert found, "the `accel` console script is not installed"
    return found


def migrated_script(tmp_path: Path, text: str, timeout: float) -> tuple[Path, Path]:
    """`text` written to tmp_path/train.py and migrated by the CLI into tmp_path/migrated (exit 0):
    (the original, the migrated script)."""
    original = tmp_path / "train.py"
    original.write_text(text)
    migrated_dir = tmp_path / "migrated"
    result = subprocess.run(
        [sys.executable, "-m", "migrate", "--output-dir", str(migrated_dir), str(original)],
        cwd=ROOT, capture_output=True, text=True, timeout=timeout,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return original, migrated_dir / "train.py"
