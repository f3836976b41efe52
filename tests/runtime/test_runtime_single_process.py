"""One process: bit-identical data and losses, device placement, options, errors, state."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from collections import namedtuple

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from runtime import Accelerator, UnsupportedOptionError
from runtime.data import PreparedDataLoader, send_to_device
from runtime.errors import DistributedEnvironmentError, PrepareError
from runtime.optim import AcceleratedScheduler
from runtime.state import ProcessState


def _dataset(size: int = 37) -> TensorDataset:
    gen = torch.Generator().manual_seed(7)
    return TensorDataset(torch.randn(size, 3, generator=gen), torch.arange(size))


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(batch_size=8, shuffle=True),
        dict(batch_size=8, shuffle=True, drop_last=True),
        dict(batch_size=5, shuffle=False),
        dict(batch_size=None, shuffle=True),
    ],
    ids=["shuffle", "shuffle-drop_last", "sequential", "per-sample"],
)
def test_one_process_loader_is_bit_identical(kwargs: dict) -> None:
    dataset = _dataset()
    torch.manual_seed(0)
    original = [b for _ in range(2) for b in DataLoader(dataset, **kwargs)]
    rng_after_original = torch.get_rng_state()

    torch.manual_seed(0)
    prepared = Accelerator().prepare(DataLoader(dataset, **kwargs))
    assert isinstance(prepared, DataLoader)
    got = [b for _ in range(2) for b in prepared]
    assert torch.equal(torch.get_rng_state(), rng_after_original)
    assert len(got) == len(original)
    for a, b in zip(original, got):
        assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert len(prepared) == len(DataLoader(dataset, **kwargs))
    assert prepared.dataset is dataset


def test_one_process_loss_sequence_is_bit_identical() -> None:
    def train(migrated: bool) -> list[float]:
        torch.manual_seed(0)
        loader = DataLoader(_dataset(64), batch_size=8, shuffle=True)
        model = nn.Sequential(nn.Linear(3, 16), nn.ReLU(), nn.Dropout(0.1), nn.Linear(16, 1))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=3, gamma=0.5)
        if migrated:
            accelerator = Accelerator()
            model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
        losses = []
        for _ in range(2):
            for x, y in loader:
                loss = nn.functional.mse_loss(model(x).squeeze(1), y.float() / 64)
                optimizer.zero_grad()
                accelerator.backward(loss) if migrated else loss.backward()
                optimizer.step()
                scheduler.step()
                losses.append(loss.item())
        return losses

    assert train(migrated=True) == train(migrated=False)


Pair = namedtuple("Pair", "x y")


@dataclasses.dataclass(frozen=True)
class Sample:
    inputs: torch.Tensor
    meta: dict
    label: str = "tag"


def test_send_to_device_moves_nested_tensors_and_keeps_types() -> None:
    meta = torch.device("meta")
    batch = {
        "pair": Pair(torch.ones(2), [torch.zeros(1), (torch.ones(3), 5)]),
        "sample": Sample(torch.ones(4), {"mask": torch.zeros(2)}),
        "name": "keep me",
    }
    moved = send_to_device(batch, meta)
    assert type(moved["pair"]) is Pair
    assert moved["pair"].x.device == meta
    assert moved["pair"].y[0].device == meta and type(moved["pair"].y) is list
    assert type(moved["pair"].y[1]) is tuple and moved["pair"].y[1][0].device == meta
    assert moved["pair"].y[1][1] == 5
    assert type(moved["sample"]) is Sample
    assert moved["sample"].inputs.device == meta and moved["sample"].meta["mask"].device == meta
    assert moved["sample"].label == "tag" and moved["name"] == "keep me"
    assert batch["pair"].x.device.type == "cpu"  # the input was not mutated


class GraphBatch:
    """A batch class with its own `to` (PyG's Batch, a collate function's class), not a container."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.x, self.y = x, y

    def to(self, device: torch.device) -> "GraphBatch":  # no non_blocking, as many such classes
        return GraphBatch(self.x.to(device), self.y.to(device))


def test_send_to_device_moves_objects_with_their_own_to() -> None:
    meta = torch.device("meta")
    batch = GraphBatch(torch.ones(3, 2), torch.zeros(3))
    moved = send_to_device(batch, meta, non_blocking=True)
    assert type(moved) is GraphBatch and moved.x.device == meta and moved.y.device == meta
    nested = send_to_device({"graphs": [batch], "name": "g", "n": 3, "kind": int}, meta)
    assert nested["graphs"][0].x.device == meta
    assert nested["name"] == "g" and nested["n"] == 3 and nested["kind"] is int
    assert batch.x.device.type == "cpu"  # the input was not mutated


