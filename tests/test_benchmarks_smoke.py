"""Smoke test: the benchmark entry point runs on a tiny setting and produces its table and JSON.

Timings are never asserted (they belong to `python -m benchmarks`, not to the test suite)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_benchmarks_entry_point_prints_table_and_writes_reports(tmp_path: Path) -> None:
    out_json, out_md = tmp_path / "perf.json", tmp_path / "perf.md"
    result = subprocess.run(
        [sys.executable, "-m", "benchmarks", "--quick", "--only", "codemod,cli,step", "--torch-sample", "-1",
         "--no-two-process", "--startup-rounds", "1", "--json", str(out_json), "--markdown", str(out_md)],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.splitlines()
    assert lines[0].split()[:4] == ["benchmark", "measure", "over", "value"]
    for expected in ("libcst parse+round-trip", "libcst parse+print process", "accel-migrate --version",
                     "fixed cost per step"):
        assert any(expected in line for line in lines), expected
    report = json.loads(out_json.read_text())
    groups = {row["group"] for row in report["rows"]}
    assert {"codemod fixtures", "codemod corpus", "CLI start-up", "step, 1 process"} <= groups
    assert all(row["value"] == row["value"] for row in report["rows"])  # no NaN
    assert out_md.read_text().startswith("| benchmark | measure |")
