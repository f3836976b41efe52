"""Processes started by MPI (`mpiexec -n N python train.py`): refused whole, with every MPI rank read named.

The shape (improved-diffusion's `dist_util.setup_dist`, shared by its descendants): a function
builds the process group from MPI (`comm = MPI.COMM_WORLD`, `os.environ["RANK"] = str(comm.rank)`,
`WORLD_SIZE` from `comm.size`, `MASTER_ADDR` / `MASTER_PORT` broadcast with `comm.bcast`, then
`dist.init_process_group(init_method="env://")`), and the rest of the program takes its rank from
MPI too: the device (`cuda:{MPI.COMM_WORLD.Get_rank() % GPUS_PER_NODE}`), the data shard
(`shard=MPI.COMM_WORLD.Get_rank(), num_shards=MPI.COMM_WORLD.Get_size()`), a checkpoint read on
rank 0 and broadcast with `MPI.COMM_WORLD.bcast`, a logger that reads the MPI launcher's
variables (`PMI_RANK`, `OMPI_COMM_WORLD_RANK`) so as not to import mpi4py.

Recognised from what the code does, not from names: a function that calls
`torch.distributed.init_process_group` and, outside any `if`, reads mpi4py (any name imported
from `mpi4py`) or an MPI launcher's variable (`PMI_RANK`, `PMI_SIZE`, `OMPI_COMM_WORLD_RANK`, `OMPI_COMM_WORLD_SIZE`,
`OMPI_COMM_WORLD_LOCAL_RANK`, `MV2_COMM_WORLD_RANK`, ...), in the file or, for a unit, in any
module of it (`migrate/crossmodule/`: the roles read the joined view). A function that reads
MPI's variables in one branch of a launcher test (`if "OMPI_COMM_WORLD_RANK" in os.environ:`
beside an `elif "RANK" in os.environ:` branch, ConvNeXt's `init_distributed_mode`) is not this
shape: under `accel launch` it takes torchrun's branch.

Why nothing is written: a partial conversion is wrong at N processes under `accel launch`
(torchrun), the launcher a migrated script runs under: MPI does not start the processes, so each
is MPI's rank 0 of 1: the helper overwrites `RANK=0` / `WORLD_SIZE=1` (and improved-diffusion's
also `MASTER_PORT`, with a port of its own), so the processes never form the launcher's group: the
init waits for a rendezvous nobody serves (torchrun's agent store was on the replaced port) or,
without a replaced port, every process trains alone on the whole data; and the batches go to
`dev()` = GPU 0 while the prepared model is on GPU k. So the file (or the whole
unit: no file of it is written) is left as it is, with AM007 at the `init_process_group` call: the
reason, every place that reads MPI's rank, size or communicator or an MPI launcher variable
(function, and in a unit each at its own line), and what to do: start the processes with
`accel launch`, build the group from the launcher's environment (`RANK`, `WORLD_SIZE`,
`MASTER_ADDR`, `MASTER_PORT`, defaulted to a world of 1 for a plain `python` run), read ranks and
sizes from `torch.distributed`, the device index from `LOCAL_RANK`, a rank needed before the
group exists from `RANK`, replace `comm.bcast` by `torch.distributed.broadcast_object_list` (or
let every process read the file itself), then run the migration again. Once no MPI is left, the
unit migrates as a torchrun-style one (`fixtures/repos/mpi_twin/`, the advice applied to
`fixtures/repos/mpi/`).

Each other read is reported where it is (AM007, left unconverted), with the fix for its use: a
device, a communication, a rank read from the launcher's variables, or a rank or size.
"""

from __future__ import annotations

import libcst as cst

from migrate.analysis import Scope
from migrate.names import ImportAliases
from migrate.roles.model import DISTRIBUTED, Finding, Roles
from migrate.walk import walk

