"""Codemod throughput on two corpora, as ratios against libcst's own floor in the same run.

(a) the fixtures (every .py under fixtures/) replicated to a few hundred files with varied names in
    nested folders: training scripts, the tool's real workload;
(b) the installed torch package's own .py sources (thousands of files that mention torch everywhere
    but hold almost no training loops), plus the zero-false-positive report: which files the tool
    would change there and by which rules.

Per round, interleaved, each in a fresh process: read+decode only; libcst parse + round-trip (the
floor); the engine in-process (read + migrate, no writes); the CLI (`--check`) with -j1 and -j2; and
torchfix -j1/-j2 when a torchfix executable is found (PATH, $TORCHFIX, or --torchfix). Asserts nothing.

And issue 12's whole-process measure on a folder of real training code (`--corpus DIR`, for
instance a scratch copy of a corpus of public scripts; the fixtures folder when none is given):
`accel-migrate --check -j 1 DIR` over a fresh process that round-trips the same files through
libcst, target <= 1.5x.

Usage: python benchmarks/codemod.py   (or through python -m benchmarks [--corpus DIR])
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from collections import Counter
from pathlib import Path

from benchmarks.common import PYTHON, ROOT, Row, log, median, output, parallel_probe, pinned_env, ratio_row, wall

NAMES = ("train", "finetune", "experiment", "run", "pretrain", "script", "main", "trainer")


def fixture_corpus(directory: Path, copies: int) -> list[Path]:
    sources = sorted((ROOT / "fixtures").rglob("*.py"))
    files = []
    for k in range(copies):
        for i, src in enumerate(sources):
            stem = src.name.removesuffix(".py").replace(".", "_")
            dest = directory / f"project_{k % 7}" / f"exp{k:02d}" / f"{NAMES[(i + k) % len(NAMES)]}_{stem}_{k}.py"
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, dest)
            files.append(dest)
    return files


def torch_corpus(directory: Path, sample: int) -> list[Path]:
    """The torch package's .py files copied out of site-packages (which the CLI excludes by default);
    sample > 0 keeps every k-th file (sorted) so that about `sample` remain."""
    import importlib.util

    spec = importlib.util.find_spec("torch")
    assert spec is not None and spec.origin is not None
    base = Path(spec.origin).parent
    sources = sorted(p for p in base.rglob("*.py") if "__pycache__" not in p.parts)
    if sample and sample < len(sources):
        step = len(sources) / sample
        sources = [sources[int(i * step)] for i in range(sample)]
    files = []
    for src in sources:
        dest = directory / "torch" / src.relative_to(base)
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, dest)
        files.append(dest)
    return files


def find_torchfix(explicit: str | None) -> str | None:
    for candidate in (explicit, os.environ.get("TORCHFIX"), shutil.which("torchfix")):
        if candidate and Path(candidate).exists():
            return candidate
    return None


def _worker(mode: str, listfile: Path) -> dict:
    return json.loads(output([PYTHON, "-m", "benchmarks.codemod_worker", mode, str(listfile)],
                             env=pinned_env(threads=None)).strip().splitlines()[-1])


def measure(name: str, directory: Path, files: list[Path], rounds: int, torchfix: str | None,
            torchfix_rounds: int = 1) -> tuple[list[Row], dict]:
    listfile = directory.parent / f"{directory.name}.list"
    listfile.write_text("\n".join(map(str, files)))
    env = pinned_env(threads=None)
    cli = [PYTHON, "-m", "migrate", "--check", "-q"]
    t: dict[str, list[float]] = {}
    parsed = 0
    for r in range(rounds):
        log(f"  codemod {name}: round {r + 1}/{rounds}")
        for mode in ("read", "floor", "engine"):
            result = _worker(mode, listfile)
            t.setdefault(mode, []).append(result["seconds"])
            if mode == "engine":
                parsed = result["hits"]
        one, two = parallel_probe(env)
        t.setdefault("probe-2x1", []).append(2 * one)
        t.setdefault("probe-2", []).append(two)
        for jobs in (1, 2):
            t.setdefault(f"cli-j{jobs}", []).append(wall(cli + ["-j", str(jobs), str(directory)], env, ok=(0, 1)))
        if torchfix and r < torchfix_rounds:
            for jobs in (1, 2):
                t.setdefault(f"torchfix-j{jobs}", []).append(
                    wall([torchfix, "-j", str(jobs), str(directory)], env, ok=(0, 1)))
    n = len(files)
    fps = {k: n / median(v) for k, v in t.items() if not k.startswith("probe")}
    ceiling = median(t["probe-2x1"]) / median(t["probe-2"])
    tag = f"{name} ({n} files)"
    rows = [
        Row("codemod " + name, "files/s: floor | engine | CLI -j1 | CLI -j2", "", fps["engine"], "files/s", 0.0,
            detail=f"read {fps['read']:.0f}, libcst floor {fps['floor']:.1f}, engine {fps['engine']:.1f}, "
            f"CLI -j1 {fps['cli-j1']:.1f}, CLI -j2 {fps['cli-j2']:.1f}"
            + (f", torchfix -j1 {fps['torchfix-j1']:.1f}, -j2 {fps['torchfix-j2']:.1f}" if torchfix else "")
            + f"; parsed {parsed}/{n}"),
        ratio_row("codemod " + name, f"engine time, {tag}", "libcst parse+round-trip", t["engine"], t["floor"],
                  "<= 2x" if name == "fixtures" else "", limit=2.0 if name == "fixtures" else None),
        ratio_row("codemod " + name, f"CLI -j1 time (with start-up), {tag}", "libcst parse+round-trip",
                  t["cli-j1"], t["floor"]),
        ratio_row("codemod " + name, f"CLI speed-up -j2 over -j1, {tag}", "CLI -j1", t["cli-j1"], t["cli-j2"],
                  ">= 1.8x", at_least=1.8,
                  detail=f"this machine's ceiling in the same rounds: {ceiling:.2f}x (2 CPU-bound processes "
                  "over 1; below 2 when the host shares the cores)"),
    ]
    if name == "torch":
        rows.append(ratio_row("codemod " + name, f"engine time, {tag}", "read + decode only", t["engine"], t["read"],
                              "close to 1x (pre-filter)", limit=1.5,
                              detail=f"pre-filter let {parsed}/{n} files through to the parser"))
    if torchfix:
        for jobs in (1, 2):
            a, b = t[f"cli-j{jobs}"][:torchfix_rounds], t[f"torchfix-j{jobs}"]
            rows.append(ratio_row("codemod " + name, f"CLI -j{jobs} time, {tag}", f"torchfix -j{jobs}", a, b,
                                  "< 1x", limit=1.0))
    return rows, {k: [round(x, 4) for x in v] for k, v in t.items()}


def _cpu_wall(args: list[str], env: dict[str, str]) -> tuple[float, float, str]:
    """(wall seconds, CPU seconds user+system, stdout) of one fresh process: CPU time is what a
    shared machine disturbs least, wall time is what the user waits."""
    import resource
    import time

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    result = subprocess.run(args, capture_output=True, env=env)
    seconds = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if result.returncode not in (0, 1):
        raise RuntimeError(f"{args!r} exited {result.returncode}:\n{result.stderr.decode()[-3000:]}")
    return seconds, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), result.stdout.decode()


_ROUND_TRIP = (
    "import sys, libcst\n"
    "for p in open(sys.argv[1]).read().splitlines():\n"
    "    t = open(p, 'rb').read().decode('utf-8', 'replace')\n"
    "    try:\n        libcst.parse_module(t).code\n"
    "    except Exception:\n        pass\n"
)


def whole_process(folder: Path, rounds: int) -> tuple[list[Row], dict]:
    """Issue 12's measure, on a folder of real training code: `accel-migrate --check -j 1 FOLDER`
    (start-up, discovery, every check and fallback included) over one fresh process that reads
    the same files and round-trips each through libcst (parse + print), interleaved per round."""
    from migrate.discovery import discover

    files = discover([folder]).files
    with tempfile.TemporaryDirectory(prefix="accel-bench-list-") as tmp:
        listfile = Path(tmp) / "files.list"
        listfile.write_text("\n".join(str(p) for p in files))
        return _whole_process(folder, files, listfile, rounds)


def _whole_process(folder: Path, files: list[Path], listfile: Path, rounds: int) -> tuple[list[Row], dict]:
    env = pinned_env(threads=None)
    # the report as JSON (same work as the text report) so that the timed run also says what it found
    cli = [PYTHON, "-m", "migrate", "--check", "-j", "1", "--output-format", "json", str(folder)]
    floor = [PYTHON, "-c", _ROUND_TRIP, str(listfile)]
    t: dict[str, list[float]] = {"cli": [], "floor": [], "cli_cpu": [], "floor_cpu": []}
    stdout = ""
    for r in range(rounds):
        log(f"  whole-process {folder.name}: round {r + 1}/{rounds}")
        for key, args in (("floor", floor), ("cli", cli)):
            seconds, cpu, out = _cpu_wall(args, env)
            t[key].append(seconds)
            t[f"{key}_cpu"].append(cpu)
            stdout = out if key == "cli" else stdout
    report = json.loads(stdout)
    checks = Counter(d["code"] for f in report["files"] for d in f.get("diagnostics") or []
                     if d["code"] in ("AM101", "AM102", "AM103", "AM104"))
    parsed = report["summary"]["files"] - report["summary"]["skipped"]
    changed = sum(1 for f in report["files"] if f["status"] == "changed")
    tag = f"{folder.name} ({len(files)} files, {parsed} parsed, {changed} changed)"
    cpu = median(t["cli_cpu"]) / median(t["floor_cpu"])
    rows = [ratio_row("codemod corpus", f"accel-migrate --check -j 1, whole process, {tag}",
                      "libcst parse+print process", t["cli"], t["floor"], "<= 1.5x", limit=1.5,
                      detail=f"CPU time ratio {cpu:.3f}x; safety-check diagnostics: "
                      + (", ".join(f"{k} x{v}" for k, v in sorted(checks.items())) or "none"))]
    return rows, {k: [round(x, 4) for x in v] for k, v in t.items()}


def false_positives(directory: Path) -> dict:
    """What --check would change in a tree that holds (almost) no training scripts."""
    text = subprocess.run([PYTHON, "-m", "migrate", "--check", "--output-format", "json", "-j", "2", str(directory)],
                          capture_output=True, text=True, env=pinned_env(threads=None)).stdout
    report = json.loads(text)
    changed = [f for f in report["files"] if f["status"] == "changed"]
    diagnostics = Counter(d["code"] for f in report["files"] for d in f.get("diagnostics") or [])
    return {
        "files": report["summary"]["files"],
        "parsed": report["summary"]["files"] - report["summary"]["skipped"],
        "changed": len(changed),
        "changes_by_rule": report["summary"]["changes_by_rule"],
        "diagnostics_by_rule": dict(sorted(diagnostics.items())),
        "changed_files": [
            {"path": str(Path(f["path"]).relative_to(directory)),
             "rules": dict(Counter(c["code"] for c in f["changes"])),
             "first": [f"{c['code']} line {c['line']}: {c['message']}" for c in f["changes"][:3]]}
            for f in changed
        ],
    }


def run(rounds: int, copies: int, torch_sample: int, torchfix: str | None, fp_report: bool,
        corpus: list[Path] | None = None) -> tuple[list[Row], dict]:
    torchfix = find_torchfix(torchfix)
    extra: dict = {"torchfix": torchfix or "not installed"}
    rows: list[Row] = []
    for folder in corpus or [ROOT / "fixtures"]:
        r, raw = whole_process(folder, rounds)
        rows += r
        extra[f"whole_process_{folder.name}_s"] = raw
    with tempfile.TemporaryDirectory(prefix="accel-bench-") as tmp:
        a = Path(tmp) / "fixtures"
        files = fixture_corpus(a, copies)
        r, raw = measure("fixtures", a, files, rounds, torchfix)
        rows += r
        extra["fixtures_raw_s"] = raw
        if torch_sample >= 0:
            b = Path(tmp) / "torchsrc"
            files = torch_corpus(b, torch_sample)
            r, raw = measure("torch", b, files, rounds, torchfix if torch_sample and torch_sample <= 200 else None)
            rows += r
            extra["torch_raw_s"] = raw
            if fp_report:
                full = Path(tmp) / "torchfull"
                torch_corpus(full, 0)
                log("  zero-false-positive report over the whole torch package ...")
                fp = false_positives(full)
                extra["torch_false_positives"] = fp
                rows.append(Row("codemod torch", f"files the tool would change in torch ({fp['files']} files)",
                                "", fp["changed"], "files", 0.0, "0", fp["changed"] == 0,
                                "; ".join(f"{c['path']} {c['rules']}" for c in fp["changed_files"])))
    return rows, extra


def main() -> None:
    from benchmarks.run import print_table

    rows, extra = run(rounds=3, copies=3, torch_sample=300, torchfix=None, fp_report=False)
    print_table(rows)
    print(json.dumps(extra, indent=1))


if __name__ == "__main__":
    main()
