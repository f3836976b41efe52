"""N-process safety of prepare: loaders that already shard, attribute reads through the prepared
model, and process groups the script initialises itself (issue 12, items 2d-2f).

The 2-process tests start real gloo jobs through torch.distributed.run (workers/ + rt_helpers);
the rest check the same rules in-process for more sizes and fake ranks.
"""

from __future__ import annotations

import json
from collections import Counter

import pytest
import torch
from torch.utils.data import BatchSampler, DataLoader, Sampler, TensorDataset
from torch.utils.data.distributed import DistributedSampler

from runtime import Accelerator
from runtime.data import _distributed_sampler_keep_rows, kept_sharding_sampler
from runtime.errors import PrepareError

from rt_helpers import WORKERS, run_worker_once, torchrun

# -- in-process: which rows of the last gathered round are DistributedSampler padding -----------


def _gathered_epoch(size: int, n: int, batch_size: int | None, drop_last: bool) -> list[int]:
    """What gather_for_metrics returns over one epoch of n kept DistributedSampler loaders."""
    dataset = TensorDataset(torch.arange(size))
    loaders, keeps = [], []
    for rank in range(n):
        sampler = DistributedSampler(dataset, num_replicas=n, rank=rank, shuffle=True, seed=3,
                                     drop_last=drop_last)
        loader = DataLoader(dataset, batch_size=batch_size, sampler=sampler)
        loaders.append([torch.atleast_1d(b[0]).tolist() for b in loader])
        keeps.append(_distributed_sampler_keep_rows(loader, sampler))
    assert all(keep == keeps[0] for keep in keeps)  # every rank trims the same rows
    rounds = len(loaders[0])
    assert all(len(batches) == rounds for batches in loaders)
    gathered: list[int] = []
    for step in range(rounds):
        row = [i for batches in loaders for i in batches[step]]
        if step == rounds - 1 and keeps[0] is not None:
            row = [row[i] for i in keeps[0]]
        gathered += row
    return gathered


@pytest.mark.parametrize("n", [2, 3, 4])
@pytest.mark.parametrize("size", [1, 7, 10, 11, 13, 24])
@pytest.mark.parametrize("batch_size", [None, 1, 2, 3, 5])
def test_gathered_epoch_is_the_dataset_once(n: int, size: int, batch_size: int | None) -> None:
    gathered = _gathered_epoch(size, n, batch_size, drop_last=False)
    assert Counter(gathered) == Counter(range(size))


@pytest.mark.parametrize("n", [2, 3])
@pytest.mark.parametrize("size", [7, 11, 24])
def test_sampler_drop_last_has_no_padding(n: int, size: int) -> None:
    gathered = _gathered_epoch(size, n, 2, drop_last=True)
    assert len(gathered) == len(set(gathered)) == size // n * n


def test_padding_inside_the_last_round_is_not_a_tail() -> None:
    # 3 ranks, 10 samples: each rank gets 4, rank 1 and 2 end with a repeated sample, so the
    # padding sits in the middle of the gathered last round: trimming a tail would be wrong.
    dataset = TensorDataset(torch.arange(10))
    sampler = DistributedSampler(dataset, num_replicas=3, rank=0, shuffle=False)
    loader = DataLoader(dataset, batch_size=2, sampler=sampler)
    assert _distributed_sampler_keep_rows(loader, sampler) == [0, 1, 2, 4]


# -- in-process: one process ---------------------------------------------------------------------


def test_one_process_refuses_a_sampler_built_for_two() -> None:
    dataset = TensorDataset(torch.arange(8))
    loader = DataLoader(dataset, batch_size=2, sampler=DistributedSampler(dataset, num_replicas=2, rank=0))
    with pytest.raises(PrepareError) as info:
        Accelerator(cpu=True).prepare(loader)
    assert "num_replicas=2" in str(info.value) and "runs 1 process" in str(info.value)


def test_one_process_keeps_a_one_replica_sampler() -> None:
    dataset = TensorDataset(torch.arange(9))
    sampler = DistributedSampler(dataset, num_replicas=1, rank=0, shuffle=True, seed=1)
    prepared = Accelerator(cpu=True).prepare(DataLoader(dataset, batch_size=4, sampler=sampler))
    assert prepared.sampler is sampler
    got = [b[0].tolist() for b in prepared]
    sampler.set_epoch(0)
    order = list(sampler)
    assert got == [order[0:4], order[4:8], order[8:9]]


