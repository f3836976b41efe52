"""The corpus report: what the tool does to every unit of a folder of real training code.

What it does:
    Splits DIR into units, copies each into a scratch folder (DIR itself is never written), migrates
    the copy in this process through the engine's own entry point (`migrate.runner.run`, the one
    the CLI calls, default options, `--target runtime`, one job), and reports per unit:

    - status: the outcome the CLI gives each file (`FileResult.outcome`, in the JSON report and the
      summary of `accel-migrate`), for the unit's files taken together
      (`migrate.results.combined_outcome`): `migrated` (some file changed, no training code left
      unconverted), `partial` (some file changed, but a diagnostic says training code was left
      unconverted: an object not prepared, a loader left unsharded, edits a safety check left out
      (AM101-AM104), another file of the unit refused), `refused` (nothing changed, and a
      diagnostic says training code was left as it is: AM007 `mp.spawn`, AM10x a safety check
      failed...), `unchanged` (files were parsed, nothing changed and nothing was left unconverted:
      a test or library module, or, with no diagnostic at all, a silent no-op, which on real
      training code is a bug), `no-training-code` (every file skipped by the text pre-filter),
      `failed` (a file could not be processed: syntax error, internal error). Which diagnostics
      leave training code unconverted is decided by the rule that reports them
      (`Diagnostic.unconverted`), never by their text;
    - files changed / files seen, and the diagnostics by code; under the table, the parsed files of
      a refused repository that were neither changed nor diagnosed (often its entry point);
    - safety: every written output re-checked directly with the checks of
      `migrate/safety/registry.py` (`CheckContext` built from the copy before and after), which
      it passes by construction; the report says which check fails if one does. The idempotence
      check (AM103) is judged by the real thing instead: a second run over the migrated copy
      (the fallback of `migrate/safety/fallback.py` makes a second run drop the same rules again,
      which a bare AM103 check with default options would not know);
    - idempotent: whether that second run changes any file;
    - time: milliseconds of the first run (discovery, read, migrate, checks, write).

    Units: each .py/.ipynb file directly in DIR or in DIR/files is one unit (the tool is run on the
    file); each folder in DIR/repos, and each other folder directly in DIR, is one unit (the tool is
    run on the folder, as a user would on a repository).

    With `--verify` (opt-in: minutes, it runs the scripts), each migrated or partial unit's entry
    script (the file; in a folder, the file with a `__main__` guard, changed ones and main.py /
    train.py / run.py first) is run by `accel-migrate verify --synthetic --nproc-per-node N` from a
    scratch copy of the unit, and a column gives its verdict: verified, differs at 1 process, fails
    at N processes, or could not run; under the table, the counts and each unit's first error or
    reason. `--verify-args FILE` gives units the arguments a user would pass after `--` (a script
    whose argparse requires `--dataset`, say): one line per unit, `UNIT<TAB>ARGS` (UNIT as the
    table names it, ARGS split as a shell would); a unit not listed gets none.

Usage:
    python -m benchmarks corpus DIR [--json PATH] [--markdown PATH] [--details] [--verify [--verify-args FILE]]
    python -m benchmarks.corpus DIR ...

    Prints a Markdown table, a summary line and, for each refused, partial or failed unit, why (its
    first diagnostic of each code, file:line); `--details` adds, per unit, every diagnostic
    (file:line code message) and any failure; `--json` writes everything, diagnostics included.
    Not run in CI on real code: the corpus (../shared/corpus) is measurement material, not part of
    the product; tests/test_corpus_report.py runs the command on a synthetic corpus. A unit's own
    `[tool.accel-migrate]` settings are not read (every unit gets the defaults).
    Exit status 0 when the report was made, whatever it says; 2 when DIR is not a folder.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import shutil
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

SAFETY_CODES = ("AM101", "AM102", "AM103", "AM104")
SUFFIXES = (".py", ".ipynb")


@dataclass
class Unit:
    name: str  # relative to DIR
    source: Path
    is_dir: bool


@dataclass
class UnitReport:
    unit: str
    kind: str  # "file" or "repo"
    status: str = ""
    files: int = 0
    changed: int = 0
    diagnostics: dict[str, int] = field(default_factory=dict)
    fallbacks: dict[str, int] = field(default_factory=dict)  # AM101-AM104 diagnostics from the engine
    safety_failures: list[str] = field(default_factory=list)  # "path: AM10x name: message" of a re-check
    idempotent: bool | None = None  # None: nothing was written
    second_run_changed: list[str] = field(default_factory=list)
    ms: float = 0.0
    errors: list[str] = field(default_factory=list)
    details: list[str] = field(default_factory=list)  # every diagnostic: "[path:]line CODE message"
    file_status: dict[str, str] = field(default_factory=dict)  # path -> changed/unchanged/skipped/failed
    file_outcomes: dict[str, str] = field(default_factory=dict)  # path -> migrated/partial/refused/... (the CLI's)
    silent_files: list[str] = field(default_factory=list)  # parsed, nothing changed, nothing said
    verify: str = ""  # --verify: verified / differs at 1 process / fails at N processes / could not run
    verify_script: str = ""  # the script verify ran
    verify_error: str = ""  # its first error, or why it could not run
    verify_s: float = 0.0
    verify_args: list[str] = field(default_factory=list)  # --verify-args: what the script got after `--`

    @property
    def safety(self) -> str:
        if not self.changed:
            return "-"
        codes = sorted({code for failure in self.safety_failures for code in re.findall(r": (AM1\d\d) ", failure)[:1]})
        return "FAIL " + ",".join(codes) if self.safety_failures else "pass"


def units(directory: Path) -> list[Unit]:
    """The units of `directory` (see the module docstring), sorted by name."""
    found: list[Unit] = []

    def visible(path: Path) -> bool:
        return not path.name.startswith(".") and path.name != "__pycache__"

    for child in sorted(directory.iterdir()):
        if not visible(child):
            continue
        if child.is_file() and child.suffix in SUFFIXES:
            found.append(Unit(child.name, child, False))
        elif child.is_dir() and child.name == "files":
            found += [Unit(f"files/{f.name}", f, False) for f in sorted(child.iterdir())
                      if f.is_file() and f.suffix in SUFFIXES and visible(f)]
        elif child.is_dir() and child.name == "repos":
            found += [Unit(f"repos/{d.name}", d, True) for d in sorted(child.iterdir()) if d.is_dir() and visible(d)]
        elif child.is_dir():
            found.append(Unit(child.name, child, True))
    return found


def _script(path: str, text: str) -> str | None:
    """The text the engine migrates: the file, or a notebook's joined code cells (None: not Python)."""
    if not path.endswith(".ipynb"):
        return text
    from migrate import notebooks

    try:
        return notebooks.load(text).script
    except (notebooks.NotPython, notebooks.NotebookError):
        return None


