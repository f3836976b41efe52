"""Checkpoints: exact resumption (1 and 2 real gloo processes), atomic writes, rotation,
registered objects, weights_only loading, per-rank RNG states, skip_first_batches, save_model."""

from __future__ import annotations

import random
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from rt_helpers import WORKERS, run_cmd, torchrun
from torch import nn
from torch.utils.data import DataLoader, IterableDataset, TensorDataset

from runtime import Accelerator, checkpoint
from runtime.checkpoint import (
    CheckpointError,
    CheckpointRegistrationError,
    ProjectConfiguration,
)

WORKER = WORKERS / "ckpt_train.py"
CASES = ["epoch_end", "mid_epoch"]


def _load_runs(out: Path, nproc: int) -> list[tuple[dict, dict]]:
    return [
        (torch.load(out / f"first_rank{r}.pt"), torch.load(out / f"resume_rank{r}.pt"))
        for r in range(nproc)
    ]


@pytest.fixture(scope="module")
def one_process(tmp_path_factory: pytest.TempPathFactory) -> list[tuple[dict, dict]]:
    out = tmp_path_factory.mktemp("ckpt1")
    for mode in ("first", "resume"):  # two separate processes: resume starts from nothing
        proc = run_cmd([sys.executable, str(WORKER), str(out), mode], cwd=out)
        assert proc.returncode == 0, proc.stdout + proc.stderr
    return _load_runs(out, 1)


@pytest.fixture(scope="module")
def two_processes(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[tuple[dict, dict]], Path]:
    out = tmp_path_factory.mktemp("ckpt2")
    for mode in ("first", "resume"):  # two separate torchrun jobs
        proc = torchrun(WORKER, str(out), mode, cwd=out)
        assert proc.returncode == 0, proc.stdout + proc.stderr
    return _load_runs(out, 2), out


def _assert_same_trajectory(first: dict, resumed: dict) -> None:
    # The resumed 5 steps saw exactly the samples steps 6..10 of the straight run saw ...
    assert resumed["resumed_seen"] == first["straight_seen"][5:]
    assert resumed["step_after_load"] == 5  # the registered counter came back
    # ... and ended with bit-identical weights.
    assert first["straight"].keys() == resumed["resumed"].keys()
    for name, tensor in first["straight"].items():
        assert torch.equal(tensor, resumed["resumed"][name]), name


@pytest.mark.parametrize("case", CASES)
def test_resume_is_bit_identical_one_process(one_process, case: str) -> None:
    (first, resumed), = one_process
    _assert_same_trajectory(first[case], resumed[case])


@pytest.mark.parametrize("case", CASES)
def test_resume_is_bit_identical_two_processes(two_processes, case: str) -> None:
    runs, _ = two_processes
    for first, resumed in runs:
        _assert_same_trajectory(first[case], resumed[case])
    # DDP kept the replicas equal, and the ranks trained on different samples.
    assert all(torch.equal(runs[0][1][case]["resumed"][k], runs[1][1][case]["resumed"][k])
               for k in runs[0][1][case]["resumed"])
    assert runs[0][1][case]["resumed_seen"] != runs[1][1][case]["resumed_seen"]


def test_saved_positions_epoch_end_and_mid_epoch(one_process, two_processes) -> None:
    runs, _ = two_processes
    for first, _ in [*one_process, *runs]:
        # 5 batches per epoch: saved after the last one -> the next epoch starts fresh.
        assert (first["epoch_end"]["epoch"], first["epoch_end"]["in_progress"]) == (1, False)
        # 3 batches per epoch: saved after batch 2 of epoch 1 -> resumes at its batch 3.
        mid = first["mid_epoch"]
        assert (mid["epoch"], mid["position"], mid["in_progress"]) == (1, 2, True)


