"""Every strategy trains the same model on the same data; sharded checkpoints across world sizes.

Usage: ``strategies.py OUT MODE`` where MODE is
- ``train`` (2 processes): ddp, zero1, fsdp-zero3 and fsdp-zero2 train the same model (with
  accumulation, clipping and a scheduler); each records its final full weights, gathered eval
  predictions, local parameter / optimizer-state sizes. zero1 and fsdp save a sharded checkpoint
  after 4 steps, train 4 more, then a fresh model loads the checkpoint and trains the same 4 steps
  (2 -> 2). The checkpoint ``OUT/one/ckpt`` written by ``save-one`` is loaded too (1 -> 2).
- ``save-one`` (1 process): fsdp strategy, 3 steps, ``save_state(OUT/one/ckpt)``.
- ``load-one`` (1 process): loads the 2-process zero1 and fsdp checkpoints (2 -> 1), and the
  fsdp one under ddp.
Results go to ``OUT/<mode>_rank<r>.json`` and reference weights to ``.pt`` files.
"""

from __future__ import annotations

import itertools
import json
import sys
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from runtime import Accelerator, FSDPStrategy
from runtime.checkpoint import CheckpointError
from runtime.errors import PrepareError

OUT, MODE = Path(sys.argv[1]), sys.argv[2]
STRATEGIES = ("ddp", "zero1", "fsdp-zero3", "fsdp-zero2")


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.linear = nn.Linear(width, width)
        self.norm = nn.LayerNorm(width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.tanh(self.norm(self.linear(x)))


def build() -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), Block(32), Block(32), Block(32), nn.Linear(32, 2))
    return model, torch.optim.AdamW(model.parameters(), lr=0.05, weight_decay=0.01)


def data() -> tuple[DataLoader, DataLoader]:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(64, 8, generator=g)
    y = (x[:, :2] * 3).tanh()
    train = DataLoader(TensorDataset(x, y), batch_size=4, shuffle=False)
    evaluation = DataLoader(TensorDataset(x[:10], y[:10]), batch_size=4)  # 10: padded at 2 ranks
    return train, evaluation


def local_numel(tensor: torch.Tensor) -> int:
    return tensor.to_local().numel() if hasattr(tensor, "to_local") else tensor.numel()


def optimizer_state_numel(optimizer: torch.optim.Optimizer) -> int:
    inner = optimizer.optimizer  # AcceleratedOptimizer -> the strategy's optimizer
    states = inner.optim.state if hasattr(inner, "optim") else inner.state  # ZeRO: this rank's
    return sum(local_numel(v) for s in states.values() for v in s.values() if v.ndim > 0)


def steps(accelerator: Accelerator, model, optimizer, scheduler, batches, count: int) -> list[float]:
    """``count`` training micro-steps on the next batches of the iterator (or loader)."""
    norms = []
    for x, y in itertools.islice(batches, count):
        with accelerator.accumulate(model):
            loss = nn.functional.mse_loss(model(x), y)
            accelerator.backward(loss)
            if accelerator.sync_gradients:
                norms.append(float(accelerator.clip_grad_norm_(model.parameters(), 0.5)))
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
    return norms


def prepared(strategy, reverse: bool = False, mixed_precision: str = "no"):
    accelerator = Accelerator(strategy=strategy, gradient_accumulation_steps=2,
                              mixed_precision=mixed_precision)
    model, optimizer = build()
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.7)
    train, evaluation = data()
    if reverse:  # the optimizer (and scheduler) before the model: prepare reorders
        scheduler, optimizer, train, model, evaluation = accelerator.prepare(
            scheduler, optimizer, train, model, evaluation)
    else:
        model, optimizer, train, evaluation, scheduler = accelerator.prepare(
            model, optimizer, train, evaluation, scheduler)
    return accelerator, model, optimizer, scheduler, train, evaluation


def full_weights(accelerator: Accelerator, model) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in accelerator.get_state_dict(model).items()}


def max_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys(), (sorted(a), sorted(b))
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in a)


