"""The prepared CUDA check (issue 29 item 6): the CUDA paths that the CPU suite never runs.

`python -m benchmarks.gpu_check` on a machine with one CUDA GPU runs, each step in its own
subprocess with its own timeout, and prints one PASS/FAIL line per step with the first error:

1. ``cuda-tests``: the tests that skip without CUDA (`CUDA_TESTS`), by pytest node id;
   ``nccl``: all_reduce / broadcast / all_gather on a 1-rank nccl group (on one process the
   runtime makes no process group, so the launches below cannot reach nccl themselves);
2. ``migrate``: `accel-migrate` on fixtures/scripts/train_mlp.py, in a temporary folder;
3. ``launch-fp32`` / ``launch-fp16`` / ``launch-bf16``: `accel launch --nproc-per-node 1
   --mixed-precision no|fp16|bf16` of the migrated copy (on the GPU; fp16 must have a scaler);
4. ``launch-fsdp``: the same with `--strategy fsdp` on one rank;
5. ``estimate-memory``: `accel estimate-memory` of a small model (1 process, fp32, Adam) against
   `torch.cuda.max_memory_allocated` of a real training step, reported as a ratio.

Each launched copy prints one ``GPUCHECK {json}`` line right after its `Accelerator(...)`
(device, process-group backend (none on one process), mixed precision, scaler, strategy) that the
step checks, along with the script's losses (finite, and the last below the first).

Without CUDA nothing is run: it says so and exits 2 (never a success). With CUDA it exits 0 when
every step passed, 1 otherwise. A JSON summary goes to ``$OUT/gpu_check.json`` when ``OUT`` is set
(the device tool collects files under $OUT), else to stdout after the PASS/FAIL lines.

Subprocesses run this interpreter with the repository root first on PYTHONPATH, and the CLIs as
``python -c "from migrate.cli import main; main()"``, so no installed entry point is needed (on
the device machine the image's python3 holds torch; libcst and pathspec travel as wheels: see
benchmarks/README.md).
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# The tests that skip without CUDA (`grep -rn "needs a CUDA GPU" tests/`); tests/test_gpu_check.py
# checks that this list covers every file that holds such a skip.
CUDA_TESTS = (
    "tests/runtime/test_optimizer_state_follows.py::test_resumed_before_prepare_steps_on_the_gpu",
    "tests/runtime/test_precision.py::test_cuda_mixed_precision_trains",
)
SCRIPT = "fixtures/scripts/train_mlp.py"
LAUNCHES = (  # (step name, accel launch options, what the GPUCHECK line must say)
    ("launch-fp32", ["--mixed-precision", "no"], {"mixed_precision": "no", "scaler": False}),
    ("launch-fp16", ["--mixed-precision", "fp16"], {"mixed_precision": "fp16", "scaler": True}),
    ("launch-bf16", ["--mixed-precision", "bf16"], {"mixed_precision": "bf16", "scaler": False}),
    ("launch-fsdp", ["--mixed-precision", "no", "--strategy", "fsdp"], {"strategy": "fsdp"}),
)
STEPS = ("cuda-tests", "nccl", "migrate", *(name for name, _, _ in LAUNCHES), "estimate-memory")
TIMEOUT_S = {"cuda-tests": 110, "nccl": 30, "migrate": 45, "estimate-memory": 60}  # estimate: its 2 subprocesses together
LAUNCH_TIMEOUT_S = 55  # each launch; all steps together stay well under 8 minutes

MIGRATE = "import sys; from migrate.cli import main; sys.argv[0] = 'accel-migrate'; sys.exit(main())"
ACCEL = "import sys; from runtime.cli import main; sys.argv[0] = 'accel'; sys.exit(main())"

PROBE = (
    '{indent}print("GPUCHECK " + __import__("json").dumps({{'
    '"device": str({name}.device), '
    '"backend": (__import__("torch").distributed.get_backend() '
    'if __import__("torch").distributed.is_initialized() else None), '
    '"mixed_precision": str(getattr({name}, "mixed_precision", None)), '
    '"scaler": getattr({name}, "scaler", None) is not None, '
    '"strategy": str(getattr(getattr({name}, "strategy", None), "name", getattr({name}, "strategy", None))), '
    '"num_processes": {name}.num_processes}}), flush=True)\n'
)

NCCL = '''
import torch, torch.distributed as dist
dist.init_process_group("nccl", init_method="tcp://127.0.0.1:29533", rank=0, world_size=1, device_id=torch.device("cuda", 0))
t = torch.arange(4.0, device="cuda")
dist.all_reduce(t); dist.broadcast(t, 0); out = [torch.empty_like(t)]; dist.all_gather(out, t)
torch.cuda.synchronize()
assert dist.get_backend() == "nccl" and torch.equal(out[0].cpu(), torch.arange(4.0)), out
print("nccl", ".".join(map(str, torch.cuda.nccl.version())))
dist.destroy_process_group()
'''

MODEL = '''"""The estimate-memory step's model: 4 residual blocks of width 1024 (about 4.2 M parameters)."""
from torch import nn