def recheck(path: str, before_text: str, after_text: str) -> list[str]:
    """Every safety check but AM103 run directly on one written output: 'path: CODE name: message'
    for each failing place (empty: it passes)."""
    import libcst as cst

    from migrate.engine import Options
    from migrate.safety import CheckContext
    from migrate.safety.registry import CHECKS

    before, after = _script(path, before_text), _script(path, after_text)
    if before is None or after is None:
        return [f"{path}: AM103 parses: the written notebook cannot be read back"]
    try:
        after_module = cst.parse_module(after)
    except cst.ParserSyntaxError as error:
        return [f"{path}: AM103 parses: libcst cannot parse the output: {error.message}"]
    context = CheckContext(path=path, before=cst.parse_module(before), after=after_module, before_text=before,
                           after_text=after, options=Options())
    failures = []
    for check in CHECKS:
        if check.code == "AM103":  # judged by a real second run (see the module docstring)
            continue
        for violation in check.run(context):
            failures.append(f"{path}: {check.code} {check.name}: output line {violation.line}: {violation.message}")
    return failures


def measure(unit: Unit, scratch: Path) -> UnitReport:
    """Migrate a scratch copy of `unit`, re-check what was written, run again; never raises."""
    from migrate import runner
    from migrate.engine import Options
    from migrate.results import combined_outcome

    report = UnitReport(unit.name, "repo" if unit.is_dir else "file")
    target = scratch / unit.name
    target.parent.mkdir(parents=True, exist_ok=True)
    if unit.is_dir:
        # links are copied as what they point to: DIR is never written through one
        shutil.copytree(unit.source, target, ignore_dangling_symlinks=True)
    else:
        shutil.copy2(unit.source, target)
    base = target.parent if not unit.is_dir else target
    options = Options()
    try:
        start = time.perf_counter()
        first = runner.run([target], options, write=True, jobs=1)
        report.ms = (time.perf_counter() - start) * 1000
    except Exception as error:  # noqa: BLE001 - one unit's crash must not stop the report
        report.status, report.errors = "failed", [f"runner crashed: {error!r}"]
        return report
    codes: Counter[str] = Counter()
    for result in first.results:
        shown = str(Path(result.path).relative_to(base)) if Path(result.path).is_relative_to(base) else result.path
        report.file_status[shown] = result.status
        report.file_outcomes[shown] = result.outcome
        if result.status == "unchanged" and not result.diagnostics:
            report.silent_files.append(shown)
        for d in result.diagnostics:
            codes[d.code] += 1
            cell = f"cell {d.cell}:" if d.cell is not None else ""
            where = f"{shown}:{cell}{d.line}" if unit.is_dir else (f"{cell}{d.line}" if cell else f"line {d.line}")
            left = "[left unconverted] " if d.unconverted else ""
            report.details.append(f"{where} {d.code} {left}{d.message}")
        if result.error is not None:
            report.errors.append(f"{shown}:{result.error.line}: {result.error.message}"
                                 + (f" ({result.traceback.strip().splitlines()[-1]})" if result.traceback else ""))
        if result.changed and result.error is None:
            written = Path(result.written_to or result.path)
            report.safety_failures += recheck(shown, result.old_text, written.read_text(encoding="utf-8"))
    report.files = len(first.results)
    report.changed = len(first.changed)
    report.diagnostics = dict(sorted(codes.items()))
    report.fallbacks = {code: n for code, n in report.diagnostics.items() if code in SAFETY_CODES}
    if report.changed:
        second = runner.run([target], options, write=False, jobs=1)
        report.second_run_changed = [str(Path(r.path).relative_to(base)) for r in second.changed]
        report.idempotent = not report.second_run_changed
    # the CLI's own outcomes; a file written and read back with an error (a failed write) is failed there too
    report.status = "failed" if report.errors else combined_outcome(r.outcome for r in first.results)
    return report


