"""`accel-migrate verify SCRIPT [-- ARGS]`: migrate a script into a temporary folder, run the
original and the migrated copy for a bounded number of optimizer steps, and compare the losses.

This RUNS THE USER'S CODE (twice), in subprocesses of the current Python interpreter, only when
the user asks for it. The user's files are never modified: the migrated copy is written into a
temporary folder, and each run gets its own empty working directory (so a script that resumes from
a checkpoint in its working directory starts fresh both times).

Losses are recorded without editing the script: each run goes through a small bootstrap
(migrate/verify_bootstrap.txt, written to the temporary folder) that patches `torch.Tensor.backward` to record
the value being back-propagated, and registers a global optimizer step pre-hook that counts the
optimizer steps and stops the run cleanly (a private BaseException caught by the bootstrap) before
the (K+1)-th step of the first optimizer that steps. Loss scaling by a `torch.amp.GradScaler` is
divided out, and `Accelerator.backward` (runtime or HF accelerate) ends in `Tensor.backward` of
`loss / gradient_accumulation_steps`, which is what a hand-written `(loss / N).backward()`
back-propagates too, so both sides record comparable numbers.

This module, like the rest of `migrate/`, never imports torch or `runtime`: the bootstrap is a
string that only runs in the subprocesses.
"""

from __future__ import annotations

import json
import math
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

DEFAULT_STEPS = 10
DEFAULT_RTOL = 1e-5
DEFAULT_ATOL = 1e-7
DEFAULT_TIMEOUT = 600.0

EXIT_OK, EXIT_DIVERGED, EXIT_ERROR = 0, 1, 2

# Environment variables read by the bootstrap.
ENV_RECORD = "ACCEL_VERIFY_RECORD"  # record file prefix; rank r writes PREFIX.r.jsonl
ENV_STEPS = "ACCEL_VERIFY_STEPS"  # stop before optimizer step K+1 (0 or unset: never stop)
ENV_EXTRA_PATH = "ACCEL_VERIFY_EXTRA_PATH"  # appended to sys.path (the original script's folder)

# The code that runs inside the child processes (it imports torch, so it is kept out of this
# package's Python modules: migrate/ itself never imports torch).
def bootstrap_code() -> str:
    from importlib import resources

    return (resources.files("migrate") / "verify_bootstrap.txt").read_text(encoding="utf-8")


@dataclass
class Run:
    """One instrumented run: its recorded losses (rank 0 unless asked) and its output."""

    returncode: int
    stdout: str
    stderr: str
    records: dict[int, list[dict]] = field(default_factory=dict)  # rank -> loss records
    ends: dict[int, dict] = field(default_factory=dict)  # rank -> end record
    timed_out: bool = False

    def losses(self, rank: int = 0) -> list[float]:
        return [r["loss"] for r in self.records.get(rank, [])]

    def steps(self, rank: int = 0) -> list[int]:
        return [r["step"] for r in self.records.get(rank, [])]


def write_bootstrap(folder: Path) -> Path:
    path = folder / "_accel_verify_bootstrap.py"
    path.write_text(bootstrap_code(), encoding="utf-8")
    return path


def run_instrumented(
    launcher: list[str],
    bootstrap: Path,
    script: Path,
    args: list[str],
    workdir: Path,
    *,
    steps: int = 0,
    env: dict[str, str] | None = None,
    extra_path: Path | None = None,
    timeout: float = DEFAULT_TIMEOUT,
) -> Run:
    """Run `launcher bootstrap script args` in `workdir` and read the per-rank loss records.

    `launcher` is e.g. `[sys.executable]`, `[accel, "launch", "--nproc-per-node", "2"]` or
    `[sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2"]`.
    """
    import subprocess

    workdir.mkdir(parents=True, exist_ok=True)
    prefix = workdir / ".accel_verify_losses"
    environment = dict(os.environ if env is None else env)
    environment[ENV_RECORD] = str(prefix)
    environment[ENV_STEPS] = str(steps)
    environment.setdefault("PYTHONUNBUFFERED", "1")
    if extra_path is not None:
        environment[ENV_EXTRA_PATH] = str(extra_path)
    command = [*launcher, str(bootstrap), str(script), *args]
    timed_out = False
    try:
        done = subprocess.run(
            command, cwd=workdir, env=environment, capture_output=True, text=True, timeout=timeout
        )
        returncode, stdout, stderr = done.returncode, done.stdout, done.stderr
    except subprocess.TimeoutExpired as expired:
        timed_out = True
        returncode = -9
        stdout = _text(expired.stdout)
        stderr = _text(expired.stderr) + f"\n(timed out after {timeout:g} s)"
    run = Run(returncode, stdout, stderr, timed_out=timed_out)
    for path in sorted(workdir.glob(".accel_verify_losses.*.jsonl")):
        rank = int(path.name.split(".")[-2])
        records = []
        for line in path.read_text(encoding="utf-8").splitlines():
            if not line.strip():
                continue
            record = json.loads(line)
            if record.get("end"):
                run.ends[rank] = record
            else:
                records.append(record)
        run.records[rank] = records
    return run


