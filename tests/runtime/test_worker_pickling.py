"""An Accelerator (and prepared objects) held by a Dataset, a collate_fn or a worker_init_fn
crosses into DataLoader workers started with spawn and forkserver (runtime/pickled.py).

In each worker the pickled Accelerator answers the training process's identity and refuses
collectives with ``WorkerProcessError``; the prepared model, optimizer and scheduler arrive as the
user's own objects. Runs the worker script on 1 process and on 2 gloo processes.
"""

from __future__ import annotations

import copy
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from runtime import Accelerator
from runtime.pickled import WorkerAccelerator, WorkerProcessError

from rt_helpers import WORKERS, child_env, read_ranks, torchrun

SCRIPT = WORKERS / "worker_pickling.py"
CONTEXTS = ("spawn", "forkserver")


def check_rank(result: dict, rank: int, world: int) -> list[int]:
    assert result["process_index"] == rank and result["num_processes"] == world
    seen = []
    for context in CONTEXTS:
        rows = result["contexts"][context]["rows"]
        assert len(rows) == 16 // world, context
        for row in rows:
            assert row["process_index"] == rank == row["collate_rank"] == row["init_fn_rank"], row
            assert row["num_processes"] == world and row["local_process_index"] == rank
            assert row["is_main_process"] is (rank == 0) and row["is_local_main_process"] is (rank == 0)
            assert row["device"] == "cpu" and row["mixed_precision"] == "no"
            assert row["refused"] == "WorkerProcessError"  # a collective in a worker is refused
            assert (row["model"], row["model_out"]) == ("Net", 1)  # the user's module, not DDP
            assert (row["optimizer"], row["scheduler"]) == ("SGD", "StepLR")
            assert row["loader_len"] == 4 // world
        seen.append(sorted(row["index"] for row in rows))
    assert seen[0] == seen[1]  # the same shard under both start methods
    return seen[0]


def test_one_process_spawn_and_forkserver_workers(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path)], cwd=tmp_path,
                          env=child_env(), capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    [result] = read_ranks(tmp_path, 1)
    assert check_rank(result, 0, 1) == list(range(16))


def test_two_processes_spawn_and_forkserver_workers(tmp_path: Path) -> None:
    proc = torchrun(SCRIPT, str(tmp_path), cwd=tmp_path, nproc=2, timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    results = read_ranks(tmp_path, 2)
    shards = [check_rank(result, rank, 2) for rank, result in enumerate(results)]
    assert sorted(shards[0] + shards[1]) == list(range(16))  # each sample once across ranks
    for context in CONTEXTS:  # the ranks trained together
        assert results[0]["contexts"][context]["weight"] == results[1]["contexts"][context]["weight"]


def test_pickled_accelerator_answers_identity_and_refuses_the_rest() -> None:
    accelerator = Accelerator(cpu=True, mixed_precision="bf16")
    copied = pickle.loads(pickle.dumps(accelerator))
    assert isinstance(copied, WorkerAccelerator)
    assert (copied.process_index, copied.num_processes, copied.is_main_process) == (0, 1, True)
    assert copied.device == torch.device("cpu") and copied.mixed_precision == "bf16"
    assert copied.distributed_type == accelerator.distributed_type
    assert isinstance(pickle.loads(pickle.dumps(copied)), WorkerAccelerator)
    for name in ("gather", "wait_for_everyone", "prepare", "backward", "save_state", "scaler"):
        with pytest.raises(WorkerProcessError, match=f"accelerator.{name} was used in a process"):
            getattr(copied, name)
    with pytest.raises(AttributeError):
        copied.no_such_attribute
    # copies inside the training process stay the Accelerator itself (one process group)
    assert copy.copy(accelerator) is accelerator and copy.deepcopy(accelerator) is accelerator


def test_an_iterated_prepared_loader_pickles_and_its_views_still_share_progress() -> None:
    accelerator = Accelerator(cpu=True)
    loader = accelerator.prepare(torch.utils.data.DataLoader(list(range(6)), batch_size=2))
    assert [b.tolist() for b in loader] == [[0, 1], [2, 3], [4, 5]]
    copied = pickle.loads(pickle.dumps(loader))
    assert [b.tolist() for b in copied] == [[0, 1], [2, 3], [4, 5]]
    view = accelerator.skip_first_batches(loader, 1)
    assert view._progress is loader._progress and view.active_loaders is loader.active_loaders
