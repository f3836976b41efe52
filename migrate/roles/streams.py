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
  read the whole data; reported (AM004) at the rank read, with the fix: the process group's rank;
- no rank at all: an unsharded stream, reported by the loaders' own AM004 message with the name of
  the generator that must take the rank.

A batch object of this module's own (nanoGPT's `DataLoaderLite(B, T, process_rank=ddp_rank,
num_processes=ddp_world_size)`, drawn from with `x, y = train_loader.next_batch()` in the training
loop) is a stream too, ranked by torch when an argument of its constructor is the process's global
rank: `dist.get_rank()`, torchrun's `RANK` (`int(os.environ["RANK"])`), `accelerator.process_index`,
or a name bound to one of them (`ddp_rank = int(os.environ["RANK"])` in one branch, `ddp_rank = 0`
in the other). Built with `LOCAL_RANK` instead, it is reported (AM004): the local rank repeats on
every node, so the processes of each machine would read the same batches; built with no rank, the
loaders' AM004 message names the object that must take one.

Names are followed as the roles follow them (`self.data = data` in the constructor, `data` from
the callers of the class), a few assignments deep.
"""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst

from migrate.analysis import Scope, Site
from migrate.names import instance_attribute
from migrate.roles.model import Roles
from migrate.walk import walk

_TORCH_RANKS = frozenset({"torch.distributed.get_rank", "torch.distributed.get_world_size"})
_GLOBAL_RANK = "torch.distributed.get_rank"
_MPI_RANKS = ("Get_rank", "Get_size")
_DEPTH = 4


@dataclass(frozen=True)
class Stream:
    """The generator function a training step draws its batches from with `next(...)`."""

    function: str
    ranked_by: str | None  # "torch", "mpi", "local" (LOCAL_RANK), or None (it reads no rank)
    rank_read: cst.CSTNode | None  # the first rank read, where a report points
    drawn: str = ""  # what the loop calls for a batch, when not `function()` (`batches.next_batch()`)


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
        for method in scope.method_calls:
            if not (method.loops and isinstance(method.receiver, cst.Name) and _assigned(method)):
                continue
            if roles.models and roles.all_in(scope, method.receiver.value, roles.models):
                continue  # the trained model's own method (`hidden = model.init_hidden(bsz)`), not a batch object
            for value in _values(roles, scope, method.receiver.value, _DEPTH):
                stream = _batch_object(roles, scope, value, method)
                if stream is not None:
                    return stream
    return None


def _assigned(site: Site) -> bool:
    """`x, y = batches.next_batch()`: the call is what a statement of the loop binds."""
    stmt = site.where.stmt
    return isinstance(stmt, cst.SimpleStatementLine) and any(
        isinstance(small, cst.Assign) and small.value is site.call for small in stmt.body)


def _batch_object(roles: Roles, scope: Scope, value: cst.BaseExpression, site: Site) -> Stream | None:
    """`DataLoaderLite(..., process_rank=ddp_rank, ...)`: an instance of a class of this module, and
    the rank its constructor is given (see the module's docstring)."""
    if not (isinstance(value, cst.Call) and isinstance(value.func, cst.Name) and value.func.value in roles.facts.classes):
        return None
    assert isinstance(site.receiver, cst.Name) and isinstance(site.call.func, cst.Attribute)
    drawn = f"{site.receiver.value}.{site.call.func.attr.value}()"
    local = None
    for arg in value.args:
        read = _rank(roles, scope, arg.value, _DEPTH)
        if read is not None and read[0] == "RANK":
            return Stream(value.func.value, "torch", read[1], drawn)
        local = local or (read[1] if read is not None else None)
    return Stream(value.func.value, "local" if local is not None else None, local, drawn)


def _rank(roles: Roles, scope: Scope, expr: cst.BaseExpression, depth: int) -> tuple[str, cst.CSTNode] | None:
    """("RANK", where) when `expr` reads the process's global rank (itself, or a binding of the name
    it is), ("LOCAL_RANK", where) for the local rank, else None."""
    if isinstance(expr, cst.Call) and isinstance(expr.func, cst.Name) and expr.func.value == "int" and expr.args:
        expr = expr.args[0].value
    aliases = roles.facts.aliases
    if isinstance(expr, cst.Call) and aliases.qualify(expr.func) == _GLOBAL_RANK:
        return "RANK", expr
    if isinstance(expr, cst.Attribute) and expr.attr.value in ("process_index", "local_process_index"):
        return ("RANK" if expr.attr.value == "process_index" else "LOCAL_RANK"), expr
    key: cst.BaseExpression | None = None
    if isinstance(expr, cst.Subscript) and aliases.qualify(expr.value) == "os.environ" and len(expr.slice) == 1:
        element = expr.slice[0].slice
        key = element.value if isinstance(element, cst.Index) else None
    elif (isinstance(expr, cst.Call) and isinstance(expr.func, cst.Attribute) and expr.func.attr.value == "get"
          and aliases.qualify(expr.func.value) == "os.environ" and expr.args):
        key = expr.args[0].value
    if key is not None:
        variable = key.evaluated_value if isinstance(key, cst.SimpleString) else None
        return (str(variable), expr) if variable in ("RANK", "LOCAL_RANK") else None
    found: tuple[str, cst.CSTNode] | None = None
    if isinstance(expr, cst.Name) and depth > 0:
        for where, name in roles.origins(scope, expr.value) or ():
            for binding in where.bindings.get(name, []):
                if binding.value is not None:
                    read = _rank(roles, where, binding.value, depth - 1)
                    if read is not None and (found is None or read[0] == "RANK"):
                        found = read
    return found


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
    if function is None or not yields(function.node):
        return None
    for call in function.library_calls:
        if call.qualified in _TORCH_RANKS:
            return Stream(function.name, "torch", call.call)
        if call.qualified.startswith("mpi4py.") and call.qualified.rsplit(".", 1)[-1] in _MPI_RANKS:
            return Stream(function.name, "mpi", call.call)
    return Stream(function.name, None, None)


def yields(node: cst.CSTNode) -> bool:
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
