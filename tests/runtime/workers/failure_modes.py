"""Worker for tests/runtime/test_failures_launch.py: one way for a job to fail, chosen by argv.

Usage: failure_modes.py OUT_DIR MODE
- ``raise``: rank 1 raises ValueError in a function of this file while rank 0 waits at a barrier;
- ``sigkill``: rank 1 kills itself with SIGKILL while rank 0 waits at a barrier;
- ``sleep``: every rank writes OUT_DIR/pid<rank> and "ready <rank>" on stdout, then sleeps
  (the test sends Ctrl-C).
A failing rank writes OUT_DIR/failing_at (`time.time()` just before it fails), which
benchmarks/launcher_failures.py reads to time how long the launcher takes to report it.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

from runtime import Accelerator


def fail_on_purpose() -> None:
    raise ValueError("bad batch on rank 1")  # the test looks for this line


def main() -> None:
    out, mode = Path(sys.argv[1]), sys.argv[2]
    accelerator = Accelerator()
    accelerator.wait_for_everyone()
    rank = accelerator.process_index
    if mode in ("raise", "sigkill") and rank == 1:
        (out / "failing_at").write_text(repr(time.time()))
    if mode == "raise" and rank == 1:
        fail_on_purpose()
    if mode == "sigkill" and rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    if mode == "sleep":
        (out / f"pid{rank}").write_text(str(os.getpid()))
        print(f"ready {rank}", flush=True)
        time.sleep(120)
    accelerator.wait_for_everyone()


if __name__ == "__main__":
    main()
