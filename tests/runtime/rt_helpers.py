"""Helpers for runtime tests that start real torchrun jobs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

WORKERS = Path(__file__).parent / "workers"
TIMEOUT_S = 120


def child_env() -> dict[str, str]:
    env = dict(os.environ)
    env["OMP_NUM_THREADS"] = "1"
    env["PYTHONWARNINGS"] = "ignore"
    return env


def run_cmd(cmd: list[str], cwd: Path, timeout: float = TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    """Run ``cmd`` with a timeout, so that a hang fails the test instead of stalling it.

    On timeout torchrun gets SIGTERM first: it stops its workers, which run in their own sessions
    and would otherwise outlive it (and keep the output pipes open).
    """
    proc = subprocess.Popen(cmd, cwd=cwd, env=child_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.terminate()
        try:
            stdout, stderr = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            stdout, stderr = "", "(no output: the process did not stop on SIGTERM)"
        pytest.fail(f"{cmd} hung for {timeout}s:\n{stdout}\n{stderr}")
    return subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr)


# What libstdc++ prints when a gloo thread is torn down still joinable: torch's own teardown of a
# process group can abort this way after training finished (rarely, under load; seen in CI on the
# hand-written DDP originals, which carry no teardown care of ours).
_GLOO_TEARDOWN_ABORT = "terminate called without an active exception"


def run_original(cmd: list[str], cwd: Path, timeout: float = TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    """``run_cmd`` for a multi-process *original* script (the reference a migration is compared to).

    Its results are what matter, not torch's teardown: a run that dies with the gloo teardown abort
    is run once more, so that a torch flake in the reference cannot fail a test of our output.
    Migrated scripts use ``run_cmd``: a teardown abort of theirs is a fault of the runtime.
    """
    result = run_cmd(cmd, cwd, timeout)
    if result.returncode != 0 and _GLOO_TEARDOWN_ABORT in result.stderr:
        result = run_cmd(cmd, cwd, timeout)
    return result


def torchrun(script: Path, *args: str, cwd: Path, nproc: int = 2, timeout: float = TIMEOUT_S,
             original: bool = False) -> subprocess.CompletedProcess[str]:
    """``python -m torch.distributed.run --standalone --nproc-per-node N script args``.

    ``original=True`` runs a reference script through ``run_original``.
    """
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           "--nproc-per-node", str(nproc), str(script), *args]
    return (run_original if original else run_cmd)(cmd, cwd, timeout)


def read_ranks(out_dir: Path, nproc: int = 2) -> list[dict]:
    """Every rank's JSON result, in rank order."""
    return [json.loads((out_dir / f"rank{r}.json").read_text()) for r in range(nproc)]


_worker_runs: dict[str, tuple[list[dict], str]] = {}


def run_worker_once(name: str, tmp_root: Path, nproc: int = 2) -> tuple[list[dict], str]:
    """Run ``workers/<name>.py OUT`` under torchrun once per pytest session (shared by test files)."""
    if name not in _worker_runs:
        out = tmp_root / name
        out.mkdir(parents=True, exist_ok=True)
        proc = torchrun(WORKERS / f"{name}.py", str(out), cwd=out, nproc=nproc)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        _worker_runs[name] = (read_ranks(out, nproc), proc.stdout)
    return _worker_runs[name]


_LAUNCHER_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK",
                       "TORCHELASTIC_USE_AGENT_STORE", "MASTER_ADDR", "MASTER_PORT")


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def srun(cmd: list[str], cwd: Path, nproc: int = 2, timeout: float = TIMEOUT_S,
         extra_env: dict[str, str] | None = None) -> list[subprocess.CompletedProcess[str]]:
    """Start ``cmd`` as ``nproc`` plain processes with SLURM's variables only (SLURM_PROCID,
    SLURM_NTASKS, SLURM_LOCALID; no RANK / WORLD_SIZE), as ``srun --ntasks N`` on one node does.
    Every process is killed when one of them runs past ``timeout``."""
    procs = []
    for rank in range(nproc):
        env = {k: v for k, v in child_env().items() if k not in _LAUNCHER_VARIABLES and not k.startswith("SLURM_")}
        env.update({"SLURM_PROCID": str(rank), "SLURM_NTASKS": str(nproc), "SLURM_LOCALID": str(rank)})
        env.update(extra_env or {})
        procs.append(subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    done = []
    try:
        for proc in procs:
            stdout, stderr = proc.communicate(timeout=timeout)
            done.append(subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr))
    except subprocess.TimeoutExpired:
        for proc in procs:
            proc.kill()
            proc.wait()
        pytest.fail(f"{cmd} x{nproc} (srun-like) hung for {timeout}s")
    return done
