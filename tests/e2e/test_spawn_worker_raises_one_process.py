"""The SimSiam / MoCo worker shape (fixtures/remove_distributed_boilerplate/spawn_worker_raises_without_group):
`mp.spawn(main_worker, ...)` under `--multiprocessing-distributed`, the worker joining the group
under `if args.distributed:` and raising `NotImplementedError("Only DistributedDataParallel is
supported.")` on every other branch. The original trains on one GPU as a process group of one; the
migration sets `args.distributed = accelerator.num_processes > 1` (the runtime starts no group on
one process), so AM007 reports the `raise` with what makes one process train. Executed here: on 2
processes the migrated script trains (each rank its half, the main process prints); on one
process it raises as reported; with the report's advice followed literally (the `raise`
statements replaced by `pass`, launched with `accel launch --nproc-per-node 1`) it trains.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))
from rt_helpers import run_cmd  # noqa: E402

from call_recording import accel_executable, migrated_script  # noqa: E402

TIMEOUT = 180
ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "fixtures" / "remove_distributed_boilerplate" / "spawn_worker_raises_without_group.in.py"
STEP = re.compile(r"^epoch (\d) step (\d) loss -?[0-9.]+$", re.M)
RAISE = 'raise NotImplementedError("Only DistributedDataParallel is supported.")'


def test_worker_that_raises_without_a_group_is_reported_and_the_advice_trains(tmp_path: Path) -> None:
    text = FIXTURE.read_text().replace(
        "            optimizer.step()\n",
        '            optimizer.step()\n            print(f"epoch {epoch} step {i} loss {loss.item():.6f}")\n')
    original, migrated = migrated_script(tmp_path, text, TIMEOUT)
    source = migrated.read_text()
    assert source.count(RAISE) == 2 and "args.distributed = accelerator.num_processes > 1" in source
    report = run_cmd([sys.executable, "-m", "migrate", "--diff", str(original)], ROOT, TIMEOUT)
    assert "every branch `if args.distributed:` leaves ends in" in report.stdout + report.stderr

    two = run_cmd([accel_executable(), "launch", "--nproc-per-node", "2", str(migrated)], tmp_path, TIMEOUT)
    assert two.returncode == 0, two.stdout + two.stderr
    # 256 samples, `-b 64` per node split over the node's 2 processes: 4 steps of 32 per epoch on each rank
    assert [(e, s) for e, s in STEP.findall(two.stdout)] == [(str(e), str(s)) for e in range(2) for s in range(4)]

    one = run_cmd([sys.executable, str(migrated)], tmp_path, TIMEOUT)
    assert one.returncode != 0 and "NotImplementedError" in one.stderr  # as the report says

    followed = tmp_path / "followed.py"
    followed.write_text(source.replace(RAISE, "pass"))
    advice = run_cmd([accel_executable(), "launch", "--nproc-per-node", "1", str(followed)], tmp_path, TIMEOUT)
    assert advice.returncode == 0, advice.stdout + advice.stderr
    assert [(e, s) for e, s in STEP.findall(advice.stdout)] == [(str(e), str(s)) for e in range(2) for s in range(4)]


def test_inline_flag_sampler_worker_migrates_whole_and_trains_on_one_and_two(tmp_path: Path) -> None:
    """The same worker with `DistributedSampler(data) if args.distributed else None` and a
    non-distributed branch that trains (fixtures/.../spawn_flag_sampler_inline): migrated whole (a
    second run changes nothing: the batch moves of the loader the sampler keeps sharding stay), it
    trains on one process (the whole data, 4 steps of 64) and on two (4 steps of 32 per rank)."""
    fixture = FIXTURE.with_name("spawn_flag_sampler_inline.in.py")
    text = fixture.read_text().replace(
        "            optimizer.step()\n",
        '            optimizer.step()\n            print(f"epoch {epoch} step {i} loss {loss.item():.6f}")\n')
    original, migrated = migrated_script(tmp_path, text, TIMEOUT)
    source = migrated.read_text()
    assert "images = images.to(accelerator.device, non_blocking=True)" in source
    again = run_cmd([sys.executable, "-m", "migrate", "--check", str(migrated)], ROOT, TIMEOUT)
    assert again.returncode == 0, again.stdout + again.stderr

    steps = [(str(e), str(s)) for e in range(2) for s in range(4)]
    one = run_cmd([sys.executable, str(migrated)], tmp_path, TIMEOUT)
    assert one.returncode == 0, one.stdout + one.stderr
    assert STEP.findall(one.stdout) == steps
    two = run_cmd([accel_executable(), "launch", "--nproc-per-node", "2", str(migrated)], tmp_path, TIMEOUT)
    assert two.returncode == 0, two.stdout + two.stderr
    assert STEP.findall(two.stdout) == steps