def _text(data: bytes | str | None) -> str:
    if data is None:
        return ""
    return data if isinstance(data, str) else data.decode("utf-8", "replace")


# -- comparison ------------------------------------------------------------------------------


@dataclass
class Row:
    index: int
    step: int | None
    original: float | None
    migrated: float | None

    @property
    def abs_diff(self) -> float | None:
        if self.original is None or self.migrated is None:
            return None
        return abs(self.original - self.migrated)

    @property
    def rel_diff(self) -> float | None:
        diff = self.abs_diff
        if diff is None:
            return None
        if diff == 0:
            return 0.0
        denominator = abs(self.original)  # type: ignore[arg-type]
        return math.inf if denominator == 0 else diff / denominator


@dataclass
class Comparison:
    rows: list[Row]
    verdict: str  # "identical", "within tolerance", "diverged"
    diverged_at: Row | None = None
    reason: str = ""

    @property
    def ok(self) -> bool:
        return self.verdict != "diverged"


def compare(
    original: list[float],
    migrated: list[float],
    steps: list[int] | None = None,
    *,
    rtol: float = DEFAULT_RTOL,
    atol: float = DEFAULT_ATOL,
) -> Comparison:
    """Row by row: identical (every value bit-equal), within tolerance (|a - b| <= atol + rtol*|a|),
    or diverged at the first row that is not (a missing row, e.g. one run stopped early, diverges).
    NaN equals NaN only when both sides are NaN."""
    rows = []
    for index in range(max(len(original), len(migrated))):
        a = original[index] if index < len(original) else None
        b = migrated[index] if index < len(migrated) else None
        step = steps[index] if steps is not None and index < len(steps) else None
        rows.append(Row(index, step, a, b))
    identical = True
    for row in rows:
        a, b = row.original, row.migrated
        if a is None or b is None:
            missing = "migrated" if b is None else "original"
            return Comparison(rows, "diverged", row, f"the {missing} run recorded no loss for this backward call")
        if a == b or (math.isnan(a) and math.isnan(b)):
            continue
        identical = False
        if math.isnan(a) or math.isnan(b) or abs(a - b) > atol + rtol * abs(a):
            return Comparison(rows, "diverged", row, f"|difference| {abs(a - b):.3e} > {atol:g} + {rtol:g} * |original|")
    return Comparison(rows, "identical" if identical else "within tolerance")


def format_table(comparison: Comparison) -> str:
    header = f"{'#':>4}  {'step':>5}  {'original loss':>16}  {'migrated loss':>16}  {'abs diff':>10}  {'rel diff':>10}"
    lines = [header, "-" * len(header)]

    def number(value: float | None) -> str:
        return "-" if value is None else f"{value:.9g}"

    def small(value: float | None) -> str:
        return "-" if value is None else ("0" if value == 0 else f"{value:.2e}")

    for row in comparison.rows:
        mark = "  <- diverged" if comparison.diverged_at is row else ""
        step = "-" if row.step is None else str(row.step)
        lines.append(
            f"{row.index:>4}  {step:>5}  {number(row.original):>16}  {number(row.migrated):>16}  "
            f"{small(row.abs_diff):>10}  {small(row.rel_diff):>10}{mark}"
        )
    return "\n".join(lines)


def verdict_line(comparison: Comparison, steps: int) -> str:
    if comparison.verdict == "identical":
        return f"verdict: identical ({len(comparison.rows)} losses over {steps or 'all'} optimizer steps, bit for bit)"
    if comparison.verdict == "within tolerance":
        worst = max((r.rel_diff or 0.0) for r in comparison.rows)
        return f"verdict: within tolerance ({len(comparison.rows)} losses; largest relative difference {worst:.2e})"
    row = comparison.diverged_at
    assert row is not None
    where = f"step {row.step}" if row.step is not None else f"loss #{row.index}"
    return f"verdict: diverged at {where} (loss #{row.index}): {comparison.reason}"


# -- the command -----------------------------------------------------------------------------


@dataclass
class VerifyResult:
    exit_code: int
    message: str
    comparison: Comparison | None = None
    original: Run | None = None
    migrated: Run | None = None
    migrated_text: str | None = None


