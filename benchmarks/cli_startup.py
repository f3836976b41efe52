"""Start-up of `accel-migrate --version` / `--help` / `rules` against `python -c "import typer, rich"`.

Interleaved fresh processes; the ratio of medians. Asserts nothing (timings belong here, not in tests).
Usage: python benchmarks/cli_startup.py [ROUNDS]   (or through python -m benchmarks)
"""

from __future__ import annotations

import shutil
import sys

from benchmarks.common import PYTHON, Row, median, pinned_env, ratio_row, wall

COMMANDS = (
    ("accel-migrate --version", ["--version"], True),
    ("accel-migrate --help", ["--help"], False),
    ("accel-migrate rules", ["rules"], False),
)


def run(rounds: int) -> list[Row]:
    env = pinned_env(threads=None)
    entry = shutil.which("accel-migrate")
    # the console script is what users (and pre-commit) run; python -m migrate when it is not on PATH
    prefix = [entry] if entry else [PYTHON, "-m", "migrate"]
    base: list[float] = []
    times: dict[str, list[float]] = {label: [] for label, _, _ in COMMANDS}
    for _ in range(rounds):
        base.append(wall([PYTHON, "-c", "import typer, rich"], env))
        for label, args, _ in COMMANDS:
            times[label].append(wall(prefix + args, env))
    rows = []
    for label, _, targeted in COMMANDS:
        rows.append(ratio_row("CLI start-up", label, "python -c 'import typer, rich'", times[label], base,
                              "< 1.2x" if targeted else "", limit=1.2 if targeted else None,
                              detail=f"baseline {median(base) * 1000:.0f} ms"))
    return rows


def main() -> None:
    from benchmarks.run import print_table

    print_table(run(int(sys.argv[1]) if len(sys.argv) > 1 else 15))


if __name__ == "__main__":
    main()