def train_mode() -> dict:
    result: dict = {"strategies": {}}
    reference = None
    for name in STRATEGIES:
        accelerator, model, optimizer, scheduler, train, evaluation = prepared(
            name, reverse=name == "fsdp-zero3")
        rank = accelerator.process_index
        total = sum(p.numel() for p in build()[0].parameters())
        norms = steps(accelerator, model, optimizer, scheduler, iter(train), 8)
        weights = full_weights(accelerator, model)
        # Measured after the last optimizer step (fsdp-zero2 keeps the parameters gathered
        # from a forward until its backward, so an eval forward leaves them whole).
        param_fraction = sum(local_numel(p) for p in model.parameters()) / total
        with torch.no_grad():
            preds = [accelerator.gather_for_metrics(model(x)) for x, _ in evaluation]
        record = {
            "strategy": accelerator.strategy.name,
            "norms": norms,
            "lr": scheduler.get_last_lr()[0],
            "param_fraction": param_fraction,
            "optimizer_fraction": optimizer_state_numel(optimizer) / (2 * total),
            "eval_rows": sum(p.shape[0] for p in preds),
            "weights_on_this_rank": bool(weights),
        }
        if rank == 0:
            if reference is None:
                reference = (weights, torch.cat(preds))
            record["max_weight_diff_to_ddp"] = max_diff(weights, reference[0])
            record["max_pred_diff_to_ddp"] = float((torch.cat(preds) - reference[1]).abs().max())
        if name == "fsdp-zero3":
            # The user's module's own state_dict() holds this rank's shards: save() refuses it.
            try:
                accelerator.save(accelerator.unwrap_model(model).state_dict(), OUT / "shards.pt")
                record["save_shards_error"] = None
            except CheckpointError as error:
                record["save_shards_error"] = str(error)
            record["shards_file_written"] = (OUT / "shards.pt").exists()
        if name in ("zero1", "fsdp-zero3"):
            record["resume"] = resume_check(name, rank)
        result["strategies"][name] = record
    # 1 -> 2: the fsdp checkpoint written by one process.
    accelerator, model, optimizer, scheduler, train, _ = prepared("fsdp")
    accelerator.load_state(OUT / "one" / "ckpt")
    loaded = full_weights(accelerator, model)  # every rank: a gather under fsdp
    one = torch.load(OUT / "one" / "weights.pt")
    result["one_to_two_diff"] = max_diff(loaded, one) if accelerator.is_main_process else None
    result["one_to_two_lr"] = scheduler.get_last_lr()[0]
    steps(accelerator, model, optimizer, scheduler, iter(train), 2)  # the loaded optimizer state steps
    # bf16 under fsdp (MixedPrecisionPolicy plus autocast) against ddp under bf16.
    x_all, y_all = data()[0].dataset.tensors
    for name in ("ddp", "fsdp"):
        accelerator, model, optimizer, scheduler, train, _ = prepared(name, mixed_precision="bf16")
        dtypes: list[str] = []
        block = accelerator.unwrap_model(model)[1].linear
        hook = block.register_forward_pre_hook(lambda m, args: dtypes.append(str(m.weight.dtype)))
        with torch.no_grad():
            before = float(nn.functional.mse_loss(model(x_all), y_all))
        steps(accelerator, model, optimizer, scheduler, iter(train), 8)
        with torch.no_grad():
            after = float(nn.functional.mse_loss(model(x_all), y_all))
        hook.remove()
        result[f"bf16_{name}"] = {"loss": [before, after], "weight_dtype_in_forward": dtypes[0]}
    # CPU offload needs a GPU: a clear error on CPU.
    try:
        Accelerator(strategy=FSDPStrategy(cpu_offload=True)).prepare(build()[0])
        result["cpu_offload_error"] = None
    except PrepareError as error:
        result["cpu_offload_error"] = str(error)
    return result


def resume_check(name: str, rank: int) -> dict:
    """Save after 4 steps, train 4 more; a fresh run loads and trains the same 4: same weights."""
    accelerator, model, optimizer, scheduler, train, _ = prepared(name)
    batches = iter(train)
    steps(accelerator, model, optimizer, scheduler, batches, 4)
    ckpt = OUT / f"two_{name}"
    accelerator.save_state(ckpt)
    files = sorted(p.name for p in (ckpt / "sharded").iterdir())
    weights_at_save = full_weights(accelerator, model)
    if rank == 0:
        torch.save(weights_at_save, OUT / f"two_{name}_weights.pt")
        torch.save(optimizer.optimizer.param_groups[0]["lr"], OUT / f"two_{name}_lr.pt")
    continued_norms = steps(accelerator, model, optimizer, scheduler, batches, 4)
    continued = full_weights(accelerator, model)

    accelerator, model, optimizer, scheduler, train, _ = prepared(name)
    accelerator.load_state(ckpt)  # the loader continues after the 4 batches saved
    loaded_norms = steps(accelerator, model, optimizer, scheduler, iter(train), 4)
    resumed = full_weights(accelerator, model)
    return {
        "files": files,
        "diff": max_diff(continued, resumed) if rank == 0 else None,
        "norms": [continued_norms, loaded_norms],
    }


def save_one() -> dict:
    accelerator, model, optimizer, scheduler, train, _ = prepared("fsdp")
    steps(accelerator, model, optimizer, scheduler, iter(train), 6)
    (OUT / "one").mkdir(exist_ok=True)
    accelerator.save_state(OUT / "one" / "ckpt")
    torch.save(full_weights(accelerator, model), OUT / "one" / "weights.pt")
    return {"files": sorted(p.name for p in (OUT / "one" / "ckpt").iterdir()),
            "lr": scheduler.get_last_lr()[0]}


def load_one() -> dict:
    result = {}
    # (strategy now, checkpoint): each sharded one, and the fsdp one under ddp.
    for name, saved_by in (("zero1", "zero1"), ("fsdp-zero3", "fsdp-zero3"), ("ddp", "fsdp-zero3")):
        accelerator, model, optimizer, scheduler, train, _ = prepared(name)
        accelerator.load_state(OUT / f"two_{saved_by}")
        saved = torch.load(OUT / f"two_{saved_by}_weights.pt")
        loaded = full_weights(accelerator, model)
        states = optimizer.optimizer.state.values()
        result[name] = {
            "diff": max_diff(loaded, saved),
            "lr": optimizer.param_groups[0]["lr"],
            "saved_lr": torch.load(OUT / f"two_{saved_by}_lr.pt"),
            "optimizer_states": len(states),
            "optimizer_steps": sorted({float(s["step"]) for s in states}),
        }
        steps(accelerator, model, optimizer, scheduler, iter(train), 2)  # the loaded state steps on
        result[name]["moved_after_steps"] = max_diff(full_weights(accelerator, model), saved) > 0
    return result


if __name__ == "__main__":
    OUT.mkdir(parents=True, exist_ok=True)
    run = {"train": train_mode, "save-one": save_one, "load-one": load_one}[MODE]
    outcome = run()
    rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
    (OUT / f"{MODE}_rank{rank}.json").write_text(json.dumps(outcome))
