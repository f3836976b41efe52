"""``accel estimate-memory MODULE:CALLABLE``: per-rank bytes of each strategy before launching.

The callable that builds the model runs under ``torch.device("meta")``: parameters get shapes
and dtypes but no storage, so a 10 GB model is "built" instantly and on any machine. From those
shapes this module computes, for each strategy at N ranks and each precision, what the worst
rank holds:

- **params**: ddp and zero1 keep every parameter on every rank; fsdp keeps one dim-0 shard of
  each parameter (FSDP2 pads each shard to ``ceil(dim0 / N)`` rows, so rank 0 holds the
  rounded-up share of every parameter).
- **grads**: one gradient per trainable parameter, in its dtype; sharded like the params under
  fsdp (the reduce-scatter leaves each rank its shard).
- **optimizer state**: the optimizer's per-element state (Adam: ``exp_avg`` and ``exp_avg_sq``)
  in the parameter's dtype. zero1 (``ZeroRedundancyOptimizer``) gives whole parameters to ranks,
  largest first, each to the rank with the fewest elements so far (torch's own partition): the
  worst rank is what that greedy partition gives it, not ``1/N``. fsdp shards the state with the
  parameters. Step counters live on the CPU and are not counted.
- **in step**: what exists only during forward/backward: ddp's and zero1's gradient buckets (a
  second copy of the gradients, ``DistributedDataParallel(gradient_as_bucket_view=False)``, the
  default; none on one process) and, under mixed precision, autocast's low-precision copies of
  the weights (an upper bound: every trainable parameter); fsdp-zero2's unsharded parameters
  (``reshard_after_forward=False`` keeps all of them from forward to backward); fsdp-zero3's
  unsharded parameters of the root module's own parameters plus the two largest blocks (the one
  running and the one prefetched), blocks as the fsdp strategy's default wrap policy picks them
  (``runtime.fsdp.default_blocks``: repeated layers, else each direct child).
- **total**: params + grads + optimizer state + in step + buffers (kept whole on every rank by
  every strategy). Activations, the CUDA context and allocator fragmentation are not included.

Mixed precision (bf16 / fp16) keeps the parameters, gradients and optimizer state in fp32 (the
master copy the optimizer updates); only the compute copies are 2 bytes per element: autocast's
cached weight casts under ddp / zero1, and the all-gathered unsharded parameters under fsdp
(``MixedPrecisionPolicy(param_dtype=...)``).
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import math
import re
import sys
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TextIO

STRATEGIES = ("ddp", "zero1", "fsdp-zero2", "fsdp-zero3")
PRECISIONS = ("fp32", "bf16", "fp16")
DEFAULT_PRECISIONS = ("fp32", "bf16")

# Elements of optimizer state per trainable parameter element (step counters excluded: CPU).
OPTIMIZER_STATES = {
    "adam": 2,  # exp_avg, exp_avg_sq
    "adamw": 2,
    "sgd": 0,
    "sgd-momentum": 1,  # momentum_buffer
    "rmsprop": 1,  # square_avg
    "adagrad": 1,  # sum
    "none": 0,
}

_COMPUTE_BYTES = {"fp32": None, "bf16": 2, "fp16": 2}  # None: the parameter's own dtype
_UNITS = {
    "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
}


class EstimateError(Exception):
    """Bad input for the estimate; the message is one line saying what to do."""


@dataclass(frozen=True)
class Tensor:
    """What the estimate needs of one parameter or buffer."""

    shape: tuple[int, ...]
    element_size: int
    trainable: bool
    floating: bool

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    def shard_numel(self, ranks: int) -> int:
        """Elements of the largest dim-0 shard (rank 0's; FSDP2 pads every rank to it)."""
        if not self.shape:
            return 1  # a scalar is sharded as one row
        return math.ceil(self.shape[0] / ranks) * math.prod(self.shape[1:])


@dataclass(frozen=True)
class ModelShape:
    """Parameters grouped as FSDP would wrap them, plus buffers."""

    params: tuple[Tensor, ...]
    blocks: tuple[tuple[Tensor, ...], ...]  # parameters of each block fsdp shards on its own
    buffers: tuple[Tensor, ...]

    @property
    def root_params(self) -> tuple[Tensor, ...]:
        """Parameters outside every block (the root FSDP unit's own)."""
        inside = {id(t) for block in self.blocks for t in block}
        return tuple(t for t in self.params if id(t) not in inside)


@dataclass(frozen=True)
class Row:
    strategy: str
    precision: str
    params: int
    grads: int
    optimizer: int
    in_step: int
    buffers: int

    @property
    def total(self) -> int:
        return self.params + self.grads + self.optimizer + self.in_step + self.buffers


# -- building on the meta device ----------------------------------------------------------------


def load_callable(spec: str) -> Callable[[], Any]:
    """``pkg.module:build`` or ``path/to/file.py:build`` (``Class.method`` allowed after ``:``)."""
    module_name, sep, attribute = spec.rpartition(":")
    if not sep or not module_name or not attribute:
        raise EstimateError(f"{spec!r} is not MODULE:CALLABLE (for example `mymodels:build_model` "
                            "or `models.py:Net`)")
    module = _import(module_name)
    target: Any = module
    for part in attribute.split("."):
        if not hasattr(target, part):
            raise EstimateError(f"{module_name} has no attribute {attribute!r} "
                                f"({part!r} not found); give a function or class that builds the model")
        target = getattr(target, part)
    from torch import nn

    if isinstance(target, nn.Module):
        raise EstimateError(f"{spec} is a model instance, already built (and allocated) at import; give the "
                            "function or class that builds it, so that it is built on the meta device")
    if not callable(target):
        raise EstimateError(f"{spec} is a {type(target).__name__}, not a callable that builds the model")
    return target


def _import(name: str) -> Any:
    if name.endswith(".py") or "/" in name or "\\" in name:
        path = Path(name)
        if not path.is_file():
            raise EstimateError(f"{name}: no such file")
        sys.path.insert(0, str(path.resolve().parent))  # the file's own imports of its neighbours
        spec = importlib.util.spec_from_file_location(path.stem, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules.setdefault(path.stem, module)
        try:
            spec.loader.exec_module(module)
        except Exception as error:
            raise EstimateError(f"{name}: importing it raised {type(error).__name__}: {error}") from None
        return module
    if "" not in sys.path:
        sys.path.insert(0, "")  # as `python -m`: modules of the current directory
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as error:
        if error.name is not None and (name == error.name or name.startswith(error.name + ".")):
            raise EstimateError(f"no module named {name!r} (run from the directory that holds it, "
                                "or give the path to its .py file)") from None
        raise EstimateError(f"importing {name} raised ModuleNotFoundError: {error}") from None
    except Exception as error:
        raise EstimateError(f"importing {name} raised {type(error).__name__}: {error}") from None


def build_on_meta(build: Callable[[], Any], spec: str) -> Any:
    """Call ``build()`` with the meta device as default, so that no parameter gets storage."""
    import torch
    from torch import nn

    try:
        with torch.device("meta"):
            model = build()
    except Exception as error:
        raise EstimateError(f"{spec}() raised {type(error).__name__}: {error} (it runs on the meta device: "
                            "build the model without loading weights or moving it to a device)") from None
    if not isinstance(model, nn.Module):
        raise EstimateError(f"{spec}() returned {type(model).__name__}, not a torch.nn.Module")
    allocated = [name for name, t in (*model.named_parameters(), *model.named_buffers()) if t.device.type != "meta"]
    if allocated:
        raise EstimateError(f"{spec}() put {allocated[0]!r} on {_device_of(model, allocated[0])}, not on the "
                            "meta device (a tensor created with an explicit device=); build it without one")
    return model


def _device_of(model: Any, name: str) -> str:
    tensors = dict((*model.named_parameters(), *model.named_buffers()))
    return str(tensors[name].device)


def model_shape(model: Any) -> ModelShape:
    """Shapes of the model's (unique) parameters and buffers, and the blocks the fsdp strategy's
    default wrap policy shards separately (``runtime.fsdp.default_blocks``)."""
    from .fsdp import default_blocks

    seen: dict[int, Tensor] = {}

    def describe(t: Any, trainable: bool) -> Tensor:
        if id(t) not in seen:
            seen[id(t)] = Tensor(tuple(t.shape), t.element_size(), trainable, t.is_floating_point())
        return seen[id(t)]

    params = tuple(describe(p, p.requires_grad) for p in model.parameters())
    buffers = tuple(describe(b, False) for b in model.buffers())
    blocks = tuple(tuple(seen[id(p)] for p in block.parameters()) for block in default_blocks(model))
    return ModelShape(params, blocks, buffers)


# -- the arithmetic ------------------------------------------------------------------------------


def estimate(shape: ModelShape, ranks: int, optimizer: str, precision: str) -> list[Row]:
    """One row per strategy for ``ranks`` processes and one precision."""
    if ranks < 1:
        raise EstimateError(f"--nproc must be at least 1, not {ranks}")
    states = OPTIMIZER_STATES[optimizer]
    trainable = [t for t in shape.params if t.trainable]
    compute = _COMPUTE_BYTES[precision]

    def low(t: Tensor) -> int:  # bytes per element of a compute copy
        return compute if compute is not None and t.floating else t.element_size

    full = sum(t.numel * t.element_size for t in shape.params)
    grads = sum(t.numel * t.element_size for t in trainable)
    buffers = sum(t.numel * t.element_size for t in shape.buffers)
    buckets = grads if ranks > 1 else 0
    casts = sum(t.numel * low(t) for t in trainable) if compute is not None else 0
    sharded = sum(t.shard_numel(ranks) * t.element_size for t in shape.params)
    sharded_grads = sum(t.shard_numel(ranks) * t.element_size for t in trainable)
    # ZeroRedundancyOptimizer partitions by element count; state bytes follow each parameter's dtype.
    zero1_state = states * _zero1_worst_bytes(trainable, ranks)
    unsharded = sum(t.numel * low(t) for t in shape.params)
    block_bytes = sorted((sum(t.numel * low(t) for t in block) for block in shape.blocks), reverse=True)
    zero3_live = sum(t.numel * low(t) for t in shape.root_params) + sum(block_bytes[:2])
    # One rank: no buckets, and FSDP has nothing to gather (the runtime does not shard one process).
    rows = [
        Row("ddp", precision, full, grads, states * grads, buckets + casts, buffers),
        Row("zero1", precision, full, grads, zero1_state, buckets + casts, buffers),
        Row("fsdp-zero2", precision, sharded, sharded_grads, states * sharded_grads,
            unsharded if ranks > 1 else 0, buffers),
        Row("fsdp-zero3", precision, sharded, sharded_grads, states * sharded_grads,
            zero3_live if ranks > 1 else 0, buffers),
    ]
    return rows


def add_arguments(parser: Any) -> None:
    """The ``accel estimate-memory`` options (argparse)."""
    parser.add_argument("model", metavar="MODULE:CALLABLE",
                        help="a function or class that builds the model: `pkg.models:build` or `models.py:Net`")
    parser.add_argument("--nproc", "--nproc-per-node", dest="nproc", type=int, action="append",
                        metavar="N", help="number of processes (ranks); repeat for several (default: 2)")
    parser.add_argument("--precision", action="append", choices=PRECISIONS,
                        help="fp32, or bf16/fp16 mixed precision; repeat for several (default: fp32 and bf16)")
    parser.add_argument("--optimizer", choices=tuple(OPTIMIZER_STATES), default="adam",
                        help="whose state to count (default: adam)")
    parser.add_argument("--gpu-memory", dest="gpu_memory", metavar="SIZE",
                        help="memory of one device (80GB, 79.6GiB; a bare number is GiB): says which rows fit")
    parser.add_argument("--json", action="store_true", help="print the numbers (bytes) as JSON")


def command(args: Any, out: TextIO, err: TextIO) -> int:
    """Run ``accel estimate-memory``; bad input is one line on ``err`` and exit code 2."""
    try:
        return run(args.model, args.nproc or [2], args.precision or list(DEFAULT_PRECISIONS),
                   args.optimizer, args.gpu_memory, args.json, out)
    except EstimateError as error:
        err.write(f"accel estimate-memory: error: {error}\n")
        return 2


def _zero1_worst_bytes(trainable: list[Tensor], ranks: int) -> int:
    loads = [0] * ranks
    held = [0] * ranks  # bytes of the parameters each rank owns
    for t in sorted(trainable, key=lambda t: t.numel, reverse=True):
        rank = loads.index(min(loads))
        loads[rank] += t.numel
        held[rank] += t.numel * t.element_size
    return max(held)


def parse_memory(text: str) -> int:
    """``80GB`` (10**9), ``80GiB`` (2**30), ``24`` (GiB) -> bytes."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", text)
    unit = match.group(2).lower() if match else ""
    if unit in ("k", "m", "g", "t"):
        unit += "ib"
    if match is None or (unit and unit not in _UNITS):
        raise EstimateError(f"--gpu-memory {text!r}: give a size such as 80GB, 79.6GiB or 24 (GiB)")
    return int(float(match.group(1)) * _UNITS[unit or "gib"])


def human(size: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if size >= scale:
            return f"{size / scale:.2f} {unit}"
    return f"{size} B"


# -- the command --------------------------------------------------------------------------------


def run(spec: str, ranks: list[int], precisions: list[str], optimizer: str, gpu_memory: str | None,
        as_json: bool, out: TextIO) -> int:
    """Build the model on meta, print the table (or JSON); raises EstimateError on bad input."""
    limit = parse_memory(gpu_memory) if gpu_memory is not None else None
    model = build_on_meta(load_callable(spec), spec)
    shape = model_shape(model)
    results = [row for n in ranks for precision in precisions for row in _with_ranks(shape, n, optimizer, precision)]
    trainable = sum(t.numel for t in shape.params if t.trainable)
    total = sum(t.numel for t in shape.params)
    if as_json:
        payload = {
            "model": spec,
            "parameters": total,
            "trainable_parameters": trainable,
            "parameter_tensors": len(shape.params),
            "blocks": len(shape.blocks),
            "optimizer": optimizer,
            "gpu_memory": limit,
            "rows": [{**asdict(row), "nproc": n, "total": row.total,
                      "fits": None if limit is None else row.total <= limit} for n, row in results],
        }
        json.dump(payload, out, indent=2)
        out.write("\n")
        return 0
    dtypes = sorted({t.element_size for t in shape.params})
    out.write(f"{spec}: {total:,} parameters ({trainable:,} trainable) in {len(shape.params)} tensors, "
              f"{'/'.join(f'{b} B' for b in dtypes)} per element; fsdp shards {len(shape.blocks)} blocks "
              f"separately; buffers {human(sum(t.numel * t.element_size for t in shape.buffers))} "
              f"on every rank\n")
    out.write(f"optimizer {optimizer}: {OPTIMIZER_STATES[optimizer]} state element(s) per trainable "
              "parameter element; bytes per rank, the fullest rank\n\n")
    header = ["nproc", "strategy", "precision", "params", "grads", "optimizer", "in step", "total"]
    if limit is not None:
        header.append(f"fits {human(limit)}")
    lines = [header]
    for n, row in results:
        line = [str(n), row.strategy, row.precision, human(row.params), human(row.grads),
                human(row.optimizer), human(row.in_step), human(row.total)]
        if limit is not None:
            line.append("yes" if row.total <= limit else "no")
        lines.append(line)
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    for line in lines:
        out.write("  ".join(cell.ljust(w) if i < 3 else cell.rjust(w)
                            for i, (cell, w) in enumerate(zip(line, widths))).rstrip() + "\n")
    out.write(
        "\nin step: memory held only during forward/backward (ddp/zero1: gradient buckets and, mixed, autocast's "
        "weight copies; fsdp: unsharded parameters). Mixed precision keeps params, grads and optimizer "
        "state in fp32; fp16 needs the same bytes as bf16. Not counted: activations, CUDA context, "
        "fragmentation.\n"
    )
    return 0


def _with_ranks(shape: ModelShape, ranks: int, optimizer: str, precision: str) -> list[tuple[int, Row]]:
    return [(ranks, row) for row in estimate(shape, ranks, optimizer, precision)]
