"""`Accelerator(kwargs_handlers=[DistributedDataParallelKwargs(...)])` at 2 gloo processes: every
option the migration carries from a removed `DDP(model, ...)` wrap (AM007, migrate/ddp_options.py)
is the one the prepared model's DistributedDataParallel runs with (workers/ddp_kwargs.py)."""

from __future__ import annotations

from pathlib import Path

from rt_helpers import WORKERS, read_ranks, torchrun


def test_every_carried_option_reaches_ddp_at_2_processes(tmp_path: Path) -> None:
    proc = torchrun(WORKERS / "ddp_kwargs.py", str(tmp_path), cwd=tmp_path, nproc=2, timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ranks = read_ranks(tmp_path, 2)
    for rank, result in enumerate(ranks):
        assert result["dim"] == 1
        assert result["broadcast_buffers"] is False
        assert result["bucket_bytes_cap"] == 7 * 1024 * 1024
        assert result["find_unused_parameters"] is True
        assert result["gradient_as_bucket_view"] is True
        assert result["static_graph"] is True
        # broadcast_buffers=False: rank 0's statistics are not copied to the others, at prepare either
        assert result["before"] == result["after"] == [float(rank + 1)] * 6
    assert ranks[0]["weight"] == ranks[1]["weight"]  # the gradients are still averaged
