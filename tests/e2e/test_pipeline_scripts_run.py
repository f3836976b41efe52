"""The whole-script golden files of fixtures/pipeline, run: original and migrated, one process.

Every case compares something non-empty: both runs go through the `accel-migrate verify`
bootstrap, which records the value given to every `.backward()` call, so a script that prints
nothing still yields its loss trajectory. For each case:

- the original runs on this CPU-only machine (exit 0) and records at least one loss;
- the migrated output runs too, records the same losses bit for bit, at the same optimizer steps,
  and prints the same stdout (loss lines included) as the original.

A script that only defines `main()` and never calls it (a module imported by a launcher) has its
`main()` called by the bootstrap after the module body ran, in both runs.

Not run here, each for its stated reason (EXCLUDED): originals that need CUDA, NCCL, torchrun or a
package this environment lacks. `test_excluded_originals_really_cannot_run` keeps that list honest:
each excluded original must fail here with the error its reason names. fixtures/scripts (the
pipeline cases with the same name) are run in depth, on 1 and 2 processes, by
test_migrate_and_train.py and are not repeated here.
"""

from __future__ import annotations

import ast
import os
import shutil
import sys
from pathlib import Path

import pytest

from migrate.verify import Run, run_instrumented, write_bootstrap

ROOT = Path(__file__).resolve().parents[2]
PIPELINE = ROOT / "fixtures" / "pipeline"
CORPUS = {p.stem for p in (ROOT / "fixtures" / "scripts").glob("*.py")}
TIMEOUT = 120

# name -> (why the original cannot run here, a string its error output contains)
EXCLUDED: dict[str, tuple[str, str]] = {
    "torchrun_ddp_fp16_scaler_accumulation": (
        "a hand-written torchrun script: init_process_group(env://) needs torchrun's RANK, then NCCL and CUDA",
        "RANK",
    ),
    "trap_accumulation_from_world_size": (
        "a hand-written torchrun script: init_process_group(env://) needs torchrun's RANK; under torchrun its "
        "DistributedSampler (own seeded permutation) and the runtime's sharding see other samples, so no "
        "bit-for-bit comparison exists",
        "RANK",
    ),
    "trap_clip_without_unscale": ("it calls .cuda(): needs a CUDA device", "CUDA"),
    "trap_gpu_index_trainer": (
        "it moves the model to the literal GPU index 0: needs a CUDA device (the migrated script drops the moves; "
        "its shape trains on 1 and 2 processes in test_trainer_objects_from_builder.py)",
        "accelerator device",
    ),
    "trap_compile_and_loss_scaler_object": ("it imports timm, which is not installed here", "timm"),
    "trap_rank_sharded_loader": (
        "main(dataset) needs a dataset from its caller, and its DistributedSampler needs a process group",
        "dataset",
    ),
}


def _cases() -> list[Path]:
    return sorted(
        p
        for p in PIPELINE.glob("*.in.py")
        if p.name.removesuffix(".in.py") not in CORPUS and _out(p).exists()
    )


def _out(case: Path) -> Path:
    return case.with_name(case.name.replace(".in.py", ".out.py"))


def _name(case: Path) -> str:
    return case.name.removesuffix(".in.py")


def uncalled_main(source: str) -> str | None:
    """"main" when the module defines a top-level `main` and no module-level code calls it."""
    tree = ast.parse(source)
    defined = any(isinstance(n, ast.FunctionDef) and n.name == "main" for n in tree.body)
    if not defined:
        return None
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        for inner in ast.walk(node):
            if isinstance(inner, ast.Call) and isinstance(inner.func, ast.Name) and inner.func.id == "main":
                return None
    return "main"


def _env() -> dict[str, str]:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    env.pop("PYTHONPATH", None)
    for name in [n for n in env if n.startswith(("ACCEL_", "ACCELERATE_"))]:
        env.pop(name)
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    return env


def _run(source: Path, folder: Path, call: str | None) -> Run:
    folder.mkdir(parents=True)
    script = folder / "script.py"
    shutil.copy(source, script)
    bootstrap = write_bootstrap(folder)
    return run_instrumented(
        [sys.executable], bootstrap, script, [], folder / "run", env=_env(), timeout=TIMEOUT, seed=0, call=call
    )


def _failure(run: Run) -> str:
    return f"exit {run.returncode}\n{run.stdout[-1500:]}\n{run.stderr[-3000:]}"


# name -> why the 1-process comparison cannot see its training: the original trains in processes it
# spawns itself, where the bootstrap records nothing. tests/e2e/test_spawn_conversion.py runs such a
# conversion on 2 processes against the spawn run instead.
SPAWNS: dict[str, str] = {
    "mp_spawn_ddp": "trains in workers started by mp.spawn; compared at 2 processes in test_spawn_conversion.py",
}

RUNNABLE = [c for c in _cases() if _name(c) not in EXCLUDED and _name(c) not in SPAWNS]


def test_every_spawning_case_really_spawns() -> None:
    for name in SPAWNS:
        assert "spawn(" in (PIPELINE / f"{name}.in.py").read_text(), name


def test_every_exclusion_names_an_existing_case() -> None:
    assert set(EXCLUDED) <= {_name(c) for c in _cases()}


@pytest.mark.parametrize("case", RUNNABLE, ids=_name)
def test_migrated_pipeline_script_runs_like_the_original(case: Path, tmp_path: Path) -> None:
    call = uncalled_main(case.read_text())
    before = _run(case, tmp_path / "original", call)
    assert before.returncode == 0 and 0 in before.ends, "the original must run here: " + _failure(before)
    assert before.losses(), "the original recorded no .backward() call: nothing would be compared"
    after = _run(_out(case), tmp_path / "migrated", call)
    assert after.returncode == 0 and 0 in after.ends, "the migrated script failed: " + _failure(after)
    assert after.losses() == before.losses()  # bit for bit, every backward call
    assert after.steps() == before.steps()
    assert after.stdout == before.stdout


@pytest.mark.parametrize("name", sorted(EXCLUDED))
def test_excluded_originals_really_cannot_run(name: str, tmp_path: Path) -> None:
    case = PIPELINE / f"{name}.in.py"
    run = _run(case, tmp_path / "original", uncalled_main(case.read_text()))
    reason, evidence = EXCLUDED[name]
    assert run.returncode != 0, f"{name} runs here after all: compare it instead ({reason})"
    assert evidence in run.stderr, run.stderr[-3000:]
