"""Strategies ddp / zero1 / fsdp-zero3 / fsdp-zero2 on 2 gloo processes, and sharded checkpoints
resumed on 2 and on 1 process (workers/strategies.py: one 1-process save, one 2-process launch,
one 1-process load)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from rt_helpers import WORKERS, read_ranks, run_cmd, torchrun

WORKER = WORKERS / "strategies.py"


def _json(out: Path, name: str) -> dict:
    import json

    return json.loads((out / name).read_text())


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, list[dict], dict]:
    out = tmp_path_factory.mktemp("strategies")
    proc = run_cmd([sys.executable, str(WORKER), str(out), "save-one"], cwd=out)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    proc = torchrun(WORKER, str(out), "train", cwd=out, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ranks = [_json(out, f"train_rank{r}.json") for r in range(2)]
    proc = run_cmd([sys.executable, str(WORKER), str(out), "load-one"], cwd=out)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return _json(out, "save-one_rank0.json"), ranks, _json(out, "load-one_rank0.json")


def test_every_strategy_trains_to_ddps_weights(runs) -> None:
    _, ranks, _ = runs
    main = ranks[0]["strategies"]
    assert [main[name]["strategy"] for name in main] == ["ddp", "zero1", "fsdp-zero3", "fsdp-zero2"]
    for name, record in main.items():
        # Accumulation (2 micro-steps), clipping and a scheduler: any step the strategy got
        # wrong (an optimizer stepping the unsharded copies, a scheduler driving the replaced
        # optimizer, a skipped gradient reduction) moves the weights far more than 1e-5.
        assert record["max_weight_diff_to_ddp"] < 1e-5, name
        assert record["max_pred_diff_to_ddp"] < 1e-5, name
        assert record["lr"] == pytest.approx(main["ddp"]["lr"]), name
        # clip_grad_norm_ returns the total norm over every shard: the same on both ranks and
        # the same as DDP's (whose gradients are whole on each rank).
        assert record["norms"] == pytest.approx(main["ddp"]["norms"], rel=1e-5), name
        assert ranks[1]["strategies"][name]["norms"] == pytest.approx(record["norms"], rel=1e-6)
        # gather_for_metrics: the 10 eval samples, padding removed, under every strategy.
        assert [r["strategies"][name]["eval_rows"] for r in ranks] == [10, 10]


def test_sharded_strategies_hold_a_share_of_parameters_and_optimizer_state(runs) -> None:
    _, ranks, _ = runs
    for rank in ranks:
        s = rank["strategies"]
        assert s["ddp"]["param_fraction"] == 1.0 and s["ddp"]["optimizer_fraction"] == 1.0
        assert s["zero1"]["param_fraction"] == 1.0  # ZeRO-1 shards the optimizer state only
        assert 0.4 <= s["zero1"]["optimizer_fraction"] <= 0.6
        for name in ("fsdp-zero3", "fsdp-zero2"):
            # Outside forward/backward both keep 1/N of every parameter (dim-0 shards).
            assert s[name]["param_fraction"] == pytest.approx(0.5, abs=0.05), name
            assert s[name]["optimizer_fraction"] == pytest.approx(0.5, abs=0.05), name
    assert sum(r["strategies"]["zero1"]["optimizer_fraction"] for r in ranks) == pytest.approx(1.0)
    # The consolidated state dict (get_state_dict / save_model) is on the main process only.
    assert [r["strategies"]["fsdp-zero3"]["weights_on_this_rank"] for r in ranks] == [True, False]


def test_sharded_checkpoints_resume_at_two_and_at_one_process(runs) -> None:
    one, ranks, loaded = runs
    # Written by one process under fsdp: DCP's folder next to the usual files, no model file.
    assert "sharded" in one["files"] and "pytorch_model.bin" not in one["files"]
    for name in ("zero1", "fsdp-zero3"):
        resume = ranks[0]["strategies"][name]["resume"]
        # Each rank wrote its own shard file.
        assert {"__0_0.distcp", "__1_0.distcp", ".metadata"} <= set(resume["files"])
        # 2 -> 2: the loaded run continues exactly (weights, optimizer state, lr, loader position).
        assert resume["diff"] == 0.0, name
        assert resume["norms"][0] == resume["norms"][1], name
        # 2 -> 1: the full weights and every parameter's optimizer state, at the saved step.
        assert loaded[name]["diff"] == 0.0, name
        assert loaded[name]["lr"] == pytest.approx(loaded[name]["saved_lr"]), name
        assert loaded[name]["optimizer_states"] == 16, name  # one per parameter tensor
        assert loaded[name]["optimizer_steps"] == [2.0], name  # 4 micro-steps / 2 accumulated
        assert loaded[name]["moved_after_steps"], name
    # The 2-process fsdp checkpoint loaded by a 1-process ddp run: whole tensors again.
    assert loaded["ddp"]["diff"] == 0.0 and loaded["ddp"]["optimizer_states"] == 16
    assert loaded["ddp"]["lr"] == pytest.approx(loaded["ddp"]["saved_lr"])
    # 1 -> 2: the one-process fsdp checkpoint loaded into a model sharded on 2 processes.
    assert ranks[0]["one_to_two_diff"] == 0.0
    assert [r["one_to_two_lr"] for r in ranks] == [one["lr"], one["lr"]]


def test_fsdp_trains_in_bf16_like_ddp(runs) -> None:
    _, ranks, _ = runs
    ddp, fsdp = ranks[0]["bf16_ddp"], ranks[0]["bf16_fsdp"]
    # MixedPrecisionPolicy: fsdp's forward sees bf16 parameters; ddp's autocast casts on the fly.
    assert fsdp["weight_dtype_in_forward"] == "torch.bfloat16"
    assert ddp["weight_dtype_in_forward"] == "torch.float32"
    # Same start, and it trains as far as ddp in bf16 (AdamW makes the weights themselves drift
    # apart with bf16 rounding, so the loss is compared, not the weights).
    assert fsdp["loss"][0] == pytest.approx(ddp["loss"][0], rel=0.02)
    assert fsdp["loss"][1] < 0.7 * fsdp["loss"][0]
    assert fsdp["loss"][1] == pytest.approx(ddp["loss"][1], rel=0.15)


def test_fsdp_cpu_offload_is_refused_on_cpu_with_the_reason(runs) -> None:
    _, ranks, _ = runs
    message = ranks[0]["cpu_offload_error"]
    assert message is not None
    assert "CPUOffloadPolicy needs a GPU" in message and "drop cpu_offload=True" in message


def test_saving_a_sharded_state_dict_is_refused_on_every_rank(runs) -> None:
    _, ranks, _ = runs
    for rank in ranks:
        message = rank["strategies"]["fsdp-zero3"]["save_shards_error"]
        # Saved from the main process, rank 0's shards would pass for the whole model.
        assert message is not None and "accelerator.get_state_dict(model)" in message
        assert "on EVERY process" in message
        assert rank["strategies"]["fsdp-zero3"]["shards_file_written"] is False
