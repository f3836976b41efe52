"""Already-distributed scripts migrated with the CLI and trained at 1 and 2 gloo processes.

Each script in `distributed_shape_scripts/` is a shape of its own, hand-written and on CPU:

- `setup_helper_device.py`: a torchrun script whose helper initialises the process group and
  returns the device (`device = setup()`): the helper is kept, the Accelerator created after it,
  the device taken from it. The original runs under torchrun (`--standalone`).
- `spawn_or_direct_call.py`: `if nprocs > 1: mp.spawn(worker, ...) else: worker(0, 1, ...)`: both
  paths become one direct call of the worker. The original spawns its own processes (or calls the
  worker once); the migrated copy runs as plain `python` on one process.
- `spawn_setup_helper.py`: the spawned worker calls its own `ddp_setup(rank, world_size)` (address,
  process group): the call becomes the Accelerator and the helper goes.
- `launcher_env_branch.py`: a module-level script (no `main()`, no `__main__` guard) whose `if ddp:`
  branch, taken when the launcher sets RANK, asserts CUDA, joins an NCCL group and pins
  `f"cuda:{local_rank}"`; the batches are sharded by hand, the gradient accumulated with the DDP
  sync skipped but on the last micro-step, the loss averaged over the ranks. The migrated branch is
  device-neutral (the assert goes with the group, the device is `accelerator.device.type` as in
  the other branch), so it trains under `accel launch` on CPUs. The original cannot run its DDP
  branch on a CPU: the migrated copy at 1 and 2 processes is compared with the original as plain
  `python` (its single-process branch).
- `trainer_class_ddp.py`: a trainer class handed the model by `main` resumes from a snapshot into
  the bare model, then wraps it in DDP, and reads `.module`: the wrapper goes (prepare wraps the
  model once) and both reads become `unwrap_model`. Every run resumes from the same snapshot
  (epoch 1 of 4), so the load before the removed wrapper is exercised at 1 and 2 processes.

The migrated copy runs under `accel launch` at 2 processes (and at 1: `accel launch` or `python`); every rank writes `rank<i>.json` (rank, world size, per-step losses, the ids
of its samples, final weights). On one process the migrated run trains on the same samples in the
same order, with the same losses and weights; on two, each rank sees its own half of every epoch,
and the weights and the loss of each step averaged over the ranks equal the original's. Every run
has a timeout.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from functools import lru_cache
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))
from rt_helpers import run_cmd, run_original, torchrun  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = Path(__file__).resolve().parent / "distributed_shape_scripts"
TIMEOUT = 180


@lru_cache(maxsize=None)
def _migrated(name: str) -> Path:
    work = Path(tempfile.mkdtemp(prefix=f"distshape-{name}-"))
    result = subprocess.run(
        [sys.executable, "-m", "migrate", "--output-dir", str(work), str(SCRIPTS / f"{name}.py")],
        cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    migrated = work / f"{name}.py"
    assert migrated.exists(), f"{name}.py was not migrated:\n{result.stdout}\n{result.stderr}"
    return migrated


# how each original is started: under torchrun, or by itself (it spawns its own processes)
SHAPES = {
    "setup_helper_device": "torchrun", "spawn_or_direct_call": "spawns", "spawn_setup_helper": "spawns",
    "trainer_class_ddp": "torchrun",
}


def _snapshot(out: Path) -> None:
    """`resume.pt` as `trainer_class_ddp.py` saves it: a model's bare weights, resumed at epoch 1."""
    import torch

    torch.manual_seed(5)
    torch.save({"MODEL_STATE": torch.nn.Linear(4, 1).state_dict(), "EPOCHS_RUN": 1}, out / "resume.pt")


@lru_cache(maxsize=None)
def _run(name: str, how: str, nproc: int) -> tuple[dict, ...]:
    out = Path(tempfile.mkdtemp(prefix=f"distshape-{name}-{how}{nproc}-"))
    if name == "trainer_class_ddp":
        _snapshot(out)
    if how == "original" and SHAPES.get(name) == "torchrun":  # else by itself (`launcher_env_branch`: one process)
        result = torchrun(SCRIPTS / f"{name}.py", str(out), cwd=out, nproc=nproc, timeout=TIMEOUT, original=True)
    elif how == "original":
        result = run_original([sys.executable, str(SCRIPTS / f"{name}.py"), str(out), str(nproc)], cwd=out,
                              timeout=TIMEOUT)
    elif how == "python":
        result = run_cmd([sys.executable, str(_migrated(name)), str(out), str(nproc)], cwd=out, timeout=TIMEOUT)
    else:
        accel = shutil.which("accel", path=str(Path(sys.executable).parent)) or shutil.which("accel")
        assert accel, "the `accel` console script is not installed"
        cmd = [accel, "launch", "--nproc-per-node", str(nproc), str(_migrated(name)), str(out), str(nproc)]
        result = run_cmd(cmd, cwd=out, timeout=TIMEOUT)
    assert result.returncode == 0, f"{name} {how} x{nproc} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return tuple(json.loads(p.read_text()) for p in sorted(out.glob("rank*.json")))


def test_setup_helper_is_kept_and_the_device_comes_from_the_accelerator() -> None:
    text = _migrated("setup_helper_device").read_text()
    main = text[text.index("def main("):]
    assert main.index("    setup()\n") < main.index("accelerator = Accelerator()") < main.index(
        "device = accelerator.device"
    )
    assert "DistributedSampler" not in text and "DDP(" not in text
    assert "def setup():" in text and "init_process_group" in text  # the group the Accelerator joins