def migrate_copy(script: Path, folder: Path, target: str, mixed_precision: str = "no") -> tuple[Path | None, str]:
    """Migrate `script` into `folder` (same file name). Returns (path, "") or (None, why not)."""
    from migrate import runner
    from migrate.engine import Options

    options = Options(target=target, mixed_precision=mixed_precision)
    report = runner.run([script], options, write=True, output_dir=folder, jobs=1)
    result = report.results[0] if report.results else None
    if result is None:
        return None, f"{script}: not a Python file the tool can read"
    if result.error is not None:
        error = result.error
        return None, f"{script}:{error.line}:{error.column}: cannot be migrated: {error.message}"
    if result.traceback is not None:
        return None, f"{script}: internal error while migrating:\n{result.traceback}"
    diagnostics = "".join(f"\n  {script.name}:{d.line}: {d.code}: {d.message}" for d in result.diagnostics)
    if not result.changed:
        return None, f"{script}: nothing to migrate (no rule changed it), so there is nothing to verify{diagnostics}"
    written = folder / script.name
    if not written.exists():
        candidates = list(folder.rglob(script.name))
        if not candidates:
            return None, f"{script}: the migrated copy was not written"
        written = candidates[0]
    return written, diagnostics


def verify(
    script: Path,
    args: list[str],
    *,
    steps: int = DEFAULT_STEPS,
    rtol: float = DEFAULT_RTOL,
    atol: float = DEFAULT_ATOL,
    target: str = "runtime",
    python: str | None = None,
    timeout: float = DEFAULT_TIMEOUT,
    keep: Path | None = None,
) -> VerifyResult:
    import shutil
    import tempfile

    script = script.resolve()
    if not script.is_file():
        return VerifyResult(EXIT_ERROR, f"{script}: no such file")
    python = python or sys.executable
    folder = Path(tempfile.mkdtemp(prefix="accel-verify-")) if keep is None else keep
    folder.mkdir(parents=True, exist_ok=True)
    try:
        migrated, notes = migrate_copy(script, folder / "migrated", target)
        if migrated is None:
            return VerifyResult(EXIT_ERROR, notes)
        bootstrap = write_bootstrap(folder)
        environment = dict(os.environ)
        for name in [n for n in environment if n.startswith("ACCEL_")]:
            environment.pop(name)  # the user's accel settings must not change one run only
        runs = {}
        for label, path, extra in (("original", script, None), ("migrated", migrated, script.parent)):
            runs[label] = run_instrumented(
                [python], bootstrap, path, args, folder / f"run-{label}", steps=steps,
                env=environment, extra_path=extra, timeout=timeout,
            )
        text = migrated.read_text(encoding="utf-8")
        for label, run in runs.items():
            if run.returncode != 0 or 0 not in run.ends:
                why = "timed out" if run.timed_out else f"exited with {run.returncode}"
                tail = (run.stderr.strip() or run.stdout.strip())[-3000:]
                return VerifyResult(
                    EXIT_ERROR, f"the {label} script {why}:\n{tail}", None, runs["original"], runs.get("migrated"), text
                )
        original, after = runs["original"], runs["migrated"]
        if not original.losses():
            return VerifyResult(
                EXIT_ERROR,
                f"{script}: the original run called no .backward(): nothing to compare",
                None, original, after, text,
            )
        comparison = compare(original.losses(), after.losses(), original.steps(), rtol=rtol, atol=atol)
        message = format_table(comparison) + "\n" + verdict_line(comparison, steps)
        if notes:
            message = f"migration diagnostics:{notes}\n\n{message}"
        return VerifyResult(EXIT_OK if comparison.ok else EXIT_DIVERGED, message, comparison, original, after, text)
    finally:
        if keep is None:
            shutil.rmtree(folder, ignore_errors=True)


HELP = (
    "Check that migrating SCRIPT preserves its training: migrate it into a temporary folder, run the "
    "original and the migrated copy on one process for --steps optimizer steps, and compare the loss "
    "of every backward call.\n\n"
    "WARNING: this RUNS YOUR SCRIPT (twice), as `python SCRIPT ARGS` would, with the current Python "
    "interpreter (or --python). It never runs unless you invoke `accel-migrate verify`. Your files are "
    "never modified: the migrated copy lives in a temporary folder and each run gets its own empty "
    "working directory. Losses are recorded by patching torch.Tensor.backward in the child processes; "
    "nothing in the script needs editing.\n\n"
    "Arguments after `--` are passed to the script, e.g. `accel-migrate verify train.py -- --epochs 1`.\n\n"
    "Prints a table (step, original loss, migrated loss, absolute and relative difference) and a "
    "verdict: identical, within tolerance (|a - b| <= atol + rtol * |a|), or diverged at step k.\n\n"
    "Exit codes: 0 identical or within tolerance; 1 diverged; 2 the script cannot be migrated, has "
    "nothing to migrate, crashes, times out or calls no backward."
)
