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

`--nproc-per-node N`: the original on one process against the migrated copy on N gloo CPU
processes under `torch.distributed.run`, the runtime's split_batches forced by the environment
(`ACCEL_SPLIT_BATCHES=1`, which the runtime's Accelerator reads when the script passes no
split_batches), so the N processes together see the one-process batches in the one-process order
and the mean over ranks of each backward call's loss is the one-process loss up to float
summation order. Both runs are seeded alike (`ACCEL_VERIFY_SEED`), and rank r writes its own
records. At the end (or the stop) every rank hashes the parameters of every optimizer that
stepped; a rank whose hashes differ from rank 0's has drifted (DDP keeps replicas bit-identical).
Every process has a deadline (`--timeout`): past it, it dumps its thread stacks (faulthandler) and
exits, so a hang names the rank and the line it was stuck at; a crash names the rank, its
exception and its line (the bootstrap records the exception before re-raising it); torchrun's
failure summary gives the exit code of a rank that vanished without either.

This module, like the rest of `migrate/`, never imports torch or `runtime`: the bootstrap is a
text file that only runs in the subprocesses.
"""

from __future__ import annotations

import json
import math
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

DEFAULT_STEPS = 10
DEFAULT_RTOL = 1e-5
DEFAULT_ATOL = 1e-7
DEFAULT_TIMEOUT = 600.0
DEFAULT_SEED = 0

EXIT_OK, EXIT_DIVERGED, EXIT_ERROR = 0, 1, 2

# Environment variables read by the bootstrap.
ENV_RECORD = "ACCEL_VERIFY_RECORD"  # record file prefix; rank r writes PREFIX.r.jsonl
ENV_STEPS = "ACCEL_VERIFY_STEPS"  # stop before optimizer step K+1 (0 or unset: never stop)
ENV_EXTRA_PATH = "ACCEL_VERIFY_EXTRA_PATH"  # appended to sys.path (the original script's folder)
ENV_SEED = "ACCEL_VERIFY_SEED"  # seed random, torch and numpy before the script runs
ENV_DEADLINE = "ACCEL_VERIFY_DEADLINE"  # seconds; past it a process dumps its stacks and exits 1
ENV_CALL = "ACCEL_VERIFY_CALL"  # a function the script defines but never calls, called after it
ENV_SYNTHETIC = "ACCEL_VERIFY_SYNTHETIC"  # --synthetic: K, the batches each DataLoader pass yields
DEFAULT_SYNTHETIC_STEPS = 3
LAUNCHER_GRACE = 30.0  # seconds the launcher gets past the processes' deadline to report and exit

# The code that runs inside the child processes (it imports torch, so it is kept out of this
# package's Python modules: migrate/ itself never imports torch).
def bootstrap_code() -> str:
    from importlib import resources

    return (resources.files("migrate") / "verify_bootstrap.txt").read_text(encoding="utf-8")


@dataclass
class Run:
    """One instrumented run: its recorded losses per rank, how each rank ended, and its output."""

    returncode: int
    stdout: str
    stderr: str
    records: dict[int, list[dict]] = field(default_factory=dict)  # rank -> loss records
    ends: dict[int, dict] = field(default_factory=dict)  # rank -> end record (the rank finished)
    errors: dict[int, dict] = field(default_factory=dict)  # rank -> error record (the script raised)
    stacks: dict[int, str] = field(default_factory=dict)  # rank -> thread stacks (deadline or SIGTERM)
    exit_codes: dict[int, int] = field(default_factory=dict)  # rank -> exit code torchrun reported
    timed_out: bool = False

    def losses(self, rank: int = 0) -> list[float]:
        return [r["loss"] for r in self.records.get(rank, [])]

    def steps(self, rank: int = 0) -> list[int]:
        return [r["step"] for r in self.records.get(rank, [])]

    def synthetic(self, rank: int = 0) -> dict:
        """The --synthetic report of a rank (replacements, writes, samples, printed lines)."""
        record = self.ends.get(rank) or self.errors.get(rank) or {}
        return record.get("synthetic") or {}

    def deadline_ranks(self) -> list[int]:
        """Ranks that were still running at the deadline (their stacks start with `Timeout`)."""
        return sorted(r for r, text in self.stacks.items() if text.lstrip().startswith("Timeout"))


def write_bootstrap(folder: Path) -> Path:
    """Write the bootstrap, and beside it the --synthetic interception module it imports."""
    from importlib import resources

    path = folder / "_accel_verify_bootstrap.py"
    path.write_text(bootstrap_code(), encoding="utf-8")
    synthetic = (resources.files("migrate") / "verify_synthetic.txt").read_text(encoding="utf-8")
    (folder / "_accel_verify_synthetic.py").write_text(synthetic, encoding="utf-8")
    return path


def torchrun_launcher(python: str, nproc: int) -> list[str]:
    """`python -m torch.distributed.run` on `nproc` local processes (a free port each time)."""
    return [python, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc)]


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
    seed: int | None = None,
    call: str | None = None,
    synthetic: int = 0,
) -> Run:
    """Run `launcher bootstrap script args` in `workdir` and read the per-rank records.

    `launcher` is e.g. `[sys.executable]`, `[accel, "launch", "--nproc-per-node", "2"]` or
    `torchrun_launcher(sys.executable, 2)`. Every process gets `timeout` seconds (the bootstrap's
    own deadline: it writes its stacks and exits, so a hang names its rank); the launcher gets a
    grace period on top, then SIGTERM (torchrun stops its workers, which run in sessions of their
    own) and SIGKILL. Output goes through files, never pipes, so a worker that outlives the
    launcher cannot keep this call waiting.
    """
    import signal
    import subprocess

    workdir.mkdir(parents=True, exist_ok=True)
    prefix = workdir / ".accel_verify_losses"
    environment = dict(os.environ if env is None else env)
    environment[ENV_RECORD] = str(prefix)
    environment[ENV_STEPS] = str(steps)
    environment[ENV_DEADLINE] = f"{timeout:g}"
    environment.setdefault("PYTHONUNBUFFERED", "1")
    if extra_path is not None:
        environment[ENV_EXTRA_PATH] = str(extra_path)
    if seed is not None:
        environment[ENV_SEED] = str(seed)
    if call is not None:
        environment[ENV_CALL] = call
    if synthetic:
        environment[ENV_SYNTHETIC] = str(synthetic)
    command = [*launcher, str(bootstrap), str(script), *args]
    out_path, err_path = workdir / ".accel_verify_stdout", workdir / ".accel_verify_stderr"
    timed_out = False
    with out_path.open("w", encoding="utf-8") as out, err_path.open("w", encoding="utf-8") as err:
        process = subprocess.Popen(
            command, cwd=workdir, env=environment, stdout=out, stderr=err, stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        try:
            returncode = process.wait(timeout=timeout + LAUNCHER_GRACE)
        except subprocess.TimeoutExpired:
            timed_out = True
            for sig, wait in ((signal.SIGTERM, LAUNCHER_GRACE), (signal.SIGKILL, None)):
                try:
                    os.killpg(process.pid, sig)
                except ProcessLookupError:
                    pass
                try:
                    process.wait(timeout=wait)
                    break
                except subprocess.TimeoutExpired:
                    continue
            returncode = process.returncode if process.returncode is not None else -9
    stdout = out_path.read_text(encoding="utf-8", errors="replace")
    stderr = err_path.read_text(encoding="utf-8", errors="replace")
    if timed_out:
        stderr += f"\n(the launcher was stopped {timeout + LAUNCHER_GRACE:g} s after it started)"
    run = Run(returncode, stdout, stderr, timed_out=timed_out, exit_codes=torchrun_exit_codes(stderr))
    for path in sorted(workdir.glob(".accel_verify_losses.*.jsonl")):
        rank = int(path.name.split(".")[-2])
        records = []
        for line in path.read_text(encoding="utf-8").splitlines():
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except ValueError:  # a line cut short by a kill
                continue
            if record.get("end"):
                run.ends[rank] = record
            elif record.get("error"):
                run.errors[rank] = record
            else:
                records.append(record)
        run.records[rank] = records
    for path in sorted(workdir.glob(".accel_verify_losses.*.stack.txt")):
        text = path.read_text(encoding="utf-8", errors="replace")
        if text.strip():
            run.stacks[int(path.name.split(".")[-3])] = text
    if run.deadline_ranks():
        run.timed_out = True
    return run


_FAILURE = re.compile(r"rank\s*:\s*(\d+)\s*\(local_rank:[^)]*\)\s*\n\s*exitcode\s*:\s*(-?\d+)")


def torchrun_exit_codes(stderr: str) -> dict[int, int]:
    """rank -> exit code, from the failure summary torchrun prints when a worker fails."""
    return {int(rank): int(code) for rank, code in _FAILURE.findall(stderr)}


def stack_location(stack: str, script: Path) -> str:
    """`file:line in function` where a dumped process was: the innermost frame in `script` of the
    thread that shows one (the current thread first, then the oldest, which is the main thread:
    faulthandler lists threads newest first and calls most recent first), else any innermost frame."""
    blocks = [b for b in re.split(r"\n(?=(?:Current thread|Thread) 0x)", stack) if "File " in b]
    blocks = [b for b in blocks if "Current thread" in b] + [b for b in reversed(blocks) if "Current thread" not in b]
    target = script.resolve()
    first = None
    for block in blocks:
        frames = re.findall(r'File "([^"]+)", line (\d+) in (\S+)', block)
        first = first or (frames[0] if frames else None)
        mine = [f for f in frames if Path(f[0]).resolve() == target]
        if mine:
            return f"{target.name}:{mine[0][1]} in {mine[0][2]}"
    if first is None:
        return "an unknown place (no Python frame in its stack dump)"
    return f"{first[0]}:{first[1]} in {first[2]}"


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
    ranks: list[float | None] | None = None  # N processes: each rank's loss (migrated is their mean)

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
    per_rank: list[list[float]] | None = None,
) -> Comparison:
    """Row by row: identical (every value bit-equal), within tolerance (|a - b| <= atol + rtol*|a|),
    or diverged at the first row that is not (a missing row, e.g. one run stopped early, diverges).
    NaN equals NaN only when both sides are NaN."""
    rows = []
    for index in range(max(len(original), len(migrated))):
        a = original[index] if index < len(original) else None
        b = migrated[index] if index < len(migrated) else None
        step = steps[index] if steps is not None and index < len(steps) else None
        ranks = None if per_rank is None else [r[index] if index < len(r) else None for r in per_rank]
        rows.append(Row(index, step, a, b, ranks))
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
    nranks = max((len(r.ranks) for r in comparison.rows if r.ranks is not None), default=0)
    migrated = f"migrated (mean of {nranks})" if nranks else "migrated loss"
    header = f"{'#':>4}  {'step':>5}  {'original loss':>16}  {migrated:>20}  {'abs diff':>10}  {'rel diff':>10}"
    header += "".join(f"  {f'rank {r}':>16}" for r in range(nranks))
    lines = [header, "-" * len(header)]

    def number(value: float | None) -> str:
        return "-" if value is None else f"{value:.9g}"

    def small(value: float | None) -> str:
        return "-" if value is None else ("0" if value == 0 else f"{value:.2e}")

    for row in comparison.rows:
        mark = "  <- diverged" if comparison.diverged_at is row else ""
        step = "-" if row.step is None else str(row.step)
        ranks = "".join(f"  {number(v):>16}" for v in (row.ranks or []))
        lines.append(
            f"{row.index:>4}  {step:>5}  {number(row.original):>16}  {number(row.migrated):>20}  "
            f"{small(row.abs_diff):>10}  {small(row.rel_diff):>10}{ranks}{mark}"
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


# -- N processes: ranks, replicas, failures -----------------------------------------------------


def rank_mean(run: Run, nproc: int) -> tuple[list[float], list[list[float]], str]:
    """(mean over ranks of each backward call's loss, each rank's losses, a problem or "").

    With split_batches every rank's loss is the mean over its 1/N slice of the global batch, so
    their mean is the mean over the whole batch: the 1-process loss, up to summation order. Ranks
    that recorded different numbers of backward calls, or at different optimizer steps, did not
    run the same loop: only the calls all ranks recorded are averaged, and the problem says so."""
    per_rank = [run.losses(r) for r in range(nproc)]
    counts = [len(losses) for losses in per_rank]
    problem = step_mismatch(run, nproc)
    if not problem and len(set(counts)) > 1:
        problem = "the ranks recorded different numbers of backward calls: " + ", ".join(
            f"rank {r} {n}" for r, n in enumerate(counts)
        )
    common = min(counts) if counts else 0
    mean = [sum(losses[i] for losses in per_rank) / nproc for i in range(common)]
    return mean, per_rank, problem


def step_mismatch(run: Run, nproc: int) -> str:
    """The first backward call (within those every rank recorded) that a rank made at another
    optimizer step than rank 0: that rank skipped or added a step. "" if none."""
    for r in range(1, nproc):
        for index, (mine, reference) in enumerate(zip(run.steps(r), run.steps(0))):
            if mine != reference:
                return (
                    f"rank {r} made backward call #{index} at optimizer step {mine}, rank 0 at step "
                    f"{reference}: rank {r} skipped or added an optimizer step"
                )
    return ""


def replica_report(run: Run, nproc: int) -> tuple[list[str], bool]:
    """Lines saying whether every rank ended with rank 0's parameters (hashes of the tensors of every
    optimizer that stepped, taken where the run stopped), and whether they all did."""
    reference = run.ends.get(0, {}).get("weights") or []
    if not reference:
        return ["replicas: not compared (no optimizer stepped on rank 0)"], True
    lines, in_sync = [], True
    by_name0 = {w["name"]: w for w in reference}
    for rank in range(1, nproc):
        weights = run.ends.get(rank, {}).get("weights") or []
        by_name = {w["name"]: w for w in weights}
        differ = [n for n, w in by_name0.items() if n not in by_name or by_name[n]["sha"] != w["sha"]]
        differ += [n for n in by_name if n not in by_name0]
        if differ:
            in_sync = False
            shown = ", ".join(differ[:6]) + (f", ... ({len(differ) - 6} more)" if len(differ) > 6 else "")
            lines.append(
                f"replicas: rank {rank}'s final weights differ from rank 0's in {len(differ)} of "
                f"{len(by_name0)} tensors: {shown}"
            )
    if in_sync:
        steps = run.ends[0].get("steps")
        lines.append(
            f"replicas: in sync (all {len(reference)} parameter tensors bit-identical on ranks 0-{nproc - 1} "
            f"after {steps} optimizer steps)"
        )
    return lines, in_sync


_COLLECTIVE = re.compile(r"torch[/\\](distributed|autograd|nn[/\\]parallel)[/\\]")


def _waiting(stack: str) -> bool:
    """Whether the innermost frame of the dumped main thread is in a collective or a backward
    (on N processes: waiting for the other ranks)."""
    blocks = [b for b in re.split(r"\n(?=(?:Current thread|Thread) 0x)", stack) if "File " in b]
    if not blocks:
        return False
    current = [b for b in blocks if "Current thread" in b]
    main = current[0] if current else blocks[-1]
    first = re.search(r'File "([^"]+)", line \d+ in', main)
    return bool(first and _COLLECTIVE.search(first.group(1)))


def _main_stack(stack: str) -> str:
    """The dumped stack of the thread stack_location reads (for the report)."""
    blocks = [b for b in re.split(r"\n(?=(?:Current thread|Thread) 0x)", stack) if "File " in b]
    current = [b for b in blocks if "Current thread" in b]
    return (current or blocks[-1:] or [stack])[0].strip()


def failure_report(run: Run, nproc: int, script: Path, label: str, timeout: float) -> str | None:
    """None when every rank finished; else a report that names each rank that crashed, hung, was
    stopped or vanished, where it was (lines of `script`), and the traceback or stack of the rank
    that caused it: a hang's culprit is a rank that was not waiting in a collective; a crash's, the
    rank that raised first (the others then fail in the collective it left)."""
    if run.returncode == 0 and all(r in run.ends for r in range(nproc)) and not run.timed_out:
        return None
    unfinished = [r for r in range(nproc) if r not in run.ends and r not in run.errors]
    hung = [r for r in unfinished if r in run.stacks] if (run.deadline_ranks() or run.timed_out) else []
    culprits = [r for r in hung if not _waiting(run.stacks[r])]
    lines = [f"the {label} script failed on {nproc} processes:"]
    for rank in range(nproc):
        if rank in run.ends:
            lines.append(f"  rank {rank}: finished")
        elif rank in run.errors:
            error = run.errors[rank]
            where = error.get("where")
            at = f" at {script.name}:{where['line']} in {where['function']}" if where else ""
            what = "failed after the hang began" if hung else "crashed"
            lines.append(f"  rank {rank}: {what}{at}: {error['type']}: {error['message'][:300]}")
        elif rank in hung:
            waiting = " (waiting in a collective or backward for the other ranks)" if _waiting(run.stacks[rank]) else ""
            place = stack_location(run.stacks[rank], script)
            lines.append(f"  rank {rank}: hung: still running after {timeout:g} s, at {place}{waiting}")
        elif rank in run.stacks:
            place = stack_location(run.stacks[rank], script)
            lines.append(f"  rank {rank}: stopped by the launcher after another rank failed, at {place}")
        elif rank in run.exit_codes:
            lines.append(f"  rank {rank}: exited with code {run.exit_codes[rank]} without finishing (killed, or os._exit)")
        else:
            lines.append(f"  rank {rank}: never reported (it did not start the script, or was killed)")
    detail = ""
    if hung:
        if culprits:
            names = ", ".join(map(str, culprits))
            lines.insert(1, f"  hang: rank {names} stopped making progress; the other ranks waited for it")
            detail = f"rank {culprits[0]} stack:\n{_main_stack(run.stacks[culprits[0]])}"
        else:
            lines.insert(1, "  hang: the ranks waited in collectives for each other (different collectives, or a rank skipped one)")
            detail = f"rank {hung[0]} stack:\n{_main_stack(run.stacks[hung[0]])}"
    elif run.errors:
        first = min(run.errors, key=lambda r: run.errors[r].get("time", 0.0))
        later = sorted(r for r in run.errors if r != first)
        after = f" (rank {', '.join(map(str, later))} failed after it, in the collective it left)" if later else ""
        lines.insert(1, f"  crash: rank {first} first{after}")
        detail = f"rank {first} traceback:\n{run.errors[first].get('traceback', '').rstrip()}"
    else:
        detail = (run.stderr.strip() or run.stdout.strip())[-2000:]
    problem = step_mismatch(run, nproc)
    if problem:
        lines.append(f"  before that, {problem}")
    if run.timed_out and not run.stacks:
        lines.append(f"  (the launcher did not return within {timeout + LAUNCHER_GRACE:g} s)")
    lines.append("  (lines are those of the migrated copy; `--keep DIR` keeps it)")
    return "\n".join([*lines, "", detail[-3000:]])


# -- the command -----------------------------------------------------------------------------


@dataclass
class VerifyResult:
    exit_code: int
    message: str
    comparison: Comparison | None = None
    original: Run | None = None
    migrated: Run | None = None
    migrated_text: str | None = None
    # --synthetic: "verified", "differs at 1 process", "fails at N processes" or "could not run",
    # and the first error (or the reason it could not run) in one line.
    status: str = ""
    first_error: str = ""


def migrate_unit(script: Path, unit: Path, folder: Path, target: str) -> tuple[Path | None, str]:
    """Copy the folder `unit` (a repository holding `script`) to `folder` and migrate the copy in
    place, as `accel-migrate UNIT` would. Returns (the copy of script, diagnostics) or (None, why not)."""
    import shutil

    from migrate import runner
    from migrate.engine import Options

    copy = folder / unit.name
    shutil.copytree(unit, copy, ignore_dangling_symlinks=True, ignore=shutil.ignore_patterns("__pycache__"))
    report = runner.run([copy], Options(target=target), write=True, jobs=1)
    diagnostics, changed = "", False
    for result in report.results:
        shown = Path(result.path).relative_to(copy) if Path(result.path).is_relative_to(copy) else Path(result.path)
        if result.traceback is not None:
            return None, f"{unit / shown}: internal error while migrating:\n{result.traceback}"
        changed = changed or result.changed
        diagnostics += "".join(f"\n  {shown}:{d.line}: {d.code}: {d.message}" for d in result.diagnostics)
    if not changed:
        return None, f"{unit}: nothing to migrate (no rule changed it), so there is nothing to verify{diagnostics}"
    return copy / script.relative_to(unit), diagnostics


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
    nproc: int = 1,
    seed: int | None = DEFAULT_SEED,
    synthetic: bool = False,
    unit: Path | None = None,
) -> VerifyResult:
    """Migrate `script`, run the original on one process and the migrated copy on `nproc`, compare.

    synthetic: see verify_synthetic (the data, weights and CUDA replaced; three runs).
    unit: a folder holding `script` (its repository), migrated whole as `accel-migrate UNIT`
    would; the script then runs from the migrated copy of the folder (--synthetic only).

    nproc == 1: both as `python SCRIPT ARGS`; the losses of every backward call are compared.
    nproc > 1: the migrated copy under `python -m torch.distributed.run --nproc-per-node N` on CPU
    (gloo, ACCEL_CPU=1, no CUDA device visible to either run) with split_batches forced through
    ACCEL_SPLIT_BATCHES=1, so that the N processes together load the original's batches in the
    original's order; the mean over ranks of each backward call's loss is compared with the
    original's loss, and every rank's final parameters with rank 0's.
    """
    import shutil
    import tempfile

    script = script.resolve()
    if not script.is_file():
        return VerifyResult(EXIT_ERROR, f"{script}: no such file")
    if nproc > 1 and target != "runtime":
        return VerifyResult(
            EXIT_ERROR,
            f"--nproc-per-node {nproc} needs --target runtime: HF Accelerate runs several CPU processes "
            "only through MPI, and under torchrun it treats each CPU process as a separate run",
        )
    python = python or sys.executable
    folder = Path(tempfile.mkdtemp(prefix="accel-verify-")) if keep is None else keep.resolve()
    folder.mkdir(parents=True, exist_ok=True)
    if synthetic:
        try:
            return verify_synthetic(script, args, folder, steps=steps, rtol=rtol, atol=atol, target=target,
                                    python=python, timeout=timeout, nproc=nproc, seed=seed, unit=unit)
        finally:
            if keep is None:
                shutil.rmtree(folder, ignore_errors=True)
    try:
        migrated, notes = migrate_copy(script, folder / "migrated", target)
        if migrated is None:
            return VerifyResult(EXIT_ERROR, notes)
        bootstrap = write_bootstrap(folder)
        environment = dict(os.environ)
        for name in [n for n in environment if n.startswith(("ACCEL_", "ACCELERATE_"))]:
            environment.pop(name)  # the user's accel settings must not change one run only
        migrated_env = dict(environment)
        if nproc > 1:
            for env in (environment, migrated_env):
                env["CUDA_VISIBLE_DEVICES"] = ""  # both on the CPU: the comparison is of the distribution
            migrated_env.update(ACCEL_SPLIT_BATCHES="1", ACCEL_CPU="1")
        runs = {}
        plan = (
            ("original", [python], script, None, environment),
            ("migrated", [python] if nproc == 1 else torchrun_launcher(python, nproc), migrated, script.parent, migrated_env),
        )
        for label, launcher, path, extra, env in plan:
            runs[label] = run_instrumented(
                launcher, bootstrap, path, args, folder / f"run-{label}", steps=steps,
                env=env, extra_path=extra, timeout=timeout, seed=seed,
            )
        text = migrated.read_text(encoding="utf-8")
        original, after = runs["original"], runs["migrated"]

        def failed(message: str) -> VerifyResult:
            return VerifyResult(EXIT_ERROR, message, None, original, after, text)

        if original.returncode != 0 or 0 not in original.ends:
            why = "timed out" if original.timed_out else f"exited with {original.returncode}"
            tail = (original.stderr.strip() or original.stdout.strip())[-3000:]
            return failed(f"the original script {why}:\n{tail}")
        if nproc == 1:
            if after.returncode != 0 or 0 not in after.ends:
                why = "timed out" if after.timed_out else f"exited with {after.returncode}"
                tail = (after.stderr.strip() or after.stdout.strip())[-3000:]
                return failed(f"the migrated script {why}:\n{tail}")
        else:
            report = failure_report(after, nproc, migrated, "migrated", timeout)
            if report is not None:
                return failed(report)
        if not original.losses():
            return failed(f"{script}: the original run called no .backward(): nothing to compare")
        header: list[str] = []
        if nproc == 1:
            comparison = compare(original.losses(), after.losses(), original.steps(), rtol=rtol, atol=atol)
            tail_lines: list[str] = []
            in_sync = True
        else:
            mean, per_rank, problem = rank_mean(after, nproc)
            comparison = compare(original.losses(), mean, original.steps(), rtol=rtol, atol=atol, per_rank=per_rank)
            header.append(
                f"the original on 1 process against the migrated copy on {nproc} processes (torch.distributed.run, "
                f"gloo, CPU, split_batches): the mean over ranks of each backward call's loss"
            )
            for accelerator in (after.ends.get(0, {}).get("accelerators") or []):
                if accelerator.get("split_batches") is False:
                    header.append(
                        f"note: the script's {accelerator['type']} has split_batches=False (given explicitly?): "
                        f"each rank loaded whole batches, so the losses cannot match the original's"
                    )
            tail_lines, in_sync = replica_report(after, nproc)
            if problem:
                tail_lines.insert(0, f"ranks: {problem}")
                in_sync = False
        message = "\n".join([*header, format_table(comparison), verdict_line(comparison, steps), *tail_lines])
        if notes:
            message = f"migration diagnostics:{notes}\n\n{message}"
        ok = comparison.ok and in_sync
        return VerifyResult(EXIT_OK if ok else EXIT_DIVERGED, message, comparison, original, after, text)
    finally:
        if keep is None:
            shutil.rmtree(folder, ignore_errors=True)


# -- --synthetic -------------------------------------------------------------------------------

VERIFIED, DIFFERS, FAILS, COULD_NOT_RUN = "verified", "differs at 1 process", "fails at N processes", "could not run"
REPLACED_SOURCES = (
    "torchvision datasets, datasets.load_dataset, np.load / np.memmap / np.fromfile / torch.load of absent "
    "files, and pretrained weights"
)


def _first_line(text: str) -> str:
    return next((line.strip() for line in text.strip().splitlines() if line.strip()), "")


def why_not_run(run: Run, script: Path) -> str:
    """Why the original could not run with synthetic data, with advice (one paragraph)."""
    error = run.errors.get(0)
    if error is None:
        if run.timed_out:
            return "the original script did not finish within --timeout"
        if 0 in run.ends and not run.losses():
            said = run.stdout.strip().splitlines()
            last = f" (its last line: {said[-1].strip()[:200]!r})" if said else ""
            return f"the original script called no .backward() with synthetic data: nothing to compare{last}"
        tail = (run.stderr.strip() or run.stdout.strip()).splitlines()
        return f"the original script exited with {run.returncode}: {tail[-1] if tail else '(no output)'}"
    where = error.get("where")
    at = f"{script.name}:{where['line']}" if where else script.name
    kind, message = error.get("type", "Error"), _first_line(error.get("message", ""))
    if kind == "SystemExit":
        usage = _first_line("\n".join(run.stderr.strip().splitlines()[-1:]))
        return (f"the original script exited with status {message} ({usage or 'its arguments'}): give it the "
                f"arguments it needs after `--`")
    missing = re.match(r"No module named '([\w.]+)'", message) if kind == "ModuleNotFoundError" else None
    top = missing.group(1).split(".")[0] if missing else ""
    beside = bool(top) and ((script.parent / f"{top}.py").exists() or (script.parent / top).is_dir())
    if missing and "." in missing.group(1) and not beside:  # the package imported, its module is not in it
        return (f"{at}: {kind}: {message}: the installed `{top}` has no `{missing.group(1)}`: the script was "
                f"written for another version of {top} (install that one)")
    if top and not beside:
        return (f"{at}: {kind}: {message}: `{top}` is neither installed nor beside the script (no {top}.py or "
                f"{top}/ in {script.parent.name}/): either a module of the script's own project that this copy "
                f"lacks (run verify where the project is whole, with --unit DIR for a repository) or a library "
                f"that is not installed (install it: --synthetic replaces data, weights and CUDA, not libraries)")
    if missing and "." in missing.group(1) and (script.parent / top).is_dir():
        inner = script.parent.joinpath(*missing.group(1).split("."))
        if not inner.is_dir() and not inner.with_suffix(".py").exists():
            return (f"{at}: {kind}: {message}: {top}/ is beside the script but has no "
                    f"{inner.relative_to(script.parent / top).as_posix()}(.py): a module of the script's own project "
                    f"that this copy lacks (run verify where the project is whole, with --unit DIR for a repository)")
    if kind in ("ModuleNotFoundError", "ImportError"):
        return (f"{at}: {kind}: {message}: install it (--synthetic replaces data, weights and CUDA, not "
                f"libraries), or add its folder to PYTHONPATH")
    if kind in ("FileNotFoundError", "IsADirectoryError", "NotADirectoryError", "PermissionError") or (
        kind in ("OSError", "RuntimeError") and ("No such file" in message or "not found" in message.lower())
    ):
        return (f"{at}: reads data through a loader --synthetic does not replace ({kind}: {message}); it "
                f"replaces {REPLACED_SOURCES}: make the data exist, or pass the script an argument that "
                f"points at data that exists (after `--`)")
    if kind in ("ConnectionError", "URLError", "HTTPError", "gaierror", "Timeout", "ConnectTimeout", "MaxRetryError",
                "NameResolutionError", "LocalEntryNotFoundError", "OfflineModeIsEnabled"):
        return (f"{at}: downloads something --synthetic does not replace ({kind}: {message[:200]}); it replaces "
                f"{REPLACED_SOURCES}: download it beforehand and point the script at the local copy (after `--`)")
    return f"{at}: {kind}: {message} (the original script, with synthetic data)"


def _error_line(run: Run, script: Path, nproc: int) -> str:
    if run.errors:
        rank = min(run.errors, key=lambda r: run.errors[r].get("time", 0.0))
        error = run.errors[rank]
        where = error.get("where")
        at = f"{script.name}:{where['line']}: " if where else ""
        on = f"rank {rank}: " if nproc > 1 else ""
        return f"{on}{at}{error.get('type')}: {_first_line(error.get('message', ''))}"
    if run.timed_out:
        return "timed out (a hang): " + ", ".join(
            f"rank {r} at {stack_location(run.stacks[r], script)}" for r in sorted(run.stacks)
        )
    tail = (run.stderr.strip() or run.stdout.strip()).splitlines()
    return f"exited with {run.returncode}: {tail[-1] if tail else '(no output)'}"


def sample_report(run: Run, nproc: int) -> tuple[list[str], bool]:
    """Whether each sample went to one rank: per dataset, the indices each rank drew in its first
    pass that fed a backward. A rank that drew more than half of its samples also on rank 0 trains
    on a copy of rank 0's data (an unsharded loader); a few shared samples are padding."""
    reference = run.synthetic(0).get("samples") or {}
    lines, ok = [], True
    for key, indices in sorted(reference.items()):
        mine = set(indices)
        for rank in range(1, nproc):
            theirs = set((run.synthetic(rank).get("samples") or {}).get(key) or [])
            if not theirs:
                continue
            shared = mine & theirs
            if len(shared) * 2 > len(theirs):
                ok = False
                lines.append(
                    f"samples: rank 0 and rank {rank} both trained on {len(shared)} of the same {len(theirs)} samples "
                    f"of {key} (first pass that fed a backward): its loader is not sharded"
                )
            elif shared:
                lines.append(f"samples: rank 0 and rank {rank} share {len(shared)} samples of {key} (padding)")
    if ok and reference:
        lines.append(f"samples: each training sample on one rank ({', '.join(sorted(reference))})")
    return lines, ok