def test_rng_states_restored_per_rank(two_processes) -> None:
    runs, out = two_processes
    for case in CASES:
        per_rank = [first[case]["draws_after_save"] for first, _ in runs]
        assert per_rank[0] != per_rank[1]  # the ranks' python, numpy and torch streams differ
        for first, resumed in runs:
            assert resumed[case]["draws_after_load"] == first[case]["draws_after_save"]
    files = sorted(p.name for p in (out / "ckpt_mid_epoch").iterdir())
    assert files == [
        "checkpoint.json", "custom_checkpoint_0.pkl", "dataloaders_0.bin", "dataloaders_1.bin",
        "optimizer.bin", "pytorch_model.bin", "random_states_0.pkl", "random_states_1.pkl",
        "scheduler.bin",
    ]
    assert not list(out.glob(".ckpt_*"))  # no temporary directories left behind


def test_failing_rank_aborts_the_save_on_every_rank(two_processes) -> None:
    runs, out = two_processes
    # Rank 1 could not write; rank 0 learnt it from the all-reduce instead of renaming.
    assert runs[1][0]["failed_save"] == "OSError: disk full (simulated on rank 1)"
    assert runs[0][0]["failed_save"].startswith("CheckpointError: another rank failed")
    # The overwritten checkpoint was the one the resume test loaded: it survived intact.
    assert not list(out.glob(".ckpt_*"))


# -- in-process, one process ----------------------------------------------------------------------


class Box:
    """A registered object with tensor and plain state."""

    def __init__(self) -> None:
        self.tensor = torch.zeros(3)
        self.note = ""

    def state_dict(self) -> dict:
        return {"tensor": self.tensor.clone(), "note": self.note}

    def load_state_dict(self, state: dict) -> None:
        self.tensor, self.note = state["tensor"], state["note"]


