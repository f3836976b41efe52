"""The ImageNet example's launcher (`mp.spawn` under `--multiprocessing-distributed`, a direct call
otherwise), migrated with the CLI and run at 1 and 2 gloo processes on CPU.

`spawn_scripts/spawn_flag_fallback.py` scales `args.world_size` before the spawn, joins its group
under `if args.distributed:`, wraps the model along a device chain (DDP, DataParallel), shards its
data with a DistributedSampler only when distributed and saves a checkpoint only where
`not args.multiprocessing_distributed or args.rank % ngpus_per_node == 0`. Migrated: one process
started plainly trains exactly as the original's direct path (same weights, same samples, same
accuracy); under `accel launch --nproc-per-node 2` each rank trains on its own half of every epoch
(together every sample once), both end with the same weights, the validation counts every sample
once, and only rank 0 saves (one checkpoint file per epoch, not one per rank). On two nodes of
one process each (`accel launch --nnodes 2 --nproc-per-node 1`, two launches on this machine, each
node with its own directory): the worker's `ngpus_per_node` is the node's process count (1, as
the original's spawn passed; the job's 2 would halve `-b` per process), so the first process of
each node saves, as the original's multi-node runs do, and the two train as one job.

`spawn_scripts/group_flag_options.py` has no spawn: it joins its group only under `if cfg.multi:`
(`--world-size` above 1), which also chooses DDP and a DistributedSampler (`if cfg.multi:` /
`else: sampler = None`). Migrated, the flag follows the launcher: at 2 processes each rank trains on
its half of every epoch (before the flag was set, the loader kept its sampler unprepared with the
flag false, so each rank trained on all of it), with equal weights; at 1 it is the original. Every run has a timeout.
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
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))
from rt_helpers import child_env, free_port, run_cmd, run_original  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).resolve().parent / "spawn_scripts" / "spawn_flag_fallback.py"
TIMEOUT = 180
SAMPLES, EPOCHS = 48, 2


FLAG_SCRIPT = SCRIPT.parent / "group_flag_options.py"


@lru_cache(maxsize=None)
def _workdir(script: Path = SCRIPT) -> Path:
    work = Path(tempfile.mkdtemp(prefix="spawn-flag-fallback-"))
    result = subprocess.run(
        [sys.executable, "-m", "migrate", "--output-dir", str(work / "migrated"), str(script)],
        cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return work


def _migrated(script: Path = SCRIPT) -> Path:
    return _workdir(script) / "migrated" / script.name


@lru_cache(maxsize=None)
def _run(how: str, script: Path = SCRIPT) -> tuple[Path, tuple[dict, ...]]:
    out = _workdir(script) / how
    out.mkdir()
    if how == "original":
        cmd = [sys.executable, str(script), str(out)]
    elif how == "one":
        cmd = [sys.executable, str(_migrated(script)), str(out)]
    else:
        accel = shutil.which("accel", path=str(Path(sys.executable).parent)) or shutil.which("accel")
        assert accel, "the `accel` console script is not installed"
        cmd = [accel, "launch", "--nproc-per-node", "2", str(_migrated(script)), str(out)]
    result = (run_original if how == "original" else run_cmd)(cmd, cwd=out, timeout=TIMEOUT)
    assert result.returncode == 0, f"{cmd} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return out, tuple(json.loads(p.read_text()) for p in sorted(out.glob("rank*.json")))


def test_the_launcher_is_converted_whole() -> None:
    text = _migrated().read_text()
    for gone in ("mp.spawn(", "init_process_group", "DistributedDataParallel", "DataParallel(", "set_device",
                 "args.world_size = ngpus_per_node"):
        assert gone not in text, gone
    # without a launcher the direct call's `args.gpu` (None on a CPU run), launched each process's local rank
    assert ('main_worker(int(os.environ["LOCAL_RANK"]) if "LOCAL_RANK" in os.environ else args.gpu, '
            'int(os.environ.get("LOCAL_WORLD_SIZE", "1")), args)') in text
    assert "args.distributed = accelerator.num_processes > 1" in text
    assert "args.multiprocessing_distributed = accelerator.num_processes > 1" in text
    assert "args.rank = accelerator.process_index" in text


def test_one_process_trains_as_the_original_direct_path() -> None:
    _, (original,) = _run("original")
    _, (one,) = _run("one")
    assert one == original
    assert one["saves"] == [1, 2]


def test_two_processes_split_every_epoch_and_agree() -> None:
    out, launched = _run("two")
    assert len(launched) == 2
    first, second = launched
    for epoch in range(EPOCHS):
        a, b = first["seen"][epoch], second["seen"][epoch]
        assert len(a) == len(b) == SAMPLES // 2
        assert sorted(a + b) == list(range(SAMPLES))
    assert first["weights"] == second["weights"]
    # the validation loader is prepared and its predictions gathered: every sample counted once
    assert [total for _, total in first["accuracies"]] == [21] * EPOCHS
    assert first["accuracies"] == second["accuracies"]
    # the save guard `not args.multiprocessing_distributed or args.rank % ngpus_per_node == 0`: rank 0 only
    assert (first["saves"], second["saves"]) == ([1, 2], [])
    checkpoint = torch.load(out / "checkpoint.pth.tar", weights_only=True)
    assert checkpoint["epoch"] == EPOCHS
    saved = [w for t in checkpoint["state_dict"].values() for w in t.flatten().tolist()]
    assert saved == pytest.approx([w for p in first["weights"] for w in p], abs=0)


def test_two_nodes_pass_the_nodes_process_count() -> None:
    accel = shutil.which("accel", path=str(Path(sys.executable).parent)) or shutil.which("accel")
    assert accel, "the `accel` console script is not installed"
    port = str(free_port())
    procs, outs = [], []
    for node in range(2):
        out = _workdir() / f"node{node}"
        out.mkdir()
        outs.append(out)
        cmd = [accel, "launch", "--nnodes", "2", "--node-rank", str(node), "--nproc-per-node", "1",
               "--master-addr", "127.0.0.1", "--master-port", port, str(_migrated()), str(out)]
        procs.append(subprocess.Popen(cmd, cwd=out, env=child_env(), stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    try:
        results = [proc.communicate(timeout=TIMEOUT) for proc in procs]
    except subprocess.TimeoutExpired:
        for proc in procs:
            proc.kill()
            proc.wait()
        pytest.fail(f"two one-process nodes hung for {TIMEOUT}s")
    for proc, (stdout, stderr) in zip(procs, results, strict=True):
        assert proc.returncode == 0, f"{stdout[-3000:]}\n{stderr[-3000:]}"
    first, second = (json.loads((out / f"rank{node}.json").read_text()) for node, out in enumerate(outs))
    for epoch in range(EPOCHS):
        a, b = first["seen"][epoch], second["seen"][epoch]
        assert len(a) == len(b) == SAMPLES // 2 and sorted(a + b) == list(range(SAMPLES))
    assert first["weights"] == second["weights"]
    # `args.rank % ngpus_per_node == 0` with the node's count (1): each node's first process saves
    assert (first["saves"], second["saves"]) == ([1, 2], [1, 2])
    for out in outs:
        assert torch.load(out / "checkpoint.pth.tar", weights_only=True)["epoch"] == EPOCHS


def test_options_flag_follows_the_launcher() -> None:
    text = _migrated(FLAG_SCRIPT).read_text()
    assert "init_process_group" not in text and "DistributedDataParallel" not in text
    assert "cfg.multi = accelerator.num_processes > 1" in text
    _, (original,) = _run("original", FLAG_SCRIPT)
    _, (one,) = _run("one", FLAG_SCRIPT)
    assert one == original
    _, launched = _run("two", FLAG_SCRIPT)
    assert len(launched) == 2
    first, second = launched
    for epoch in range(2):
        a, b = first["seen"][epoch], second["seen"][epoch]
        assert len(a) == len(b) == 12
        assert sorted(a + b) == list(range(24))
    assert first["weights"] == second["weights"]
