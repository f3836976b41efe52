"""The runner's garbage collection (`migrate/runner.py` `_process_unit_uncollected`): with the
collector running, each unit runs with it paused and its young garbage is collected when it ends;
in a process that paused the collector itself (the CLI), the young garbage is collected only once
more than COLLECT_AT objects have piled up, and the results are the same either way."""

from __future__ import annotations

import gc
import subprocess
import sys
from pathlib import Path

import pytest

from migrate import runner
from migrate.engine import Options

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "fixtures" / "pipeline"


def _unit(tmp_path: Path) -> runner.Unit:
    source = next(p for p in sorted(SCRIPT.glob("*.in.py")) if "accelerator" not in p.read_text())
    path = tmp_path / "train.py"
    path.write_text(source.read_text())
    return runner.Unit([path])


def _collections(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    made: list[int] = []
    collect = gc.collect

    def counted(generation: int = 2) -> int:
        made.append(generation)
        return collect(generation)

    monkeypatch.setattr(runner.gc, "collect", counted)
    return made


def test_with_the_collector_running_each_unit_is_collected_and_it_runs_again(tmp_path, monkeypatch) -> None:
    made = _collections(monkeypatch)
    assert gc.isenabled()
    results = runner._process_unit_uncollected(_unit(tmp_path), runner.Settings(Options(), write=False))
    assert made == [0] and gc.isenabled()
    assert results[0].changed


def test_a_paused_collector_is_run_only_past_the_limit(tmp_path, monkeypatch) -> None:
    made = _collections(monkeypatch)
    settings = runner.Settings(Options(), write=False)
    unit = _unit(tmp_path)
    gc.disable()
    try:
        under = runner._process_unit_uncollected(unit, settings)
        assert made == [] and not gc.isenabled()  # a unit's garbage is far below a million objects
        monkeypatch.setattr(runner, "COLLECT_AT", 0)
        over = runner._process_unit_uncollected(unit, settings)
        assert made == [0] and not gc.isenabled()
    finally:
        gc.enable()
    assert [r.new_text for r in under] == [r.new_text for r in over]


def test_the_command_pauses_the_collector_for_its_process(tmp_path: Path) -> None:
    """`python -m migrate` (the command's own process) runs with the collector paused; `main(argv)`
    called as a library function leaves it as it was."""
    probe = (
        "import gc, sys\n"
        "from migrate import cli, runner\n"
        "seen = []\n"
        "real = runner.process_unit\n"
        "runner.process_unit = lambda unit, settings: (seen.append(gc.isenabled()), real(unit, settings))[1]\n"
        "try:\n"
        "    cli.main([sys.argv[1], '--check', '-q'])\n"
        "except SystemExit:\n"
        "    pass\n"
        "library = (seen[-1], gc.isenabled())\n"
        "sys.argv = ['accel-migrate', sys.argv[1], '--check', '-q']\n"
        "try:\n"
        "    cli.main()\n"
        "except SystemExit:\n"
        "    pass\n"
        "print(library, seen[-1], gc.isenabled())\n"
    )
    unit = _unit(tmp_path)
    out = subprocess.run([sys.executable, "-c", probe, str(unit.paths[0])], capture_output=True, text=True,
                         cwd=ROOT, timeout=120)
    assert out.stdout.strip().splitlines()[-1] == "(False, True) False False", out.stdout + out.stderr
