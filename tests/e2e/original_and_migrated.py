"""Shared by the e2e tests that run one script's original next to its migrated copy: the script is
written to `<folder>/original/<name>`, migrated by the CLI into `<folder>/migrated/<name>`, and
either copy is run on 1 process (plain python) or N (torchrun), each run in a folder of its own."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from rt_helpers import run_cmd, torchrun

ROOT = Path(__file__).resolve().parents[2]


def migrate_into(folder: Path, name: str, script: str, timeout: float) -> Path:
    """`script` (dedented) written as `folder/original/<name>` and migrated into `folder/migrated`
    (the CLI must exit 0); returns `folder`."""
    (folder / "original").mkdir(parents=True)
    (folder / "original" / name).write_text(textwrap.dedent(script).lstrip())
    result = subprocess.run(
        [sys.executable, "-m", "migrate", "--output-dir", str(folder / "migrated"), str(folder / "original")],
        cwd=ROOT, capture_output=True, text=True, timeout=timeout,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return folder


def run_copy(
    folder: Path, which: str, name: str, nproc: int, timeout: float
) -> tuple[subprocess.CompletedProcess[str], Path]:
    """Runs `folder/<which>/<name>` ("original" or "migrated") on `nproc` processes in
    `folder/<which>-<nproc>` (it must exit 0); returns the run and its folder."""
    run_dir = folder / f"{which}-{nproc}"
    run_dir.mkdir(exist_ok=True)
    script = folder / which / name
    if nproc == 1:
        proc = run_cmd([sys.executable, str(script)], cwd=run_dir, timeout=timeout)
    else:
        proc = torchrun(script, cwd=run_dir, nproc=nproc, timeout=timeout)
    assert proc.returncode == 0, f"{which} on {nproc} process(es):\n{proc.stdout}\n{proc.stderr}"
    return proc, run_dir
