"""A prepared model moved away and back (`model.eval().cpu()` to save, then `model.to(device)`)
still averages its gradients.

Moving a parameter to another device or dtype gives it a new gradient accumulator that DDP's
reducer never hooked: plain DDP then leaves every later gradient local and the ranks drift apart
without an error. On a CPU machine the same happens with a dtype round trip (`double()` then
`float()`), which is what this test does.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

from tests.runtime.rt_helpers import torchrun

SCRIPT = textwrap.dedent('''
    import json, os, sys
    import torch
    from runtime import Accelerator

    accelerator = Accelerator(cpu=True)
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = accelerator.prepare(model, optimizer)
    x = torch.full((2, 3), float(accelerator.process_index + 1))  # rank 0: ones, rank 1: twos
    grads = []
    for step in range(3):
        optimizer.zero_grad()
        accelerator.backward(model(x).sum())
        grads.append(model.weight.grad[0, 0].item())
        optimizer.step()
        model.eval().double()  # away from where prepare() put the parameters...
        model.float().train()  # ...and back
    out = {"grads": grads, "weight": model.weight.flatten().tolist()}
    with open(os.path.join(sys.argv[1], f"rank{accelerator.process_index}.json"), "w") as f:
        json.dump(out, f)
''')


def test_gradients_are_averaged_after_a_round_trip(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    result = torchrun(script, str(tmp_path), cwd=Path(__file__).resolve().parents[2], timeout=180)
    assert result.returncode == 0, result.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    # each rank's gradient of a weight is 2 * its input (2 or 4): averaged, 3 at every step
    assert ranks[0]["grads"] == [3.0, 3.0, 3.0]
    assert ranks[1]["grads"] == [3.0, 3.0, 3.0]
    assert ranks[0]["weight"] == ranks[1]["weight"]