_MAIN = re.compile(r"""^if\s+__name__\s*==\s*['"]__main__['"]\s*:""", re.MULTILINE)
_ENTRY_NAMES = ("main.py", "train.py", "run.py")


def entry_script(unit: Unit, report: UnitReport) -> Path | None:
    """The script `--verify` runs for a unit: the file itself; in a folder, a file with a
    `__main__` guard, changed ones first, then main.py / train.py / run.py, then by path."""
    if not unit.is_dir:
        return unit.source
    candidates = []
    for path in sorted(unit.source.rglob("*.py")):
        shown = str(path.relative_to(unit.source))
        if _MAIN.search(path.read_text(encoding="utf-8", errors="replace")):
            candidates.append((report.file_status.get(shown) != "changed", path.name not in _ENTRY_NAMES,
                               shown.count("/"), shown, path))
    return min(candidates)[-1] if candidates else None


def read_verify_args(path: Path) -> dict[str, list[str]]:
    """--verify-args FILE: `UNIT<TAB>ARGS` lines (blank lines and `#` comments skipped)."""
    table = {}
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        unit, tab, args = line.partition("\t")
        if not tab:
            raise ValueError(f"{path}:{number}: expected UNIT<TAB>ARGS")
        table[unit.strip()] = shlex.split(args)
    return table


