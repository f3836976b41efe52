"""The benchmark suite's one entry point: a table of ratios, each against a baseline measured in
the same run (interleaved A/B runs in fresh processes; medians; +- is half the inter-quartile
range of the per-round ratios).

    python -m benchmarks                       # everything, default repetitions (~6 min on 2 cores)
    python -m benchmarks --only cli,import     # a subset: codemod, cli, import, step, memory
    python -m benchmarks --quick               # a tiny setting (smoke test; numbers meaningless)
    python -m benchmarks --only codemod --corpus /tmp/corpus   # issue 12's ratio on real code
    python -m benchmarks --markdown perf.md --json perf.json
    python -m benchmarks corpus DIR [--json PATH]   # per-unit report on real code (benchmarks/corpus.py)

Targets (issue 7) are shown next to each ratio; nothing here fails on a missed target.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

from benchmarks.common import Row, log

SECTIONS = ("codemod", "cli", "import", "step", "memory")


def _value(row: Row) -> str:
    if row.unit == "x":
        return f"{row.value:.3f}x"
    if row.unit == "files":
        return f"{row.value:.0f}"
    if row.unit == "ms/step":
        return f"{row.value:+.4f} ms"
    return f"{row.value:.1f} {row.unit}"


def _spread(row: Row) -> str:
    if not row.samples or len(row.samples) < 2:
        return ""
    return f"±{row.spread * 100:.1f}%" if row.unit == "x" else f"±{row.spread * abs(row.value):.4f}"


def _met(row: Row) -> str:
    return "" if row.met is None else ("met" if row.met else "MISSED")


def table_lines(rows: list[Row], markdown: bool = False) -> list[str]:
    header = ["benchmark", "measure", "over", "value", "spread", "target", "", "detail"]
    body = [[r.group, r.measure, r.baseline, _value(r), _spread(r), r.target, _met(r), r.detail] for r in rows]
    if markdown:
        lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        lines += ["| " + " | ".join(c.replace("|", "/") for c in line) + " |" for line in body]
        return lines
    widths = [max(len(str(x[i])) for x in [header] + body) for i in range(len(header) - 1)]
    lines = []
    for line in [header] + body:
        lines.append("  ".join(str(c).ljust(w) for c, w in zip(line, widths)) + "  " + line[-1])
    return lines


def print_table(rows: list[Row]) -> None:
    print("\n".join(table_lines(rows)))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["corpus"]:
        from benchmarks import corpus

        return corpus.main(argv[1:])
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default=",".join(SECTIONS), help="comma-separated: " + ", ".join(SECTIONS))
    parser.add_argument("--quick", action="store_true", help="tiny setting for a smoke test")
    parser.add_argument("--rounds", type=int, help="interleaved rounds for the step benchmarks (default 3)")
    parser.add_argument("--startup-rounds", type=int, help="rounds for start-up/import timings (default 11)")
    parser.add_argument("--codemod-rounds", type=int, help="rounds for codemod throughput (default 3)")
    parser.add_argument("--copies", type=int, help="fixture replicas for corpus (a) (default 3: ~340 files)")
    parser.add_argument("--torch-sample", type=int,
                        help="torch files for the throughput rounds (0: all, -1: skip corpus (b); default 200)")
    parser.add_argument("--no-fp-report", action="store_true",
                        help="skip the zero-false-positive pass over the whole torch package")
    parser.add_argument("--torchfix", help="torchfix executable (default: $TORCHFIX or PATH)")
    parser.add_argument("--corpus", action="append", metavar="DIR",
                        help="a folder of real training code for the whole-process codemod ratio (repeatable; "
                        "default: fixtures/)")
    parser.add_argument("--no-two-process", action="store_true", help="skip the 2-process step benchmarks")
    parser.add_argument("--markdown", help="also write the table as Markdown to this file")
    parser.add_argument("--json", help="also write rows and raw samples as JSON to this file")
    args = parser.parse_args(argv)
    only = {s.strip() for s in args.only.split(",") if s.strip()}
    unknown = only - set(SECTIONS)
    if unknown:
        parser.error(f"unknown section(s): {', '.join(sorted(unknown))}")
    q = args.quick
    rounds = args.rounds or (1 if q else 3)
    startup = args.startup_rounds or (2 if q else 11)
    codemod_rounds = args.codemod_rounds or (1 if q else 3)
    copies = args.copies or 1 if q else args.copies or 3
    torch_sample = args.torch_sample if args.torch_sample is not None else (20 if q else 200)

    rows: list[Row] = []
    extra: dict = {}
    started = time.perf_counter()
    if "codemod" in only:
        from benchmarks import codemod

        log("codemod throughput ...")
        corpus = [Path(folder) for folder in args.corpus] if args.corpus else None
        for folder in corpus or []:
            if not folder.is_dir():
                parser.error(f"--corpus {folder}: not a folder")
        r, extra["codemod"] = codemod.run(codemod_rounds, copies, torch_sample, args.torchfix,
                                          fp_report=not (q or args.no_fp_report), corpus=corpus)
        rows += r
    if "cli" in only:
        from benchmarks import cli_startup

        log("CLI start-up ...")
        rows += cli_startup.run(startup)
    if "import" in only:
        from benchmarks import runtime_overhead

        log("runtime import ...")
        rows += runtime_overhead.imports(startup)
    if "step" in only:
        from benchmarks import runtime_overhead

        log("runtime step overhead ...")
        rows += runtime_overhead.steps(rounds, scale=0.05 if q else 1.0, two_process=not args.no_two_process,
                                       models=("tiny",) if q else ("tiny", "mlp", "transformer"),
                                       accumulation=(1,) if q else (1, 4))
    if "memory" in only:
        from benchmarks import memory

        log("strategies' memory per rank ...")
        rows += memory.run(rounds, quick=q)
    seconds = time.perf_counter() - started
    command = "python -m benchmarks " + " ".join(argv if argv is not None else sys.argv[1:])
    footer = (f"{command.strip()} — {seconds:.0f} s, Python {platform.python_version()}, "
              f"{os.cpu_count()} CPUs, {platform.machine()}; GPU: none (step benchmarks are CPU/gloo)")
    print_table(rows)
    print(footer)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write("\n".join(table_lines(rows, markdown=True)) + f"\n\n{footer}\n")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"command": command.strip(), "seconds": seconds, "rows": [r.as_dict() for r in rows],
                       "extra": extra}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
