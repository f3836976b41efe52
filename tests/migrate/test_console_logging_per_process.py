"""`logging.basicConfig(...)` in a script that already chooses per process what its loggers print
(a level set from the process, HF Accelerate's `get_logger`) is left on every process: guarding it
would be a second guard over the script's own, dropping the lines it logs on the other processes.
A setup that writes a file, or levels that do not depend on the process, are still guarded."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from migrate.cli import app

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "guard_experiment_loggers"
PER_PROCESS = (FIXTURES / "leave_console_logging_levels_set_per_process.in.py").read_text()
LEVEL = "log.setLevel(logging.INFO if accelerator.is_local_main_process else logging.ERROR)"
CONSOLE = 'logging.basicConfig(format="%(levelname)s %(message)s", level=logging.INFO)'
GUARDED = "    if accelerator.is_main_process:\n        logging.basicConfig("


def migrated(tmp_path: Path, text: str) -> str:
    path = tmp_path / "train.py"
    path.write_text(text)
    result = CliRunner().invoke(app, [str(path)], env={"NO_COLOR": "1"})
    assert result.exit_code == 0, result.output
    return path.read_text()


def test_level_from_the_process_keeps_console_setup(tmp_path: Path) -> None:
    assert LEVEL in PER_PROCESS
    assert migrated(tmp_path, PER_PROCESS) == PER_PROCESS


def test_verbosity_in_a_rank_branch_keeps_console_setup(tmp_path: Path) -> None:
    branch = ("if accelerator.is_local_main_process:\n        log.setLevel(logging.INFO)\n"
              "    else:\n        transformers_logging.set_verbosity_error()")
    text = PER_PROCESS.replace(LEVEL, branch).replace(
        "log = logging.getLogger(__name__)", "log = logging.getLogger(__name__)\ntransformers_logging = logging")
    assert branch in text
    assert migrated(tmp_path, text) == text


def test_file_setup_is_still_guarded(tmp_path: Path) -> None:
    text = PER_PROCESS.replace(CONSOLE, 'logging.basicConfig(filename="train.log", level=logging.INFO)')
    assert GUARDED in migrated(tmp_path, text)


def test_levels_shared_by_every_process_guard_console_setup(tmp_path: Path) -> None:
    text = PER_PROCESS.replace(LEVEL, "log.setLevel(logging.INFO)")
    assert GUARDED in migrated(tmp_path, text)
