"""Start-up of `accel-migrate --version` / `--help` against `python -c "import typer, rich"`.

Prints the medians and their ratio; asserts nothing (timings belong here, not in tests).
Usage: python benchmarks/cli_startup.py [RUNS]
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time


def median_seconds(args: list[str], runs: int) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(args, check=True, capture_output=True)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 15
    python = sys.executable
    baseline = median_seconds([python, "-c", "import typer, rich"], runs)
    print(f"python -c 'import typer, rich'   {baseline * 1000:7.1f} ms")
    for label, args in (
        ("accel-migrate --version", [python, "-m", "migrate", "--version"]),
        ("accel-migrate --help", [python, "-m", "migrate", "--help"]),
        ("accel-migrate rules", [python, "-m", "migrate", "rules"]),
    ):
        seconds = median_seconds(args, runs)
        print(f"{label:<32} {seconds * 1000:7.1f} ms  ({seconds / baseline:.2f}x the baseline)")


if __name__ == "__main__":
    main()
