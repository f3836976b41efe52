"""Worker for test_share_streams.py: run under torchrun with 2 processes.

Writes OUT_DIR/rank{r}.json with each process's share of the streams of a (5, 4) tensor (rows:
padded by wrapping), of a (4, 6) tensor along dim=1 (columns, no padding), and the error raised
when the processes hold tensors of different shapes.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from runtime import Accelerator

out_dir = Path(sys.argv[1])
accelerator = Accelerator()
rank = accelerator.process_index
result: dict = {"rank": rank}
result["rows"] = accelerator.share_streams(torch.arange(20).view(5, 4)).tolist()
result["columns"] = accelerator.share_streams(torch.arange(24).view(4, 6), dim=1).tolist()
try:
    accelerator.share_streams(torch.zeros(3 + rank, 4))
    result["differing"] = None
except ValueError as error:
    result["differing"] = str(error)
(out_dir / f"rank{rank}.json").write_text(json.dumps(result))
