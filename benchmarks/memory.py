"""Per-rank memory of the strategies (issue 14): ddp, zero1, fsdp-zero2, fsdp-zero3 on 2 processes.

One 2-process gloo job (benchmarks/memory_worker.py) trains the same model under every strategy
in turn (a stack of residual MLP blocks, 268 MB of fp32 parameters by default; AdamW), rotating
the order every round. After a step, with gradients still held, each rank counts the bytes of
parameters, gradients and optimizer state it holds; the rows are the largest rank's bytes as
ratios to ddp's, per part and in total (ZeRO's accounting: the persistent parts, not the blocks
FSDP gathers for the duration of one forward or backward, nor activations or DDP's buckets).
A second measure, the real peak: one 2-process job per strategy reports each rank's peak resident
memory growth over the step (ru_maxrss minus the size before the model was built), which also
holds what the counted parts leave out: the blocks FSDP gathers while they run (where zero2 and
zero3 differ), DDP's gradient buckets, activations, and the whole model as built before it is
sharded. Step time is the median seconds per optimizer step over the rounds, as a ratio to ddp's
measured in the same processes. Targets: a sharded part at most 1/N + 10% of ddp's (0.55 at N=2).
Asserts nothing.

Usage: python -m benchmarks --only memory   (or python benchmarks/memory.py [ROUNDS])
"""

from __future__ import annotations

import json
import sys

from benchmarks.common import PYTHON, ROOT, Row, log, median, output, pinned_env, ratio_row

WORKER = ROOT / "benchmarks" / "memory_worker.py"
STRATEGIES = ("zero1", "fsdp-zero2", "fsdp-zero3")
# Which parts each strategy shards (the others are whole, ratio 1, as in DDP).
SHARDED = {"zero1": ("optimizer",), "fsdp-zero2": ("params", "grads", "optimizer"),
           "fsdp-zero3": ("params", "grads", "optimizer")}
LIMIT = 0.5 + 0.05  # 1/N + 10% of it, N = 2


def measure(width: int, layers: int, steps: int, rounds: int, *strategy: str) -> dict:
    args = [PYTHON, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
            str(WORKER), str(width), str(layers), str(steps), str(rounds), *strategy]
    text = output(args, env=pinned_env(threads=1, PYTHONWARNINGS="ignore"), timeout=900)
    return json.loads(text.strip().splitlines()[-1])


def peak_rows(peaks: dict[str, list[int]]) -> list[Row]:
    ddp = max(peaks["ddp"])
    return [Row("memory", f"{name} peak resident growth per rank", "ddp", max(peaks[name]) / ddp, "x", 0.0,
                "", None, f"{max(peaks[name]) / 1e6:.0f} MB vs {ddp / 1e6:.0f} MB (largest rank)")
            for name in STRATEGIES]


def rows_from(result: dict) -> list[Row]:
    held = {name: {part: max(rank[name][part] for rank in result["held"])
                   for part in ("params", "grads", "optimizer")} for name in result["held"][0]}
    mb = result["parameters"] * 4 / 1e6
    rows = []
    ddp = held["ddp"]
    for name in STRATEGIES:
        for part in ("params", "grads", "optimizer"):
            value = held[name][part] / ddp[part]
            sharded = part in SHARDED[name]
            rows.append(Row("memory", f"{name} {part} per rank", "ddp", value, "x", 0.0,
                            f"<= {LIMIT:.2f}" if sharded else "", value <= LIMIT if sharded else None,
                            f"{held[name][part] / 1e6:.0f} MB vs {ddp[part] / 1e6:.0f} MB"))
        total = sum(held[name].values()) / sum(ddp.values())
        rows.append(Row("memory", f"{name} params+grads+optimizer per rank", "ddp", total, "x", 0.0, "",
                        None, f"{sum(held[name].values()) / 1e6:.0f} MB vs {sum(ddp.values()) / 1e6:.0f} "
                        f"MB; model {mb:.0f} MB fp32"))
    times = result["times"]
    for name in STRATEGIES:
        rows.append(ratio_row("memory", f"{name} step time", "ddp", times[name], times["ddp"],
                              detail=f"{median(times[name]) * 1e3:.0f} ms vs {median(times['ddp']) * 1e3:.0f} "
                              "ms per step, 2 gloo processes"))
    return rows


def run(rounds: int = 3, quick: bool = False) -> list[Row]:
    width, layers, steps = (128, 4, 1) if quick else (1024, 16, 3)
    log(f"memory: {layers} blocks of width {width}, {rounds} rounds of {steps} steps ...")
    rows = rows_from(measure(width, layers, steps, rounds))
    log("memory: peak resident growth, one job per strategy ...")
    peaks = {name: measure(width, layers, steps, 1, name)["peak"] for name in ("ddp", *STRATEGIES)}
    return rows + peak_rows(peaks)


if __name__ == "__main__":
    from benchmarks.run import print_table

    print_table(run(int(sys.argv[1]) if len(sys.argv) > 1 else 3))
