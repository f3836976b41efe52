"""Gradient accumulation and the prepared optimizer / scheduler.

One-process tests run in this interpreter; the DDP behaviour (no all-reduce on non-sync steps,
equality with a big batch under plain DDP, DDP + bf16 / fp16) comes from one real 2-process gloo
job (workers/accumulation_checks.py under torch.distributed.run, with rt_helpers' timeout).
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from rt_helpers import WORKERS, read_ranks, torchrun
from runtime import AccelError, Accelerator
from runtime.accumulation import GradientState
from runtime.optim import AcceleratedOptimizer, AcceleratedScheduler

N = 3


def _data(size: int, seed: int = 0) -> TensorDataset:
    gen = torch.Generator().manual_seed(seed)
    return TensorDataset(torch.randn(size, 4, generator=gen), torch.randn(size, 1, generator=gen))


def _model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))


def _grads(model: nn.Module) -> list[torch.Tensor]:
    return [p.grad.detach().clone() for p in model.parameters()]


# -- one process ----------------------------------------------------------------------------------


def test_sync_pattern_every_nth_step_and_at_the_last_batch() -> None:
    accelerator = Accelerator(gradient_accumulation_steps=N, cpu=True)
    assert accelerator.gradient_accumulation_steps == N
    model = _model()
    loader = accelerator.prepare(DataLoader(_data(14), batch_size=2))  # 7 batches: not a multiple of 3
    pattern = []
    for _epoch in range(2):
        for _batch in loader:
            with accelerator.accumulate(model):
                pattern.append(accelerator.sync_gradients)
    epoch = [False, False, True, False, False, True, True]
    assert pattern == epoch * 2  # the count restarts at the end of each epoch
    # Without a prepared loader: every N-th micro-step.
    plain = Accelerator(gradient_accumulation_steps=2, cpu=True)
    flags = []
    for _ in range(5):
        with plain.accumulate(model):
            flags.append(plain.sync_gradients)
    assert flags == [False, True, False, True, False]


def test_backward_divides_the_loss_by_n() -> None:
    accelerator = Accelerator(gradient_accumulation_steps=4, cpu=True)
    model = _model()
    reference = copy.deepcopy(model)
    x, y = _data(6)[:]
    accelerator.backward(nn.functional.mse_loss(model(x), y))
    (nn.functional.mse_loss(reference(x), y) / 4).backward()
    for got, want in zip(_grads(model), _grads(reference)):
        assert torch.equal(got, want)


def test_optimizer_and_scheduler_do_nothing_on_non_sync_steps() -> None:
    accelerator = Accelerator(gradient_accumulation_steps=N, cpu=True)
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    x, y = _data(4)[:]
    for step in range(1, 2 * N + 1):
        with accelerator.accumulate(model):
            before = [p.detach().clone() for p in model.parameters()]
            accelerator.backward(nn.functional.mse_loss(model(x), y))
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
            changed = any(not torch.equal(p, b) for p, b in zip(model.parameters(), before))
            cleared = all(p.grad is None for p in model.parameters())
            sync = step % N == 0
            assert accelerator.sync_gradients is sync
            assert changed is sync and cleared is sync, f"micro-step {step}"
            assert scheduler.last_epoch == step // N  # one process: once per optimizer step


def test_accumulated_gradients_equal_one_big_batch() -> None:
    accelerator = Accelerator(gradient_accumulation_steps=N, cpu=True)
    model = _model()
    reference = copy.deepcopy(model)
    x, y = _data(4 * N)[:]
    for i in range(N):
        with accelerator.accumulate(model):
            accelerator.backward(nn.functional.mse_loss(model(x[4 * i : 4 * i + 4]), y[4 * i : 4 * i + 4]))
    assert accelerator.sync_gradients
    nn.functional.mse_loss(reference(x), y).backward()
    for got, want in zip(_grads(model), _grads(reference)):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-7)  # summation order only


def test_no_accumulation_fp32_stays_bit_identical_to_plain_pytorch() -> None:
    def train(migrated: bool) -> list[float]:
        torch.manual_seed(0)
        loader = DataLoader(_data(40), batch_size=8, shuffle=True)
        model = _model(1)
        optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
        scheduler = torch.optim.lr_scheduler.LinearLR(optimizer, total_iters=5)
        if migrated:
            accelerator = Accelerator(cpu=True)
            model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
        losses = []
        for _ in range(2):
            for x, y in loader:
                with accelerator.accumulate(model) if migrated else torch.enable_grad():
                    loss = nn.functional.mse_loss(model(x), y)
                    optimizer.zero_grad()
                    accelerator.backward(loss) if migrated else loss.backward()
                    if migrated:
                        accelerator.clip_grad_norm_(model.parameters(), 0.5)
                    else:
                        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
                    optimizer.step()
                    scheduler.step()
                    losses.append(loss.item())
        return losses

    assert train(migrated=True) == train(migrated=False)


def test_prepared_optimizer_is_an_optimizer_for_schedulers_built_after_prepare() -> None:
    accelerator = Accelerator(cpu=True)
    model = _model()
    inner = torch.optim.SGD(model.parameters(), lr=1.0, momentum=0.9)
    optimizer = accelerator.prepare(inner)
    assert isinstance(optimizer, torch.optim.Optimizer) and isinstance(optimizer, AcceleratedOptimizer)
    assert optimizer.param_groups is inner.param_groups and optimizer.state is inner.state
    assert optimizer.defaults is inner.defaults
    scheduler = accelerator.prepare(torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 0.5**s))
    x, y = _data(4)[:]
    accelerator.backward(nn.functional.mse_loss(model(x), y))
    optimizer.step()
    scheduler.step()
    assert inner.param_groups[0]["lr"] == 0.5  # the scheduler drives the wrapped optimizer's LR
    assert scheduler.optimizers == (optimizer,)  # attached to its prepared optimizer
    assert optimizer.state_dict() == inner.state_dict()
    state = copy.deepcopy(optimizer.state_dict())
    optimizer.load_state_dict(state)
    assert len(inner.state) == 2 * 2  # momentum buffers of both Linear layers


@pytest.mark.filterwarnings("ignore:Detected call of:UserWarning")
def test_scheduler_rule_split_batches_and_step_with_optimizer_false() -> None:
    def make() -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.StepLR]:
        opt = torch.optim.SGD(nn.Linear(1, 1).parameters(), lr=1.0)
        return opt, torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)

    state = GradientState(2)
    opt, sched = make()
    wrapped = AcceleratedScheduler(sched, num_processes=4, gradient_state=state)
    state.advance(end_of_dataloader=False)  # micro-step 1 of 2: no sync
    wrapped.step()
    assert sched.last_epoch == 0
    state.advance(end_of_dataloader=False)  # micro-step 2: sync, 4 processes -> 4 steps
    wrapped.step()
    assert sched.last_epoch == 4
    opt, sched = make()
    AcceleratedScheduler(sched, num_processes=4, gradient_state=state, split_batches=True).step()
    assert sched.last_epoch == 1  # split_batches: one step per optimizer step
    opt, sched = make()
    state.advance(end_of_dataloader=False)  # a non-sync micro-step ...
    AcceleratedScheduler(sched, 4, step_with_optimizer=False, gradient_state=state).step()
    assert sched.last_epoch == 1  # ... still steps once: step_scheduler_with_optimizer=False


@pytest.mark.parametrize("value", [0, -2, 2.5, True])
def test_invalid_accumulation_steps_are_clear_errors(value: object) -> None:
    with pytest.raises(AccelError, match="gradient_accumulation_steps") as info:
        Accelerator(gradient_accumulation_steps=value, cpu=True)  # type: ignore[arg-type]
    assert "expected:" in str(info.value) and "fix:" in str(info.value)


def test_fp16_accumulation_keeps_scaled_gradients_until_the_sync_step() -> None:
    accelerator = Accelerator(mixed_precision="fp16", gradient_accumulation_steps=2, cpu=True)
    model = _model()
    reference = copy.deepcopy(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    prepared, optimizer = accelerator.prepare(model, optimizer)
    x, y = _data(8)[:]
    norms = []
    for i in range(2):
        with accelerator.accumulate(prepared):
            accelerator.backward(nn.functional.mse_loss(prepared(x[4 * i : 4 * i + 4]), y[4 * i : 4 * i + 4]))
            norms.append(accelerator.clip_grad_norm_(prepared.parameters(), 1e9))
            optimizer.step()
            optimizer.zero_grad()
    with torch.autocast("cpu", dtype=torch.float16):
        out = reference(x)
    nn.functional.mse_loss(out.float(), y).backward()
    want = torch.nn.utils.get_total_norm([p.grad for p in reference.parameters()])
    # The clip on the sync step sees the unscaled sum of both micro-batches.
    torch.testing.assert_close(norms[1], want, rtol=1e-3, atol=0)
    assert norms[0].item() < 1e3  # the non-sync call reported an unscaled norm and changed nothing
    assert not accelerator.optimizer_step_was_skipped


# -- two processes --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    out = tmp_path_factory.mktemp("accumulation_checks")
    proc = torchrun(WORKERS / "accumulation_checks.py", str(out), cwd=out)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return read_ranks(out, 2)


def test_ddp_sync_pattern_over_the_loader(ranks: list[dict]) -> None:
    epoch = [False, False, True, False, True]  # 5 batches per rank, N=3: the last batch syncs
    for r in ranks:
        assert r["gradient_accumulation_steps"] == N and r["loader_len"] == 5
        assert r["sync_pattern"] == epoch * 2
        assert r["params_changed"] == epoch * 2  # the optimizer stepped exactly on sync steps


def test_ddp_no_allreduce_on_non_sync_steps(ranks: list[dict]) -> None:
    r0, r1 = (r["micro_steps"] for r in ranks)
    for step0, step1 in zip(r0[:-1], r1[:-1]):
        assert not step0["sync"] and not step1["sync"]
        assert step0["allreduce_calls"] == step1["allreduce_calls"] == 0
        assert step0["grads"] != step1["grads"]  # local gradients only: the ranks' data differ
    assert r0[-1]["sync"] and r1[-1]["sync"]
    assert r0[-1]["allreduce_calls"] >= 1 and r1[-1]["allreduce_calls"] >= 1
    assert r0[-1]["grads"] == r1[-1]["grads"]  # all-reduced on the sync step


def test_ddp_optimizer_and_scheduler_are_no_ops_until_sync(ranks: list[dict]) -> None:
    for r in ranks:
        steps = r["micro_steps"]
        for s in steps[:-1]:
            assert not s["params_changed"] and not s["grads_cleared"]
            assert s["scheduler_last_epoch"] == 0 and s["lr"] == 0.1
        last = steps[-1]
        assert last["params_changed"] and last["grads_cleared"]
        # One optimizer step on 2 processes advances the scheduler twice (Accelerate's rule).
        assert last["scheduler_last_epoch"] == 2 and last["lr"] == pytest.approx(0.025)


def test_ddp_accumulated_gradients_equal_plain_ddp_big_batch(ranks: list[dict]) -> None:
    for r in ranks:
        got = torch.tensor(r["micro_steps"][-1]["grads"])
        want = torch.tensor(r["reference_grads"])
        # Same math, different summation order: within 1e-5 relative / 1e-7 absolute.
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-7)


def test_ddp_bf16_autocasts_and_returns_fp32(ranks: list[dict]) -> None:
    for r in ranks:
        b = r["bf16"]
        assert b["wrapped_type"] == "PreparedDDP"  # runtime.ddp's DistributedDataParallel subclass
        assert b["inner_dtype"] == "torch.bfloat16" and b["output_dtype"] == "torch.float32"
        assert b["unwrapped_is_user_module"] and b["forward_is_original"]
    assert ranks[0]["bf16"]["params_after_step"] == ranks[1]["bf16"]["params_after_step"]


def test_ddp_fp16_inf_on_one_rank_skips_the_step_on_every_rank(ranks: list[dict]) -> None:
    for r in ranks:
        f = r["fp16"]
        assert f["skipped_first"] and f["unchanged_first"] and f["scale_after_skip"] == 32768.0
        assert not f["skipped_healthy"] and f["output_dtype"] == "torch.float32"
        assert 0 < f["norm"] < 1e3  # clip_grad_norm_ saw unscaled gradients
    assert ranks[0]["fp16"]["params_after_healthy"] == ranks[1]["fp16"]["params_after_healthy"]