def test_spawned_setup_helper_becomes_the_accelerator() -> None:
    text = _migrated("spawn_setup_helper").read_text()
    assert "def ddp_setup" not in text and "init_process_group" not in text and "MASTER_PORT" not in text
    worker = text[text.index("def worker("):]
    assert worker.index("accelerator = Accelerator()") < worker.index("torch.manual_seed(0)")


def test_trainer_class_wrapper_goes_with_its_readers() -> None:
    text = _migrated("trainer_class_ddp").read_text()
    assert "DDP(self.model" not in text and "self.model.module" not in text
    assert "self.accelerator.unwrap_model(self.model).load_state_dict(" in text
    assert "self.accelerator.unwrap_model(self.model).parameters()" in text


def test_spawn_and_direct_call_become_one_call() -> None:
    text = _migrated("spawn_or_direct_call").read_text()
    assert "mp.spawn(" not in text and "init_process_group" not in text and "else:" not in text
    assert 'worker(int(os.environ.get("LOCAL_RANK", "0")), int(os.environ.get("LOCAL_WORLD_SIZE", "1")), sys.argv[1])' in text


@pytest.mark.parametrize(("name", "how"), [
    ("setup_helper_device", "migrated"), ("spawn_or_direct_call", "migrated"), ("spawn_or_direct_call", "python"),
    ("spawn_setup_helper", "python"), ("trainer_class_ddp", "migrated"),
])
def test_one_process_trains_like_the_original(name: str, how: str) -> None:
    (original,), (migrated,) = _run(name, "original", 1), _run(name, how, 1)
    assert (migrated["rank"], migrated["world_size"]) == (original["rank"], original["world_size"]) == (0, 1)
    assert migrated["seen"] == original["seen"] and len(original["seen"]) == 3 * 64
    assert migrated["losses"] == pytest.approx(original["losses"], abs=1e-6)
    assert migrated["weights"] == pytest.approx(original["weights"], abs=1e-6)
    assert migrated.get("start") == original.get("start")


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_two_processes_train_like_the_original(name: str) -> None:
    """The prepared loader splits each epoch into other halves than the DistributedSampler did
    (whole batches per rank, not every other sample), but each step still trains on the same 16
    samples in total: the same weights, and the same loss averaged over the ranks."""
    original, migrated = _run(name, "original", 2), _run(name, "migrated", 2)
    assert [(r["rank"], r["world_size"]) for r in migrated] == [(0, 2), (1, 2)]
    first, second = (r["seen"] for r in migrated)
    assert len(first) == len(second) == 3 * 32
    for epoch in range(3):
        halves = first[epoch * 32:(epoch + 1) * 32], second[epoch * 32:(epoch + 1) * 32]
        assert sorted(halves[0] + halves[1]) == list(range(64))
    assert migrated[0]["weights"] == migrated[1]["weights"]
    assert migrated[0]["weights"] == pytest.approx(original[0]["weights"], abs=1e-6)

    def step_losses(ranks: tuple[dict, ...]) -> list[float]:
        return [(a + b) / 2 for a, b in zip(ranks[0]["losses"], ranks[1]["losses"], strict=True)]

    assert len(step_losses(original)) == 3 * 4
    assert step_losses(migrated) == pytest.approx(step_losses(original), abs=1e-6)


def test_launcher_branch_is_device_neutral() -> None:
    text = _migrated("launcher_env_branch").read_text()
    text = text[text.index("out_dir = "):]  # the code, not the docstring
    assert "torch.cuda.is_available()" not in text and "cuda:" not in text and "set_device" not in text
    branch = text[text.index("if ddp:\n"):text.index("else:\n")]
    assert "    device = accelerator.device.type\n" in branch
    assert text.count("device = accelerator.device.type\n") == 2
    assert text.index("accelerator = Accelerator()") < text.index("if ddp:\n")


@pytest.mark.parametrize("how", ["python", "migrated"])
def test_launcher_branch_one_process_trains_like_the_original(how: str) -> None:
    """`python` takes the script's single-process branch, `accel launch --nproc-per-node 1` (RANK
    set) its DDP branch: both train as the original's single-process branch."""
    (original,), (migrated,) = _run("launcher_env_branch", "original", 1), _run("launcher_env_branch", how, 1)
    assert (migrated["rank"], migrated["world_size"]) == (original["rank"], original["world_size"]) == (0, 1)
    assert migrated["seen"] == original["seen"] and len(original["seen"]) == 8 * 16
    assert migrated["losses"] == pytest.approx(original["losses"], abs=1e-6)
    assert migrated["weights"] == pytest.approx(original["weights"], abs=1e-6)


def test_launcher_branch_two_processes_train_like_one() -> None:
    """Each rank reads its own micro-batches (half of each step's 16 samples); the gradient and the
    loss averaged over the ranks are the single-process ones."""
    (original,) = _run("launcher_env_branch", "original", 1)
    migrated = _run("launcher_env_branch", "migrated", 2)
    assert [(r["rank"], r["world_size"]) for r in migrated] == [(0, 2), (1, 2)]
    first, second = (r["seen"] for r in migrated)
    assert len(first) == len(second) == 8 * 8
    for step in range(8):
        both = first[step * 8:(step + 1) * 8] + second[step * 8:(step + 1) * 8]
        assert sorted(both) == sorted(original["seen"][step * 16:(step + 1) * 16])
    for rank in migrated:
        assert rank["losses"] == pytest.approx(original["losses"], abs=1e-6)
        assert rank["weights"] == pytest.approx(original["weights"], abs=1e-6)