class _RankSampler(Sampler[int]):
    """A user's own sharding sampler: not a DistributedSampler, but num_replicas and rank."""

    def __init__(self, size: int, num_replicas: int, rank: int) -> None:
        self.size, self.num_replicas, self.rank = size, num_replicas, rank

    def __iter__(self):
        return iter(range(self.rank, self.size, self.num_replicas))

    def __len__(self) -> int:
        return len(range(self.rank, self.size, self.num_replicas))


def test_any_sampler_with_num_replicas_and_rank_counts_as_sharding() -> None:
    dataset = TensorDataset(torch.arange(6))
    own = _RankSampler(6, 1, 0)
    assert kept_sharding_sampler(DataLoader(dataset, sampler=own)) is own
    inner = DistributedSampler(dataset, num_replicas=2, rank=1)
    loader = DataLoader(dataset, batch_sampler=BatchSampler(inner, 2, False))
    assert kept_sharding_sampler(loader) is inner
    assert kept_sharding_sampler(DataLoader(dataset, batch_size=2, shuffle=True)) is None


class _Scaled(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = torch.nn.Linear(2, 2)
        self.temperature = 1.0
        self.autocast_dtype = "the user's own"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.encoder(x) / self.temperature


def test_one_process_returns_the_users_module() -> None:
    module = _Scaled()
    assert Accelerator(cpu=True).prepare(module) is module


def test_one_process_bf16_wrapper_reads_and_writes_reach_the_module() -> None:
    module = _Scaled()
    prepared = Accelerator(cpu=True, mixed_precision="bf16").prepare(module)
    assert prepared is not module and prepared.encoder is module.encoder
    assert module.autocast_dtype == "the user's own"  # the wrapper's own names stay its own
    x = torch.ones(1, 2)
    before = prepared(x)
    prepared.temperature = 2.0
    assert module.temperature == 2.0 and "temperature" not in prepared.__dict__
    torch.testing.assert_close(prepared(x), before / 2.0)
    prepared.new_flag = 1
    assert prepared.new_flag == 1 and not hasattr(module, "new_flag")


# -- 2 processes: a loader built with DistributedSampler -----------------------------------------


@pytest.fixture(scope="module")
def presharded(tmp_path_factory):
    ranks, _ = run_worker_once("presharded_loaders", tmp_path_factory.mktemp("presharded"))
    return ranks


CASES = ["divisible", "padded", "sequential_padded", "sampler_drop_last", "per_sample", "batch_sampler"]


@pytest.mark.parametrize("name", CASES)
def test_each_rank_sees_exactly_its_distributed_sampler_share(presharded, name: str) -> None:
    for result in presharded:
        case = result["cases"][name]
        assert case["epochs"] == case["expected"]  # the sampler's own indices, not a shard of them
        assert all(len(epoch) == case["num_samples"] for epoch in case["epochs"])


@pytest.mark.parametrize("name", CASES)
def test_no_sample_twice_beyond_the_samplers_padding(presharded, name: str) -> None:
    case0, case1 = (r["cases"][name] for r in presharded)
    size = {"divisible": 16, "padded": 11, "sequential_padded": 9, "sampler_drop_last": 11,
            "per_sample": 7, "batch_sampler": 11}[name]
    for epoch in range(2):
        seen = case0["epochs"][epoch] + case1["epochs"][epoch]
        if name == "sampler_drop_last":
            assert len(seen) == len(set(seen)) == size // 2 * 2
        else:
            assert set(seen) == set(range(size))
            assert len(seen) - size == 2 * case0["num_samples"] - size  # the sampler's padding only


def test_runtime_sets_the_epoch_of_a_kept_sampler(presharded) -> None:
    for result in presharded:
        epochs = result["cases"]["divisible"]["epochs"]
        assert epochs[0] != epochs[1]


@pytest.mark.parametrize("name", CASES)
def test_gather_for_metrics_drops_the_samplers_padding(presharded, name: str) -> None:
    for result in presharded:
        gathered = result["cases"][name]["gathered"]
        if name == "sampler_drop_last":
            assert len(gathered) == len(set(gathered)) == 10
        else:
            size = {"divisible": 16, "padded": 11, "sequential_padded": 9, "per_sample": 7,
                    "batch_sampler": 11}[name]
            assert Counter(gathered) == Counter(range(size))


def test_one_warning_on_the_main_process(presharded) -> None:
    main, other = (r["cases"]["padded"]["warnings"] for r in presharded)
    assert len(main) == 1 and "already shards by rank" in main[0] and "not sharded again" in main[0]
    assert other == []


def test_the_scripts_own_set_epoch_wins(presharded) -> None:
    for result in presharded:
        assert result["script_epoch"]["sampler_kept"]  # prepared.sampler.set_epoch(e) works
        assert result["script_epoch"]["got"] == result["script_epoch"]["expected"]


def test_a_sampler_for_another_job_is_refused_naming_both(presharded) -> None:
    for result in presharded:
        errors = result["errors"]
        assert "num_replicas=3" in errors["replicas"] and "runs 2 process(es)" in errors["replicas"]
        wrong = 1 - result["rank"]
        assert f"built for rank={wrong}" in errors["rank"]
        assert f"this process is rank {result['rank']} of 2" in errors["rank"]


# -- 2 processes: attribute reads, writes and calls through the prepared model -------------------


@pytest.fixture(scope="module")
def attrs(tmp_path_factory):
    ranks, _ = run_worker_once("prepared_model_attrs", tmp_path_factory.mktemp("attrs"))
    return ranks


def test_reads_fall_through_to_the_users_module(attrs) -> None:
    for r in attrs:
        assert r["is_ddp"] and r["output_shape"] == [1] and r["encoder_is_inner"] and r["embed_equal"]
        assert r["bf16_output_shape"] == [1] and r["bf16_embed"] == [8, 3]


def test_missing_attribute_names_both_objects(attrs) -> None:
    for r in attrs:
        assert "no_such_attribute" in r["missing_error"] and "'Net'" in r["missing_error"]


def test_state_dict_keys_are_the_users(attrs) -> None:
    for r in attrs:
        assert r["state_dict_keys"] == ["encoder.bias", "encoder.weight", "head.bias", "head.weight"]


def test_writes_to_the_modules_names_reach_its_forward(attrs) -> None:
    for r in attrs:
        assert r["write_reaches_inner"] and r["forward_sees_write"] and r["new_name_on_wrapper"]


def test_replacing_a_submodule_after_prepare_warns(attrs) -> None:
    for r in attrs:
        assert r["replace_reaches_inner"]
        assert len(r["replace_warning"]) == 1 and "not synchronised" in r["replace_warning"][0]


def test_pickle_deepcopy_and_compile(attrs) -> None:
    for r in attrs:
        assert r["pickle_roundtrip"] and r["deepcopy"]
        assert r["compile_equal"] and r["compile_attr"] == [1]


def test_model_and_encoder_calls_in_one_step_synchronise(attrs) -> None:
    for r in attrs:
        assert r["mixed_grads_match_average"]
    assert attrs[0]["mixed_grads_by_rank"][0] == attrs[0]["mixed_grads_by_rank"][1]


@pytest.mark.parametrize("label", ["method", "submodule"])
def test_a_step_that_bypasses_ddps_forward_is_an_error(attrs, label: str) -> None:
    grads = attrs[0][f"bypass_{label}_grads_by_rank"]
    assert grads[0] != grads[1]  # plain DDP left them local: what the error is about
    for r in attrs:
        message = r[f"bypass_{label}_error"]
        assert message is not None
        assert "differ between the 2 processes" in message and "inside Net.forward" in message


def test_parameters_left_without_gradient_are_left_out_of_the_sync(attrs) -> None:
    # A backbone under torch.no_grad() whose parameters require grad: plain DDP never all-reduces
    # their bucket, so the head's gradients would stay local too. The runtime leaves the
    # backbone out of the synchronisation (runtime/unused_parameters.py; trained in
    # tests/runtime/test_unused_parameters.py) and averages the first step's gradients itself.
    for r in attrs:
        assert r["no_grad_backbone_error"] is None
    grads = attrs[0]["no_grad_backbone_head_grads_by_rank"]
    assert grads[0] == grads[1]


# -- 2 processes: the script's own init_process_group and the Accelerator ------------------------


def test_script_initialises_the_group_then_the_accelerator_reuses_it(tmp_path) -> None:
    proc = torchrun(WORKERS / "group_order.py", "script_first", str(tmp_path), cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr

    for rank in range(2):
        r = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert r["num_processes"] == 2 and r["same_group"] and r["gathered"] == [0, 1]
        assert r["grads_by_rank"][0] == r["grads_by_rank"][1]
        assert r["initialised_after_end_training"] and r["destroyed_by_script"]


def test_accelerator_then_scripts_init_fails_with_the_fix(tmp_path) -> None:
    proc = torchrun(WORKERS / "group_order.py", "accelerator_first", str(tmp_path), cwd=tmp_path)
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert not list(tmp_path.glob("rank*.json"))
    for rank in range(2):
        assert f"[rank{rank}]: ValueError: trying to initialize the default process group twice" in output
        assert f"[rank{rank}]:   fix: create the Accelerator after the script's own init_process_group" in output
