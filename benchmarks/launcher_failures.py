"""How long each launcher failure takes to surface: seconds from the failure to `accel launch`'s exit.

The scenarios of tests/runtime/test_failures_launch.py, with its worker
(tests/runtime/workers/failure_modes.py), on 2 gloo processes:

- raise: rank 1 raises while rank 0 waits at a barrier;
- sigkill: rank 1 kills itself with SIGKILL while rank 0 waits at a barrier (`--timeout 20`);
- ctrl-c: SIGINT to the launcher's process group while both ranks sleep; also the time until the
  last worker process is gone.

The failing rank writes the moment it fails (`time.time()`); the launcher's exit is taken when
`wait()` returns here; Ctrl-C is timed from the `killpg`. Each scenario runs ROUNDS times; the
median and the range are printed with the exit status. Absolute seconds on a shared machine:
read them as "seconds, not minutes", never as a benchmark to compare. Asserts nothing.

Usage: python -m benchmarks.launcher_failures [ROUNDS]   (default 3)
"""

from __future__ import annotations

import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WORKER = ROOT / "tests" / "runtime" / "workers" / "failure_modes.py"
ACCEL = shutil.which("accel") or str(Path(sys.executable).with_name("accel"))
COLLECTIVE_TIMEOUT_S = 20
LIMIT_S = 180  # a launcher that has not exited by then is reported as hung


def _env() -> dict[str, str]:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    return env


def _launch(out: Path, mode: str, *options: str) -> subprocess.Popen[bytes]:
    # Its own session, so SIGINT can go to the launcher's process group as a terminal's Ctrl-C does.
    return subprocess.Popen([ACCEL, "launch", "--nproc-per-node", "2", *options, str(WORKER), str(out), mode],
                            cwd=out, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)


def _wait(proc: subprocess.Popen[bytes]) -> int:
    try:
        return proc.wait(timeout=LIMIT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise RuntimeError(f"accel launch did not exit within {LIMIT_S} s") from None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def rank_failure(mode: str, *options: str) -> tuple[float, int]:
    """(seconds from rank 1's failure to the launcher's exit, exit status)."""
    with tempfile.TemporaryDirectory(prefix=f"accel-{mode}-") as tmp:
        out = Path(tmp)
        status = _wait(_launch(out, mode, *options))
        exited = time.time()
        failed = float((out / "failing_at").read_text())
        return exited - failed, status


def ctrl_c() -> tuple[float, float, int]:
    """(seconds from SIGINT to the launcher's exit, to the last worker gone, exit status)."""
    with tempfile.TemporaryDirectory(prefix="accel-ctrl-c-") as tmp:
        out = Path(tmp)
        proc = _launch(out, "sleep")
        deadline = time.monotonic() + LIMIT_S
        while not all((out / f"pid{r}").exists() for r in range(2)):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the workers did not start")
            time.sleep(0.05)
        time.sleep(0.2)  # both pid files written: let the ranks reach their sleep
        pids = [int((out / f"pid{r}").read_text()) for r in range(2)]
        sent = time.monotonic()
        os.killpg(proc.pid, signal.SIGINT)
        status = _wait(proc)
        exited = time.monotonic() - sent
        while any(_alive(pid) for pid in pids) and time.monotonic() - sent < LIMIT_S:
            time.sleep(0.01)
        return exited, time.monotonic() - sent, status


def _summary(values: list[float]) -> str:
    return f"median {statistics.median(values):.2f} s (min {min(values):.2f}, max {max(values):.2f})"


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    rounds = int(args[0]) if args else 3
    results: dict[str, list[float]] = {"raise": [], "sigkill": [], "ctrl-c": [], "ctrl-c workers gone": []}
    statuses: dict[str, set[int]] = {"raise": set(), "sigkill": set(), "ctrl-c": set()}
    for _ in range(rounds):  # interleaved, so a busy minute of the machine hits every scenario
        seconds, status = rank_failure("raise")
        results["raise"].append(seconds)
        statuses["raise"].add(status)
        seconds, status = rank_failure("sigkill", "--timeout", str(COLLECTIVE_TIMEOUT_S))
        results["sigkill"].append(seconds)
        statuses["sigkill"].add(status)
        exited, gone, status = ctrl_c()
        results["ctrl-c"].append(exited)
        results["ctrl-c workers gone"].append(gone)
        statuses["ctrl-c"].add(status)
    labels = {
        "raise": "exception on rank 1 -> launcher exit",
        "sigkill": f"SIGKILL of rank 1 (--timeout {COLLECTIVE_TIMEOUT_S}) -> launcher exit",
        "ctrl-c": "Ctrl-C -> launcher exit",
        "ctrl-c workers gone": "Ctrl-C -> last worker gone",
    }
    for key, values in results.items():
        status = statuses.get(key)
        codes = f"; exit status {', '.join(map(str, sorted(status)))}" if status else ""
        print(f"{labels[key]}: {_summary(values)} over {rounds} run(s){codes}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
