"""Processes started by MPI (migrate/roles/mpi_launch.py), in-process: fixtures/repos/mpi (the
improved-diffusion shape: the process group, the device, the data shard, a checkpoint broadcast
and the logger's rank all from MPI) is refused whole, every MPI read reported at its own line; its
twin fixtures/repos/mpi_twin (the refusal's advice applied) migrates to its out/; a single script
that builds its group from MPI is refused as a file. Trained at 1 and 2 processes:
tests/e2e/test_repos_mpi_twin.py."""

from __future__ import annotations

import shutil
from pathlib import Path

from migrate.engine import Options
from migrate.runner import migrate_text, run

REPOS = Path(__file__).resolve().parents[2] / "fixtures" / "repos"


def _results(tmp_path: Path, name: str):  # type: ignore[no-untyped-def]
    repo = tmp_path / name
    shutil.copytree(REPOS / name / "in", repo)
    report = run([repo], Options(), write=False)
    return repo, {str(Path(r.path).relative_to(repo)): r for r in report.results}


def _line(path: Path, needle: str) -> int:
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if needle in line)


def test_a_unit_started_by_mpi_is_left_whole_with_every_mpi_read_named(tmp_path: Path) -> None:
    repo, results = _results(tmp_path, "mpi")
    assert not any(r.changed for r in results.values())  # nothing written: no partial unit
    helper = repo / "tiny_diffusion" / "dist_util.py"
    setup = [d for d in results["tiny_diffusion/dist_util.py"].diagnostics if "`setup_dist` builds" in d.message]
    assert len(setup) == 1 and setup[0].code == "AM007" and setup[0].unconverted
    assert setup[0].line == _line(helper, "dist.init_process_group(")
    message = setup[0].message
    for named in ("`dev`", "`load_state_dict`", "`load_data`", "`get_rank_without_mpi_import`", "`configure`",
                  "accel launch", "LOCAL_RANK", "broadcast_object_list", "os.environ.setdefault"):
        assert named in message, named
    # each other read at its own line, with the fix for what it is used for
    expected = {
        ("tiny_diffusion/dist_util.py", _line(helper, "Get_rank() % GPUS_PER_NODE")): "LOCAL_RANK",
        ("tiny_diffusion/dist_util.py", _line(helper, "if MPI.COMM_WORLD.Get_rank() == 0")): "broadcast_object_list",
        ("tiny_diffusion/image_datasets.py", _line(repo / "tiny_diffusion" / "image_datasets.py", "Get_rank()")):
            "dist.get_rank()",
        ("tiny_diffusion/logger.py", _line(repo / "tiny_diffusion" / "logger.py", "PMI_RANK")): 'os.environ.get("RANK"',
    }
    for (path, line), fix in expected.items():
        found = [d for d in results[path].diagnostics if d.line == line and d.code == "AM007"]
        assert len(found) == 1 and fix in found[0].message and found[0].unconverted, (path, line, results[path].diagnostics)
    entry = results["scripts/image_train.py"]
    assert [d.code for d in entry.diagnostics if d.unconverted] == ["AM013"]
    assert "dist_util.py" in entry.diagnostics[0].message and "already trains distributed" not in entry.diagnostics[0].message
    assert entry.outcome == "refused"


def test_the_twin_with_the_advice_applied_migrates(tmp_path: Path) -> None:
    repo, results = _results(tmp_path, "mpi_twin")
    out = REPOS / "mpi_twin" / "out"
    written = sorted(path for path, r in results.items() if r.changed)
    assert written == sorted(str(p.relative_to(out)) for p in out.rglob("*.py"))
    for path in written:
        assert results[path].new_text == (out / path).read_text(), path
    assert not any(d.unconverted for r in results.values() for d in r.diagnostics)


SCRIPT = '''import os

import torch
import torch.distributed as dist
from mpi4py import MPI


def setup():
    comm = MPI.COMM_WORLD
    os.environ["RANK"] = str(comm.Get_rank())
    os.environ["WORLD_SIZE"] = str(comm.Get_size())
    dist.init_process_group("gloo", init_method="env://")


def main():
    setup()
    model = torch.nn.Linear(4, 1)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(8, 4)[MPI.COMM_WORLD.Get_rank()::MPI.COMM_WORLD.Get_size()]
    for _ in range(3):
        optimizer.zero_grad()
        ddp(x).sum().backward()
        optimizer.step()


if __name__ == "__main__":
    main()
'''


