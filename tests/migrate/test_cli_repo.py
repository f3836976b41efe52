"""The CLI on whole repositories and in CI: discovery, config, output-dir, parallel runs, reports,
stdin, subcommands, zero-touch and the shadowing check."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from migrate import cli
from migrate.cli import app, commands

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
PLAIN = (FIXTURES / "create_accelerator" / "device_ifexp_module_level.in.py").read_text()
MIGRATED = (FIXTURES / "create_accelerator" / "device_ifexp_module_level.out.py").read_text()
LIBRARY = (FIXTURES / "replace_loss_backward" / "leave_library_function.in.py").read_text()
# Training code with a syntax error: the pre-filter lets it through, the parser reports it.
BROKEN = "import torch\ndef f(:\n    loss.backward()\n"


def invoke(*args: str, env: dict[str, str] | None = None, input: bytes | str | None = None):  # type: ignore[no-untyped-def]
    return CliRunner().invoke(app, list(args), env=env, input=input)


def snapshot(path: Path) -> tuple[bytes, int]:
    return path.read_bytes(), path.stat().st_mtime_ns


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


# -- zero-touch ---------------------------------------------------------------------------------


def test_file_without_torch_is_not_even_parsed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import libcst

    parsed: list[str] = []
    real = libcst.parse_module

    def counting(source, *args, **kwargs):  # type: ignore[no-untyped-def]
        parsed.append(source)
        return real(source, *args, **kwargs)

    monkeypatch.setattr(libcst, "parse_module", counting)
    other = write(tmp_path / "utils.py", "import numpy as np\n\ndef f(x):\n    return x.backward()\n")
    write(tmp_path / "train.py", PLAIN)
    before = snapshot(other)
    result = invoke("-j", "1", "--output-format", "json", str(tmp_path))
    assert result.exit_code == 0, result.output
    # the torch file was parsed once through the patched function (the safety checks read the
    # rewritten tree, not a parse of the output), utils.py never
    assert parsed == [PLAIN]
    assert snapshot(other) == before
    statuses = {Path(f["path"]).name: f["status"] for f in json.loads(result.stdout)["files"]}
    assert statuses == {"train.py": "changed", "utils.py": "skipped"}


def test_torch_file_no_rule_changes_keeps_bytes_and_mtime(tmp_path: Path) -> None:
    # odd formatting that a careless writer would normalise: tabs, trailing spaces, form feed,
    # mixed line endings, no final newline; only a diagnostic, no change
    text = LIBRARY.replace("\n", "\r\n", 3) + "\x0c\n#\ttrailing   \nx = 1"
    path = tmp_path / "engine.py"
    path.write_bytes(text.encode())
    before = snapshot(path)
    result = invoke(str(path))
    assert result.exit_code == 0, result.output
    assert "AM003 warning" in result.output
    assert snapshot(path) == before


def test_round_trip_difference_without_a_rule_change_is_never_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import migrate.engine
    from migrate.results import FileResult

    def round_trip_only(text, path="<string>", options=None, module=None, facts=None):  # type: ignore[no-untyped-def]
        return FileResult(path, text, new_text=text.replace("    ", "\t"), parsed=True)  # no changes recorded

    monkeypatch.setattr(migrate.engine, "migrate_source", round_trip_only)
    path = write(tmp_path / "train.py", PLAIN)
    before = snapshot(path)
    assert invoke("-j", "1", str(path)).exit_code == 0
    assert snapshot(path) == before
    assert invoke("-j", "1", "--check", str(path)).exit_code == 0


# -- --output-dir -------------------------------------------------------------------------------


def test_output_dir_mirrors_paths_and_leaves_inputs_alone(tmp_path: Path) -> None:
    src = tmp_path / "src"
    a = write(src / "a" / "train.py", PLAIN)
    a.chmod(0o750)
    b = write(src / "b" / "other.py", PLAIN)
    write(src / "b" / "plain.py", "x = 1\n")
    before = snapshot(a), snapshot(b)
    out = tmp_path / "out"
    result = invoke("--output-dir", str(out), str(src))
    assert result.exit_code == 0, result.output
    assert (snapshot(a), snapshot(b)) == before
    assert (out / "a" / "train.py").read_text() == MIGRATED
    assert (out / "b" / "other.py").read_text() == MIGRATED
    assert not (out / "b" / "plain.py").exists()  # only files that change are written
    assert stat.S_IMODE((out / "a" / "train.py").stat().st_mode) == 0o750
    assert f"-> {out / 'a' / 'train.py'}" in result.output


def test_output_dir_single_file(tmp_path: Path) -> None:
    script = write(tmp_path / "proj" / "train.py", PLAIN)
    out = tmp_path / "converted"
    assert invoke("--output-dir", str(out), str(script)).exit_code == 0
    assert (out / "train.py").read_text() == MIGRATED
    assert script.read_text() == PLAIN


def test_output_dir_inside_input_is_refused(tmp_path: Path) -> None:
    script = write(tmp_path / "train.py", PLAIN)
    result = invoke("--output-dir", str(tmp_path / "out"), str(tmp_path))
    assert result.exit_code == 2
    assert "is inside the input directory" in result.output
    assert script.read_text() == PLAIN
    assert not (tmp_path / "out").exists()


def test_output_dir_non_empty_needs_force(tmp_path: Path) -> None:
    script = write(tmp_path / "in" / "train.py", PLAIN)
    out = tmp_path / "out"
    write(out / "keep.txt", "x")
    result = invoke("--output-dir", str(out), str(script))
    assert result.exit_code == 2
    assert "not empty; use --force" in result.output
    assert not (out / "train.py").exists()
    assert invoke("--output-dir", str(out), "--force", str(script)).exit_code == 0
    assert (out / "train.py").read_text() == MIGRATED
    assert (out / "keep.txt").read_text() == "x"


# -- discovery ----------------------------------------------------------------------------------


def _json(result) -> dict:  # type: ignore[no-untyped-def,type-arg]
    assert result.exit_code in (0, 1), result.output
    return json.loads(result.stdout)


def _seen(root: Path, *args: str) -> list[str]:
    document = _json(invoke("--check", "--output-format", "json", *args))
    return [Path(f["path"]).relative_to(root).as_posix() for f in document["files"]]


def test_gitignore_from_git_root_nested_and_negated(tmp_path: Path) -> None:
    (tmp_path / ".git").mkdir()
    write(tmp_path / ".gitignore", "generated/\n*_old.py\n")
    project = tmp_path / "project"
    for name in ("train.py", "train_old.py", "generated/gen.py", "sub/keep.py", "sub/skip.py", "sub/x_old.py"):
        write(project / name, PLAIN)
    write(project / "sub" / ".gitignore", "skip.py\n!x_old.py\n")
    assert _seen(project, str(project)) == ["sub/keep.py", "sub/x_old.py", "train.py"]


def test_gitignore_without_git_uses_walk_root(tmp_path: Path) -> None:
    write(tmp_path / ".gitignore", "ignored.py\n")
    write(tmp_path / "ignored.py", PLAIN)
    write(tmp_path / "train.py", PLAIN)
    assert _seen(tmp_path, str(tmp_path)) == ["train.py"]


def test_default_excludes_exclude_and_extend_exclude(tmp_path: Path) -> None:
    for name in (".venv/a.py", "venv/b.py", "build/c.py", "dist/d.py", "lib/site-packages/e.py", "x/f.py", "g.py"):
        write(tmp_path / name, PLAIN)
    root = str(tmp_path)
    assert _seen(tmp_path, root) == ["g.py", "x/f.py"]
    assert _seen(tmp_path, "--extend-exclude", "x/", root) == ["g.py"]
    # --exclude replaces the defaults
    assert _seen(tmp_path, "--exclude", "build/,dist/", root) == [
        ".venv/a.py",
        "g.py",
        "lib/site-packages/e.py",
        "venv/b.py",
        "x/f.py",
    ]


def test_explicit_files_are_processed_unless_force_exclude(tmp_path: Path) -> None:
    inside = write(tmp_path / ".venv" / "train.py", PLAIN)
    result = invoke("--check", str(inside))
    assert result.exit_code == 1
    result = invoke("--check", "--force-exclude", str(inside))
    assert result.exit_code == 0
    assert "excluded" in result.output


def test_directories_include_notebooks(tmp_path: Path) -> None:
    cell = {"cell_type": "code", "metadata": {}, "outputs": [], "execution_count": None, "source": "import torch"}
    write(tmp_path / "nb.ipynb", json.dumps({"cells": [cell], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
    write(tmp_path / "notes.txt", "torch")
    assert _seen(tmp_path, str(tmp_path)) == ["nb.ipynb"]


# -- config -------------------------------------------------------------------------------------


def test_config_is_read_and_overridden_by_the_command_line(tmp_path: Path) -> None:
    write(tmp_path / "pyproject.toml", '[tool.accel-migrate]\ntarget = "accelerate"\nselect = ["AM003", "AM001"]\n')
    script = write(tmp_path / "pkg" / "train.py", PLAIN)
    result = invoke("--diff", str(script))
    assert "+from accelerate import Accelerator" in result.stdout
    assert "prepare(" not in result.stdout  # AM004 not selected
    result = invoke("--diff", "--target", "runtime", "--select", "AM001,AM004", str(script))
    assert "+from runtime import Accelerator" in result.stdout
    assert "accelerator.prepare(" in result.stdout


def test_nearest_pyproject_with_the_table_wins(tmp_path: Path) -> None:
    write(tmp_path / "pyproject.toml", '[tool.accel-migrate]\noutput-format = "json"\n')
    write(tmp_path / "sub" / "pyproject.toml", '[project]\nname = "x"\n')  # no table: not used
    script = write(tmp_path / "sub" / "train.py", PLAIN)
    assert json.loads(invoke("--check", str(script)).stdout)["schema_version"] == 1


def test_config_excludes_jobs_and_mixed_precision(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write(
        tmp_path / "pyproject.toml",
        '[tool.accel-migrate]\nextend-exclude = ["legacy/"]\njobs = 1\nmixed-precision = "bf16"\nignore = "AM002"\n',
    )
    write(tmp_path / "legacy" / "old.py", PLAIN)
    write(tmp_path / "train.py", PLAIN)
    import migrate.runner

    seen: dict[str, object] = {}
    real = migrate.runner.run

    def spy(paths, options, write, **kwargs):  # type: ignore[no-untyped-def]
        seen["options"], seen["jobs"] = options, kwargs["jobs"]
        return real(paths, options, write, **kwargs)

    monkeypatch.setattr(migrate.runner, "run", spy)
    document = _json(invoke("--check", "--output-format", "json", str(tmp_path)))
    assert [Path(f["path"]).name for f in document["files"]] == ["train.py"]
    assert seen["jobs"] == 1
    options = seen["options"]
    assert options.mixed_precision == "bf16" and options.ignore == frozenset({"AM002"})  # type: ignore[attr-defined]
    invoke("--check", "--mixed-precision", "fp16", "-j", "2", str(tmp_path))
    assert seen["options"].mixed_precision == "fp16" and seen["jobs"] == 2  # type: ignore[attr-defined]


def test_unknown_config_key_is_an_error_naming_file_and_key(tmp_path: Path) -> None:
    config = write(tmp_path / "pyproject.toml", '[tool.accel-migrate]\ntarget = "runtime"\ntargets = "x"\n')
    script = write(tmp_path / "train.py", PLAIN)
    result = invoke(str(script))
    assert result.exit_code == 2
    assert f"{config}: unknown key 'targets'" in result.output
    assert script.read_text() == PLAIN
    write(tmp_path / "pyproject.toml", '[tool.accel-migrate]\njobs = "many"\n')
    result = invoke(str(script))
    assert result.exit_code == 2 and "jobs must be a positive integer" in result.output



def test_strategy_from_config_and_command_line(tmp_path: Path) -> None:
    write(tmp_path / "pyproject.toml", '[tool.accel-migrate]\nstrategy = "zero1"\n')
    script = write(tmp_path / "train.py", PLAIN)
    assert '+accelerator = Accelerator(strategy="zero1")' in invoke("--diff", str(script)).stdout
    assert '+accelerator = Accelerator(strategy="fsdp")' in invoke("--diff", "--strategy", "fsdp", str(script)).stdout
    result = invoke("--diff", "--strategy", "zero3", str(script))
    assert result.exit_code == 2 and "--strategy must be one of ddp, zero1, fsdp" in result.output
    result = invoke("--diff", "--strategy", "fsdp", "--target", "accelerate", str(script))
    assert result.exit_code == 2 and "`accelerate config`" in result.output
    write(tmp_path / "pyproject.toml", '[tool.accel-migrate]\nstrategy = "deepspeed"\n')
    result = invoke(str(script))
    assert result.exit_code == 2 and "strategy must be one of ddp, zero1, fsdp" in result.output
    assert script.read_text() == PLAIN


# -- parallel and progress ----------------------------------------------------------------------


def test_parallel_output_is_sorted_and_identical_to_serial(tmp_path: Path) -> None:
    names = [f"d{i % 3}/s{i:02d}.py" for i in range(24)]
    for i, name in enumerate(reversed(names)):
        write(tmp_path / name, PLAIN if i % 2 else LIBRARY)
    serial = invoke("--check", "--output-format", "json", "-j", "1", str(tmp_path))
    parallel = invoke("--check", "--output-format", "json", "-j", "2", str(tmp_path))
    assert serial.exit_code == parallel.exit_code == 1
    assert serial.stdout == parallel.stdout
    paths = [f["path"] for f in json.loads(parallel.stdout)["files"]]
    assert paths == sorted(paths, key=lambda p: Path(p).parts) and len(paths) == 24
    text_serial = invoke("--check", "-j", "1", str(tmp_path)).output
    assert invoke("--check", "-j", "2", str(tmp_path)).output == text_serial


def test_parallel_writes_every_file(tmp_path: Path) -> None:
    files = [write(tmp_path / f"s{i}.py", PLAIN) for i in range(10)]
    assert invoke("-j", "2", str(tmp_path)).exit_code == 0
    assert all(f.read_text() == MIGRATED for f in files)


def test_runner_reports_progress_for_every_file(tmp_path: Path) -> None:
    from migrate import runner
    from migrate.engine import Options

    for i in range(12):
        write(tmp_path / f"s{i}.py", PLAIN)
    ticks: list[int] = []
    totals: list[int] = []
    report = runner.run([tmp_path], Options(), write=False, jobs=2, progress=ticks.append, on_start=totals.append)
    assert totals == [12] and sum(ticks) == 12 and len(report.changed) == 12


def test_progress_bar_only_on_a_terminal_for_many_files() -> None:
    bar = cli._ProgressBar(enabled=True)
    bar.total(cli.PROGRESS_MIN_FILES)
    bar.advance(1)
    assert bar._progress is None  # few files: no bar
    bar.total(cli.PROGRESS_MIN_FILES + 1)
    bar.advance(1)
    assert bar._progress is not None
    bar.stop()
    off = cli._ProgressBar(enabled=False)
    off.total(100)
    off.advance(1)
    assert off._progress is None

    class Tty:
        def isatty(self) -> bool:
            return True

    assert cli._is_terminal(Tty()) and not cli._is_terminal(object())


# -- output formats -----------------------------------------------------------------------------


def test_json_report_schema(tmp_path: Path) -> None:
    script = write(tmp_path / "train.py", PLAIN)
    library = write(tmp_path / "lib.py", LIBRARY)
    broken = write(tmp_path / "broken.py", BROKEN)
    result = invoke("--diff", "--output-format", "json", str(tmp_path))
    assert result.exit_code == 2
    document = json.loads(result.stdout)
    assert document["schema_version"] == 1
    assert document["mode"] == "diff" and document["exit_code"] == 2
    assert document["tool"]["name"] == "accel-migrate"
    summary = document["summary"]
    assert (summary["files"], summary["changed"], summary["failed"]) == (3, 1, 1)
    assert summary["diagnostics"] >= 1 and summary["changes_by_rule"]["AM003"] == 1
    files = {Path(f["path"]).name: f for f in document["files"]}
    assert files["train.py"]["status"] == "changed" and "+accelerator = Accelerator()" in files["train.py"]["diff"]
    assert any(c["code"] == "AM003" and c["line"] == 16 and c["cell"] is None for c in files["train.py"]["changes"])
    assert files["lib.py"]["diagnostics"][0]["code"] == "AM003"
    assert files["lib.py"]["diagnostics"][0]["severity"] == "warning"
    # lib.py's `.backward()` was left as it is (no optimizer in the file): refused, and said so
    assert files["lib.py"]["diagnostics"][0]["unconverted"] is True and files["lib.py"]["outcome"] == "refused"
    assert files["train.py"]["outcome"] == "migrated" and files["broken.py"]["outcome"] == "failed"
    assert summary["outcomes"] == {"migrated": 1, "partial": 0, "refused": 1, "unchanged": 0, "no-training-code": 0,
                                   "failed": 1}
    assert files["broken.py"]["error"]["line"] == 2 and files["broken.py"]["status"] == "failed"
    assert set(files["train.py"]) == {
        "path", "kind", "status", "outcome", "written_to", "changes", "diagnostics", "error", "diff"
    }  # fmt: skip
    assert script.read_text() == PLAIN and library.read_text() == LIBRARY and broken.exists()


def test_github_annotations(tmp_path: Path) -> None:
    write(tmp_path / "train.py", PLAIN)
    library = write(tmp_path / "lib,1.py", LIBRARY)
    broken = write(tmp_path / "broken.py", BROKEN)
    result = invoke("--check", "--output-format", "github", str(tmp_path))
    assert result.exit_code == 2
    lines = result.stdout.splitlines()
    assert any(line.startswith(f"::error file={broken},line=2,col=") for line in lines)
    assert any(  # training code left as it is: an error, as it fails --check
        line.startswith(f"::error file={str(library).replace(',', '%2C')},line=9,title=accel-migrate AM003::")
        for line in lines
    )
    assert any(
        line.startswith(f"::warning file={tmp_path / 'train.py'},line=16,title=accel-migrate AM003::would change")
        for line in lines
    )
    from migrate.output import _annotation

    assert (
        _annotation("warning", "a:b.py", 1, "50%\nnext", "t") == "::warning file=a%3Ab.py,line=1,title=t::50%25%0Anext"
    )


def test_sarif_report(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    write(tmp_path / "train.py", PLAIN)
    write(tmp_path / "lib.py", LIBRARY)
    write(tmp_path / "broken.py", BROKEN)
    result = invoke("--check", "--output-format", "sarif", ".")
    assert result.exit_code == 2
    sarif = json.loads(result.stdout)
    assert sarif["version"] == "2.1.0" and "sarif-2.1.0" in sarif["$schema"]
    run = sarif["runs"][0]
    rules = run["tool"]["driver"]["rules"]
    from migrate.registry import RULES

    ids = [rule["id"] for rule in rules]
    assert {rule.code for rule in RULES} <= set(ids)
    assert all(rule["shortDescription"]["text"] and rule["name"] for rule in rules)
    for item in run["results"]:
        assert ids[item["ruleIndex"]] == item["ruleId"]
        assert item["level"] in ("note", "warning", "error")
        location = item["locations"][0]["physicalLocation"]
        assert location["artifactLocation"]["uri"] in ("train.py", "lib.py")
        assert location["region"]["startLine"] >= 1
    # lib.py's `.backward()` was left as it is: an error (it fails --check), not a warning
    error = [r for r in run["results"] if r["level"] == "error"]
    assert error and error[0]["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] == "lib.py"
    notifications = run["invocations"][0]["toolExecutionNotifications"]
    assert notifications[0]["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] == "broken.py"
    assert run["invocations"][0]["executionSuccessful"] is False


def test_colours_only_when_wanted_and_quiet(tmp_path: Path) -> None:
    library = write(tmp_path / "lib.py", LIBRARY)
    plain = invoke(str(library), env={"NO_COLOR": "", "FORCE_COLOR": ""})
    assert "\033[" not in plain.output and "AM003 warning" in plain.output
    forced = invoke(str(library), env={"FORCE_COLOR": "1", "NO_COLOR": ""})
    assert "\033[33m" in forced.output
    assert "\033[" not in invoke(str(library), env={"FORCE_COLOR": "1", "NO_COLOR": "1"}).output
    quiet = invoke("-q", str(library))
    assert quiet.output == ""  # no summary, no diagnostics
    broken = write(tmp_path / "broken.py", BROKEN)
    assert "error: cannot parse" in invoke("-q", str(broken)).output


def test_summary_counts_seen_skipped_changed_failed(tmp_path: Path) -> None:
    write(tmp_path / "a.py", PLAIN)
    write(tmp_path / "b.py", "x = 1\n")
    write(tmp_path / "c.py", LIBRARY)
    write(tmp_path / "d.py", BROKEN)
    write(tmp_path / ".venv" / "e.py", PLAIN)
    # Mentions torch but holds no training code: not parsed, so even its syntax error goes unseen.
    write(tmp_path / "f.py", "import torch\nx = torch.zeros(2)\ndef g(:\n")
    output = invoke("--check", str(tmp_path)).output
    assert "1 file would be migrated, 1 unchanged, 2 skipped (no training code), 1 failed;" in output
    assert "5 files seen, 1 path excluded." in output
    assert "Changes by rule:" in output and "AM003 x1" in output


# -- internal errors ------------------------------------------------------------------------------


def test_internal_error_in_one_file_still_processes_the_others(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import migrate.engine

    real = migrate.engine.migrate_source

    def flaky(text, path="<string>", options=None, module=None, facts=None):  # type: ignore[no-untyped-def]
        if path.endswith("bad.py"):
            raise RuntimeError("boom")
        return real(text, path, options, module, facts)

    monkeypatch.setattr(migrate.engine, "migrate_source", flaky)
    bad = write(tmp_path / "bad.py", PLAIN)
    good = write(tmp_path / "good.py", PLAIN)
    result = invoke("-j", "1", str(tmp_path))
    assert result.exit_code == 123
    assert "please report" in result.output and "RuntimeError" not in result.output
    assert good.read_text() == MIGRATED and bad.read_text() == PLAIN
    assert "RuntimeError: boom" in invoke("-j", "1", "-v", str(bad)).output


# -- subcommands ----------------------------------------------------------------------------------


def test_rules_lists_every_rule() -> None:
    from migrate.registry import RULES

    result = CliRunner().invoke(commands, ["rules"])
    assert result.exit_code == 0
    for rule in RULES:
        assert any(
            line.split()[:2] == [rule.code, rule.name] and rule.summary in line for line in result.output.splitlines()
        )


def test_explain_prints_the_rule_doc_and_rejects_unknown_codes() -> None:
    from migrate.registry import BY_CODE

    result = CliRunner().invoke(commands, ["explain", "am003"])
    assert result.exit_code == 0
    assert result.output.startswith("AM003 (replace-loss-backward)")
    assert BY_CODE["AM003"].summary in result.output
    result = CliRunner().invoke(commands, ["explain", "AM999"])
    assert result.exit_code == 2
    assert "no rule 'AM999'" in result.output and "AM001" in result.output
    assert "shadow" in CliRunner().invoke(commands, ["explain", "AM900"]).output


def test_main_dispatches_subcommands_and_dot_slash_rules_is_a_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    write(tmp_path / "rules", PLAIN)
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["rules"])
    assert exit_info.value.code == 0
    assert "AM003" in capsys.readouterr().out
    assert (tmp_path / "rules").read_text() == PLAIN
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["--check", "./rules"])
    assert exit_info.value.code == 1
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["./rules"])
    assert exit_info.value.code == 0
    assert (tmp_path / "rules").read_text() == MIGRATED


def test_help_mentions_exit_codes_and_subcommands() -> None:
    text = " ".join(invoke("--help").output.split())
    for needle in ("123 internal error", "1 changes would be made", "accel-migrate rules", "explain", "--output-dir",
                   "--exclude", "--extend-exclude", "--force-exclude", "--jobs", "--output-format", "--stdin-filename",
                   "--mixed-precision", "--config", "--force",
                   "tool.accel-migrate table of the nearest pyproject.toml"):  # fmt: skip
        assert needle in text, needle


# -- stdin ---------------------------------------------------------------------------------------------


def test_stdin_writes_result_to_stdout(tmp_path: Path) -> None:
    result = invoke("-", input=PLAIN.encode())
    assert result.exit_code == 0
    assert result.stdout == MIGRATED
    unchanged = invoke("-", input=b"x = 1\r\n")
    assert unchanged.exit_code == 0 and unchanged.stdout_bytes == b"x = 1\r\n"


def test_stdin_check_and_diff(tmp_path: Path) -> None:
    check = invoke("--check", "-", input=PLAIN)
    assert check.exit_code == 1 and check.stdout == ""
    assert invoke("--check", "-", input=MIGRATED).exit_code == 0
    diff = invoke("--diff", "--stdin-filename", "pkg/train.py", "-", input=PLAIN)
    assert diff.exit_code == 1
    assert "--- pkg/train.py\t(original)" in diff.stdout and "+accelerator = Accelerator()" in diff.stdout


def test_stdin_filename_for_messages_and_config(tmp_path: Path) -> None:
    write(tmp_path / "pyproject.toml", '[tool.accel-migrate]\ntarget = "accelerate"\n')
    name = str(tmp_path / "sub" / "train.py")
    result = invoke("--stdin-filename", name, "-", input=PLAIN)
    assert "from accelerate import Accelerator" in result.stdout
    lib = invoke("--stdin-filename", name, "-", input=LIBRARY)
    assert f"{name}:9: AM003 warning" in lib.output
    broken = invoke("--stdin-filename", name, "-", input=BROKEN)
    assert broken.exit_code == 2 and f"{name}:2:" in broken.output
    write(tmp_path / "pyproject.toml", '[tool.accel-migrate]\nextend-exclude = ["sub/"]\nforce-exclude = true\n')
    excluded = invoke("--stdin-filename", name, "-", input=PLAIN)
    assert excluded.exit_code == 0 and excluded.stdout == PLAIN


def test_stdin_keeps_crlf_and_bom() -> None:
    data = b"\xef\xbb\xbf" + PLAIN.replace("\n", "\r\n").encode()
    result = invoke("-", input=data)
    assert result.stdout_bytes == b"\xef\xbb\xbf" + MIGRATED.replace("\n", "\r\n").encode()


# -- shadowing -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("shadow", ["runtime.py", "runtime"])
def test_local_runtime_that_would_shadow_is_reported(tmp_path: Path, shadow: str) -> None:
    script = write(tmp_path / "train.py", PLAIN)
    if shadow == "runtime":
        write(tmp_path / "runtime" / "__init__.py", "")
    else:
        write(tmp_path / "runtime.py", "")
    result = invoke("--check", str(script))
    assert f"AM900 warning: {tmp_path / shadow} would shadow the bundled runtime" in result.output
    assert "AM900" not in invoke("--check", "--target", "accelerate", str(script)).output
    assert "AM900" not in invoke("--check", "--ignore", "AM900", str(script)).output


def test_no_shadow_warning_without_local_runtime_or_change(tmp_path: Path) -> None:
    script = write(tmp_path / "train.py", PLAIN)
    assert "AM900" not in invoke("--check", str(script)).output
    write(tmp_path / "runtime.py", "")
    write(tmp_path / "other.py", "x = 1\n")
    assert "AM900" not in invoke("--check", str(tmp_path / "other.py")).output


# -- start-up --------------------------------------------------------------------------------------------


def test_version_and_help_do_not_import_libcst_or_torch() -> None:
    code = (
        "import sys\n"
        "from migrate.cli import main\n"
        "for args in (['--version'], ['--help']):\n"
        "    try:\n        main(args)\n    except SystemExit:\n        pass\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'runtime', 'libcst', 'pathspec'))\n"
        "assert not bad, bad\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("accel-migrate ")


def test_python_dash_m_and_console_script_agree(tmp_path: Path) -> None:
    script = write(tmp_path / "rules", PLAIN)
    env = {**os.environ, "NO_COLOR": "1"}
    result = subprocess.run(
        [sys.executable, "-m", "migrate", "--check", str(script)], capture_output=True, text=True, env=env, timeout=60
    )
    assert result.returncode == 1, result.stderr
    listing = subprocess.run([sys.executable, "-m", "migrate", "rules"], capture_output=True, text=True, timeout=60)
    assert listing.returncode == 0 and "AM001" in listing.stdout


def test_invalid_exclude_pattern_is_a_usage_error(tmp_path: Path) -> None:
    write(tmp_path / "train.py", PLAIN)
    result = invoke("--check", "--exclude", "!", str(tmp_path))
    assert result.exit_code == cli.EXIT_FAILED
    assert "invalid exclude pattern '!'" in result.output and "--exclude" in result.output
    assert "internal error" not in result.output


def test_invalid_exclude_pattern_in_config_names_the_file(tmp_path: Path) -> None:
    config = write(tmp_path / "pyproject.toml", '[tool.accel-migrate]\nextend-exclude = ["ok/", "\\\\"]\n')
    write(tmp_path / "train.py", PLAIN)
    result = invoke("--check", str(tmp_path))
    assert result.exit_code == cli.EXIT_FAILED
    assert "invalid exclude pattern '\\\\'" in result.output and str(config) in result.output


def test_gitignore_invalid_line_is_passed_over_like_git(tmp_path: Path) -> None:
    (tmp_path / ".git").mkdir()
    write(tmp_path / ".gitignore", "!\nignored.py\n")
    write(tmp_path / "ignored.py", PLAIN)
    write(tmp_path / "train.py", PLAIN)
    assert _seen(tmp_path, str(tmp_path)) == ["train.py"]


def test_output_pipe_closed_by_its_reader_stops_quietly(tmp_path: Path) -> None:
    files = 150  # diffs well over a pipe's 64 KiB buffer, so writing them must hit the closed end
    for k in range(files):
        write(tmp_path / f"train_{k}.py", PLAIN)
    proc = subprocess.Popen([sys.executable, "-m", "migrate", "--diff", str(tmp_path)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.readline()
    proc.stdout.close()  # as `| head -1` does
    stderr = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == cli.EXIT_BROKEN_PIPE
    assert "internal error" not in stderr and "Traceback" not in stderr and "BrokenPipe" not in stderr
    assert [p.read_text() for p in tmp_path.glob("*.py")] == [PLAIN] * files  # --diff wrote nothing