def verify_unit(unit: Unit, report: UnitReport, *, nproc: int, steps: int, timeout: float,
                args: dict[str, list[str]] | None = None) -> None:
    """`accel-migrate verify --synthetic` on a migrated (or partial) unit's entry script, run from a
    scratch copy of the unit; fills report.verify*."""
    from migrate.verify import COULD_NOT_RUN, verify

    if report.status not in ("migrated", "partial"):
        return
    start = time.perf_counter()
    script = entry_script(unit, report)
    if script is None:
        report.verify, report.verify_error = COULD_NOT_RUN, "no script with a __main__ guard"
        return
    with tempfile.TemporaryDirectory(prefix="accel-migrate-corpus-verify-") as scratch:
        root = Path(scratch) / "unit"
        if unit.is_dir:
            shutil.copytree(unit.source, root, ignore_dangling_symlinks=True)
            copy = root / script.relative_to(unit.source)
        else:
            root.mkdir()
            copy = root / script.name
            shutil.copy2(script, copy)
        try:
            report.verify_args = list((args or {}).get(unit.name, []))
            result = verify(copy, report.verify_args, steps=steps, synthetic=True, nproc=nproc, timeout=timeout,
                            unit=root if unit.is_dir else None)
        except Exception as error:  # noqa: BLE001 - one unit's crash must not stop the report
            report.verify, report.verify_error = COULD_NOT_RUN, f"verify crashed: {error!r}"
            return
    report.verify, report.verify_error = result.status, result.first_error
    report.verify_script = str(script.relative_to(unit.source)) if unit.is_dir else script.name
    report.verify_s = time.perf_counter() - start


def run(directory: Path, verify: dict | None = None) -> list[UnitReport]:
    with tempfile.TemporaryDirectory(prefix="accel-migrate-corpus-") as scratch:
        reports = []
        for unit in units(directory):
            report = measure(unit, Path(scratch))
            if verify is not None:
                verify_unit(unit, report, **verify)
            reports.append(report)
        return reports


def verify_lines(reports: list[UnitReport]) -> list[str]:
    """--verify: the counts of each verdict, then the first error of every unit that did not verify."""
    ran = [r for r in reports if r.verify]
    counts = Counter(r.verify for r in ran)
    reached = sum(n for verdict, n in counts.items() if verdict != "could not run")
    lines = [f"verify --synthetic on {len(ran)} migrated units: " + ", ".join(f"{n} {v}" for v, n in counts.most_common())
             + f"; a verdict on {reached}/{len(ran)}; {sum(r.verify_s for r in ran):.0f} s."]
    for r in ran:
        if r.verify != "verified":
            given = f" -- {shlex.join(r.verify_args)}" if r.verify_args else ""
            lines.append(f"- `{r.unit}` ({r.verify_script or '-'}{given}): {r.verify}: {_cut(r.verify_error, 300)}")
    return lines


def _codes(counts: dict[str, int]) -> str:
    return ", ".join(f"{code} x{n}" if n > 1 else code for code, n in counts.items()) or "-"


def table_lines(reports: list[UnitReport]) -> list[str]:
    header = ["unit", "status", "changed/files", "diagnostics by code", "safety re-check", "idempotent", "ms"]
    verified = any(r.verify for r in reports)
    if verified:
        header.append("verify --synthetic")
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for r in reports:
        idempotent = "-" if r.idempotent is None else ("yes" if r.idempotent else "NO")
        cells = [r.unit, r.status, f"{r.changed}/{r.files}", _codes(r.diagnostics), r.safety, idempotent,
                 f"{r.ms:.0f}"]
        if verified:
            cells.append(r.verify or "-")
        lines.append("| " + " | ".join(c.replace("|", "/") for c in cells) + " |")
    return lines


def summary(reports: list[UnitReport]) -> str:
    statuses = Counter(r.status for r in reports)
    from migrate.results import OUTCOMES

    parts = [f"{statuses[s]} {s}" for s in OUTCOMES if statuses[s]]
    written = [r for r in reports if r.changed]
    failing = [r.unit for r in written if r.safety_failures]
    not_fixed = [r.unit for r in written if r.idempotent is False]
    line = f"{len(reports)} unit{'s' if len(reports) != 1 else ''}: " + ", ".join(parts) + "."
    line += f" Safety re-check of every written output: {len(written) - len(failing)}/{len(written)} units pass"
    line += f" (failing: {', '.join(failing)})." if failing else "."
    line += f" Idempotent: {len(written) - len(not_fixed)}/{len(written)}"
    line += f" (not: {', '.join(not_fixed)})." if not_fixed else "."
    line += f" {sum(r.changed for r in reports)}/{sum(r.files for r in reports)} files changed,"
    diagnostics = sum(sum(r.diagnostics.values()) for r in reports)
    silent = sum(len(r.silent_files) for r in reports)
    line += f" {diagnostics} diagnostics; {silent} parsed files neither changed nor diagnosed;"
    line += f" {sum(r.ms for r in reports) / 1000:.1f} s."
    return line