def test_a_script_that_builds_its_group_from_mpi_is_refused_as_a_file() -> None:
    result = migrate_text(SCRIPT, "train.py", Options())
    assert result.new_text is None and result.outcome == "refused"
    lines = SCRIPT.splitlines()
    found = {d.line: d for d in result.diagnostics}
    init = next(i for i, line in enumerate(lines, 1) if "init_process_group" in line)
    shard = next(i for i, line in enumerate(lines, 1) if "Get_size()]" in line)
    assert "`setup` builds the process group" in found[init].message and "`main`" in found[init].message
    assert found[shard].code == "AM007" and "dist.get_rank()" in found[shard].message


def test_a_group_from_the_launchers_environment_is_not_mpi() -> None:
    text = SCRIPT.replace("from mpi4py import MPI\n", "").replace("comm = MPI.COMM_WORLD\n    ", "")
    text = text.replace("str(comm.Get_rank())", 'os.environ.get("RANK", "0")').replace(
        "str(comm.Get_size())", 'os.environ.get("WORLD_SIZE", "1")')
    text = text.replace("[MPI.COMM_WORLD.Get_rank()::MPI.COMM_WORLD.Get_size()]", "")
    result = migrate_text(text, "train.py", Options())
    assert result.new_text is not None and not any("MPI" in d.message for d in result.diagnostics)


def test_mpi_variables_in_one_branch_of_a_launcher_test_are_not_an_mpi_launch() -> None:
    # ConvNeXt's shape: MPI's variables read only when an MPI launcher set them, torchrun's otherwise
    text = SCRIPT.replace("from mpi4py import MPI\n", "").replace(
        '''    comm = MPI.COMM_WORLD
    os.environ["RANK"] = str(comm.Get_rank())
    os.environ["WORLD_SIZE"] = str(comm.Get_size())
''', '''    if "OMPI_COMM_WORLD_RANK" in os.environ:
        os.environ["RANK"] = os.environ["OMPI_COMM_WORLD_RANK"]
        os.environ["WORLD_SIZE"] = os.environ["OMPI_COMM_WORLD_SIZE"]
        os.environ["LOCAL_RANK"] = os.environ["OMPI_COMM_WORLD_LOCAL_RANK"]
''').replace("[MPI.COMM_WORLD.Get_rank()::MPI.COMM_WORLD.Get_size()]", "")
    assert "OMPI_COMM_WORLD_RANK" in text and "MPI." not in text
    result = migrate_text(text, "train.py", Options())
    assert result.new_text is not None and not any("starts its processes with MPI" in d.message for d in result.diagnostics)


GATHERING = '''import os

import torch
import torch.distributed as dist


def setup():
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29500")
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    dist.init_process_group("gloo", init_method="env://")


class Sampler:
    def update(self, losses):
        gathered = [torch.zeros_like(losses) for _ in range(dist.get_world_size())]
        dist.all_gather(gathered, losses)
        self.seen = torch.cat(gathered)


def main():
    setup()
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    sampler = Sampler()
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(8, 4)), batch_size=2)
    for (x,) in loader:
        optimizer.zero_grad()
        losses = model(x).squeeze(1)
        sampler.update(losses.detach())
        losses.mean().backward()
        optimizer.step()


if __name__ == "__main__":
    main()
'''


def test_a_collective_is_not_said_to_fail_on_one_process_where_the_group_is_always_created() -> None:
    # improved-diffusion's resample.py (after the MPI advice): `setup_dist` creates a group on every
    # run, a world of 1 under plain python, so the sampler's all_gather works on one process
    result = migrate_text(GATHERING, "train.py", Options())
    assert result.new_text is not None
    assert not any("fails on a single process" in d.message for d in result.diagnostics), result.diagnostics
    kept = [d for d in result.diagnostics if "`setup`" in d.message]
    assert len(kept) == 1 and "a world of 1" in kept[0].message and "needed torchrun's variables" not in kept[0].message
    # without the defaults, plain `python` has no group: the warning stays
    bare = migrate_text(GATHERING.replace('    os.environ.setdefault("RANK", "0")\n', ""), "train.py", Options())
    assert any("fails on a single process" in d.message for d in bare.diagnostics)
