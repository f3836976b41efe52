"""A download function and a file written then read back, on 2 processes: each runs whole, once (AM009).

A training script calls its own download function (skip when the data file exists; else
`urlretrieve` of a `file://` URL, `extractall`, then `os.rename` of the unpacked file), splits the
data with a fake `pandas` (put on PYTHONPATH by the test, so nothing is installed), writes the
training split with `to_csv` and builds its Dataset from that CSV at once. The fake `to_csv` writes
its rows in two halves with a pause between them and records each call with the rank that made it;
the fake `read_csv` raises on a file without its end marker, as a parser would on a truncated file.

Before this, the migrated script guarded the fetch and the unpack but left the rename on every
process after the barrier: rank 1 failed with FileNotFoundError. Now the call of the download
function runs on the main process only, followed by `accelerator.wait_for_everyone()`, and the
`to_csv` runs on the main process with a barrier before the read. At 2 processes: one fetch, one
`to_csv`, both ranks train on their half, and the per-batch `sys.stdout.write` status lines come
from rank 0 alone; run again in the same folder (the data already there,
the function returns early on the main process alone), it neither hangs nor fetches. On one
process the migrated script prints what the original prints and writes the same calls.
"""

from __future__ import annotations

import io
import sys
import tarfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))
from rt_helpers import run_cmd  # noqa: E402

from call_recording import RECORD_CALLS, accel_executable, migrated_script, recorded_calls  # noqa: E402

TIMEOUT = 180

FAKE_PANDAS = RECORD_CALLS + '''
import time

END = "# end"


class DataFrame:
    def __init__(self, rows):
        self.rows = [list(map(float, row)) for row in rows]

    def __len__(self):
        return len(self.rows)

    def head(self, n):
        return DataFrame(self.rows[:n])

    def to_csv(self, path, index=None):
        _record(f"to_csv {os.path.basename(str(path))}")
        lines = [",".join(str(v) for v in row) for row in self.rows]
        half = len(lines) // 2
        with open(path, "w") as f:
            f.write("\\n".join(lines[:half]) + "\\n")
            f.flush()
            time.sleep(0.5)  # a reader on another process now sees a truncated file
            f.write("\\n".join(lines[half:]) + "\\n" + END + "\\n")


def read_csv(path):
    with open(path) as f:
        lines = f.read().splitlines()
    if not lines or lines[-1] != END:
        raise ValueError(f"Error tokenizing data: {path} ends early")
    return DataFrame(line.split(",") for line in lines[:-1])
'''

SCRIPT = '''
import os
import sys
import tarfile
import urllib.request

import pandas as pd
import torch
from torch.utils.data import DataLoader, Dataset


def fetch_data(url, archive, folder, data_file):
    if os.path.exists(data_file):
        print("data already there")
        return
    urllib.request.urlretrieve(url, archive)
    with tarfile.open(archive) as tar:
        tar.extractall(folder)
    os.rename(os.path.join(folder, "raw.csv"), data_file)
    print("fetched", os.path.basename(data_file))


class CsvPoints(Dataset):
    def __init__(self, csv_file):
        self.frame = pd.read_csv(csv_file)

    def __len__(self):
        return len(self.frame)

    def __getitem__(self, index):
        return torch.tensor(self.frame.rows[index])


def main(workdir):
    torch.manual_seed(0)
    data_file = os.path.join(workdir, "points.csv")
    fetch_data("file://" + os.environ["SOURCE_ARCHIVE"], os.path.join(workdir, "points.tar"), workdir, data_file)
    frame = pd.read_csv(data_file)
    train_path = os.path.join(workdir, "train.csv")
    train_frame = frame.head(16)
    train_frame.to_csv(train_path, index=None)
    loader = DataLoader(CsvPoints(train_path), batch_size=4)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    seen = 0
    for x in loader:
        loss = model(x).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        seen += len(x)
        sys.stdout.write(f"batch {seen}\\n")
    print("seen", seen)


if __name__ == "__main__":
    main(sys.argv[1])
'''


def _setup(tmp_path: Path) -> tuple[Path, Path, Path, Path]:
    fakes = tmp_path / "fakes"
    (fakes / "pandas").mkdir(parents=True)
    (fakes / "pandas" / "__init__.py").write_text(FAKE_PANDAS)
    source = tmp_path / "source.tar"
    rows = "\n".join(",".join(str(float(i * 4 + j) / 100) for j in range(4)) for i in range(24))
    data = (rows + "\n# end\n").encode()
    with tarfile.open(source, "w") as tar:
        info = tarfile.TarInfo("raw.csv")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    original, migrated = migrated_script(tmp_path, SCRIPT, TIMEOUT)
    return fakes, source, original, migrated


def _run(fakes: Path, source: Path, script: Path, out: Path, nproc: int | None):
    out.mkdir(exist_ok=True)
    for old in out.glob("calls_rank*.txt"):
        old.unlink()
    env = ["env", f"PYTHONPATH={fakes}", f"LOG_CALLS_DIR={out}", f"SOURCE_ARCHIVE={source}"]
    launch = [accel_executable(), "launch", "--nproc-per-node", str(nproc)] if nproc else [sys.executable]
    result = run_cmd([*env, *launch, str(script), str(out)], cwd=out, timeout=TIMEOUT)
    return result, recorded_calls(out)


def test_download_function_and_csv_read_back_run_whole_on_the_main_process(tmp_path: Path) -> None:
    fakes, source, original, migrated = _setup(tmp_path)
    text = migrated.read_text()
    assert ("    if accelerator.is_main_process:\n"
            "        fetch_data(") in text, text
    assert ("    if accelerator.is_main_process:\n"
            "        train_frame.to_csv(train_path, index=None)\n"
            "    accelerator.wait_for_everyone()\n") in text, text
    assert "    os.rename(os.path.join(folder, \"raw.csv\"), data_file)\n" in text, text  # untouched inside

    single, single_calls = _run(fakes, source, original, tmp_path / "original", None)
    assert single.returncode == 0, single.stderr[-3000:]
    one, one_calls = _run(fakes, source, migrated, tmp_path / "one", None)
    assert one.returncode == 0, one.stderr[-3000:]
    assert one.stdout == single.stdout and one_calls == single_calls == {"calls_rank0": ["to_csv train.csv"]}

    two, calls = _run(fakes, source, migrated, tmp_path / "two", 2)
    assert two.returncode == 0, f"{two.stdout[-3000:]}\n{two.stderr[-3000:]}"
    assert calls == {"calls_rank0": ["to_csv train.csv"]}, calls
    assert two.stdout.count("fetched points.csv") == 1, two.stdout  # one process fetched and renamed
    assert "seen 8" in two.stdout, two.stdout  # each rank read the whole CSV and trained on its half
    assert two.stdout.count("batch ") == 2, two.stdout  # the status lines of rank 0's 2 batches only

    # Again in the same folder: the main process skips the download and returns early; no hang.
    again, calls = _run(fakes, source, migrated, tmp_path / "two", 2)
    assert again.returncode == 0, f"{again.stdout[-3000:]}\n{again.stderr[-3000:]}"
    assert again.stdout.count("data already there") == 1 and "fetched" not in again.stdout, again.stdout
    assert calls == {"calls_rank0": ["to_csv train.csv"]}, calls