_INIT = "torch.distributed.init_process_group"
# Variables that MPI launchers (MPICH / Intel MPI's PMI, Open MPI, MVAPICH2) set in each process.
MPI_VARIABLES = frozenset({
    "PMI_RANK", "PMI_SIZE", "PMI_LOCAL_RANK", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
    "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE", "MV2_COMM_WORLD_RANK", "MV2_COMM_WORLD_SIZE",
    "MV2_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID",
})
_COMMUNICATION = frozenset({
    "bcast", "Bcast", "allgather", "Allgather", "allreduce", "Allreduce", "gather", "Gather", "scatter",
    "Scatter", "reduce", "Reduce", "barrier", "Barrier", "send", "recv", "Send", "Recv",
})


class _Read:
    """The first statement of a function that uses MPI, and how it uses it."""

    def __init__(self, scope: Scope, node: cst.CSTNode, kind: str, always: bool) -> None:
        self.scope, self.node, self.kind = scope, node, kind
        # a read outside any `if` of the function: MPI whatever started the processes (not one
        # branch of a launcher test, `if "OMPI_COMM_WORLD_RANK" in os.environ:` beside torchrun's)
        self.always = always


def refuse(roles: Roles) -> bool:
    """Refuse the file (or unit) when a process group is built from MPI; True when refused."""
    facts = roles.facts
    # only a scope that builds a process group can make the program MPI's; the others are read
    # (for the message) once one does
    if not any(call.qualified == _INIT and (read := _reads(facts.aliases, scope)) is not None and read.always
               for scope in facts.scopes for call in scope.library_calls):
        return False
    reads = [read for scope in facts.scopes if (read := _reads(facts.aliases, scope)) is not None]
    by_scope = {id(read.scope): read for read in reads}
    init = next(((scope, call.call) for scope in facts.scopes for call in scope.library_calls
                 if call.qualified == _INIT and id(scope) in by_scope and by_scope[id(scope)].always), None)
    if init is None:
        return False
    setup, call = init
    others = [read for read in reads if read.scope is not setup]
    roles.refused = roles.started_by_mpi = True
    roles.findings = [Finding(DISTRIBUTED, call, _message(roles, setup, by_scope[id(setup)], others), unconverted=True)]
    roles.findings.extend(Finding(DISTRIBUTED, read.node, _read_message(roles, read, setup), unconverted=True)
                          for read in others)
    return True


def _message(roles: Roles, setup: Scope, read: _Read, others: list[_Read]) -> str:
    source = "an MPI launcher's variables" if read.kind == "variables" else "MPI's rank and size (mpi4py)"
    named = "; ".join(_described(roles, other) for other in others)
    elsewhere = f". MPI is also read by {named}" if named else ""
    return (
        f"this program starts its processes with MPI (mpiexec): `{setup.name}` builds the process group from "
        f"{source}{elsewhere}. Nothing was written: a partial conversion is wrong at N processes under "
        "`accel launch` (MPI did not start the processes, so each is MPI's rank 0 of 1: the helper builds the "
        "group with that rank and size instead of the launcher's (and with a rendezvous address of its own where it "
        "sets one), so the processes never form one group: the process group's init waits for a rendezvous no process serves, or each "
        "process trains alone; and `dev()`-style devices put every process's batches on GPU 0). To "
        "migrate it, "
        "start it with `accel launch` and remove MPI: "
        f"in `{setup.name}` build the group from the launcher's environment "
        "(`dist.init_process_group(backend, init_method=\"env://\")`, with RANK, WORLD_SIZE, MASTER_ADDR and "
        "MASTER_PORT set by `accel launch`, defaulted with `os.environ.setdefault` to a world of 1 for a plain "
        "`python` run); read ranks and sizes with `dist.get_rank()` / `dist.get_world_size()`, a device index "
        "from `int(os.environ.get(\"LOCAL_RANK\", \"0\"))`, a rank needed before the group exists from "
        "`int(os.environ.get(\"RANK\", \"0\"))`, and replace MPI's `bcast` by `dist.broadcast_object_list` (or let "
        "every process read the file itself); then run accel-migrate again"
    )


