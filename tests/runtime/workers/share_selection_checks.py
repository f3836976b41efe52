"""Worker for test_share_selection.py: run under torchrun with 2 processes.

Writes OUT_DIR/rank{r}.json with each process's share of an index, a mask, an empty selection and
one that needs no padding, and the error raised when the processes hold different selections.
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
result["index"] = accelerator.share_selection(torch.tensor([5, 3, 9, 1, 7])).tolist()
mask = torch.tensor([True, False, True, True, False, True, True])
result["mask"] = accelerator.share_selection(mask).tolist()
result["even"] = accelerator.share_selection(torch.arange(10, 18)).tolist()
result["empty"] = accelerator.share_selection(torch.zeros(4, dtype=torch.bool)).tolist()
second = Accelerator()  # a fresh check: each process holds its own selection
try:
    second.share_selection(torch.tensor([rank, 4]))
    result["differing"] = None
except ValueError as error:
    result["differing"] = str(error)
(out_dir / f"rank{rank}.json").write_text(json.dumps(result))
