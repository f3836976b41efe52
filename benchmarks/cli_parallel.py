"""`accel-migrate --check` over N copies of a fixture with -j 1 and -j 2..CPUs: files/s and speed-up.

Usage: python benchmarks/cli_parallel.py [COPIES]   (default 200). Prints; asserts nothing.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "scripts" / "train_mlp.py"


def main() -> None:
    copies = int(sys.argv[1]) if len(sys.argv) > 1 else 200
    with tempfile.TemporaryDirectory() as directory:
        for i in range(copies):
            shutil.copy(FIXTURE, Path(directory) / f"train_{i:04d}.py")
        jobs = sorted({1, 2, os.cpu_count() or 1})
        base = None
        for j in jobs:
            start = time.perf_counter()
            result = subprocess.run(
                [sys.executable, "-m", "migrate", "--check", "-q", "-j", str(j), directory], capture_output=True
            )
            seconds = time.perf_counter() - start
            assert result.returncode == 1, result.stderr
            base = base or seconds
            print(f"-j {j:<3} {seconds:6.2f} s  {copies / seconds:7.1f} files/s  speed-up {base / seconds:.2f}x")


if __name__ == "__main__":
    main()
