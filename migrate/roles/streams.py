"""Batch streams: a training step fed by `next(data)` from a generator that shards by rank itself.

The shape (improved-diffusion's): `data = load_data(...)` is a generator function that builds a
DataLoader over a dataset given this process's share (`shard=dist.get_rank(),
num_shards=dist.get_world_size()`) and yields from it forever; the script hands `data` to a
trainer class, whose loop draws `batch, cond = next(self.data)`. The stream is not a DataLoader, so
it is not prepared (preparing the loader inside it would shard the shard again), and the training
step gets no loader. Whether it is still right at N processes depends on where the rank comes from:

- `torch.distributed.get_rank()` / `get_world_size()`: the Accelerator joins (or creates) that
  process group, so the rank is `accelerator.process_index` and the shard is this process's;
  nothing to report;
- an MPI rank (`MPI.COMM_WORLD.Get_rank()` of mpi4py): under `accel launch` (torchrun) MPI is
  not what started the processes, and every process is MPI's rank 0 of 1, so every process would
  read the whole data (and mpiexec sets no LOCAL_RANK, so the Accelerator would put every process
  of a node on GPU 0); reported (AM004) at the rank read, with the fix: the process group's rank;
- no rank at all: an unsharded stream, reported by the loaders' own AM004 message with the name of
  the generator that must take the rank.

Names are followed as the roles follow them (`self.data = data` in the constructor, `data` from
the callers of the class), a few assignments deep.
"""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst

from migrate.analysis import Scope
from migrate.names import instance_attribute
from migrate.roles.model import Roles
from migrate.walk import walk

_TORCH_RANKS = frozenset({"torch.distributed.get_rank", "torch.distributed.get_world_size"})
_MPI_RANKS = ("Get_rank", "Get_size")
_DEPTH = 4


@dataclass(frozen=True)
class Stream:
    """The generator function a training step draws its batches from with `next(...)`."""

    function: str
    ranked_by: str | None  # "torch", "mpi", or None (it reads no rank)
    rank_read: cst.Call | None  # the first rank read of the generator, where a report points


def training_stream(roles: Roles, trainer: Scope) -> Stream | None:
    """The stream `next(...)` draws from in `trainer` (the scope holding the backward) or in the
    other methods of its class; None when the batches come from anything else."""
    scopes = roles.methods_of(trainer) or [trainer]
    for scope in scopes:
        for site in scope.calls:
            if site.callee != "next" or len(site.call.args) != 1:
                continue
            arg = site.call.args[0].value
            ref = arg.value if isinstance(arg, cst.Name) else instance_attribute(arg)
            if ref is None:
                continue
            for value in _values(roles, scope, ref, _DEPTH):
                stream = _generator_stream(roles, value)
                if stream is not None:
                    return stream
    return None


def _values(roles: Roles, scope: Scope, ref: str, depth: int) -> list[cst.BaseExpression]:
    """What `ref` may be bound to in `scope` (through `self.` attributes of the class, plain
    assignments and the callers' arguments), the bare names followed `depth` times."""
    if depth == 0:
        return []
    if ref.startswith("self."):
        bound = [(m, b.value) for m in roles.methods_of(scope) or [] for b in m.bindings.get(ref, [])]
    else:
        bound = [(s, b.value) for s, n in roles.origins(scope, ref) or () for b in s.bindings.get(n, [])]
    found: list[cst.BaseExpression] = []
    for where, value in bound:
        if isinstance(value, cst.Name):
            found.extend(_values(roles, where, value.value, depth - 1))
        elif value is not None:
            found.append(value)
    return found


def _generator_stream(roles: Roles, value: cst.BaseExpression) -> Stream | None:
    if not (isinstance(value, cst.Call) and isinstance(value.func, cst.Name)):
        return None
    function = roles.facts.function_called(value)
    if function is None or not _yields(function.node):
        return None
    for call in function.library_calls:
        if call.qualified in _TORCH_RANKS:
            return Stream(function.name, "torch", call.call)
        if call.qualified.startswith("mpi4py.") and call.qualified.rsplit(".", 1)[-1] in _MPI_RANKS:
            return Stream(function.name, "mpi", call.call)
    return Stream(function.name, None, None)


def _yields(node: cst.CSTNode) -> bool:
    class Finder(cst.CSTVisitor):
        found = False

        def visit_Yield(self, node: cst.Yield) -> None:
            self.found = True

        def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
            return node is function  # a nested function's yields are its own

    function = node
    finder = Finder()
    walk(node, finder)
    return finder.found
