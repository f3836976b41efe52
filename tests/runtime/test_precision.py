"""Mixed precision on one process: bf16 autocast, fp16 GradScaler, unwrap_model, honest errors.

Every test here runs on the CPU (this torch build autocasts to bf16 and fp16 on CPU, and
``GradScaler("cpu")`` works); the CUDA variants at the end skip without a GPU. The two-process
checks (DDP + bf16 / fp16) live in test_accumulation.py's torchrun worker.
"""

from __future__ import annotations

import copy
from contextlib import nullcontext

import pytest
import torch
from torch import nn

from runtime import Accelerator, UnsupportedOptionError
from runtime.optim import AcceleratedOptimizer
from runtime.precision import (
    AutocastModule,
    PrecisionNotSupportedError,
    _autocast_problem,
    select_precision,
)


def _model(seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 1))


def _batch(seed: int = 1, n: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(n, 4, generator=gen), torch.randn(n, 1, generator=gen)


def _grads(model: nn.Module) -> list[torch.Tensor]:
    return [p.grad.detach().clone() for p in model.parameters()]


# -- bf16 -----------------------------------------------------------------------------------------


def test_bf16_autocast_on_cpu_and_fp32_outputs() -> None:
    accelerator = Accelerator(mixed_precision="bf16", cpu=True)
    assert accelerator.mixed_precision == "bf16" and accelerator.scaler is None
    a = torch.randn(3, 3)
    with accelerator.autocast():
        assert (a @ a).dtype == torch.bfloat16
    assert (a @ a).dtype == torch.float32  # only inside the context

    model = _model()
    inner_dtypes: list[torch.dtype] = []
    model[0].register_forward_hook(lambda m, i, o: inner_dtypes.append(o.dtype))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    prepared, optimizer = accelerator.prepare(model, optimizer)
    x, y = _batch()
    out = prepared(x)
    assert inner_dtypes == [torch.bfloat16]  # the forward ran under autocast ...
    assert out.dtype == torch.float32  # ... and its output came back in fp32

    losses = []
    for _ in range(20):
        loss = nn.functional.mse_loss(prepared(x), y)
        optimizer.zero_grad()
        accelerator.backward(loss)
        optimizer.step()
        losses.append(loss.item())
    assert all(torch.isfinite(torch.tensor(losses)))
    assert losses[-1] < 0.7 * losses[0]
    assert all(p.dtype == torch.float32 for p in model.parameters())  # master weights stay fp32


# -- fp16 -----------------------------------------------------------------------------------------


def _fp16_setup(max_norm_model_seed: int = 0):
    accelerator = Accelerator(mixed_precision="fp16", cpu=True)
    model = _model(max_norm_model_seed)
    reference = copy.deepcopy(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    prepared, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    return accelerator, model, reference, prepared, optimizer, scheduler


def _reference_grads(reference: nn.Module, x: torch.Tensor, y: torch.Tensor, dtype: torch.dtype | None):
    """Gradients without loss scaling: under fp16 autocast (dtype=float16) or in plain fp32."""
    reference.zero_grad()
    ctx = torch.autocast("cpu", dtype=dtype) if dtype is not None else nullcontext()
    with ctx:
        out = reference(x)
    nn.functional.mse_loss(out.float(), y).backward()
    return _grads(reference)


def test_fp16_scales_the_loss_and_steps_through_the_scaler() -> None:
    accelerator, model, reference, prepared, optimizer, scheduler = _fp16_setup()
    assert isinstance(accelerator.scaler, torch.amp.GradScaler) and accelerator.scaler.is_enabled()
    scale = accelerator.scaler.get_scale()
    assert scale == 65536.0
    x, y = _batch()
    out = prepared(x)
    assert out.dtype == torch.float32
    accelerator.backward(nn.functional.mse_loss(out, y))
    want = _reference_grads(reference, x, y, torch.float16)
    for got, ref in zip(_grads(model), want):  # the gradients are the loss-scaled ones
        torch.testing.assert_close(got / scale, ref, rtol=1e-3, atol=1e-6)
    before = [p.detach().clone() for p in model.parameters()]
    optimizer.step()
    assert not accelerator.optimizer_step_was_skipped
    # GradScaler unscaled before the update: an SGD step on the unscaled gradients.
    for p, b, ref in zip(model.parameters(), before, want):
        torch.testing.assert_close(p.detach(), b - 0.1 * ref, rtol=1e-3, atol=1e-6)
    scheduler.step()
    assert scheduler.get_last_lr() == [0.05]  # a real step advances the scheduler


def test_fp16_inf_gradient_skips_the_step_and_the_scheduler() -> None:
    accelerator, model, _, prepared, optimizer, scheduler = _fp16_setup()
    x, y = _batch()
    accelerator.backward(nn.functional.mse_loss(prepared(x), y))
    next(model.parameters()).grad[0, 0] = float("inf")  # injected overflow
    before = [p.detach().clone() for p in model.parameters()]
    optimizer.step()
    scheduler.step()
    assert accelerator.optimizer_step_was_skipped and optimizer.step_was_skipped
    assert all(torch.equal(p, b) for p, b in zip(model.parameters(), before))  # weights unchanged
    assert accelerator.scaler.get_scale() == 32768.0  # backed off
    assert scheduler.get_last_lr() == [0.1]  # a skipped step does not advance the scheduler
    optimizer.zero_grad()

    accelerator.backward(nn.functional.mse_loss(prepared(x), y))  # a healthy step afterwards
    optimizer.step()
    scheduler.step()
    assert not accelerator.optimizer_step_was_skipped
    assert not all(torch.equal(p, b) for p, b in zip(model.parameters(), before))
    assert scheduler.get_last_lr() == [0.05]


def test_fp16_clip_grad_norm_unscales_first_and_only_once() -> None:
    accelerator, model, reference, prepared, optimizer, _ = _fp16_setup()
    x, y = _batch()
    accelerator.backward(nn.functional.mse_loss(prepared(x), y))
    norm = accelerator.clip_grad_norm_(prepared.parameters(), max_norm=1e9)
    half_ref = _reference_grads(copy.deepcopy(reference), x, y, torch.float16)
    fp32_ref = _reference_grads(copy.deepcopy(reference), x, y, None)
    half_norm = torch.nn.utils.get_total_norm(half_ref)
    fp32_norm = torch.nn.utils.get_total_norm(fp32_ref)
    # The norm is the one of the unscaled gradients: equal to the unscaled fp16-autocast reference
    # (same arithmetic, rtol 1e-3) and to the pure fp32 reference up to fp16 rounding (rtol 1e-2).
    torch.testing.assert_close(norm, half_norm, rtol=1e-3, atol=0)
    torch.testing.assert_close(norm, fp32_norm, rtol=1e-2, atol=0)
    assert norm.item() < 1e3  # a scaled norm would be ~65536x larger
    # A second clip in the same step does not unscale again (GradScaler would raise).
    again = accelerator.clip_grad_norm_(prepared.parameters(), max_norm=0.5 * norm.item())
    torch.testing.assert_close(again, norm)
    clipped = torch.nn.utils.get_total_norm([p.grad for p in model.parameters()])
    torch.testing.assert_close(clipped, 0.5 * norm, rtol=1e-4, atol=0)
    before = [p.detach().clone() for p in model.parameters()]
    grads = _grads(model)
    optimizer.step()  # GradScaler.step must not unscale a second time either
    assert not accelerator.optimizer_step_was_skipped
    for p, b, g in zip(model.parameters(), before, grads):
        torch.testing.assert_close(p.detach(), b - 0.1 * g)


def test_fp16_clip_grad_value_unscales_first() -> None:
    accelerator, model, reference, prepared, optimizer, _ = _fp16_setup()
    x, y = _batch()
    accelerator.backward(nn.functional.mse_loss(prepared(x), y))
    accelerator.clip_grad_value_(prepared.parameters(), clip_value=1e9)  # no clipping, just unscale
    want = _reference_grads(reference, x, y, torch.float16)
    for got, ref in zip(_grads(model), want):
        torch.testing.assert_close(got, ref, rtol=1e-3, atol=1e-6)
    optimizer.step()
    assert not accelerator.optimizer_step_was_skipped


# -- prepared models and unwrap_model -------------------------------------------------------------


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_unwrap_model_returns_the_untouched_user_module(precision: str) -> None:
    accelerator = Accelerator(mixed_precision=precision, cpu=True)
    model = _model()
    original_forward = type(model).forward
    prepared = accelerator.prepare(model)
    assert isinstance(prepared, AutocastModule) and prepared is not model
    unwrapped = accelerator.unwrap_model(prepared)
    assert unwrapped is model
    assert unwrapped.forward.__func__ is original_forward and "forward" not in vars(model)
    assert accelerator.unwrap_model(prepared, keep_fp32_wrapper=False) is model
    x, _ = _batch()
    assert unwrapped(x).dtype == torch.float32 and prepared(x).dtype == torch.float32
    # The prepared model behaves like the user's: attributes, parameters and state_dict keys.
    assert prepared[0] is model[0]
    assert list(prepared.parameters()) == list(model.parameters())
    assert list(prepared.state_dict()) == list(model.state_dict())
    prepared.load_state_dict(model.state_dict())
    assert accelerator.prepare(prepared) is prepared  # preparing twice does not wrap twice
    twin = copy.deepcopy(prepared)  # e.g. an EMA copy: a copy of the user's module itself
    assert type(twin) is type(model) and twin[0].weight is not model[0].weight
    with torch.no_grad():
        twin[0].weight.zero_()
    assert not torch.equal(twin(x), prepared(x)) and twin(x).dtype == torch.float32


def test_fp32_prepare_returns_the_model_itself() -> None:
    accelerator = Accelerator(mixed_precision="no", cpu=True)
    model = _model()
    assert accelerator.prepare(model) is model
    assert accelerator.unwrap_model(model) is model
    assert accelerator.scaler is None
    with accelerator.autocast():
        assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.float32


def test_outputs_are_converted_inside_containers() -> None:
    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(2, 2)

        def forward(self, x: torch.Tensor) -> dict:
            h = self.fc(x)
            return {"h": h, "pair": (h, x.long()), "name": "n"}

    prepared = Accelerator(mixed_precision="bf16", cpu=True).prepare(Net())
    out = prepared(torch.ones(3, 2))
    assert out["h"].dtype == torch.float32 and out["pair"][0].dtype == torch.float32
    assert out["pair"][1].dtype == torch.int64 and out["name"] == "n"


# -- errors ---------------------------------------------------------------------------------------


def test_unknown_precision_is_an_error_listing_the_choices() -> None:
    with pytest.raises(UnsupportedOptionError) as info:
        Accelerator(mixed_precision="fp8", cpu=True)
    message = str(info.value)
    assert "fp8" in message and "'bf16'" in message and "fix:" in message


def test_precision_the_device_cannot_do_is_an_error_not_a_fallback(monkeypatch) -> None:
    # A device type without autocast at all.
    with pytest.raises(PrecisionNotSupportedError, match="does not support device type 'meta'") as info:
        select_precision("bf16", torch.device("meta"))
    assert "expected:" in str(info.value) and 'mixed_precision="no"' in str(info.value)
    # A torch build that silently ignores the requested dtype (autocast becomes a no-op).
    monkeypatch.setattr(torch, "autocast", lambda *args, **kwargs: nullcontext())
    with pytest.raises(PrecisionNotSupportedError, match="ran in torch.float32"):
        Accelerator(mixed_precision="fp16", cpu=True)
    monkeypatch.undo()
    # A GPU without native bf16 (simulated: this check must not trust emulation).
    monkeypatch.setattr(torch.amp, "is_autocast_available", lambda device_type: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: including_emulation)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Tesla T4")
    problem = _autocast_problem(torch.device("cuda", 0), torch.bfloat16)
    assert problem is not None and "Tesla T4" in problem and "bf16" in problem
    monkeypatch.undo()
    # A GradScaler that disables itself (e.g. torch too old for CPU fp16).
    monkeypatch.setattr(torch.amp.GradScaler, "is_enabled", lambda self: False)
    with pytest.raises(PrecisionNotSupportedError, match="GradScaler"):
        Accelerator(mixed_precision="fp16", cpu=True)


def test_closure_with_fp16_is_a_clear_error() -> None:
    accelerator, _, _, prepared, optimizer, _ = _fp16_setup()
    x, y = _batch()
    accelerator.backward(nn.functional.mse_loss(prepared(x), y))
    assert isinstance(optimizer, AcceleratedOptimizer)
    with pytest.raises(Exception, match="closure"):
        optimizer.step(lambda: 0.0)


# -- CUDA -----------------------------------------------------------------------------------------

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@cuda
@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_cuda_mixed_precision_trains(precision: str) -> None:
    if precision == "bf16" and not torch.cuda.is_bf16_supported(including_emulation=False):
        with pytest.raises(PrecisionNotSupportedError):
            Accelerator(mixed_precision="bf16")
        return
    accelerator = Accelerator(mixed_precision=precision)
    assert accelerator.device.type == "cuda"
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    prepared, optimizer = accelerator.prepare(model, optimizer)
    x, y = (t.to(accelerator.device) for t in _batch())
    with accelerator.autocast():
        assert (x @ x.T).dtype == (torch.bfloat16 if precision == "bf16" else torch.float16)
    losses = []
    for _ in range(20):
        out = prepared(x)
        assert out.dtype == torch.float32
        loss = nn.functional.mse_loss(out, y)
        optimizer.zero_grad()
        accelerator.backward(loss)
        accelerator.clip_grad_norm_(prepared.parameters(), 1.0)
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0]
    if precision == "fp16":
        assert accelerator.scaler is not None and accelerator.scaler.get_scale() > 1
        next(model.parameters()).grad = None
        loss = nn.functional.mse_loss(prepared(x), y)
        optimizer.zero_grad()
        accelerator.backward(loss)
        next(model.parameters()).grad[0, 0] = float("inf")
        optimizer.step()
        assert accelerator.optimizer_step_was_skipped
    assert accelerator.unwrap_model(prepared) is model