def _described(roles: Roles, read: _Read) -> str:
    callers = sorted({scope.name for scope in roles.facts.scopes for site in scope.calls
                      if site.callee == read.scope.name and scope is not read.scope and scope.is_function})
    used = f", used by {', '.join(f'`{c}`' for c in callers)}" if callers else ""
    return f"`{read.scope.name}` ({_KINDS[read.kind]}{used})"


_KINDS = {
    "device": "a device from MPI's rank",
    "communication": "an MPI broadcast or gather",
    "variables": "the rank from an MPI launcher's variables",
    "rank": "MPI's rank or size",
}

_FIXES = {
    "device": "take the device index from torchrun's `int(os.environ.get(\"LOCAL_RANK\", \"0\"))`",
    "communication": "replace MPI's communication by `torch.distributed`'s (`dist.broadcast_object_list`), or "
                     "let every process do the work itself",
    "variables": "read torchrun's `int(os.environ.get(\"RANK\", \"0\"))` instead",
    "rank": "read `dist.get_rank()` / `dist.get_world_size()` instead",
}


def _read_message(roles: Roles, read: _Read, setup: Scope) -> str:
    return (f"{_described(roles, read)}: under `accel launch` every process "
            f"is MPI's rank 0 of 1 (the processes never form one group); {_FIXES[read.kind]}. Left as it is with the rest of the program, which starts its "
            f"processes with MPI (see `{setup.name}`)")


def started_by_mpi(aliases: ImportAliases, scope: Scope) -> bool:
    """The scope (one that initialises a process group) reads mpi4py or an MPI launcher's variable
    outside any `if`."""
    read = _reads(aliases, scope)
    return read is not None and read.always


def _reads(aliases: ImportAliases, scope: Scope) -> _Read | None:
    """The first node of the scope itself (not of a nested function) that reads mpi4py or an MPI
    launcher's variable, and what the scope does with MPI."""

    class Finder(cst.CSTVisitor):
        first: cst.CSTNode | None = None
        always = False
        branches = 0
        variables = False
        communication = False
        device = False

        def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
            return node is scope.node

        def visit_ClassDef(self, node: cst.ClassDef) -> bool:
            return node is scope.node

        def visit_Import(self, node: cst.Import) -> bool:
            return False

        def visit_ImportFrom(self, node: cst.ImportFrom) -> bool:
            return False

        def visit_If(self, node: cst.If) -> None:
            self.branches += 1

        def leave_If(self, node: cst.If) -> None:
            self.branches -= 1

        def visit_IfExp(self, node: cst.IfExp) -> None:
            self.branches += 1

        def leave_IfExp(self, node: cst.IfExp) -> None:
            self.branches -= 1

        def visit_Name(self, node: cst.Name) -> None:
            if (aliases.qualify(node) or "").startswith("mpi4py"):
                self.read(node)

        def visit_SimpleString(self, node: cst.SimpleString) -> None:
            if node.evaluated_value in MPI_VARIABLES:
                self.variables = True
                self.read(node)

        def read(self, node: cst.CSTNode) -> None:
            self.first = self.first or node
            self.always = self.always or not self.branches

        def visit_Attribute(self, node: cst.Attribute) -> None:
            if node.attr.value in _COMMUNICATION:
                self.communication = True

        def visit_FormattedStringText(self, node: cst.FormattedStringText) -> None:
            self.device = self.device or "cuda" in node.value

        def visit_Call(self, node: cst.Call) -> None:
            if (aliases.qualify(node.func) or "") in ("torch.device", "torch.cuda.set_device"):
                self.device = True

    finder = Finder()
    walk(scope.node, finder)
    if finder.first is None:
        return None
    kind = ("variables" if finder.variables else "device" if finder.device
            else "communication" if finder.communication else "rank")
    return _Read(scope, finder.first, kind, finder.always)
