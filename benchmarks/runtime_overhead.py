"""The runtime's cost: import time against `import torch`, and fixed cost per training step.

Step overhead: the same tiny training loop (Linear(16, 1), batch 8, SGD) runs plain and through
`Accelerator().prepare(...)` + `accelerator.backward`, one process, in fresh interpreters,
interleaved A/B, with glibc's mmap/trim thresholds pinned so page faults do not favour either
side. The fixed cost per step is (runtime - plain) / steps. Prints medians and ratios; asserts
nothing (timings belong here, not in tests).

Usage: python benchmarks/runtime_overhead.py [ROUNDS]
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time

STEPS = 3000
LOOP = """
import time, torch
from torch.utils.data import DataLoader, TensorDataset
torch.manual_seed(0)
torch.set_num_threads(1)
data = TensorDataset(torch.randn({n}, 16), torch.randn({n}, 1))
loader = DataLoader(data, batch_size=8)
model = torch.nn.Linear(16, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
{prepare}
for x, y in loader:  # warm-up epoch
    loss = torch.nn.functional.mse_loss(model(x), y); {backward}; optimizer.step(); optimizer.zero_grad()
start = time.perf_counter()
for x, y in loader:
    loss = torch.nn.functional.mse_loss(model(x), y); {backward}; optimizer.step(); optimizer.zero_grad()
print(time.perf_counter() - start)
"""
PLAIN = LOOP.format(n=STEPS * 8, prepare="", backward="loss.backward()")
RUNTIME = LOOP.format(
    n=STEPS * 8,
    prepare="from runtime import Accelerator\naccelerator = Accelerator()\n"
    "model, optimizer, loader = accelerator.prepare(model, optimizer, loader)",
    backward="accelerator.backward(loss)",
)


def _env() -> dict[str, str]:
    return dict(
        os.environ,
        MALLOC_MMAP_THRESHOLD_="1073741824",
        MALLOC_TRIM_THRESHOLD_="1073741824",
        OMP_NUM_THREADS="1",
    )


def _seconds(code: str) -> float:
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True, env=_env())
    return float(out.stdout.strip().splitlines()[-1])


def _wall(code: str) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, env=_env())
    return time.perf_counter() - start


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 7
    plain, runtime = [], []
    imports_torch, imports_runtime = [], []
    for _ in range(rounds):  # interleaved A/B in fresh processes
        plain.append(_seconds(PLAIN))
        runtime.append(_seconds(RUNTIME))
        imports_torch.append(_wall("import torch"))
        imports_runtime.append(_wall("from runtime import Accelerator"))
    p, r = statistics.median(plain), statistics.median(runtime)
    ti, ri = statistics.median(imports_torch), statistics.median(imports_runtime)
    print(f"import torch                     {ti * 1000:8.1f} ms")
    print(f"from runtime import Accelerator  {ri * 1000:8.1f} ms  ({ri / ti:.3f}x import torch)")
    print(f"plain loop      {p / STEPS * 1000:.4f} ms/step")
    print(f"runtime loop    {r / STEPS * 1000:.4f} ms/step  ({r / p:.3f}x plain)")
    print(f"fixed cost per step: {(r - p) / STEPS * 1000:+.4f} ms (median of {rounds} interleaved rounds)")


if __name__ == "__main__":
    main()
