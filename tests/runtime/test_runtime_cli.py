"""``accel`` CLI: help, argument translation to torchrun, and a real 2-process launch."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest


from rt_helpers import run_cmd
from runtime.cli import build_parser, main
from runtime.launch import WORKER_ENTRY, shadowing_module, torchrun_argv

ACCEL = shutil.which("accel") or str(Path(sys.executable).with_name("accel"))


def _launch_args(*argv: str):
    return build_parser().parse_args(["launch", *argv])


def test_accel_without_command_prints_help_and_exits_2(tmp_path) -> None:
    proc = run_cmd([ACCEL], tmp_path)
    assert proc.returncode == 2
    assert "launch" in proc.stderr and "usage: accel" in proc.stderr


def test_accel_help_lists_commands(tmp_path) -> None:
    proc = run_cmd([ACCEL, "--help"], tmp_path)
    assert proc.returncode == 0
    assert "launch" in proc.stdout


def test_accel_launch_help_describes_every_option(tmp_path) -> None:
    proc = run_cmd([ACCEL, "launch", "--help"], tmp_path)
    assert proc.returncode == 0
    for option in ("--nproc-per-node", "--nproc_per_node", "--nnodes", "--node-rank",
                   "--rdzv-endpoint", "--master-addr", "--master-port", "--module", "--migrate", "ARGS"):
        assert option in proc.stdout, option


def test_one_node_uses_standalone_and_keeps_script_args() -> None:
    args = _launch_args("--nproc_per_node", "2", "train.py", "--nproc-per-node", "9", "-m", "x")
    argv = torchrun_argv(args)
    assert "--standalone" in argv
    assert argv[argv.index("--nproc-per-node") + 1] == "2"
    assert argv[-5:] == ["train.py", "--nproc-per-node", "9", "-m", "x"]
    assert "--module" not in argv


def test_rendezvous_options_are_forwarded() -> None:
    argv = torchrun_argv(_launch_args("--nnodes", "2", "--node-rank", "1",
                                      "--rdzv-endpoint", "host:29400", "-m", "pkg.train", "a"))
    assert "--standalone" not in argv
    assert argv[argv.index("--rdzv-endpoint") + 1] == "host:29400"
    assert argv[argv.index("--rdzv-backend") + 1] == "c10d"
    assert argv[argv.index("--node-rank") + 1] == "1"
    assert argv[-4:] == [str(WORKER_ENTRY), "-m", "pkg.train", "a"]  # run under @record
    assert "--module" not in argv
    static = torchrun_argv(_launch_args("--master-addr", "10.0.0.1", "--master-port", "1234", "t.py"))
    assert "--standalone" not in static
    assert static[static.index("--master-addr") + 1] == "10.0.0.1"
    assert static[static.index("--master-port") + 1] == "1234"


def test_shadowing_runtime_module_is_detected(tmp_path) -> None:
    script = tmp_path / "train.py"
    script.write_text("")
    assert shadowing_module(str(script)) is None
    (tmp_path / "runtime.py").write_text("")
    assert shadowing_module(str(script)) == tmp_path / "runtime.py"


SCRIPT = """
import json, os, sys
from pathlib import Path
from runtime import Accelerator
accelerator = Accelerator()
out = Path(os.environ["ACCEL_TEST_OUT"])
(out / f"rank{accelerator.process_index}.json").write_text(json.dumps(
    {"argv": sys.argv[1:], "world": accelerator.num_processes, "rank": accelerator.process_index}))
if "--fail-on-rank-1" in sys.argv and accelerator.process_index == 1:
    raise SystemExit(3)
accelerator.end_training()
"""


def test_accel_launch_runs_two_ranks_and_passes_script_args(tmp_path, monkeypatch) -> None:
    script = tmp_path / "script.py"
    script.write_text(SCRIPT)
    monkeypatch.setenv("ACCEL_TEST_OUT", str(tmp_path))
    proc = run_cmd([ACCEL, "launch", "--nproc-per-node", "2", str(script), "--some-arg", "x",
                    "--nnodes", "7"], tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert [r["rank"] for r in results] == [0, 1]
    assert all(r["world"] == 2 for r in results)
    assert all(r["argv"] == ["--some-arg", "x", "--nnodes", "7"] for r in results)


def test_accel_launch_reports_a_failing_rank(tmp_path, monkeypatch) -> None:
    script = tmp_path / "script.py"
    script.write_text(SCRIPT)
    monkeypatch.setenv("ACCEL_TEST_OUT", str(tmp_path))
    proc = run_cmd([ACCEL, "launch", "--nproc-per-node", "2", str(script), "--fail-on-rank-1"], tmp_path)
    assert proc.returncode != 0
    assert "rank" in proc.stderr and "1" in proc.stderr


def test_accel_launch_missing_script(tmp_path) -> None:
    proc = run_cmd([ACCEL, "launch", str(tmp_path / "nope.py")], tmp_path)
    assert proc.returncode == 2
    assert "not found" in proc.stderr


def test_accel_cli_answers_without_importing_torch() -> None:
    # `accel --help` and option errors must be instant: the package loads torch lazily.
    code = (
        "import sys\n"
        "from runtime.cli import main\n"
        "import runtime\n"
        "assert 'torch' not in sys.modules, 'runtime.cli imported torch'\n"
        "from runtime import Accelerator\n"
        "assert 'torch' in sys.modules and Accelerator.__name__ == 'Accelerator'\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("command", [[], ["launch"], ["config"], ["env"]], ids=lambda c: " ".join(c) or "accel")
def test_help_is_readable_at_80_columns(command, capsys, monkeypatch) -> None:
    import re

    monkeypatch.setenv("COLUMNS", "80")
    with pytest.raises(SystemExit) as exit_info:
        main([*command, "--help"])
    out = capsys.readouterr().out
    assert exit_info.value.code == 0 and out.strip()
    assert not [line for line in out.splitlines() if len(line) > 80]
    assert not re.search(r"(\w-|\s--?)\n", out), out  # no word or option name cut at a hyphen
    # Every option's value has a name of its own (not argparse's NPROC_PER_NODE), shown once.
    parser = build_parser()
    actions = [a for a in parser._actions if a.option_strings]
    for sub in parser._actions[-1].choices.values():
        actions += [a for a in sub._actions if a.option_strings]
    for action in actions:
        if action.nargs != 0 and action.choices is None:
            assert action.metavar is not None, action.option_strings
    assert "NPROC_PER_NODE" not in out and "CONFIG_FILE CONFIG_FILE" not in out


def test_mistyped_command_suggests_the_right_one(capsys) -> None:
    assert main(["lauch", "train.py"]) == 2
    assert "unknown command 'lauch'; did you mean `accel launch`?" in capsys.readouterr().err
    assert main(["frobnicate"]) == 2
    assert "the commands are launch, config, env" in capsys.readouterr().err


def test_config_default_does_not_overwrite_without_force(tmp_path, capsys) -> None:
    path = tmp_path / "config.yaml"
    assert main(["config", "--default", "--config-file", str(path)]) == 0
    path.write_text("num_processes: 4\n")  # the user's own edit
    assert main(["config", "--default", "--config-file", str(path)]) == 1
    err = capsys.readouterr().err
    assert f"{path} already exists; pass --force to overwrite it" in err
    assert path.read_text() == "num_processes: 4\n"
    assert main(["config", "--default", "--force", "--config-file", str(path)]) == 0
    assert "num_processes: 1" in path.read_text()
