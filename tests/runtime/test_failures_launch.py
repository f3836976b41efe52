"""``accel launch`` fails loudly and briefly: what the user sees when a rank or the launcher fails.

Each test starts real 2-process gloo jobs through ``accel launch`` (torchrun's engine), with a
timeout, and checks one guarantee of docs/safety.md, "Failure behaviour":

- an exception on one rank: non-zero exit; the last line names the rank, the exception and the
  user's file and line; the traceback has no worker-entry or runpy frames;
- a rank killed with SIGKILL while its peer waits in a collective: the launcher exits within the
  collective timeout plus a margin and names the killed rank and the signal (not the peer whose
  "connection closed" error merely followed);
- Ctrl-C: every process gone, exit status 130, no traceback from the launcher;
- bad options and a missing script: one line, exit status 2, no traceback, no torch import;
- ``--max-restarts 1``: after a rank is killed, the restarted group resumes from the newest
  checkpoint and ends with the weights of an uninterrupted run, bit for bit.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from rt_helpers import WORKERS, child_env, run_cmd

ACCEL = shutil.which("accel") or str(Path(sys.executable).with_name("accel"))
COLLECTIVE_TIMEOUT_S = 20
MARGIN_S = 60  # startup of two processes on a loaded 2-core machine, and torchrun's shutdown


def accel_launch(*args: str, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return run_cmd([ACCEL, "launch", "--nproc-per-node", "2", *args], cwd, timeout)


def test_exception_on_one_rank_names_rank_exception_and_user_line(tmp_path: Path) -> None:
    proc = accel_launch(str(WORKERS / "failure_modes.py"), str(tmp_path), "raise", cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    line = next(i for i, text in enumerate((WORKERS / "failure_modes.py").read_text().splitlines(), 1)
                if "bad batch on rank 1" in text)
    assert last == (f"accel launch: rank 1 failed first: ValueError: bad batch on rank 1 "
                    f"(at {WORKERS / 'failure_modes.py'}, line {line})"), proc.stderr
    assert "failure_modes.py FAILED" in proc.stderr  # the summary's title is the user's script
    root = proc.stderr.split("Root Cause")[1]
    assert re.search(r"rank\s*:\s*1 \(local_rank: 1\)", root) and "fail_on_purpose()" in root
    assert "worker_entry" not in proc.stderr and "runpy" not in proc.stderr, proc.stderr
    # Short: each rank's trimmed traceback once on its stderr, the summary with one traceback.
    assert len(proc.stderr.splitlines()) < 60, proc.stderr


def test_sigkilled_rank_is_named_with_its_signal_within_the_timeout(tmp_path: Path) -> None:
    proc = accel_launch("--timeout", str(COLLECTIVE_TIMEOUT_S), str(WORKERS / "failure_modes.py"),
                        str(tmp_path), "sigkill", cwd=tmp_path,
                        timeout=COLLECTIVE_TIMEOUT_S + MARGIN_S)
    assert proc.returncode == 128 + signal.SIGKILL, proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == (
        "accel launch: rank 1 failed first: killed by signal 9 (SIGKILL)"), proc.stderr
    root = proc.stderr.split("Root Cause")[1]
    assert re.search(r"rank\s*:\s*1 \(local_rank: 1\)", root) and "SIGKILL" in root, root


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_ctrl_c_stops_every_process_and_exits_130(tmp_path: Path) -> None:
    cmd = [ACCEL, "launch", "--nproc-per-node", "2", str(WORKERS / "failure_modes.py"),
           str(tmp_path), "sleep"]
    # Its own session: SIGINT goes to the launcher's process group, as a terminal's Ctrl-C does.
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=child_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not all((tmp_path / f"pid{r}").exists() for r in range(2)):
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.2)
        pids = [int((tmp_path / f"pid{r}").read_text()) for r in range(2)]
        os.killpg(proc.pid, signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 128 + signal.SIGINT, stderr
    assert "Traceback" not in stderr, stderr
    assert stderr.strip().splitlines()[-1] == "accel launch: stopped by SIGINT; every worker was stopped"
    deadline = time.monotonic() + 10  # the workers are reaped by torchrun before it returns
    while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(_alive(pid) for pid in pids)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--nproc-per-node", "0", "SCRIPT"], "--nproc-per-node 0: expected a positive number"),
        (["--nproc-per-node", "abc", "SCRIPT"], "--nproc-per-node abc: expected a positive number"),
        (["--nnodes", "2:1", "SCRIPT"], "--nnodes 2:1: expected"),
        (["missing.py"], "script 'missing.py' not found"),
    ],
)
def test_bad_arguments_are_one_line_usage_errors_before_torch(tmp_path: Path, argv, message) -> None:
    script = tmp_path / "train.py"
    script.write_text("raise SystemExit('must not run')\n")
    argv = [str(script) if a == "SCRIPT" else a for a in argv]
    code = (
        "import sys\n"
        "from runtime.cli import main\n"
        f"code = main(['launch', *{argv!r}])\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
        "sys.exit(code)\n"
    )
    proc = run_cmd([sys.executable, "-c", code], tmp_path, timeout=60)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"accel launch: error: {message}"), proc.stderr


def test_argparse_errors_are_one_line_too(tmp_path: Path) -> None:
    proc = run_cmd([ACCEL, "launch", "--max-restarts", "x", "train.py"], tmp_path, timeout=60)
    assert proc.returncode == 2
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "--max-restarts" in proc.stderr and "invalid int value" in proc.stderr


@pytest.fixture(scope="module")
def uninterrupted_weights(tmp_path_factory) -> dict[str, torch.Tensor]:
    out = tmp_path_factory.mktemp("straight")
    proc = accel_launch(str(WORKERS / "elastic_resume.py"), str(out), cwd=out, timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (out / "attempt.txt").read_text() == "0"
    return torch.load(out / "final.pt", weights_only=True)


_PORT_TAKEN = re.compile(r"EADDRINUSE|address already in use", re.IGNORECASE)


# standalone: torchrun's c10d rendezvous (accel launch's default on one node); static: a fixed
# --master-addr/--master-port, the multi-node form. Both reuse one store across attempts.
@pytest.mark.parametrize("rendezvous", [[], ["--master-addr", "127.0.0.1"]], ids=["standalone", "static"])
def test_max_restarts_resumes_to_the_uninterrupted_weights(
    tmp_path: Path, uninterrupted_weights, rendezvous: list[str]
) -> None:
    # --timeout: a restarted group that hangs in init_process_group fails in 30 s, not 30 min.
    proc = accel_launch(*rendezvous, "--max-restarts", "1", "--timeout", "30",
                        str(WORKERS / "elastic_resume.py"), str(tmp_path), "--kill-at", "4",
                        cwd=tmp_path, timeout=240)
    if proc.returncode != 0 and _PORT_TAKEN.search(proc.stderr):
        # torchrun picks the restarted attempt's port free, then rank 0 binds it later: under a busy
        # machine (other tests' launchers) another process can take it in between. That race is
        # torch's launcher's, not the runtime's: run the job once more, from the start.
        for stale in tmp_path.iterdir():
            stale.unlink() if stale.is_file() else shutil.rmtree(stale)
        proc = accel_launch(*rendezvous, "--max-restarts", "1", "--timeout", "30",
                            str(WORKERS / "elastic_resume.py"), str(tmp_path), "--kill-at", "4",
                            cwd=tmp_path, timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # rank 1 killed itself once, and the launcher saw the first attempt fail (it names the first
    # failure it notices: rank 1's SIGKILL, or rank 0 whose collective broke and which it then stopped)
    assert (tmp_path / "killed.txt").read_text() == "4"
    assert "failed (exitcode: " in proc.stderr
    assert (tmp_path / "attempt.txt").read_text() == "1"  # the second attempt finished the job
    got = torch.load(tmp_path / "final.pt", weights_only=True)
    assert uninterrupted_weights.keys() == got.keys()
    for name, expected in uninterrupted_weights.items():
        assert torch.equal(expected, got[name]), name