class Block(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.fc = nn.Linear(width, width)

    def forward(self, x):
        return x + self.fc(x).relu()


def build():
    return nn.Sequential(*(Block(1024) for _ in range(4)), nn.Linear(1024, 1))
'''

MEASURE = '''
import json, sys, torch
sys.path.insert(0, sys.argv[1])
from gpucheck_model import build
warm = torch.nn.Linear(8, 8).cuda()  # cuBLAS's workspace (tens of MiB on Hopper) is allocated once
warm(torch.randn(4, 8, device="cuda")).sum().backward()  # per handle: keep it out of the measure
del warm
torch.cuda.synchronize()
torch.cuda.reset_peak_memory_stats()
base = torch.cuda.memory_allocated()
model = build().cuda()
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
x, y = torch.randn(2, 1024, device="cuda"), torch.randn(2, 1, device="cuda")
for _ in range(3):
    optimizer.zero_grad(set_to_none=False)
    torch.nn.functional.mse_loss(model(x), y).backward()
    optimizer.step()
torch.cuda.synchronize()
print(json.dumps({"peak": torch.cuda.max_memory_allocated() - base, "after": torch.cuda.memory_allocated() - base}))
'''


class StepFailed(Exception):
    pass


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _run(argv: list[str], timeout: float, cwd: Path | str = ROOT) -> subprocess.CompletedProcess:
    try:
        result = subprocess.run(argv, cwd=cwd, env=_env(), capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        raise StepFailed(f"timed out after {timeout:.0f} s") from exc
    if result.returncode != 0:
        raise StepFailed(f"exit {result.returncode}: {_first_error(result.stdout + result.stderr)}")
    return result


def _first_error(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    for pattern in (r"^E\s+\S", r"(Error|Exception)\b.*:", r"FAILED|Traceback|error"):
        for line in lines:
            if re.search(pattern, line):
                return line[:300]
    return (lines[-1] if lines else "no output")[:300]


def cuda_tests(work: Path) -> str:
    result = _run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs", *CUDA_TESTS],
                  TIMEOUT_S["cuda-tests"])
    summary = [line for line in result.stdout.splitlines() if re.search(r"\d+ (passed|failed|skipped)", line)]
    if "skipped" in (summary[-1] if summary else "") or "SKIPPED" in result.stdout:
        raise StepFailed(f"a CUDA test skipped: {summary[-1] if summary else result.stdout[-300:]}")
    return summary[-1].strip("= ") if summary else "passed"


def nccl(work: Path) -> str:
    result = _run([sys.executable, "-c", NCCL], TIMEOUT_S["nccl"])
    return result.stdout.strip().splitlines()[-1] + ": all_reduce, broadcast, all_gather on a 1-rank group"


def migrate(work: Path) -> str:
    target = work / "train_mlp.py"
    shutil.copy(ROOT / SCRIPT, target)
    _run([sys.executable, "-c", MIGRATE, str(target)], TIMEOUT_S["migrate"])
    text = target.read_text()
    match = re.search(r"^([ \t]*)(\w+)\s*=\s*Accelerator\(.*\)[ \t]*$", text, re.M)
    if not match:
        raise StepFailed("no one-line `NAME = Accelerator(...)` in the migrated copy")
    probe = PROBE.format(indent=match.group(1), name=match.group(2))
    (work / "train_mlp_probe.py").write_text(text[: match.end()] + "\n" + probe + text[match.end() + 1:])
    return f"migrated {SCRIPT}; Accelerator bound to `{match.group(2)}`"


def launch(work: Path, options: list[str], expected: dict) -> str:
    script = work / "train_mlp_probe.py"
    if not script.exists():
        raise StepFailed("no migrated copy (the migrate step failed)")
    result = _run([sys.executable, "-c", ACCEL, "launch", "--nproc-per-node", "1", *options, str(script),
                   "--epochs", "3"], LAUNCH_TIMEOUT_S, cwd=work)
    probes = [json.loads(line.split(" ", 1)[1]) for line in result.stdout.splitlines() if line.startswith("GPUCHECK ")]
    if not probes:
        raise StepFailed("the migrated copy printed no GPUCHECK line")
    probe = probes[0]
    # One process: the runtime creates no process group (runtime/state.py, world_size == 1), so no
    # backend; nccl itself is checked by the nccl step.
    wanted = {"backend": None, "num_processes": 1, **expected}
    for key, value in wanted.items():
        got = probe.get(key)
        if key == "strategy" and isinstance(got, str):
            got = "fsdp" if "fsdp" in got.lower() else got
        if key == "mixed_precision" and isinstance(got, str):
            got = got.rsplit(".", 1)[-1].lower()
        if got != value:
            raise StepFailed(f"{key} is {got!r}, expected {value!r} (GPUCHECK {json.dumps(probe)})")
    if not probe["device"].startswith("cuda"):
        raise StepFailed(f"device is {probe['device']}, expected cuda")
    losses = [float(m) for m in re.findall(r"loss (\S+)", result.stdout)]
    if not losses or not all(math.isfinite(v) for v in losses):
        raise StepFailed(f"losses not finite or missing: {losses[:3]}...{losses[-3:]}")
    if losses[-1] >= losses[0]:
        raise StepFailed(f"loss did not fall: {losses[0]:.4f} -> {losses[-1]:.4f}")
    return f"{probe['device']} {probe['backend']} {probe['mixed_precision']}; loss {losses[0]:.4f} -> {losses[-1]:.4f}"


def estimate_memory(work: Path) -> tuple[str, dict]:
    (work / "gpucheck_model.py").write_text(MODEL)
    result = _run([sys.executable, "-c", ACCEL, "estimate-memory", "gpucheck_model:build", "--nproc", "1",
                   "--precision", "fp32", "--optimizer", "adam", "--json"], TIMEOUT_S["estimate-memory"] / 2, cwd=work)
    rows = _estimate_rows(json.loads(result.stdout))
    row = next((r for r in rows if r.get("strategy") == "ddp" and r.get("precision") == "fp32"), None)
    if row is None:
        raise StepFailed(f"no ddp fp32 row in the estimate: {result.stdout[:300]}")
    measured = json.loads(_run([sys.executable, "-c", MEASURE, str(work)], TIMEOUT_S["estimate-memory"] / 2).stdout)
    ratio = measured["peak"] / row["total"]
    details = {"estimate_total": row["total"], "max_memory_allocated": measured["peak"],
               "allocated_after": measured["after"], "ratio": round(ratio, 4)}
    # Not counted by the estimate: activations (batch of 2: tiny) and the optimizer step's own
    # temporaries (foreach Adam holds about one parameter-sized sqrt(v) while it steps), so the peak
    # may exceed it by about a quarter; a peak far from it means the estimate is wrong.
    if not 0.9 <= ratio <= 1.6:
        raise StepFailed(f"max_memory_allocated / estimate = {ratio:.3f}, outside [0.9, 1.6]: {details}")
    return (f"max_memory_allocated / estimate = {ratio:.3f} ({measured['peak']:,} / {row['total']:,} B; "
            f"after the step {measured['after'] / row['total']:.3f})"), details


def _estimate_rows(report) -> list[dict]:
    if isinstance(report, list):
        return report
    for value in report.values() if isinstance(report, dict) else ():
        if isinstance(value, list) and value and isinstance(value[0], dict) and "strategy" in value[0]:
            return value
    return []


def main() -> int:
    import torch

    summary: dict = {"steps": {}, "torch": torch.__version__, "python": sys.version.split()[0]}
    if not torch.cuda.is_available():
        print("gpu_check: no CUDA GPU here: nothing was run (steps: " + ", ".join(STEPS) + ")")
        summary["cuda"] = False
        _write(summary)
        return 2
    summary["cuda"] = True
    summary["device"] = torch.cuda.get_device_name(0)
    print(f"gpu_check: {summary['device']}, torch {torch.__version__}, python {summary['python']}", flush=True)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="gpu_check_") as tmp:
        work = Path(tmp)
        steps = [("cuda-tests", lambda: cuda_tests(work)), ("nccl", lambda: nccl(work)),
                 ("migrate", lambda: migrate(work))]
        steps += [(name, lambda o=o, e=e: launch(work, o, e)) for name, o, e in LAUNCHES]
        steps.append(("estimate-memory", lambda: estimate_memory(work)))
        assert [name for name, _ in steps] == list(STEPS)
        for name, step in steps:
            t0 = time.monotonic()
            entry: dict = {}
            try:
                out = step()
                if isinstance(out, tuple):
                    out, entry["details"] = out
                entry.update(status="PASS", message=out)
            except StepFailed as exc:
                entry.update(status="FAIL", message=str(exc))
            except Exception as exc:  # a bug in this script is a failure too, never a crash
                entry.update(status="FAIL", message=f"{type(exc).__name__}: {exc}"[:300])
            entry["seconds"] = round(time.monotonic() - t0, 1)
            summary["steps"][name] = entry
            print(f"{entry['status']} {name} ({entry['seconds']} s): {entry['message']}", flush=True)
    summary["seconds"] = round(time.monotonic() - started, 1)
    summary["passed"] = all(e["status"] == "PASS" for e in summary["steps"].values())
    _write(summary)
    return 0 if summary["passed"] else 1


def _write(summary: dict) -> None:
    text = json.dumps(summary, indent=2)
    out = os.environ.get("OUT")
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / "gpu_check.json").write_text(text + "\n")
        print(f"gpu_check: summary in {Path(out) / 'gpu_check.json'}")
    else:
        print(text)


if __name__ == "__main__":
    sys.exit(main())
