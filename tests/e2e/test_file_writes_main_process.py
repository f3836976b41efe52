"""File writes and a download on 2 processes: only the main process writes (AM009).

A training script downloads an archive (`urllib.request.urlretrieve` of a `file://` URL, only when
it is missing), unpacks it (`tarfile` `extractall`), loads the data every process trains on, and
each epoch saves an image (`torchvision.utils.save_image`), a plot (`plt.savefig`) and appends a
line to a text file (`with open(path, "a")`). Neither torchvision nor matplotlib is installed here:
fake modules of the same names, put on PYTHONPATH by the test, record each call with the rank that
made it (as does the `filter=` the script unpacks with, one line per member unpacked). The script is
migrated with the CLI and launched with `accel launch --nproc-per-node 2`: rank 0 must have made
every call, rank 1 none, the text file must hold each line once, and both ranks must have read the
unpacked data (the barrier after the download). On one process the migrated script must make
exactly the calls the original makes.
"""

from __future__ import annotations

import io
import sys
import tarfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))
from rt_helpers import run_cmd  # noqa: E402

from call_recording import RECORD_CALLS, accel_executable, migrated_script, recorded_calls  # noqa: E402

TIMEOUT = 180

FAKE_TV_UTILS = RECORD_CALLS + '''

def save_image(tensor, fp, **kwargs):
    _record(f"save_image {os.path.basename(str(fp))} {tuple(tensor.shape)}")
'''

FAKE_PYPLOT = RECORD_CALLS + '''

def plot(*args, **kwargs):
    pass


def savefig(fname, **kwargs):
    _record(f"savefig {os.path.basename(str(fname))}")
'''

FAKE_RECORDING = RECORD_CALLS + '''

def record_member(member, path):
    _record(f"unpack {member.name}")
    return member
'''

SCRIPT = '''
import os
import sys
import tarfile
import urllib.request

import matplotlib.pyplot as plt
import torch
from recording import record_member
from torch.utils.data import DataLoader
from torchvision.utils import save_image


def main(out):
    torch.manual_seed(0)
    archive = os.path.join(out, "points.tar")
    if not os.path.exists(archive):
        urllib.request.urlretrieve("file://" + os.environ["SOURCE_ARCHIVE"], archive)
    with tarfile.open(archive) as tar:
        tar.extractall(os.path.join(out, "data"), filter=record_member)
    points = torch.load(os.path.join(out, "data", "points.pt"))
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(points, batch_size=4)
    seen = 0
    for epoch in range(2):
        for x in loader:
            loss = model(x).pow(2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            seen += len(x)
        save_image(model.weight.detach().view(1, 1, 2, 2), os.path.join(out, f"weights_{epoch}.png"))
        plt.plot([epoch], [loss.item()])
        plt.savefig(os.path.join(out, "loss.pdf"))
        with open(os.path.join(out, "samples.txt"), "a") as f:
            f.write(f"epoch {epoch}\\n")
    print("seen", seen)


if __name__ == "__main__":
    main(sys.argv[1])
'''


def _setup(tmp_path: Path) -> tuple[Path, Path, Path, Path]:
    fakes = tmp_path / "fakes"
    (fakes / "torchvision").mkdir(parents=True)
    (fakes / "torchvision" / "__init__.py").write_text("")
    (fakes / "torchvision" / "utils.py").write_text(FAKE_TV_UTILS)
    (fakes / "matplotlib").mkdir()
    (fakes / "matplotlib" / "__init__.py").write_text("")
    (fakes / "matplotlib" / "pyplot.py").write_text(FAKE_PYPLOT)
    (fakes / "recording.py").write_text(FAKE_RECORDING)
    source = tmp_path / "source.tar"
    buffer = io.BytesIO()
    torch.save(torch.randn(32, 4), buffer)
    with tarfile.open(source, "w") as tar:
        info = tarfile.TarInfo("points.pt")
        info.size = len(buffer.getvalue())
        tar.addfile(info, io.BytesIO(buffer.getvalue()))
    original, migrated = migrated_script(tmp_path, SCRIPT, TIMEOUT)
    return fakes, source, original, migrated


def _run(fakes: Path, source: Path, script: Path, out: Path, nproc: int | None) -> tuple[dict[str, list[str]], str]:
    out.mkdir()
    env = ["env", f"PYTHONPATH={fakes}", f"LOG_CALLS_DIR={out}", f"SOURCE_ARCHIVE={source}"]
    launch = [accel_executable(), "launch", "--nproc-per-node", str(nproc)] if nproc else [sys.executable]
    cmd = [*env, *launch, str(script), str(out)]
    result = run_cmd(cmd, cwd=out, timeout=TIMEOUT)
    assert result.returncode == 0, f"{cmd} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    calls = recorded_calls(out)
    return calls, result.stdout


def test_file_writes_and_download_run_on_the_main_process_only(tmp_path: Path) -> None:
    fakes, source, original, migrated = _setup(tmp_path)
    text = migrated.read_text()
    assert "if accelerator.is_main_process:\n        if not os.path.exists(archive):" in text, text
    assert text.count("accelerator.wait_for_everyone()") == 2, text
    assert "if accelerator.is_main_process:\n            save_image(" in text, text
    assert "Accelerator()" in text, text  # the prepared DataLoader moves the batches: no cpu=True

    expected = [
        "unpack points.pt",
        "save_image weights_0.png (1, 1, 2, 2)", "savefig loss.pdf",
        "save_image weights_1.png (1, 1, 2, 2)", "savefig loss.pdf",
    ]
    single, single_out = _run(fakes, source, original, tmp_path / "original", None)
    assert single == {"calls_rank0": expected}
    one, one_out = _run(fakes, source, migrated, tmp_path / "one", None)
    assert one == single and one_out == single_out
    assert (tmp_path / "one" / "samples.txt").read_text() == "epoch 0\nepoch 1\n"

    two, two_out = _run(fakes, source, migrated, tmp_path / "two", 2)
    assert two == {"calls_rank0": expected}, "rank 1 wrote too" if "calls_rank1" in two else two
    assert (tmp_path / "two" / "samples.txt").read_text() == "epoch 0\nepoch 1\n"
    assert "seen 32" in two_out, two_out  # each rank trained on its half of the unpacked data