def _setup(**kwargs):
    accelerator = Accelerator(**kwargs)
    torch.manual_seed(0)
    model = nn.Linear(3, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model, optimizer = accelerator.prepare(model, optimizer)
    box = Box()
    accelerator.register_for_checkpointing(box)
    return accelerator, model, optimizer, box


def _step(model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    optimizer.zero_grad()
    model(torch.ones(4, 3)).sum().backward()
    optimizer.step()


def test_registered_objects_and_optimizer_state_restored(tmp_path: Path) -> None:
    accelerator, model, optimizer, box = _setup()
    _step(model, optimizer)
    box.tensor, box.note = torch.arange(3.0), "saved"
    accelerator.save_state(tmp_path / "ckpt")
    saved_weights = {k: v.clone() for k, v in model.state_dict().items()}
    momentum = [optimizer.state[p]["momentum_buffer"].clone() for p in model.parameters()]

    accelerator2, model2, optimizer2, box2 = _setup()
    accelerator2.load_state(tmp_path / "ckpt")
    assert box2.note == "saved" and torch.equal(box2.tensor, torch.arange(3.0))
    assert all(torch.equal(v, model2.state_dict()[k]) for k, v in saved_weights.items())
    for p, m in zip(model2.parameters(), momentum):
        assert torch.equal(optimizer2.state[p]["momentum_buffer"], m)


def test_register_without_state_dict_is_a_clear_error() -> None:
    accelerator = Accelerator()
    with pytest.raises(CheckpointRegistrationError) as info:
        accelerator.register_for_checkpointing(object())
    assert isinstance(info.value, ValueError)  # what Accelerate raises
    message = str(info.value)
    assert "state_dict" in message and "load_state_dict" in message and "fix:" in message


def test_crash_during_save_keeps_previous_checkpoint(tmp_path: Path, monkeypatch) -> None:
    accelerator, model, optimizer, box = _setup()
    target = tmp_path / "ckpt"
    box.note = "first"
    accelerator.save_state(target)
    before = {p.name: p.read_bytes() for p in target.iterdir()}

    real_write, calls = checkpoint.write_file, []

    def failing_write(obj, path):
        calls.append(path.name)
        if len(calls) == 3:  # after two files of the new checkpoint were written
            raise OSError("disk full (simulated)")
        real_write(obj, path)

    monkeypatch.setattr(checkpoint, "write_file", failing_write)
    _step(model, optimizer)
    box.note = "second"
    for directory in (target, tmp_path / "fresh"):  # overwrite an old one / write a new one
        calls.clear()
        with pytest.raises(OSError, match="disk full"):
            accelerator.save_state(directory)
    assert {p.name: p.read_bytes() for p in target.iterdir()} == before  # untouched
    assert not (tmp_path / "fresh").exists()  # no half-written target
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]  # temp dir cleaned up

    monkeypatch.setattr(checkpoint, "write_file", real_write)
    accelerator2, _, _, box2 = _setup()
    accelerator2.load_state(target)
    assert box2.note == "first"


def test_killed_process_during_save_keeps_previous_checkpoint(tmp_path: Path) -> None:
    """A hard crash (os._exit, no cleanup) mid-save: old checkpoint intact, next save recovers."""
    script = textwrap.dedent(
        f"""
        import os, torch
        from runtime import checkpoint
        from runtime import Accelerator
        acc = Accelerator()
        model = acc.prepare(torch.nn.Linear(2, 2))
        target = {str(tmp_path / "ckpt")!r}
        acc.save_state(target)
        real, calls = checkpoint.write_file, []
        def dying(obj, path):
            calls.append(1)
            if len(calls) == 2:
                os._exit(3)
            real(obj, path)
        checkpoint.write_file = dying
        with torch.no_grad():
            model.weight.add_(1.0)
        acc.save_state(target)
        """
    )
    proc = run_cmd([sys.executable, "-c", script], cwd=tmp_path)
    assert proc.returncode == 3, proc.stderr
    assert (tmp_path / ".ckpt.tmp").is_dir()  # the crash left its temporary directory ...
    weights = torch.load(tmp_path / "ckpt" / "pytorch_model.bin", weights_only=True)
    accelerator = Accelerator()
    model = accelerator.prepare(nn.Linear(2, 2))
    accelerator.load_state(tmp_path / "ckpt")  # ... and the previous checkpoint still loads
    assert torch.equal(model.weight, weights["weight"])
    accelerator.save_state(tmp_path / "ckpt")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]  # the next save cleaned up


def test_automatic_naming_and_total_limit_rotation(tmp_path: Path) -> None:
    config = ProjectConfiguration(automatic_checkpoint_naming=True, total_limit=2)
    accelerator, _, _, box = _setup(project_dir=tmp_path, project_config=config)
    assert accelerator.project_dir == str(tmp_path)
    for i in range(3):
        box.note = f"save {i}"
        saved = accelerator.save_state()
        assert Path(saved) == tmp_path / "checkpoints" / f"checkpoint_{i}"
    names = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert names == ["checkpoint_1", "checkpoint_2"]  # the oldest was rotated out
    assert accelerator.save_iteration == 3

    config2 = ProjectConfiguration(project_dir=str(tmp_path), automatic_checkpoint_naming=True, total_limit=2)
    accelerator2, _, _, box2 = _setup(project_config=config2)
    accelerator2.load_state()  # the newest automatic checkpoint
    assert box2.note == "save 2"
    assert accelerator2.save_iteration == 3  # numbering continues after it
    accelerator2.save_state()
    names = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert names == ["checkpoint_2", "checkpoint_3"]


def test_missing_directory_arguments_are_clear_errors(tmp_path: Path) -> None:
    accelerator, *_ = _setup()
    with pytest.raises(CheckpointError, match="automatic checkpoint naming is off"):
        accelerator.save_state()
    with pytest.raises(CheckpointError, match="does not exist"):
        accelerator.load_state(tmp_path / "nope")
    config = ProjectConfiguration(project_dir=str(tmp_path), automatic_checkpoint_naming=True)
    accelerator2, *_ = _setup(project_config=config)
    with pytest.raises(CheckpointError, match="found no checkpoint"):
        accelerator2.load_state()