def write_report(run: Run, nproc: int) -> tuple[list[str], bool]:
    """Whether every file was written by one rank only (all ranks share the working directory)."""
    writers: dict[str, list[tuple[int, str]]] = {}
    for rank in range(nproc):
        for path, op in (run.synthetic(rank).get("writes") or {}).items():
            writers.setdefault(path, []).append((rank, op))
    twice = {path: who for path, who in writers.items() if len(who) > 1}
    if not twice:
        return ([f"writes: each file by one rank ({len(writers)} files)"] if writers else []), True
    lines = [
        f"writes: {path} written by ranks {', '.join(str(r) for r, _ in who)} ({who[0][1]}): on N processes "
        f"every rank writes it (at once, or one over another's)"
        for path, who in sorted(twice.items())[:6]
    ]
    return lines, False


def print_report(run: Run, nproc: int) -> list[str]:
    counts = [run.synthetic(rank).get("printed", 0) for rank in range(nproc)]
    if nproc > 1 and any(counts[1:]):
        return [f"note: lines printed per rank {counts}: prints that run on every process"]
    return []


def notebook_script(notebook: Path, folder: Path) -> Path:
    """A notebook's code cells joined into one script (notebooks.load: IPython lines and cell
    magics become calls of a no-op marker, so shell lines like `!pip install` are not run), written
    to `folder` as NAME.py; ValueError when it is not a Python notebook."""
    from migrate import notebooks

    try:
        loaded = notebooks.load(notebook.read_text(encoding="utf-8"))
    except notebooks.NotebookError as error:
        raise ValueError(f"{notebook}: {error}") from None
    prelude = "".join(f"def {name}(index):\n    pass\n" for name in (notebooks.CELL_MARKER, notebooks.MAGIC_MARKER))
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{notebook.stem}.py"
    path.write_text(prelude + loaded.script, encoding="utf-8")
    return path


