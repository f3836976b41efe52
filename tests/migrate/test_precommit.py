"""The pre-commit hooks of .pre-commit-hooks.yaml, run for real by pre-commit in a temporary git repo.

The hook repository is a snapshot of this checkout's working tree (tracked and untracked files that
git does not ignore, committed into a temporary repository), so the test exercises the hooks file
and the package as they are now. pre-commit builds the hook's virtualenv with pip from it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

CHECKOUT = Path(__file__).resolve().parents[2]
FIXTURES = CHECKOUT / "fixtures"
PLAIN = (FIXTURES / "create_accelerator" / "device_ifexp_module_level.in.py").read_text()
MIGRATED = (FIXTURES / "create_accelerator" / "device_ifexp_module_level.out.py").read_text()

pre_commit = pytest.importorskip("pre_commit", reason="pre-commit is not installed (pip install -e '.[test]')")
if shutil.which("git") is None:  # pragma: no cover
    pytest.skip("git is not installed", allow_module_level=True)


def git(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, env=ENV, timeout=600)


ENV = {
    **os.environ,
    "GIT_AUTHOR_NAME": "t",
    "GIT_AUTHOR_EMAIL": "t@example.com",
    "GIT_COMMITTER_NAME": "t",
    "GIT_COMMITTER_EMAIL": "t@example.com",
    "GIT_CONFIG_GLOBAL": os.devnull,
    "NO_COLOR": "1",
}


def snapshot_checkout(destination: Path) -> str:
    """Commit this checkout's working tree into a new repository; return the commit."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=CHECKOUT,
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    for name in filter(None, (n.decode() for n in listed)):
        source = CHECKOUT / name
        if source.is_file():
            target = destination / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
    for args in (("init", "-q"), ("add", "-A"), ("commit", "-q", "-m", "snapshot")):
        result = git(destination, *args)
        assert result.returncode == 0, result.stderr
    return git(destination, "rev-parse", "HEAD").stdout.strip()


def test_pre_commit_hooks_block_then_pass(tmp_path: Path) -> None:
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    rev = snapshot_checkout(hooks)
    repo = tmp_path / "project"
    repo.mkdir()
    env = {**ENV, "PRE_COMMIT_HOME": str(tmp_path / "cache")}
    assert git(repo, "init", "-q").returncode == 0
    (repo / ".pre-commit-config.yaml").write_text(
        f"repos:\n- repo: {hooks}\n  rev: {rev}\n  hooks:\n  - id: accel-migrate\n  - id: accel-migrate-check\n"
        "    stages: [manual]\n"
    )
    (repo / "train.py").write_text(PLAIN)
    (repo / "README.md").write_text("not python\n")
    run = lambda *args: subprocess.run(  # noqa: E731
        [sys.executable, "-m", "pre_commit", *args], cwd=repo, capture_output=True, text=True, env=env, timeout=900
    )
    installed = run("install")
    assert installed.returncode == 0, installed.stdout + installed.stderr
    git(repo, "add", "-A")

    first = subprocess.run(
        ["git", "commit", "-m", "add training script"], cwd=repo, capture_output=True, text=True, env=env, timeout=900
    )
    assert first.returncode != 0, first.stdout + first.stderr  # blocked, as black blocks a commit
    assert "accel-migrate" in first.stdout + first.stderr
    assert "files were modified by this hook" in first.stdout + first.stderr
    assert (repo / "train.py").read_text() == MIGRATED  # converted in the working tree
    assert git(repo, "rev-parse", "--verify", "-q", "HEAD").returncode != 0  # nothing committed

    git(repo, "add", "train.py")
    second = subprocess.run(
        ["git", "commit", "-m", "add training script"], cwd=repo, capture_output=True, text=True, env=env, timeout=900
    )
    assert second.returncode == 0, second.stdout + second.stderr
    assert git(repo, "show", "HEAD:train.py").stdout == MIGRATED

    # the check-only hook fails on an unconverted file and leaves it as it is
    (repo / "other.py").write_text(PLAIN)
    git(repo, "add", "other.py")
    check = run("run", "accel-migrate-check", "--hook-stage", "manual", "--files", "other.py")
    assert check.returncode == 1, check.stdout + check.stderr
    assert "would migrate" in check.stdout
    assert (repo / "other.py").read_text() == PLAIN
    passing = run("run", "accel-migrate-check", "--hook-stage", "manual", "--files", "train.py")
    assert passing.returncode == 0, passing.stdout + passing.stderr