def test_mismatched_objects_are_a_clear_error(tmp_path: Path) -> None:
    accelerator, *_ = _setup()
    accelerator.save_state(tmp_path / "ckpt")
    other = Accelerator()
    other.prepare(nn.Linear(3, 2), nn.Linear(3, 2))
    with pytest.raises(CheckpointError, match="holds 1 models but this run has 2"):
        other.load_state(tmp_path / "ckpt")


class Payload:
    """Unpickling this runs code: weights_only loading must refuse it."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def test_loading_uses_weights_only(tmp_path: Path, monkeypatch) -> None:
    accelerator, *_ = _setup()
    target = tmp_path / "ckpt"
    accelerator.save_state(target)

    seen: list[object] = []
    real_load = torch.load

    def spy(*args, **kwargs):
        seen.append(kwargs.get("weights_only"))
        return real_load(*args, **kwargs)

    monkeypatch.setattr(torch, "load", spy)
    accelerator.load_state(target)
    assert seen and all(flag is True for flag in seen)  # every file: model, optimizer, RNG, ...
    monkeypatch.setattr(torch, "load", real_load)

    marker = tmp_path / "code-ran"
    torch.save({"weight": Payload(marker)}, target / "pytorch_model.bin")
    with pytest.raises(CheckpointError, match="weights_only") as info:
        accelerator.load_state(target)
    assert "fix:" in str(info.value)
    assert not marker.exists()  # the pickled call was never executed


def test_rng_state_round_trip_in_weights_only_format(tmp_path: Path) -> None:
    random.seed(1), np.random.seed(2), torch.manual_seed(3)
    checkpoint.write_file(checkpoint.capture_rng_state(), tmp_path / "rng.pkl")
    expected = [random.random(), float(np.random.randn()), float(torch.rand(()))]
    random.seed(9), np.random.seed(9), torch.manual_seed(9)
    checkpoint.restore_rng_state(torch.load(tmp_path / "rng.pkl", weights_only=True))
    assert [random.random(), float(np.random.randn()), float(torch.rand(()))] == expected


def _loader_batches(loader) -> list[list[int]]:
    return [batch[0].tolist() for batch in loader]


def test_skip_first_batches_like_accelerate_and_no_double_skip(tmp_path: Path) -> None:
    dataset = TensorDataset(torch.arange(20))
    torch.manual_seed(5)
    full = _loader_batches(DataLoader(dataset, batch_size=4, shuffle=True))
    rng_after_full = torch.get_rng_state()

    torch.manual_seed(5)
    accelerator = Accelerator()
    loader = accelerator.prepare(DataLoader(dataset, batch_size=4, shuffle=True))
    skipped = accelerator.skip_first_batches(loader, 2)
    assert len(skipped) == 3 and len(loader) == 5
    assert _loader_batches(skipped) == full[2:]
    assert torch.equal(torch.get_rng_state(), rng_after_full)  # same shuffle draw as the original

    # Mid-epoch save, then an Accelerate-style resume that also calls skip_first_batches:
    torch.manual_seed(6)
    iterator = iter(loader)
    first_two = [next(iterator)[0].tolist() for _ in range(2)]
    accelerator.save_state(tmp_path / "ckpt")
    rest = [b[0].tolist() for b in iterator]

    acc2 = Accelerator()
    loader2 = acc2.prepare(DataLoader(dataset, batch_size=4, shuffle=True))
    acc2.load_state(tmp_path / "ckpt")
    assert _loader_batches(acc2.skip_first_batches(loader2, 2)) == rest  # skipped once, not twice
    assert len(first_two + rest) == 5
    acc3 = Accelerator()
    loader3 = acc3.prepare(DataLoader(dataset, batch_size=4, shuffle=True))
    acc3.load_state(tmp_path / "ckpt")
    assert _loader_batches(loader3) == rest  # load_state alone already resumes at batch 3

    with pytest.raises(Exception, match="was not prepared"):
        accelerator.skip_first_batches(DataLoader(dataset), 1)


def test_save_model_writes_unwrapped_state_dict(tmp_path: Path) -> None:
    accelerator, model, *_ = _setup()
    accelerator.save_model(model, tmp_path / "export")
    assert sorted(p.name for p in (tmp_path / "export").iterdir()) == ["pytorch_model.bin"]
    saved = torch.load(tmp_path / "export" / "pytorch_model.bin", weights_only=True)
    unwrapped = accelerator.unwrap_model(model).state_dict()
    assert saved.keys() == unwrapped.keys()
    assert all(torch.equal(saved[k], unwrapped[k]) for k in saved)


class ShuffledStream(IterableDataset):
    """An IterableDataset that shuffles with the global RNG when its iteration starts."""

    def __iter__(self):
        yield from torch.randperm(24).tolist()


@pytest.mark.parametrize(
    "make",
    [
        lambda: DataLoader(ShuffledStream(), batch_size=4),
        lambda: DataLoader(TensorDataset(torch.arange(24)), batch_size=4, shuffle=True, num_workers=2),
        lambda: DataLoader(
            TensorDataset(torch.arange(24)), batch_size=4, shuffle=True, num_workers=2,
            persistent_workers=True,
        ),
    ],
    ids=["iterable", "workers", "persistent-workers"],
)
def test_mid_epoch_resume_iterable_and_worker_loaders(tmp_path: Path, make) -> None:
    def batches(loader) -> list[list[int]]:
        return [(b[0] if isinstance(b, list) else b).tolist() for b in loader]

    torch.manual_seed(1)
    accelerator = Accelerator()
    loader = accelerator.prepare(make())
    iterator = iter(loader)
    _ = [next(iterator) for _ in range(2)]
    accelerator.save_state(tmp_path / "ckpt")
    rest, next_epoch = batches(iterator), batches(loader)

    torch.manual_seed(2)  # another RNG: load_state must bring back the shuffle and the position
    accelerator2 = Accelerator()
    loader2 = accelerator2.prepare(make())
    accelerator2.load_state(tmp_path / "ckpt")
    assert batches(loader2) == rest and len(rest) == 4
    assert batches(loader2) == next_epoch


def test_grad_scaler_state_saved_and_restored(tmp_path: Path) -> None:
    accelerator, model, optimizer, _ = _setup(mixed_precision="fp16")
    assert accelerator.scaler is not None
    optimizer.zero_grad()
    with accelerator.autocast():
        loss = model(torch.ones(4, 3)).float().sum()
    accelerator.backward(loss)
    optimizer.step()
    accelerator.scaler.update(new_scale=1234.0)
    accelerator.save_state(tmp_path / "ckpt")
    assert (tmp_path / "ckpt" / "scaler.pt").is_file()

    accelerator2, *_ = _setup(mixed_precision="fp16")
    assert accelerator2.scaler.get_scale() != 1234.0
    accelerator2.load_state(tmp_path / "ckpt")
    assert accelerator2.scaler.get_scale() == 1234.0


def test_accumulation_micro_step_restored(tmp_path: Path) -> None:
    accelerator, model, _, _ = _setup(gradient_accumulation_steps=4)
    for _ in range(2):
        with accelerator.accumulate(model):
            pass
    assert not accelerator.sync_gradients
    accelerator.save_state(tmp_path / "ckpt")
    accelerator2, model2, _, _ = _setup(gradient_accumulation_steps=4)
    accelerator2.load_state(tmp_path / "ckpt")
    syncs = []
    for _ in range(2):
        with accelerator2.accumulate(model2):
            syncs.append(accelerator2.sync_gradients)
    assert syncs == [False, True]  # micro-steps 3 and 4 of the saved cycle
