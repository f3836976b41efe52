"""`mp.spawn` launchers that compute the rank and the world size into `args`
(migrate/roles/spawn_namespace.py, converted by AM007), the parameter groups filled from a
model's parameters that such scripts optimise (migrate/roles/optimizers.py), and their explicit
collectives (guarded by `is_initialized()`), in-process on small scripts."""

from __future__ import annotations

import libcst as cst

from migrate.engine import migrate_source
from migrate.roles import spawn_namespace

WORKER = '''
def main_worker(gpu, args):
    args.rank += gpu
    torch.distributed.init_process_group(
        backend="nccl", init_method=args.dist_url, world_size=args.world_size, rank=args.rank)
    model = torch.nn.Linear(4, 4).cuda(gpu)
    model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[gpu])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = torch.utils.data.DataLoader(torch.randn(16, 4), batch_size=8 // args.world_size)
    for x in loader:
        loss = model(x.cuda(gpu)).sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    if args.rank == 0:
        torch.save(model.module.state_dict(), "w.pt")
'''

SPAWNER = '''
def main():
    args = parser.parse_args()
    args.ngpus_per_node = torch.cuda.device_count()
    if "SLURM_JOB_ID" in os.environ:
        signal.signal(signal.SIGUSR1, handler)
        host = subprocess.check_output(["scontrol"]).decode()
        args.rank = int(os.environ["SLURM_NODEID"]) * args.ngpus_per_node
        args.world_size = int(os.environ["SLURM_NNODES"]) * args.ngpus_per_node
        args.dist_url = f"tcp://{host}:58472"
    else:
        args.rank = 0
        args.dist_url = "tcp://localhost:58472"
        args.world_size = args.ngpus_per_node
    torch.multiprocessing.spawn(main_worker, (args,), args.ngpus_per_node)
'''

HEADER = "import os\nimport signal\nimport subprocess\nimport argparse\n\nimport torch\n\nparser = argparse.ArgumentParser()\n"
MAIN = "\n\nif __name__ == '__main__':\n    main()\n"


def _find(source: str) -> spawn_namespace.NamespaceRank | str | None:
    module = cst.parse_module(source)
    functions = {s.name.value: s for s in module.body if isinstance(s, cst.FunctionDef)}
    main, worker = functions["main"], functions["main_worker"]
    assert isinstance(main.body, cst.IndentedBlock) and isinstance(worker.body, cst.IndentedBlock)
    spawn = main.body.body[-1]
    init = worker.body.body[1]
    small = init.body[0]  # type: ignore[attr-defined]
    return spawn_namespace.find(module, main, spawn, worker, [cst.Name("args")], small.value, init)


def test_the_computation_goes_and_what_only_it_read_goes_with_it() -> None:
    source = HEADER + SPAWNER + WORKER + MAIN
    found = _find(source)
    assert isinstance(found, spawn_namespace.NamespaceRank)
    assert found.namespace == "args"
    assert found.attributes == {"rank": "rank", "world_size": "world_size", "init_method": "dist_url"}
    gone = {cst.Module([]).code_for_node(s).strip().splitlines()[0]: r for s, r in found.replace.items()}
    # `args.ngpus_per_node` was read only by the removed world size and the spawn's process count
    assert gone["args.ngpus_per_node = torch.cuda.device_count()"] == []
    assert gone["args.rank += gpu"] == []
    # the SLURM block keeps its signal handler and loses `host` (read only by the address); the else goes
    (slurm,) = gone['if "SLURM_JOB_ID" in os.environ:']
    assert cst.Module([slurm]).code == 'if "SLURM_JOB_ID" in os.environ:\n    signal.signal(signal.SIGUSR1, handler)\n'
    assert [cst.Module([]).code_for_node(s) for s in found.assignments()] == [
        "args.rank = accelerator.process_index\n", "args.world_size = accelerator.num_processes\n"]


def test_a_binding_read_elsewhere_stays() -> None:
    worker = WORKER.replace("    if args.rank == 0:", "    print(args.ngpus_per_node)\n    if args.rank == 0:")
    found = _find(HEADER + SPAWNER + worker + MAIN)
    assert isinstance(found, spawn_namespace.NamespaceRank)
    kept = [cst.Module([]).code_for_node(s).strip() for s in found.replace]
    assert "args.ngpus_per_node = torch.cuda.device_count()" not in kept


def test_the_whole_script_is_converted_and_stays_converted() -> None:
    result = migrate_source(HEADER + SPAWNER + WORKER + MAIN)
    text = result.new_text
    assert text is not None, result.diagnostics
    assert "torch.multiprocessing.spawn" not in text and "init_process_group" not in text
    assert 'main_worker(int(os.environ.get("LOCAL_RANK", "0")), args)' in text
    assert "    accelerator = Accelerator()\n    args.rank = accelerator.process_index\n" in text
    assert "dist_url" not in text and "else:" not in text and "host" not in text
    assert "signal.signal(signal.SIGUSR1, handler)" in text
    assert "if args.rank == 0:" in text  # now the accelerator's rank
    assert migrate_source(text).new_text is None


def test_the_spawner_reading_the_rank_itself_is_refused_with_the_reason() -> None:
    spawner = SPAWNER.replace("    torch.multiprocessing.spawn(", "    print(args.rank)\n    torch.multiprocessing.spawn(")
    assert _find(HEADER + spawner + WORKER + MAIN) == (
        "`main` itself reads `args.rank`, which the launcher computes now")
    result = migrate_source(HEADER + spawner + WORKER + MAIN)
    assert result.new_text is None
    assert any(d.code == "AM007" and "`main` itself reads `args.rank`" in d.message for d in result.diagnostics)


def test_parameter_groups_filled_from_the_model_find_the_model() -> None:
    source = '''import torch


class LARS(torch.optim.Optimizer):
    def __init__(self, params, lr):
        super().__init__(params, dict(lr=lr))


def main():
    model = torch.nn.Linear(4, 4)
    weights, biases = [], []
    for p in model.parameters():
        if p.ndim == 1:
            biases.append(p)
        else:
            weights.append(p)
    optimizer = LARS([{"params": weights}, {"params": biases}], lr=0.1)
    loader = torch.utils.data.DataLoader(torch.randn(16, 4), batch_size=4)
    for x in loader:
        loss = model(x).sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
''' + MAIN
    text = migrate_source(source).new_text
    assert text is not None
    assert "model, optimizer, loader = accelerator.prepare(model, optimizer, loader)" in text


def test_an_in_place_collective_is_guarded_once() -> None:
    source = '''import torch
import torch.distributed as dist


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)

    def forward(self, x):
        c = self.fc(x).T @ x
        dist.all_reduce(c)
        return c.sum()


def main():
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = torch.utils.data.DataLoader(torch.randn(16, 4), batch_size=4)
    for x in loader:
        loss = model(x)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
''' + MAIN
    result = migrate_source(source)
    assert result.new_text is not None
    assert "        if dist.is_initialized():\n            dist.all_reduce(c)\n" in result.new_text
    assert not any("explicit collective kept" in d.message for d in result.diagnostics)
    assert migrate_source(result.new_text).new_text is None
