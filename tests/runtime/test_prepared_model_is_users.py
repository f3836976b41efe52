"""The prepared model is the user's module from the outside, on 1 and 2 processes.

Code the codemod never rewrites (a project's checkpoint helper, a sibling script, tracing,
introspection) sees the user's keys, names and class: runtime/user_module.py.
"""

from __future__ import annotations

import copy
import io
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from runtime import Accelerator

from rt_helpers import WORKERS, child_env, read_ranks, torchrun

sys.path.insert(0, str(WORKERS))
from user_net import USER_KEYS, Net  # noqa: E402


def ddp_keys(state: dict) -> dict:
    """What a hand-written DDP script's ``model.state_dict()`` holds."""
    return {f"module.{key}": value for key, value in state.items()}


def load_without_runtime(tmp_path: Path, code: str) -> str:
    """Run ``code`` in a fresh process where ``import runtime`` fails; return its stdout."""
    prelude = f"import sys; sys.modules['runtime'] = None; sys.path.insert(0, {str(WORKERS)!r})\n"
    proc = subprocess.run([sys.executable, "-c", prelude + code], cwd=tmp_path, env=child_env(),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


# -- 1 process ---------------------------------------------------------------------------------


@pytest.mark.parametrize("precision", ["no", "bf16"])
def test_one_process_names_keys_and_module(precision: str) -> None:
    net = Net()
    model = Accelerator(cpu=True, mixed_precision=precision).prepare(net)
    assert (model is net) == (precision == "no")  # bf16 wraps the module in AutocastModule
    assert model.module is net if precision == "bf16" else not hasattr(model, "module")
    assert sorted(model.state_dict()) == USER_KEYS
    assert [n for n, _ in model.named_parameters()] == [n for n, _ in net.named_parameters()]
    assert [n for n, _ in model.named_modules()] == ["", "encoder", "norm", "head"]
    assert list(model.children()) == list(net.children())
    model.eval()
    assert not net.training and not net.norm.training
    model.train()
    assert net.training


@pytest.mark.parametrize("precision", ["no", "bf16"])
def test_one_process_loads_plain_and_ddp_keys_strictly(precision: str) -> None:
    torch.manual_seed(1)
    saved = Net().state_dict()
    for checkpoint in (saved, ddp_keys(saved)):
        model = Accelerator(cpu=True, mixed_precision=precision).prepare(Net())
        outcome = model.load_state_dict(checkpoint, strict=True)
        assert not outcome.missing_keys and not outcome.unexpected_keys
        for key, value in saved.items():
            assert torch.equal(model.state_dict()[key], value), key
    wrong = {"module.other.weight": torch.zeros(1)}
    with pytest.raises(RuntimeError, match="Missing key"):
        Accelerator(cpu=True).prepare(Net()).load_state_dict(wrong, strict=True)


class HoldsAModule(nn.Module):
    """A user's class with a submodule named ``module``: its own ``module.`` keys stay."""

    def __init__(self) -> None:
        super().__init__()
        self.module = nn.Linear(2, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.module(x)


def test_a_users_own_module_attribute_and_keys_are_kept() -> None:
    torch.manual_seed(2)
    saved = HoldsAModule().state_dict()
    model = Accelerator(cpu=True).prepare(HoldsAModule())
    assert isinstance(model.module, nn.Linear)
    model.load_state_dict(saved, strict=True)  # keys "module.weight": not stripped
    assert torch.equal(model.module.weight, saved["module.weight"])
    model.load_state_dict(ddp_keys(saved), strict=True)  # "module.module.weight": stripped once
    assert torch.equal(model.module.weight, saved["module.weight"])


def test_bf16_wrapper_moves_and_copies_as_the_users_module() -> None:
    net = Net()
    model = Accelerator(cpu=True, mixed_precision="bf16").prepare(net)
    model.double()  # _apply reaches the root's own parameter too
    assert net.scale.dtype == torch.float64 and net.encoder.weight.dtype == torch.float64
    model.float()
    assert type(copy.deepcopy(model)) is Net
    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    assert type(torch.load(buffer, weights_only=False)) is Net
    x = torch.randn(3, 4)
    model.eval()
    assert torch.equal(torch.jit.trace(model, x)(x), model(x))


def test_one_process_pickle_loads_without_the_runtime(tmp_path: Path) -> None:
    model = Accelerator(cpu=True).prepare(Net())
    torch.save(model, tmp_path / "model.pt")
    out = load_without_runtime(tmp_path, (
        "import torch\n"
        "m = torch.load('model.pt', weights_only=False)\n"
        "print(type(m).__name__, sorted(m.state_dict()) == __import__('user_net').USER_KEYS)\n"
    ))
    assert out.split() == ["Net", "True"]


def test_prepared_optimizer_and_scheduler_pickle_as_the_users(tmp_path: Path) -> None:
    accelerator = Accelerator(cpu=True)
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2)
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    assert type(copy.deepcopy(optimizer)) is torch.optim.SGD
    torch.save({"model": model, "optimizer": optimizer, "scheduler": scheduler}, tmp_path / "all.pt")
    out = load_without_runtime(tmp_path, (
        "import torch\n"
        "saved = torch.load('all.pt', weights_only=False)\n"
        "print(*(type(saved[k]).__name__ for k in ('model', 'optimizer', 'scheduler')),\n"
        "      saved['scheduler'].optimizer is saved['optimizer'])\n"
    ))
    assert out.split() == ["Net", "SGD", "StepLR", "True"]


# -- 2 processes -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def view(tmp_path_factory):
    root = tmp_path_factory.mktemp("user_view")
    ckpt = root / "ckpt"
    ckpt.mkdir()
    torch.manual_seed(3)
    saved = Net().state_dict()
    torch.save(saved, ckpt / "plain.pt")
    torch.save(ddp_keys(saved), ckpt / "ddp.pt")
    out = root / "out"
    out.mkdir()
    proc = torchrun(WORKERS / "user_module_view.py", str(out), str(ckpt), cwd=out)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return read_ranks(out), out


def test_two_processes_names_are_the_users(view) -> None:
    ranks, _ = view
    for r in ranks:
        assert r["is_ddp"] and r["module_is_users"] and r["same_parameters"]
        assert r["state_dict_keys"] == USER_KEYS
        assert r["parameter_names"] == ["scale", "encoder.weight", "encoder.bias", "norm.weight",
                                        "norm.bias", "head.weight", "head.bias"]
        assert r["module_names"] == ["", "encoder", "norm", "head"]
        assert r["children"] == ["Linear", "BatchNorm1d", "Linear"]
        assert r["eval_reaches_user"] and r["train_reaches_user"]


def test_two_processes_state_dict_answers_ddp_key_lookups(view) -> None:
    # timm's ModelEma.update reads msd["module." + k] when the model has .module
    for r in view[0]:
        assert r["module_key_lookup"] and not r["module_key_listed"] and r["state_dict_pickles_plain"]


def test_two_processes_load_the_original_scripts_checkpoints(view) -> None:
    for r in view[0]:
        assert r["load_plain"] and r["load_ddp"]


def test_two_processes_trace_and_add_graph(view) -> None:
    for r in view[0]:
        assert r["trace_equal"] and r["add_graph"]


def test_two_processes_pickle_and_deepcopy_give_the_users_module(view) -> None:
    for r in view[0]:
        assert r["deepcopy_type"] == "Net" and r["deepcopy_separate"]
        assert r["pickle_type"] == "Net" and r["pickle_shares_inner"]


def test_two_processes_train_bit_identically_to_plain_ddp(view) -> None:
    for r in view[0]:
        assert r["bit_identical_to_ddp"] and r["no_sync_left_local"]


def test_two_processes_sharded_strategies_keep_the_users_keys(view) -> None:
    ranks, _ = view
    for r in ranks:
        assert r["zero1_keys"] == USER_KEYS
    assert ranks[0]["fsdp_full_keys"] == USER_KEYS


def test_migrated_checkpoint_loads_strictly_into_the_users_class_in_a_fresh_process(view) -> None:
    ranks, out = view
    printed = load_without_runtime(out, (
        "import torch\n"
        "from user_net import Net\n"
        "net = Net()\n"
        "net.load_state_dict(torch.load('migrated_state.pt'), strict=True)\n"
        "whole = torch.load('migrated_model.pt', weights_only=False)\n"
        "flat = lambda m: torch.cat([t.flatten().float() for t in m.state_dict().values()])\n"
        "print(type(whole).__name__, torch.equal(flat(net), flat(whole)), flat(net).tolist())\n"
    ))
    kind, same, values = printed.split(" ", 2)
    assert kind == "Net" and same == "True"
    assert eval(values) == ranks[0]["saved_flat"]  # noqa: S307 (our own printed list)
