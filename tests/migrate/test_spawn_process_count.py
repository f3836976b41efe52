"""The process count an `mp.spawn` conversion passes where the spawn passed `nprocs` (AM007).

`mp.spawn` starts `nprocs` processes on one node; the ImageNet example's lineage passes that count
to the worker as `ngpus_per_node` and divides the node's batch (`-b`, the batch of all GPUs of the
node) and its loader workers by it. The direct call the conversion writes must pass the launcher's
count on this node (`LOCAL_WORLD_SIZE`), not the job's (`WORLD_SIZE`): on 2 nodes x 4 processes
the original divides by 4 and a job-wide count would divide by 8, halving the global batch at the
same learning rate (reader 30, imagenet main.py:134). In-process, on a small script of that shape.
"""

from __future__ import annotations

import libcst as cst

from migrate.engine import migrate_source

SCRIPT = '''import argparse

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

parser = argparse.ArgumentParser()
parser.add_argument("-b", "--batch-size", type=int, default=32)
parser.add_argument("--world-size", type=int, default=1)
parser.add_argument("--rank", type=int, default=0)
parser.add_argument("--dist-url", default="tcp://127.0.0.1:23456")
parser.add_argument("--gpu", type=int, default=None)
parser.add_argument("--multiprocessing-distributed", action="store_true")


def main_worker(gpu, ngpus_per_node, args):
    args.gpu = gpu
    if args.distributed:
        args.rank = args.rank * ngpus_per_node + gpu
        dist.init_process_group(backend="gloo", init_method=args.dist_url, world_size=args.world_size, rank=args.rank)
    model = torch.nn.Linear(4, 2)
    if args.distributed:
        args.batch_size = int(args.batch_size / ngpus_per_node)
        model = torch.nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    data = torch.utils.data.TensorDataset(torch.randn(64, 4))
    sampler = torch.utils.data.distributed.DistributedSampler(data) if args.distributed else None
    loader = torch.utils.data.DataLoader(data, batch_size=args.batch_size, shuffle=(sampler is None), sampler=sampler)
    for (x,) in loader:
        loss = model(x).sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def main():
    args = parser.parse_args()
    args.distributed = args.world_size > 1 or args.multiprocessing_distributed
    ngpus_per_node = torch.cuda.device_count()
    if args.multiprocessing_distributed:
        args.world_size = ngpus_per_node * args.world_size
        mp.spawn(main_worker, nprocs=ngpus_per_node, args=(ngpus_per_node, args))
    else:
        main_worker(args.gpu, ngpus_per_node, args)


if __name__ == "__main__":
    main()
'''


def _worker_call(text: str) -> cst.Call:
    calls = []

    class Calls(cst.CSTVisitor):
        def visit_Call(self, node: cst.Call) -> None:
            if isinstance(node.func, cst.Name) and node.func.value == "main_worker":
                calls.append(node)

    cst.parse_module(text).visit(Calls())
    (call,) = calls
    return call


def _evaluate(expression: cst.BaseExpression, environ: dict[str, str]) -> object:
    """The value the migrated call passes, with `environ` as the process's environment."""
    args = type("Args", (), {"gpu": None})
    return eval(cst.Module([]).code_for_node(expression), {"environ": environ, "args": args})


def test_the_spawns_process_count_becomes_the_nodes() -> None:
    result = migrate_source(SCRIPT)
    text = result.new_text
    assert text is not None, result.diagnostics
    assert "mp.spawn(" not in text and "init_process_group" not in text and "from os import environ" in text
    assert "args.batch_size = int(args.batch_size / ngpus_per_node)" in text  # the node's batch, divided as before
    index, count, _ = (arg.value for arg in _worker_call(text).args)
    # `accel launch --nnodes 2 --nproc-per-node 4`, the second process of the second node: the
    # original's spawn passed 4 (its node's processes) and the index 1
    launched = {"LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4", "WORLD_SIZE": "8", "RANK": "5"}
    assert (_evaluate(index, launched), _evaluate(count, launched)) == (1, 4)
    # `python script.py`: one process, the user's `--gpu` (None) as before
    assert (_evaluate(index, {}), _evaluate(count, {})) == (None, 1)
    assert migrate_source(text).new_text is None  # stays converted