def verify_synthetic(
    script: Path, args: list[str], folder: Path, *, steps: int, rtol: float, atol: float, target: str,
    python: str, timeout: float, nproc: int, seed: int | None, unit: Path | None = None,
) -> VerifyResult:
    """`--synthetic`: the original and the migrated copy on 1 process, then the migrated copy on
    `nproc`, each with its data, pretrained weights and CUDA replaced (migrate/verify_synthetic.txt)
    and every DataLoader pass cut to `steps` batches.

    Verdicts: could not run (the original does not run with synthetic data: why, and what to do),
    differs at 1 process (the migrated copy crashes, or a loss differs beyond tolerance), fails at N
    processes (a rank crashes or hangs, ranks step differently, replicas end out of sync, a rank
    trains on another rank's samples, or a file is written by several ranks), verified."""
    limit = steps or DEFAULT_SYNTHETIC_STEPS
    if unit is not None:
        unit = unit.resolve()
        if not script.is_relative_to(unit):
            return VerifyResult(EXIT_ERROR, f"{script} is not in --unit {unit}", status=COULD_NOT_RUN,
                                first_error=f"{script} is not in --unit {unit}")
        migrated, notes = migrate_unit(script, unit, folder / "migrated", target)
    else:
        migrated, notes = migrate_copy(script, folder / "migrated", target)
    if migrated is None:
        return VerifyResult(EXIT_ERROR, notes, status=COULD_NOT_RUN, first_error=_first_line(notes))
    original_path, original_extra = script, None
    if script.suffix == ".ipynb":  # both notebooks run as their joined code cells (magics skipped)
        try:
            original_path = notebook_script(script, folder / "original")
            migrated = notebook_script(migrated, migrated.parent)
        except ValueError as error:
            return VerifyResult(EXIT_ERROR, str(error), status=COULD_NOT_RUN, first_error=str(error))
        original_extra = script.parent
    migrated_extra = script.parent
    if unit is not None:  # the unit's root importable from a script in a subfolder, as `pip install -e .` makes it
        original_extra, migrated_extra = unit, folder / "migrated" / unit.name
    bootstrap = write_bootstrap(folder)
    environment = {k: v for k, v in os.environ.items() if not k.startswith(("ACCEL_", "ACCELERATE_"))}
    environment.update(HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")

    def run(label: str, path: Path, nprocs: int, extra: Path | None) -> Run:
        env = dict(environment)
        launcher = [python]
        if nprocs > 1:
            env.update(CUDA_VISIBLE_DEVICES="", ACCEL_CPU="1")
            launcher = torchrun_launcher(python, nprocs)
        return run_instrumented(launcher, bootstrap, path, args, folder / f"run-{label}", steps=limit, env=env,
                                extra_path=extra, timeout=timeout, seed=seed, synthetic=limit)

    text = migrated.read_text(encoding="utf-8")
    original = run("original", original_path, 1, original_extra)
    replaced = original.synthetic(0).get("replaced") or []
    lines = [f"synthetic: {r}" for r in replaced] or ["synthetic: nothing replaced (the script makes its own data)"]
    if original.returncode != 0 or 0 not in original.ends or not original.losses():
        why = why_not_run(original, original_path)
        guesses = [r for r in replaced if "random tokens" in r or "(a guess)" in r]
        if guesses and why.endswith("(the original script, with synthetic data)"):
            # an error after a replacement whose structure was guessed: name the guess
            why += (f"; it ran after a replacement whose structure is a guess ({guesses[-1]}): make the data exist, "
                    f"or pass an argument that points at data that exists (after `--`)")
        message = "\n".join([f"could not run: {why}", *(f"synthetic (before it stopped): {r}" for r in replaced)])
        return VerifyResult(EXIT_ERROR, message, None, original, None, text, COULD_NOT_RUN, why)
    after = run("migrated", migrated, 1, migrated_extra)
    if notes:
        lines.insert(0, f"migration diagnostics:{notes}\n")
    if after.returncode != 0 or 0 not in after.ends:
        first = _error_line(after, migrated, 1)
        tail = (after.stderr.strip() or after.stdout.strip())[-3000:]
        message = "\n".join([*lines, f"differs at 1 process: the migrated copy failed where the original ran: {first}",
                             "", tail])
        return VerifyResult(EXIT_DIVERGED, message, None, original, after, text, DIFFERS, first)
    comparison = compare(original.losses(), after.losses(), original.steps(), rtol=rtol, atol=atol)
    lines += [format_table(comparison), verdict_line(comparison, limit)]
    if not comparison.ok:
        first = verdict_line(comparison, limit).removeprefix("verdict: ")
        return VerifyResult(EXIT_DIVERGED, "\n".join([*lines, f"differs at 1 process: {first}"]), comparison,
                            original, after, text, DIFFERS, first)
    if nproc > 1:
        many = run(f"migrated-{nproc}", migrated, nproc, migrated_extra)
        report = failure_report(many, nproc, migrated, "migrated", timeout)
        if report is not None:
            first = _error_line(many, migrated, nproc)
            return VerifyResult(EXIT_DIVERGED, "\n".join([*lines, f"fails at {nproc} processes: {report}"]),
                                comparison, original, many, text, FAILS.replace("N", str(nproc)), first)
        checks: list[tuple[list[str], bool]] = []
        problem = step_mismatch(many, nproc)
        if problem:
            checks.append(([f"ranks: {problem}"], False))
        checks += [replica_report(many, nproc), sample_report(many, nproc), write_report(many, nproc)]
        failed = [line for found, ok in checks if not ok for line in found if "(padding)" not in line]
        for found, _ in checks:
            lines += found
        lines += print_report(many, nproc)
        if failed:
            first = failed[0]
            return VerifyResult(EXIT_DIVERGED, "\n".join([*lines, f"verdict: fails at {nproc} processes: {first}"]),
                                comparison, original, many, text, FAILS.replace("N", str(nproc)), first)
        lines.append(f"the migrated copy ran on {nproc} processes (gloo, CPU): exit 0, every check passed")
    lines.append("verdict: verified")
    return VerifyResult(EXIT_OK, "\n".join(lines), comparison, original, after, text, VERIFIED)


HELP = (
    "Check that migrating SCRIPT preserves its training: migrate it into a temporary folder, run the "
    "original on one process and the migrated copy on --nproc-per-node processes for --steps optimizer "
    "steps, and compare the loss of every backward call.\n\n"
    "WARNING: this RUNS YOUR SCRIPT (twice), as `python SCRIPT ARGS` would, with the current Python "
    "interpreter (or --python). It never runs unless you invoke `accel-migrate verify`. Your files are "
    "never modified: the migrated copy lives in a temporary folder and each run gets its own empty "
    "working directory. Losses are recorded by patching torch.Tensor.backward in the child processes; "
    "nothing in the script needs editing. Python's, torch's and numpy's RNGs are seeded with --seed "
    "before each run (a script that seeds itself overrides it).\n\n"
    "Arguments after `--` are passed to the script, e.g. `accel-migrate verify train.py -- --epochs 1`.\n\n"
    "With --nproc-per-node N (N > 1, --target runtime) the migrated copy runs under "
    "`python -m torch.distributed.run --nproc-per-node N` on N gloo CPU processes, with split_batches "
    "forced (ACCEL_SPLIT_BATCHES=1), so the N processes together load the original's batches in the "
    "original's order; no CUDA device is visible to either run. The mean over ranks of each backward "
    "call's loss is compared with the original's (with split_batches each rank's loss is the mean of "
    "its 1/N slice of the batch), and every rank's final parameters (those of every optimizer that "
    "stepped) with rank 0's, bit for bit. A rank that crashes is named with its error and line; a rank "
    "still running after --timeout seconds is named with the line it was at (a rank waiting in a "
    "collective for the others is marked so).\n\n"
    "What a pass proves: on this data, these arguments and this seed, for the steps run, the migrated "
    "script follows the original's loss trajectory within tolerance, and on N processes its replicas "
    "stay in sync (DDP averages the gradients of the whole batch; no rank trains alone). What it does "
    "not prove: other data, arguments, seeds or step counts; GPUs, NCCL or mixed precision on a GPU "
    "(the N-process check runs on CPU); code paths this run does not reach (resuming, evaluation "
    "after --steps, branches behind flags); nondeterministic ops; the default split_batches=False "
    "(each rank loads whole batches: a global batch N times larger, another training run this "
    "check cannot compare); "
    "a loss reduced by sum rather than mean (DDP averages gradients, so it is reported as a "
    "divergence, truthfully); the short last batch of an epoch that N does not divide (padded by "
    "even_batches: a divergence there is real but expected).\n\n"
    "With --synthetic, the script's data, pretrained weights and CUDA are replaced in the child processes "
    "(torchvision datasets by FakeData-like datasets of the same structure, datasets.load_dataset, np.load / "
    "np.memmap / np.fromfile / torch.load of absent files, pretrained weights by a random initialisation, "
    ".cuda() by the CPU) and every DataLoader pass yields at most --steps batches (default 3): the original "
    "and the migrated copy are compared on one process, then the migrated copy runs on --nproc-per-node "
    "processes with the runtime's defaults and must exit 0, keep its replicas in sync, give each training "
    "sample to one rank and write each file from one rank. Verdict: verified (exit 0), differs at 1 process "
    "or fails at N processes (exit 1, with the first error), could not run (exit 2, with why and what to do). "
    "See docs/verify.md.\n\n"
    "Prints a table (step, original loss, migrated loss, absolute and relative difference, and each "
    "rank's loss on N processes) and a verdict: identical, within tolerance (|a - b| <= atol + rtol * "
    "|a|), or diverged at step k; on N processes also whether the replicas are in sync.\n\n"
    "Exit codes: 0 identical or within tolerance (and replicas in sync); 1 diverged, or ranks whose "
    "final weights differ, or ranks that ran different steps; 2 the script cannot be migrated, has "
    "nothing to migrate, crashes, times out (hangs) or calls no backward."
)
