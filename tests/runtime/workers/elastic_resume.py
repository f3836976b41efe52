"""Worker for the elastic-restart test: train, checkpoint every step, resume from the newest.

Usage: elastic_resume.py PROJECT_DIR [--kill-at STEP]

The resume idiom under ``accel launch --max-restarts K``: automatic checkpoint naming under
``project_dir``, and ``load_state()`` at start when a ``checkpoint_*`` directory exists. With
``--kill-at``, rank 1 of the first attempt (``TORCHELASTIC_RESTART_COUNT=0``) SIGKILLs itself right
after the checkpoint of that step; the restarted attempt resumes from it (its rank 1 starts 2 s
late, which made a restarted group that read the previous attempt's rendezvous keys fail). Rank 0 writes the final
weights to PROJECT_DIR/final.pt and the number of attempts it saw to PROJECT_DIR/attempt.txt
(the killed rank leaves PROJECT_DIR/killed.txt, the step it died at).
The model has dropout and the loader shuffles: the RNG states and loader positions must be
restored exactly for the final weights to match an uninterrupted run.
"""

from __future__ import annotations

import glob
import os
import signal
import sys
import time
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from runtime import Accelerator, ProjectConfiguration

TOTAL_STEPS = 7  # 3 batches per rank and epoch: the kill falls mid-epoch


class Step:
    def __init__(self) -> None:
        self.value = 0

    def state_dict(self) -> dict:
        return {"value": self.value}

    def load_state_dict(self, state: dict) -> None:
        self.value = state["value"]


def main() -> None:
    project_dir = sys.argv[1]
    kill_at = int(sys.argv[3]) if len(sys.argv) > 3 and sys.argv[2] == "--kill-at" else None
    if os.environ.get("TORCHELASTIC_RESTART_COUNT") == "1" and os.environ.get("RANK") == "1":
        # A restarted rank that reaches init_process_group late (slow imports, a busy node):
        # its peer then reads the rendezvous store before this rank's new address is in it.
        time.sleep(2)
    torch.manual_seed(0)
    accelerator = Accelerator(
        project_dir=project_dir,
        project_config=ProjectConfiguration(automatic_checkpoint_naming=True, total_limit=2),
    )
    gen = torch.Generator().manual_seed(1)
    data = TensorDataset(torch.randn(24, 4, generator=gen), torch.randn(24, 1, generator=gen))
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Dropout(0.2), nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    loader = DataLoader(data, batch_size=4, shuffle=True)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    step = Step()
    accelerator.register_for_checkpointing(step)
    if glob.glob(os.path.join(project_dir, "checkpoints", "checkpoint_*")):
        accelerator.load_state()  # the newest complete checkpoint
    first_attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
    while step.value < TOTAL_STEPS:
        for x, y in loader:
            loss = nn.functional.mse_loss(model(x), y)
            optimizer.zero_grad()
            accelerator.backward(loss)
            optimizer.step()
            step.value += 1
            accelerator.save_state()
            if step.value == kill_at and first_attempt and accelerator.process_index == 1:
                (Path(project_dir) / "killed.txt").write_text(str(step.value))
                os.kill(os.getpid(), signal.SIGKILL)
            if step.value == TOTAL_STEPS:
                break
    if accelerator.is_main_process:
        weights = accelerator.unwrap_model(model).state_dict()
        torch.save(weights, Path(project_dir) / "final.pt")
        (Path(project_dir) / "attempt.txt").write_text(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    accelerator.end_training()


if __name__ == "__main__":
    main()
