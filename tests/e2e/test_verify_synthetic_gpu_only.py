"""`verify --synthetic` on a GPU-only, already-distributed script without a GPU: the interception
(migrate/verify_synthetic.txt) makes an NCCL process group a gloo one, drops DDP's `device_ids`,
times `torch.cuda.Event` on the CPU clock, shuffles a one-process DistributedSampler as the loader's own shuffle would, runs the runtime's
Accelerator without fp16 (the original's
CUDA autocast does nothing on the CPU), and answers a plain-text download (`requests.get`,
`urllib.request.urlopen` / `urlretrieve` of a `.txt` URL) with generated text when it fails
offline; any other failing download still raises. Run in a subprocess (the interception patches
torch for the rest of its process), with the requests stand-in of synthetic_scripts/standins."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

from importlib import resources

STANDINS = Path(__file__).resolve().parent / "synthetic_scripts" / "standins"

PROBE = r'''
import json, os, sys, urllib.request
import torch
import _accel_verify_synthetic as synthetic
synthetic.install()
import requests
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

result = {}
response = requests.get("https://example.org/books/novel.txt", timeout=3)
response.raise_for_status()
result["requests_text"] = response.text[:40]
result["requests_len"] = len(response.text)
result["same_again"] = requests.get("https://example.org/books/novel.txt").text == response.text
with urllib.request.urlopen("https://example.org/books/other.txt") as page:
    result["urlopen_len"] = len(page.read().decode("utf-8"))
urllib.request.urlretrieve("https://example.org/books/third.txt", "third.txt")
result["retrieved"] = os.path.getsize("third.txt")
try:
    requests.get("https://example.org/archive.tgz")
    result["archive"] = "answered"
except OSError as error:
    result["archive"] = type(error).__name__

dist.init_process_group(backend="nccl", init_method=sys.argv[1], rank=0, world_size=1)
result["backend"] = dist.get_backend()
model = DistributedDataParallel(nn.Linear(4, 1).cuda(), device_ids=[0])
start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
start.record()
model(torch.randn(2, 4, device="cuda")).sum().backward()
end.record()
torch.cuda.synchronize()
result["elapsed_ms"] = start.elapsed_time(end)
result["grad"] = model.module.weight.grad is not None
result["memory"] = torch.cuda.max_memory_allocated()
dist.destroy_process_group()
from torch.utils.data import DistributedSampler, RandomSampler
torch.manual_seed(5)
first = list(DistributedSampler(range(10), num_replicas=1, rank=0, shuffle=True))
torch.manual_seed(5)
result["sampler_as_random"] = first == list(RandomSampler(range(10))) and first != list(range(10))
result["two_ranks_untouched"] = sorted(DistributedSampler(range(10), num_replicas=2, rank=1, seed=3)) == sorted(
    list(DistributedSampler.__iter__.__wrapped__(DistributedSampler(range(10), num_replicas=2, rank=1, seed=3))))
from runtime import Accelerator
result["mixed_precision"] = Accelerator(mixed_precision="fp16").mixed_precision
result["replaced"] = list(synthetic.replaced)
print(json.dumps(result))
'''


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_gpu_only_distributed_script_runs_on_cpu(tmp_path: Path) -> None:
    (tmp_path / "_accel_verify_synthetic.py").write_text(
        (resources.files("migrate") / "verify_synthetic.txt").read_text(encoding="utf-8"), encoding="utf-8")
    (tmp_path / "probe.py").write_text(PROBE, encoding="utf-8")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(STANDINS), str(tmp_path)]), CUDA_VISIBLE_DEVICES="",
               ACCEL_VERIFY_SYNTHETIC="3", OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "probe.py", f"tcp://127.0.0.1:{_free_port()}"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["requests_len"] == 200_000 and result["same_again"] is True
    assert result["requests_text"].split()[0].isalpha()
    assert result["urlopen_len"] == 200_000 and result["retrieved"] == 200_000
    assert result["archive"] == "ConnectionError"  # only plain-text URLs are answered
    assert result["backend"] == "gloo"
    assert result["grad"] is True and result["elapsed_ms"] >= 0 and result["memory"] == 0
    replaced = "\n".join(result["replaced"])
    assert "requests.get('https://example.org/books/novel.txt') (ConnectionError" in replaced
    assert "init_process_group(backend='nccl')" in replaced
    assert "DistributedDataParallel(device_ids=...)" in replaced
    assert result["sampler_as_random"] is True and result["two_ranks_untouched"] is True
    assert result["mixed_precision"] == "no"  # the original's CUDA autocast does nothing on the CPU either
    assert "`runtime.Accelerator(mixed_precision='fp16')`: CUDA is not available here" in replaced
