"""Shared helpers: pinned environments, fresh-process timing, medians with spread, result rows.

Every number the suite prints is a ratio against a baseline measured in the same run, with A/B
measurements interleaved round by round in fresh processes (absolute times on a shared machine
are noise). Nothing here asserts a timing.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PYTHON = sys.executable
GIB = "1073741824"


_COMPILED = False


def compile_bytecode() -> None:
    """Byte-compile the checkout's packages once, as pip does when it installs them.

    Python reads existing bytecode even under PYTHONDONTWRITEBYTECODE=1 but never writes it; with
    that set (as on the machines these numbers come from) and no __pycache__ in the checkout, every
    fresh process compiled migrate/ (32 modules, about 30 ms) and runtime/ from source, while the
    baselines (typer, rich, libcst, torch) load their installed bytecode: a cost users never pay.
    """
    global _COMPILED
    if _COMPILED:
        return
    import compileall

    for package in ("migrate", "runtime"):
        compileall.compile_dir(str(ROOT / package), quiet=2)
    _COMPILED = True


def pinned_env(threads: int | None = 1, **extra: str) -> dict[str, str]:
    """glibc's allocator thresholds pinned (so page faults do not favour whichever process imported
    more modules), one intra-op thread unless told otherwise, the project importable (and
    byte-compiled, as installed)."""
    compile_bytecode()
    env = dict(os.environ)
    env.update(MALLOC_MMAP_THRESHOLD_=GIB, MALLOC_TRIM_THRESHOLD_=GIB)
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads)
        env["MKL_NUM_THREADS"] = str(threads)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    env.pop("PYTHONPROFILEIMPORTTIME", None)
    env.update(extra)
    return env


def wall(args: list[str], env: dict[str, str] | None = None, ok: tuple[int, ...] = (0,), cwd: Path | None = None) -> float:
    """Seconds one fresh process takes, start to exit."""
    start = time.perf_counter()
    result = subprocess.run(args, capture_output=True, env=env, cwd=cwd)
    seconds = time.perf_counter() - start
    if result.returncode not in ok:
        raise RuntimeError(f"{args!r} exited {result.returncode}:\n{result.stderr.decode()[-3000:]}")
    return seconds


def output(args: list[str], env: dict[str, str] | None = None, cwd: Path | None = None, timeout: float = 600) -> str:
    """stdout of one process; on timeout it and its children (torchrun's ranks too) are stopped."""
    import signal

    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=cwd,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        # torchrun starts each rank in a session of its own, out of reach of killpg, and the ranks
        # hold the output pipes open; on SIGTERM torchrun stops them itself.
        proc.terminate()
        try:
            proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        raise RuntimeError(f"{args!r} timed out after {timeout} s") from None
    if proc.returncode != 0:
        raise RuntimeError(f"{args!r} exited {proc.returncode}:\n{out[-2000:]}\n{err[-4000:]}")
    return out


_SPIN = "s = 0\nfor i in range(4_000_000):\n    s += i\n"


def parallel_probe(env: dict[str, str] | None = None) -> tuple[float, float]:
    """(one, two): seconds for one CPU-bound fresh process alone and for two of them at once.

    one * 2 / two is how much two processes can gain on this machine right now: 2.0 on two idle
    cores, near 1.0 when the host hands the second core to someone else (seen on shared VMs), which
    caps any -j2 speed-up measured in the same round.
    """
    command = [PYTHON, "-c", _SPIN]
    one = wall(command, env)
    start = time.perf_counter()
    processes = [subprocess.Popen(command, env=env) for _ in range(2)]
    for process in processes:
        process.wait()
    return one, time.perf_counter() - start


def median(values: list[float]) -> float:
    return statistics.median(values)


def spread(values: list[float]) -> float:
    """Half the inter-quartile range over the median (a robust +-), as a fraction."""
    if len(values) < 2:
        return 0.0
    q = statistics.quantiles(values, n=4, method="inclusive")
    m = statistics.median(values)
    return (q[2] - q[0]) / 2 / m if m else 0.0


def ratio_samples(a: list[float], b: list[float]) -> list[float]:
    """Per-round ratios a[i]/b[i] of interleaved runs (their spread shows the pairing's noise)."""
    return [x / y for x, y in zip(a, b) if y]


@dataclass
class Row:
    """One line of the table: `value` of `measure` over `baseline` (a ratio unless unit says so)."""

    group: str
    measure: str
    baseline: str
    value: float
    unit: str = "x"  # "x": ratio; anything else: an absolute quantity (ms/step, files, ...)
    spread: float = 0.0  # +- as a fraction of value (half the IQR of the per-round ratios)
    target: str = ""
    met: bool | None = None
    detail: str = ""
    samples: list[float] = field(default_factory=list)

    def as_dict(self) -> dict:
        return asdict(self)


def ratio_row(group: str, measure: str, baseline: str, a: list[float], b: list[float], target: str = "",
              limit: float | None = None, at_least: float | None = None, detail: str = "") -> Row:
    """a over b from interleaved samples: the ratio of medians, spread from the per-round ratios."""
    value = median(a) / median(b)
    met = None
    if limit is not None:
        met = value <= limit
    if at_least is not None:
        met = value >= at_least
    return Row(group, measure, baseline, value, "x", spread(ratio_samples(a, b)), target, met, detail,
               ratio_samples(a, b))


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)
