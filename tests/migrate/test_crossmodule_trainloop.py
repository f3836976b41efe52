"""The TrainLoop shape in-process (no launches): a trainer class of another module that the script
builds, its optimizer over a parameter list it keeps, the model alias it wraps in DDP by hand,
nested helpers of its methods, and the sharding of the batch stream it draws with `next(...)`; on
copies of fixtures/repos/trainloop/in and on one small single-file trainer."""

from __future__ import annotations

import shutil
from pathlib import Path

from migrate.engine import Options
from migrate.runner import migrate_text, run

REPO = Path(__file__).resolve().parents[2] / "fixtures" / "repos" / "trainloop" / "in"


def _copy(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    shutil.copytree(REPO, repo)
    return repo


def _results(repo: Path):  # type: ignore[no-untyped-def]
    report = run([repo], Options(), write=False)
    return {str(Path(r.path).relative_to(repo)): r for r in report.results}


def _line(text: str, needle: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), 1) if needle in line)


def test_a_trainer_class_the_script_builds_is_migrated_in_its_own_module(tmp_path: Path) -> None:
    results = _results(_copy(tmp_path))
    loop = results["tiny_diffusion/train_util.py"]
    assert loop.changed and not any(d.code == "AM013" for d in loop.diagnostics)
    text = loop.new_text or ""
    assert "        self.accelerator = Accelerator()\n" in text
    # the optimizer's `self.master_params` is `list(self.model.parameters())`: the model is prepared,
    # into the alias the class trains through; `self.model` stays the bare module it saves
    assert "self.ddp_model, self.opt = self.accelerator.prepare(self.model, self.opt)" in text
    assert "DDP(" not in text and "self.ddp_model = self.model" not in text
    # the script creates nothing, so it gets no import it would not use
    assert not results["scripts/image_train.py"].changed
    # the dataset takes its shard from `dist.get_rank()`: the Accelerator's process group, so right
    assert not any(d.code == "AM004" for r in results.values() for d in r.diagnostics)


def test_the_kept_process_group_helper_is_reported(tmp_path: Path) -> None:
    results = _results(_copy(tmp_path))
    helper = results["tiny_diffusion/dist_util.py"]
    assert any(d.code == "AM007" and "`setup_dist`" in d.message for d in helper.diagnostics)


def test_a_stream_sharded_by_mpi_is_reported_at_the_rank_read(tmp_path: Path) -> None:
    repo = _copy(tmp_path)
    datasets = repo / "tiny_diffusion" / "image_datasets.py"
    text = datasets.read_text().replace("import torch.distributed as dist\n", "from mpi4py import MPI\n")
    text = text.replace("dist.get_rank()", "MPI.COMM_WORLD.Get_rank()").replace("dist.get_world_size()", "MPI.COMM_WORLD.Get_size()")
    datasets.write_text(text)
    results = _results(repo)
    found = [d for d in results["tiny_diffusion/image_datasets.py"].diagnostics if d.code == "AM004"]
    assert len(found) == 1 and found[0].line == _line(text, "Get_rank()")
    assert "`load_data()`" in found[0].message and "`torch.distributed.get_rank()`" in found[0].message
    assert results["tiny_diffusion/train_util.py"].changed  # the rest still migrates


def test_an_unsharded_stream_names_the_generator_that_must_take_the_rank(tmp_path: Path) -> None:
    repo = _copy(tmp_path)
    datasets = repo / "tiny_diffusion" / "image_datasets.py"
    text = datasets.read_text().replace("shard=dist.get_rank()", "shard=0").replace("num_shards=dist.get_world_size()", "num_shards=1")
    datasets.write_text(text)
    results = _results(repo)
    found = [d for r in results.values() for d in r.diagnostics if d.code == "AM004"]
    assert len(found) == 1 and "from `load_data()`" in found[0].message


def test_a_process_group_set_up_from_mpi_ranks_says_how_to_launch(tmp_path: Path) -> None:
    repo = _copy(tmp_path)
    helper = repo / "tiny_diffusion" / "dist_util.py"
    text = helper.read_text().replace("import torch as th\n", "import torch as th\nfrom mpi4py import MPI\n")
    text = text.replace('int(os.environ.get("RANK", "0"))', "MPI.COMM_WORLD.rank")
    helper.write_text(text)
    results = _results(repo)
    found = [d for d in results["tiny_diffusion/dist_util.py"].diagnostics if "`setup_dist`" in d.message]
    assert len(found) == 1 and "starts its processes with MPI" in found[0].message and "LOCAL_RANK" in found[0].message
    assert found[0].line == _line(text, "dist.init_process_group(") and found[0].unconverted
    assert not any(r.changed for r in results.values())  # the unit is left whole (tests/migrate/test_mpi_launch.py)


TRAINER = '''import torch
import torch.distributed as dist
from torch.nn.parallel.distributed import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset


class Trainer:
    def __init__(self, model, loader):
        self.model = model
        self.loader = loader
        self.params = list(self.model.parameters())
        self.opt = torch.optim.SGD(self.params, lr=0.1)
        if torch.cuda.is_available():
            self.ddp_model = DDP(self.model)
        else:
            self.ddp_model = self.model
        self.steps = 0

    def run(self):
        for x, y in self.loader:
            with self.ddp_model.no_sync():
                loss = torch.nn.functional.mse_loss(self.ddp_model(x), y)
            loss.backward()
            self.opt.step()
        self.save()

    def save(self):
        def write(path):
            if dist.get_rank() == 0:
                torch.save(self.model.state_dict(), path)

        write("model.pt")


def main():
    data = TensorDataset(torch.randn(8, 2), torch.randn(8, 1))
    Trainer(torch.nn.Linear(2, 1), DataLoader(data, batch_size=4)).run()


if __name__ == "__main__":
    main()
'''


def _trainer() -> str:
    result = migrate_text(TRAINER, "trainer.py", Options())
    assert result.new_text is not None, result.diagnostics
    return result.new_text


def test_an_alias_wrapped_in_ddp_in_both_branches_is_what_prepare_binds() -> None:
    text = _trainer()
    assert "self.ddp_model, self.opt, self.loader = self.accelerator.prepare(\n            self.model, self.opt, self.loader" in text
    assert "torch.cuda.is_available()" not in text and "DDP" not in text  # the whole if/else went
    assert "with self.accelerator.accumulate(self.ddp_model):" in text  # the model the loop trains


def test_no_sync_on_an_attribute_goes_through_the_accelerator() -> None:
    # on one process the prepared model is the bare module, which has no `no_sync`
    assert "with self.accelerator.no_sync(self.ddp_model):" in _trainer()


def test_a_function_nested_in_a_method_reads_self_accelerator() -> None:
    text = _trainer()
    assert "        def write(path):\n            if self.accelerator.is_main_process:" in text
    assert 'write("model.pt")' in text  # no `accelerator` parameter threaded through it


def test_without_am007_the_alias_keeps_its_bindings_and_prepare_binds_the_model() -> None:
    result = migrate_text(TRAINER, "trainer.py", Options(ignore=frozenset({"AM007"})))
    text = result.new_text or ""
    assert "self.model, self.opt, self.loader = self.accelerator.prepare(" in text
    assert "self.ddp_model, self.opt" not in text  # the kept `self.ddp_model = ...` would overwrite it