def reason_lines(reports: list[UnitReport], width: int = 240) -> list[str]:
    """Why each refused, partial, failed or unchanged unit was not (fully) migrated: its errors,
    then its first diagnostic of each code (those that left training code unconverted first,
    AM10x first among them), each cut to `width` characters."""
    lines = []
    for r in reports:
        if r.status not in ("refused", "partial", "failed", "unchanged"):
            continue
        first: dict[str, str] = {}
        for item in r.details:
            code = re.findall(r"\b(AM\d{3})\b", item)[0]
            first.setdefault(code, item)
        # what left training code unconverted first (the safety checks' first among them)
        ordered = sorted(first, key=lambda code: ("[left unconverted]" not in first[code], code not in SAFETY_CODES, code))
        items = r.errors + [first[code] for code in ordered] or ["no diagnostic: a silent no-op"]
        if r.silent_files and r.kind == "repo":
            items.append("parsed, neither changed nor diagnosed: " + ", ".join(r.silent_files))
        lines.append(f"- `{r.unit}` ({r.status}): " + "; ".join(_cut(item, width) for item in items))
    return lines


def _cut(text: str, width: int) -> str:
    text = text.splitlines()[0] if text else text
    return text if len(text) <= width else text[: width - 3] + "..."


def detail_lines(reports: list[UnitReport]) -> list[str]:
    lines = []
    for r in reports:
        items = r.errors + r.safety_failures + [f"second run changes {p}" for p in r.second_run_changed] + r.details
        if items:
            lines.append(f"- `{r.unit}` ({r.status}):")
            lines += [f"  - {item.splitlines()[0]}" for item in items]
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks corpus", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("directory", type=Path, metavar="DIR", help="a folder of real training code")
    parser.add_argument("--json", help="also write every unit's report as JSON to this file")
    parser.add_argument("--markdown", help="also write the table and summary as Markdown to this file")
    parser.add_argument("--details", action="store_true", help="also print every diagnostic and failure per unit")
    parser.add_argument("--verify", action="store_true",
                        help="also run `accel-migrate verify --synthetic` on each migrated or partial unit (slow: "
                        "minutes) and add its verdict as a column")
    parser.add_argument("--verify-nproc", type=int, default=2, metavar="N", help="processes of --verify's N-process run")
    parser.add_argument("--verify-steps", type=int, default=3, metavar="K", help="--verify's --steps (batches per loader pass)")
    parser.add_argument("--verify-timeout", type=float, default=90.0, metavar="SECONDS",
                        help="--verify's --timeout for each process")
    parser.add_argument("--verify-args", type=Path, metavar="FILE",
                        help="--verify: the arguments each unit's script gets after `--`, one `UNIT<TAB>ARGS` line per unit")
    args = parser.parse_args(argv)
    if not args.directory.is_dir():
        parser.error(f"{args.directory}: not a folder")
    verify = dict(nproc=args.verify_nproc, steps=args.verify_steps, timeout=args.verify_timeout) if args.verify else None
    if verify is not None and args.verify_args is not None:
        verify["args"] = read_verify_args(args.verify_args)
    reports = run(args.directory, verify)
    lines = table_lines(reports) + ["", summary(reports)]
    if args.verify:
        lines += ["", *verify_lines(reports)]
    reasons = reason_lines(reports)
    if reasons:
        lines += ["", "Not (fully) migrated, and why:", *reasons]
    if args.details:
        lines += ["", "Every diagnostic:", *(detail_lines(reports) or ["(none)"])]
    print("\n".join(lines))
    if args.markdown:
        Path(args.markdown).write_text("\n".join(lines) + "\n")
    if args.json:
        document = {"directory": str(args.directory), "summary": summary(reports),
                    "units": [{**asdict(r), "safety": r.safety} for r in reports]}
        Path(args.json).write_text(json.dumps(document, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
