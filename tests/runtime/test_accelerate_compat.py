"""The same training script under our ``runtime`` and under HF ``accelerate`` (import swapped).

workers/compat_train.py trains an MLP (AdamW, LambdaLR, gradient_accumulation_steps=2,
``accumulate``, ``backward``) on a shuffling loader of 70 samples (batch 8: the last batch is short,
and 9 batches do not split evenly over 2 ranks), then evaluates on 37 samples with
``gather_for_metrics``. It runs twice per backend: once with plain ``python`` (1 process) and once
under torchrun (2 gloo processes, ``cpu=True``); all four jobs run concurrently. Losses, learning
rates and weights are recorded with ``float.hex`` and compared exactly.

What holds (each asserted below):
- 1 process: identical batches, losses, sync_gradients, learning rates, eval outputs and final weights
  under both, with or without an explicit DataLoader ``generator``.
- 2 processes, DataLoader with ``generator=``: identical per-rank batches and losses (and weights).
- 2 processes without a generator: Accelerate seeds the sampler at ``prepare`` time (one draw from
  the global RNG there), so its global order differs from one process's; our runtime draws the seed
  where a plain DataLoader does and shares rank 0's, so its order equals the one-process order
  (docs/runtime.md, "Compatibility with HF Accelerate"; issue 3, "Equivalence"). Asserted as a documented difference.
- ``gather_for_metrics`` returns exactly len(eval dataset) = 37 items under both, on 1 and 2 processes.

The accelerate-dependent tests skip when ``accelerate`` is not installed; the runtime-only ones do not.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.utils.data import RandomSampler

from rt_helpers import TIMEOUT_S, WORKERS, child_env
from runtime.data import SharedSeedRandomSampler

WORKER = WORKERS / "compat_train.py"
TRAIN_SIZE, EVAL_SIZE, BATCH = 70, 37, 8  # mirrors the worker
N = 2
HAVE_ACCELERATE = importlib.util.find_spec("accelerate") is not None


def _command(backend: str, nproc: int, out: Path) -> list[str]:
    if nproc == 1:
        return [sys.executable, str(WORKER), backend, str(out)]
    return [sys.executable, "-m", "torch.distributed.run", "--standalone",
            "--nproc-per-node", str(nproc), str(WORKER), backend, str(out)]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, int], list[dict]]:
    """{(backend, nproc): [rank results]} for every backend installed, 1 and 2 processes."""
    backends = ["runtime"] + (["accelerate"] if HAVE_ACCELERATE else [])
    root = tmp_path_factory.mktemp("compat")
    jobs = {}
    for backend in backends:
        for nproc in (1, N):
            out = root / f"{backend}{nproc}"
            out.mkdir()
            jobs[backend, nproc] = (out, subprocess.Popen(
                _command(backend, nproc, out), cwd=out, env=child_env(),
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            ))
    results = {}
    try:
        for key, (out, proc) in jobs.items():
            try:
                output, _ = proc.communicate(timeout=TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                pytest.fail(f"{key} hung for {TIMEOUT_S}s:\n{proc.communicate()[0]}")
            assert proc.returncode == 0, f"{key}:\n{output}"
            results[key] = [json.loads((out / f"rank{r}.json").read_text()) for r in range(key[1])]
    finally:
        for _, proc in jobs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return results


def need_accelerate() -> None:
    pytest.importorskip("accelerate")


def field(run: dict, name: str) -> list:
    return [step[name] for step in run["steps"]]


def global_order(ranks: list[dict], variant: str) -> list[list[int]]:
    """Per epoch, the samples in global order: rank batches interleaved, padding cut off."""
    per_rank = [field(r[variant], "idx") for r in ranks]
    per_epoch = len(per_rank[0]) // 2  # the worker trains 2 epochs
    epochs = []
    for e in range(2):
        rounds = zip(*(batches[e * per_epoch:(e + 1) * per_epoch] for batches in per_rank))
        epochs.append([i for batches in rounds for batch in batches for i in batch][:TRAIN_SIZE])
    return epochs


VARIANTS = ["generator", "global_rng"]


@pytest.mark.parametrize("variant", VARIANTS)
def test_one_process_bit_identical_to_accelerate(runs, variant: str) -> None:
    need_accelerate()
    ours, theirs = runs["runtime", 1][0][variant], runs["accelerate", 1][0][variant]
    assert len(ours["steps"]) == 2 * 9  # 9 batches per epoch, 2 epochs
    for name in ("idx", "loss", "sync", "lr"):
        assert field(ours, name) == field(theirs, name), name
    assert ours["eval_pred"] == theirs["eval_pred"]
    assert ours["weights"] == theirs["weights"]
    losses = [float.fromhex(h) for h in field(ours, "loss")]
    assert sum(losses[9:]) < sum(losses[:9])  # it really trains: epoch 2's mean loss is lower


def test_two_processes_same_per_rank_batches_and_losses_with_generator(runs) -> None:
    need_accelerate()
    ours, theirs = runs["runtime", N], runs["accelerate", N]
    for rank in range(N):
        a, b = ours[rank]["generator"], theirs[rank]["generator"]
        assert len(a["steps"]) == 2 * 5  # ceil(9 / 2) batches per epoch and rank
        for name in ("idx", "loss", "sync", "lr"):
            assert field(a, name) == field(b, name), (rank, name)
        assert a["eval_pred"] == b["eval_pred"]
        assert a["weights"] == b["weights"]
    # The ranks really got different data, and DDP kept their weights equal.
    assert field(ours[0]["generator"], "idx") != field(ours[1]["generator"], "idx")
    assert ours[0]["generator"]["weights"] == ours[1]["generator"]["weights"]


def test_accumulation_sync_pattern_matches_accelerate(runs) -> None:
    need_accelerate()
    # Every 2nd micro-step, and always at the loader's last batch (then the count restarts).
    one = [False, True, False, True, False, True, False, True, True]
    two = [False, True, False, True, True]
    for backend in ("runtime", "accelerate"):
        assert field(runs[backend, 1][0]["generator"], "sync") == one * 2, backend
        for rank in range(N):
            assert field(runs[backend, N][rank]["generator"], "sync") == two * 2, (backend, rank)


@pytest.mark.parametrize("backend", ["runtime", "accelerate"])
@pytest.mark.parametrize("nproc", [1, N])
def test_gather_for_metrics_returns_len_dataset(runs, backend: str, nproc: int) -> None:
    if backend == "accelerate":
        need_accelerate()
    for variant in VARIANTS:
        for rank, result in enumerate(runs[backend, nproc]):
            run = result[variant]
            assert len(run["eval_idx"]) == EVAL_SIZE, (variant, rank)
            assert run["eval_idx"] == list(range(EVAL_SIZE)), (variant, rank)
            assert len(run["eval_pred"]) == EVAL_SIZE
            # On 2 processes the loader padded 37 samples to 3 rounds of 2 x 8 = 48: 24 per rank.
            assert run["eval_local"] == (EVAL_SIZE if nproc == 1 else 24)


def test_runtime_two_processes_keep_the_one_process_order(runs) -> None:
    """With or without a generator, 2 processes walk the one-process permutation every epoch.

    With an explicit generator this needed a fix: the shared sampler used to draw a seed from the
    generator and permute with a new generator, while RandomSampler (and Accelerate) permute with
    the user's generator itself.
    """
    for variant in VARIANTS:
        one = global_order(runs["runtime", 1], variant)
        two = global_order(runs["runtime", N], variant)
        assert two == one, variant
        assert one[0] != one[1] and sorted(one[0]) == list(range(TRAIN_SIZE))


def test_without_generator_accelerate_changes_the_order_and_we_do_not(runs) -> None:
    """Documented difference: Accelerate seeds an unseeded shuffle at prepare() time on N > 1
    processes, so its N-process order (and per-rank losses) differ from one process's and from our
    runtime's; ours keeps the plain-DataLoader order. With ``generator=`` both agree (tested above).
    """
    need_accelerate()
    ours1, ours2 = runs["runtime", 1], runs["runtime", N]
    theirs1, theirs2 = runs["accelerate", 1], runs["accelerate", N]
    assert global_order(theirs1, "global_rng") == global_order(ours1, "global_rng")
    assert global_order(ours2, "global_rng") == global_order(ours1, "global_rng")
    assert global_order(theirs2, "global_rng") != global_order(theirs1, "global_rng")
    assert field(ours2[0]["global_rng"], "loss") != field(theirs2[0]["global_rng"], "loss")


def test_shared_sampler_with_generator_permutes_like_random_sampler() -> None:
    """Unit check of the fix: the user's generator is used directly, after the state is shared."""
    data = range(30)
    plain = RandomSampler(data, generator=torch.Generator().manual_seed(7))
    expected = [list(plain) for _ in range(3)]
    shared: list[torch.Generator] = []
    sampler = SharedSeedRandomSampler(
        data, share_seed=lambda s: 0, generator=torch.Generator().manual_seed(7),
        share_generator=shared.append,
    )
    global_state = torch.get_rng_state()
    assert [list(sampler) for _ in range(3)] == expected
    assert len(shared) == 3 and all(g is sampler.generator for g in shared)  # once per epoch
    assert torch.equal(torch.get_rng_state(), global_state)  # the global RNG is not touched