def test_prepared_loader_yields_batches_on_its_device() -> None:
    def collate(items):
        xs = torch.stack([x for x, _ in items])
        return {"inputs": Pair(xs, [xs * 2]), "ids": [i for _, i in items]}

    from runtime.data import prepare_data_loader

    loader = DataLoader(_dataset(10), batch_size=4, collate_fn=collate)
    prepared = prepare_data_loader(loader, ProcessState(), torch.device("meta"))
    assert isinstance(prepared, PreparedDataLoader)
    batches = list(prepared)
    assert len(batches) == len(prepared) == 3
    assert all(b["inputs"].x.device.type == "meta" and b["inputs"].y[0].device.type == "meta" for b in batches)
    assert all(isinstance(b["ids"][0], torch.Tensor) and b["ids"][0].device.type == "meta" for b in batches)


def test_prepare_returns_objects_in_order() -> None:
    accelerator = Accelerator()
    model = nn.Linear(2, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 1)
    other = object()
    m, o, s, x = accelerator.prepare(model, optimizer, scheduler, other)
    assert m is model and x is other
    # The optimizer is wrapped (accumulation / fp16), but is still an Optimizer over the same state.
    assert isinstance(o, torch.optim.Optimizer) and o.optimizer is optimizer
    assert o.param_groups is optimizer.param_groups and o.state is optimizer.state
    assert isinstance(s, AcceleratedScheduler) and s.optimizer is optimizer
    assert accelerator.unwrap_model(m) is model
    assert accelerator.prepare(model) is model  # one object in, one object out


def test_preparing_a_loader_twice_is_an_error() -> None:
    accelerator = Accelerator()
    prepared = accelerator.prepare(DataLoader(_dataset(), batch_size=4))
    with pytest.raises(PrepareError, match="twice") as info:
        accelerator.prepare(prepared)
    assert "fix:" in str(info.value)


@pytest.mark.parametrize(
    "kwargs, option",
    [
        (dict(mixed_precision="fp8"), "mixed_precision"),
    ],
)
def test_unsupported_options_name_the_option(kwargs: dict, option: str) -> None:
    with pytest.raises(UnsupportedOptionError) as info:
        Accelerator(**kwargs)
    assert isinstance(info.value, NotImplementedError)
    message = str(info.value)
    assert option in message and "expected:" in message and "fix:" in message


def test_supported_default_values_are_accepted() -> None:
    accelerator = Accelerator(mixed_precision="no", gradient_accumulation_steps=1, cpu=True)
    assert accelerator.mixed_precision == "no"
    assert accelerator.gradient_accumulation_steps == 1
    assert accelerator.sync_gradients
    assert accelerator.num_processes == 1 and accelerator.is_main_process
    assert accelerator.device == torch.device("cpu")
    with accelerator.accumulate(nn.Linear(1, 1)), accelerator.autocast():
        pass


def test_single_process_gather_print_save(tmp_path, capsys) -> None:
    accelerator = Accelerator()
    t = torch.arange(3)
    assert accelerator.gather(t) is t
    loader = accelerator.prepare(DataLoader(_dataset(10), batch_size=4))
    assert torch.cat([accelerator.gather_for_metrics(y) for _, y in loader]).tolist() == list(range(10))
    accelerator.print("hello", 1)
    assert capsys.readouterr().out == "hello 1\n"
    accelerator.save({"a": 1}, tmp_path / "x.pt")
    assert torch.load(tmp_path / "x.pt") == {"a": 1}
    accelerator.wait_for_everyone()
    accelerator.end_training()


def test_state_without_env_is_single_process() -> None:
    state = ProcessState.from_env(cpu=True, environ={})
    assert (state.rank, state.world_size, state.local_rank, state.backend) == (0, 1, 0, None)
    assert not state.distributed and state.device == torch.device("cpu")


def test_state_with_incomplete_env_says_how_to_launch() -> None:
    with pytest.raises(DistributedEnvironmentError, match="MASTER_ADDR") as info:
        ProcessState.from_env(cpu=True, environ={"WORLD_SIZE": "2", "RANK": "1"})
    assert "accel launch" in str(info.value)
    with pytest.raises(DistributedEnvironmentError, match="outside"):
        ProcessState.from_env(cpu=True, environ={"WORLD_SIZE": "2", "RANK": "2"})


def test_scheduler_steps_once_per_process() -> None:
    optimizer = torch.optim.SGD(nn.Linear(1, 1).parameters(), lr=1.0)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    AcceleratedScheduler(scheduler, num_processes=2).step()
    assert scheduler.get_last_lr() == [0.25]
    AcceleratedScheduler(scheduler, num_processes=1).step()
    assert scheduler.get_last_lr() == [0.125]
    one_cycle = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=1.0, total_steps=3)
    wrapped = AcceleratedScheduler(one_cycle, num_processes=2)
    wrapped.step()
    wrapped.step()  # would raise inside OneCycleLR without the total_steps guard
    assert one_cycle.last_epoch == 3


def test_import_runtime_is_cheap() -> None:
    code = (
        "import sys, runtime; from runtime import Accelerator; "
        "bad = [m for m in ('libcst', 'typer', 'rich', 'migrate') if m in sys.modules]; "
        "print(bad)"
    )
    out = subprocess.run([sys.executable, "-W", "ignore", "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
