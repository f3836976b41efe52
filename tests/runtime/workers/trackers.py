"""Trackers on every rank: ``Accelerator(log_with=[...], project_dir=OUT/proj)``, 4 ``log`` calls.

Usage: trackers.py OUT. Logs with tensorboard and jsonl (and mlflow, into a ``file:`` store under
OUT, when mlflow is installed), with a config, a tensor value, a step and a sample count. Each rank
writes OUT/rank<r>.json: what ``trackers`` and ``get_tracker`` gave it, and, on the main process,
whether ``end_training`` closed the tracker files.
"""

import importlib.util
import json
import os
import sys

out = sys.argv[1]
HAVE_MLFLOW = importlib.util.find_spec("mlflow") is not None
if HAVE_MLFLOW:
    os.environ["MLFLOW_TRACKING_URI"] = "file:" + os.path.join(out, "mlruns")
    os.environ["MLFLOW_ALLOW_FILE_STORE"] = "true"  # mlflow 3 refuses a file store without it

import torch  # noqa: E402

from runtime import Accelerator  # noqa: E402

kinds = ["tensorboard", "jsonl"] + (["mlflow"] if HAVE_MLFLOW else [])
accelerator = Accelerator(cpu=True, log_with=kinds, project_dir=os.path.join(out, "proj"))
rank = accelerator.process_index
accelerator.init_trackers("exp", config={"lr": 0.5, "batch_size": 4, "optimizer": "sgd"})
for step in range(4):
    # Each rank logs its own value: only rank 0's may reach the files.
    loss = torch.tensor(1.0 / (step + 1) + 10.0 * rank)
    accelerator.log({"loss": loss, "rank": rank}, step=step, samples=4)
trackers = accelerator.trackers
no_op = accelerator.get_tracker("tensorboard", unwrap=True)
no_op.add_scalar("on_every_rank", 1.0, 0)  # a SummaryWriter on rank 0, a no-op elsewhere
result = {
    "trackers": [t.name for t in trackers],
    "tensorboard_unwrapped": type(no_op).__name__,
    "jsonl_tracker": type(accelerator.get_tracker("jsonl")).__name__,
}
accelerator.end_training()
if trackers:
    by_name = {t.name: t for t in trackers}
    result["jsonl_closed"] = by_name["jsonl"].file.closed
    result["tensorboard_closed"] = by_name["tensorboard"].writer.file_writer is None
    result["trackers_after_end"] = [t.name for t in accelerator.trackers]
with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
    json.dump(result, f)
