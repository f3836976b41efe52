"""Checkpoints fail loudly and lose nothing (docs/safety.md, "Failure behaviour").

- a process killed with SIGKILL inside ``save_state``: the previous checkpoint is intact and is the
  one ``load_state()`` picks; the next save succeeds;
- a truncated or corrupted file: a ``CheckpointError`` naming the file;
- a checkpoint of a model with other shapes: an error naming the parameter and both shapes, and
  the model is left as it was;
- a checkpoint written by 2 processes loaded by 1: what can be restored is restored, with a warning;
- a file that would run code when unpickled: refused, and the code does not run.
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import pytest
import torch
from torch import nn

from rt_helpers import run_cmd, torchrun
from runtime import Accelerator, ProjectConfiguration
from runtime.checkpoint import CheckpointError


class Note:
    def __init__(self) -> None:
        self.text = ""

    def state_dict(self) -> dict:
        return {"text": self.text}

    def load_state_dict(self, state: dict) -> None:
        self.text = state["text"]


def _setup(size: int = 3, **kwargs):
    accelerator = Accelerator(**kwargs)
    torch.manual_seed(0)
    model = nn.Linear(size, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model, optimizer = accelerator.prepare(model, optimizer)
    note = Note()
    accelerator.register_for_checkpointing(note)
    return accelerator, model, optimizer, note


KILLED_SAVE = """
import os, signal, sys, torch
from runtime import Accelerator, ProjectConfiguration, checkpoint
project = sys.argv[1]
acc = Accelerator(project_dir=project,
                  project_config=ProjectConfiguration(automatic_checkpoint_naming=True))
model = acc.prepare(torch.nn.Linear(3, 2))
for value in (1.0, 2.0):
    with torch.no_grad():
        model.weight.fill_(value)
    acc.save_state()  # checkpoint_0, checkpoint_1
real, calls = checkpoint.write_file, []
def dying(obj, path):
    calls.append(path.name)
    if len(calls) == 2:  # the new checkpoint is half written
        os.kill(os.getpid(), signal.SIGKILL)
    real(obj, path)
checkpoint.write_file = dying
with torch.no_grad():
    model.weight.fill_(3.0)
acc.save_state()  # would be checkpoint_2
"""


def test_sigkill_during_save_keeps_the_previous_checkpoint_for_load_state(tmp_path: Path) -> None:
    script = tmp_path / "save.py"
    script.write_text(KILLED_SAVE)
    proc = run_cmd([sys.executable, str(script), str(tmp_path)], cwd=tmp_path, timeout=60)
    assert proc.returncode == -9, proc.stderr
    root = tmp_path / "checkpoints"
    assert sorted(p.name for p in root.iterdir()) == [".checkpoint_2.tmp", "checkpoint_0", "checkpoint_1"]

    config = ProjectConfiguration(automatic_checkpoint_naming=True)
    accelerator = Accelerator(project_dir=tmp_path, project_config=config)
    model = accelerator.prepare(nn.Linear(3, 2))
    accelerator.load_state()  # picks the newest complete checkpoint, never the half-written one
    assert torch.equal(model.weight, torch.full((2, 3), 2.0))
    assert accelerator.save_iteration == 2
    accelerator.save_state()
    assert sorted(p.name for p in root.iterdir()) == ["checkpoint_0", "checkpoint_1", "checkpoint_2"]


@pytest.mark.parametrize("name", ["pytorch_model.bin", "optimizer.bin", "custom_checkpoint_0.pkl",
                                  "random_states_0.pkl", "checkpoint.json"])
@pytest.mark.parametrize("damage", ["truncate", "garbage"])
def test_truncated_or_corrupted_file_is_named(tmp_path: Path, name: str, damage: str) -> None:
    accelerator, *_ = _setup()
    target = tmp_path / "ckpt"
    accelerator.save_state(target)
    path = target / name
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2] if damage == "truncate" else b"\x00garbage" * 40)
    with pytest.raises(CheckpointError) as info:
        _setup()[0].load_state(target)
    message = str(info.value)
    assert str(path) in message and "truncated or corrupted" in message and "fix:" in message


def test_other_model_shape_names_the_parameter_and_both_shapes(tmp_path: Path) -> None:
    accelerator, *_ = _setup(size=3)
    accelerator.save_state(tmp_path / "ckpt")
    other, model, _, _ = _setup(size=5)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(CheckpointError) as info:
        other.load_state(tmp_path / "ckpt")
    message = str(info.value)
    assert "weight with shape (2, 3)" in message and "has shape (2, 5)" in message, message
    assert str(tmp_path / "ckpt" / "pytorch_model.bin") in message
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # untouched


TWO_PROCESS_SAVE = """
import sys, torch
from runtime import Accelerator
acc = Accelerator()
torch.manual_seed(0)
model = acc.prepare(torch.nn.Linear(3, 2))
with torch.no_grad():
    model.weight.fill_(7.0)
acc.save_state(sys.argv[1])
acc.end_training()
"""


def test_checkpoint_of_two_processes_loads_on_one_with_a_warning(tmp_path: Path) -> None:
    script = tmp_path / "save2.py"
    script.write_text(TWO_PROCESS_SAVE)
    proc = torchrun(script, str(tmp_path / "ckpt"), cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "ckpt" / "random_states_1.pkl").exists()
    accelerator = Accelerator()
    model = accelerator.prepare(nn.Linear(3, 2))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        accelerator.load_state(tmp_path / "ckpt")
    messages = [str(w.message) for w in caught]
    assert any("written by 2 processes and this job has 1" in m for m in messages), messages
    assert torch.equal(model.weight, torch.full((2, 3), 7.0))


class Payload:
    """Unpickling this creates a file: proof that code ran."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


@pytest.mark.parametrize("name", ["pytorch_model.bin", "optimizer.bin", "custom_checkpoint_0.pkl", "random_states_0.pkl"])
def test_file_that_runs_code_is_refused_and_the_code_does_not_run(tmp_path: Path, name: str) -> None:
    accelerator, *_ = _setup()
    target = tmp_path / "ckpt"
    accelerator.save_state(target)
    marker = tmp_path / "code-ran"
    torch.save({"state": Payload(marker)}, target / name)
    with pytest.raises(CheckpointError, match="weights_only") as info:
        _setup()[0].load_state(target)
    assert str(target / name) in str(info.value)
    assert not marker.exists()
