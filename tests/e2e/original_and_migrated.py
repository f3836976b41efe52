"""Shared by the e2e tests that run one script's original next to its migrated copy: the script is
written to `<folder>/original/<name>`, migrated by the CLI into `<folder>/migrated/<name>`, and
either copy is run on 1 process (plain python) or N (torchrun), each run in a folder of its own."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import textwrap
from functools import cached_property
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


class RankFileScript:
    """A script of `nprocess_scripts/` that writes `rank<N>.json` into the folder given as its
    argument, migrated once by the CLI (`migrated`: the folder and the CLI's report) and run as
    "original" (1 process), "one" (the migrated copy, 1 process) or "two" (the migrated copy under
    `accel launch --nproc-per-node 2`); each run once, its rank files returned in rank order."""

    def __init__(self, script: Path, timeout: float) -> None:
        self.script = script
        self.timeout = timeout
        self._runs: dict[str, list[dict]] = {}

    @cached_property
    def migrated(self) -> tuple[Path, str]:
        work = Path(tempfile.mkdtemp(prefix=f"{self.script.stem}-"))
        result = subprocess.run(
            [sys.executable, "-m", "migrate", "--output-dir", str(work / "migrated"), str(self.script)],
            cwd=ROOT, capture_output=True, text=True, timeout=self.timeout,
        )
        assert result.returncode == 0, result.stdout + result.stderr
        return work, result.stdout + result.stderr

    def run(self, how: str) -> list[dict]:
        if how not in self._runs:
            work, _ = self.migrated
            out = work / how
            out.mkdir()
            script = self.script if how == "original" else work / "migrated" / self.script.name
            if how in ("original", "one"):
                cmd = [sys.executable, str(script), str(out)]
            else:
                accel = shutil.which("accel", path=str(Path(sys.executable).parent)) or shutil.which("accel")
                assert accel, "the `accel` console script is not installed"
                cmd = [accel, "launch", "--nproc-per-node", "2", str(script), str(out)]
            result = run_cmd(cmd, cwd=out, timeout=self.timeout)
            assert result.returncode == 0, f"{cmd} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
            self._runs[how] = [json.loads(p.read_text()) for p in sorted(out.glob("rank*.json"))]
        return self._runs[how]
