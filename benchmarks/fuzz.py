"""The long property run of the codemod: many generated programs, every failure counted, none fatal.

    python -m benchmarks.fuzz --examples 10000            # the long run (about 20-40 min on 2 cores)
    python -m benchmarks.fuzz --examples 200 --seed 7     # a short one
    python -m benchmarks.fuzz --json fuzz.json            # also the counts and one example per failure
    python -m benchmarks.fuzz --minutes 40                # stop generating after 40 min, report what ran

Programs come from `benchmarks/fuzz_programs.py` (statements of our own fixtures, recombined,
renamed, nested and reformatted); the properties are `fuzz_programs.failures` (no internal error,
the output compiles, passes every safety check, is a fixed point, and a program without training
code is left alone). Unlike the bounded test (`tests/migrate/test_fuzz_codemod.py`), a failing
program does not stop the run: failures are grouped by signature (the property and, for an
exception, where it was raised), and the shortest program of each group is printed. Exit status 1
when any property failed.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from hypothesis import HealthCheck, Phase, given, seed, settings

from benchmarks.fuzz_programs import Program, failures, programs


@dataclass
class Tally:
    programs: int = 0
    stopped: bool = False  # the time budget ran out before `examples` programs
    changed: int = 0
    groups: dict[str, list[str]] = field(default_factory=dict)  # signature -> [shortest program, detail]
    counts: dict[str, int] = field(default_factory=dict)


def signature(problem: str) -> str:
    """A failure's group: the property number and message, with an exception's innermost project frame."""
    lines = problem.strip().splitlines()
    head = re.sub(r"\d+", "N", lines[0])[:120]
    if "Traceback" not in problem:
        return head
    frames = re.findall(r'File "[^"]*/((?:migrate|benchmarks)/[^"]+)", line (\d+), in (\w+)', problem)
    where = f"{frames[-1][0]}:{frames[-1][1]} {frames[-1][2]}" if frames else "?"
    return f"{head} {lines[-1][:80]} at {where}"


class _OutOfTime(BaseException):
    """Ends the run at the time budget (a BaseException: hypothesis does not treat it as a failure)."""


def run(examples: int, seed_value: int, progress_every: int = 500, minutes: float | None = None,
        on_progress: Callable[[Tally], None] | None = None) -> Tally:
    from migrate.engine import Options
    from migrate.runner import migrate_text

    tally = Tally()
    started = time.perf_counter()

    @seed(seed_value)
    @settings(
        max_examples=examples,
        deadline=None,
        database=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(programs())
    def one(program: Program) -> None:
        if minutes is not None and time.perf_counter() - started > minutes * 60:
            tally.stopped = True
            raise _OutOfTime
        tally.programs += 1
        problems = failures(program.text)
        if not problems:
            try:
                tally.changed += migrate_text(program.text, "fuzz_program.py", Options()).changed
            except Exception:  # noqa: BLE001 - counted by failures() already
                pass
        for problem in problems:
            key = signature(problem)
            tally.counts[key] = tally.counts.get(key, 0) + 1
            known = tally.groups.get(key)
            if known is None or len(program.text) < len(known[0]):
                tally.groups[key] = [program.text, problem]
        if tally.programs % progress_every == 0:
            print(f"fuzz: {tally.programs} programs, {sum(tally.counts.values())} failures, "
                  f"{time.perf_counter() - started:.0f} s", file=sys.stderr, flush=True)
            if on_progress is not None:
                on_progress(tally)

    try:
        one()
    except _OutOfTime:
        pass
    return tally


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.fuzz", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--examples", type=int, default=10000, help="programs to generate (default 10000)")
    parser.add_argument("--seed", type=int, default=0, help="hypothesis seed (default 0: reproducible)")
    parser.add_argument("--minutes", type=float, help="stop generating after this many minutes (default: no limit)")
    parser.add_argument("--json", help="also write the counts and one program per failure group here "
                        "(rewritten at every progress line, so a long run can be read while it runs)")
    parser.add_argument("--progress-every", type=int, default=500, help="programs between progress lines")
    args = parser.parse_args(argv)
    started = time.perf_counter()

    def write_json(tally: Tally) -> None:
        if args.json:
            with open(args.json, "w") as handle:
                json.dump({"programs": tally.programs, "stopped": tally.stopped, "changed": tally.changed,
                           "seconds": time.perf_counter() - started, "seed": args.seed,
                           "failures": {k: {"count": tally.counts[k], "program": v[0], "detail": v[1]}
                                        for k, v in tally.groups.items()}}, handle, indent=1)

    tally = run(args.examples, args.seed, args.progress_every, args.minutes, write_json)
    seconds = time.perf_counter() - started
    total = sum(tally.counts.values())
    print(f"programs checked: {tally.programs}; outputs changed by a rule: {tally.changed}; "
          f"failures: {total} in {len(tally.groups)} group(s); {seconds:.0f} s (seed {args.seed})"
          + (f"; stopped by --minutes {args.minutes:g} before {args.examples}" if tally.stopped else ""))
    for key, count in sorted(tally.counts.items(), key=lambda item: -item[1]):
        text, detail = tally.groups[key]
        print(f"\n[{count}x] {key}\n--- shortest program ({len(text)} chars):\n{text}\n--- detail:\n{detail[-2000:]}")
    write_json(tally)
    return 1 if total else 0


if __name__ == "__main__":
    sys.exit(main())
