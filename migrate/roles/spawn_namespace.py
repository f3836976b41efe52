"""The rank, world size and rendezvous address of an `mp.spawn` launcher, computed into a namespace.

What it does: finds the launcher shape where the spawning function writes the rank, the world size
and the rendezvous address into the namespace it hands to the worker, and the worker joins the
process group from them (`init_process_group(init_method=args.dist_url, world_size=args.world_size,
rank=args.rank)`), and says which statements the launcher makes obsolete:

    def main():
        args = parser.parse_args()
        args.ngpus_per_node = torch.cuda.device_count()      # goes: only the removed code read it
        if "SLURM_JOB_ID" in os.environ:
            signal.signal(signal.SIGUSR1, handle_sigusr1)   # kept
            host_name = ...                                  # goes: it only fed `args.dist_url`
            args.rank = int(os.getenv("SLURM_NODEID")) * args.ngpus_per_node     # goes
            args.world_size = int(os.getenv("SLURM_NNODES")) * args.ngpus_per_node  # goes
            args.dist_url = f"tcp://{host_name}:58472"      # goes
        else:                                                # goes with its three assignments
            args.rank = 0
            ...
        mp.spawn(main_worker, (args,), args.ngpus_per_node)

    def main_worker(gpu, args):
        args.rank += gpu                                     # goes
        dist.init_process_group(...)                         # the Accelerator (AM007), then
                                                             # args.rank = accelerator.process_index
                                                             # args.world_size = accelerator.num_processes

The worker may join the group under a flag of the namespace, `if args.distributed:`, holding only
the rank computation and the init (the ImageNet example): that `if` goes whole, the flag's own
assignment in the spawning function goes, and after the Accelerator the worker sets
`args.distributed = accelerator.num_processes > 1`; so does the flag that chose the spawn
(`if args.multiprocessing_distributed: mp.spawn(...)`) where the worker reads it.

Why: under `accel launch` the launcher owns the rank, the world size and the rendezvous; the worker's
later reads (`args.batch_size // args.world_size`, `if args.rank == 0:`) then read the launcher's
values, which are what the spawned process computed on one node and on SLURM alike.

Leaves alone (the reason is returned, AM007 refuses the file with it): the namespace's rank or world
size also written elsewhere in the file, read by the spawning function for anything but the removed
computation (an `if` it keeps testing them, or the flag, included), or read in the worker before
its process group exists; the `rank=` and `world_size=` of the init not both attributes of the same
namespace that the spawn passes; a guard `if args.distributed:` around the init that also runs
anything but the rank and world size computation and pinning the GPU (`torch.cuda.set_device`:
the Accelerator sets the device), a print say, reported at that statement.

Fix safety: only statements whose every effect is the removed computation go (assignments of the
three attributes, and bindings read by nothing else); every read of the rank and the world size
after the process group exists gets the accelerator's value.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import libcst as cst

from migrate.walk import Visitor, walk

# the namespace attributes the accelerator sets again after it is created, and from what
PROPERTIES = {"rank": "process_index", "world_size": "num_processes"}


@dataclass(eq=False)
class NamespaceRank:
    """`args.rank` / `args.world_size` / `args.dist_url` computed for the spawned worker."""

    namespace: str  # the worker's parameter that receives it ("args")
    init: cst.BaseStatement  # the worker's `init_process_group(...)`: the assignments follow it
    attributes: dict[str, str]  # init keyword -> attribute name ("rank" -> "rank", "init_method" -> "dist_url")
    replace: dict[cst.BaseStatement, list[cst.BaseStatement]] = field(default_factory=dict)  # what goes
    outer: str = ""  # the spawning function's name for the namespace
    guard: cst.If | None = None  # `if args.distributed:` around the init and the rank computation: goes whole
    flags: list[str] = field(default_factory=list)  # attributes that said "several processes": N > 1 now

    def assignments(self) -> list[cst.BaseStatement]:
        """The statements written after the Accelerator: the namespace gets the launcher's values
        (both, also when this file reads neither: the namespace travels to code it may not see)."""
        return [
            *(
                cst.parse_statement(f"{self.namespace}.{self.attributes[keyword]} = accelerator.{prop}\n")
                for keyword, prop in PROPERTIES.items()
                if keyword in self.attributes
            ),
            *(cst.parse_statement(f"{self.namespace}.{flag} = accelerator.num_processes > 1\n") for flag in self.flags),
        ]


class At(str):
    """A reason with the statement it is about (reported there rather than at the init)."""

    node: cst.CSTNode | None = None


def _at(node: cst.CSTNode, reason: str) -> At:
    found = At(reason)
    found.node = node
    return found


class NotThisShape(str):
    """A reason `find` gives when the launcher is not the namespace shape at all (the init's rank
    and world size are not attributes the spawn passes), rather than a part of it it cannot convert."""


def find(
    module: cst.Module,
    spawner: cst.FunctionDef,
    spawn_stmt: cst.BaseStatement,
    worker: cst.FunctionDef,
    spawn_args: Sequence[cst.BaseExpression],
    init_call: cst.Call,
    init_stmt: cst.BaseStatement,
    guard: cst.If | None = None,
    spawn_test: cst.BaseExpression | None = None,
) -> NamespaceRank | str | None:
    """The namespace shape of this launcher, the reason it cannot be converted, or None when the
    init's `rank=` / `world_size=` are not attributes (another shape)."""
    given = {a.keyword.value: a.value for a in init_call.args if a.keyword is not None}
    attributes: dict[str, str] = {}
    namespaces: set[str] = set()
    for keyword in ("rank", "world_size", "init_method"):
        value = given.get(keyword)
        if isinstance(value, cst.Attribute) and isinstance(value.value, cst.Name):
            attributes[keyword] = value.attr.value
            namespaces.add(value.value.value)
    if not ({"rank", "world_size"} & attributes.keys()):
        return None
    params = [p.name.value for p in worker.params.params]
    if len(namespaces) != 1 or not {"rank", "world_size"} <= attributes.keys():
        return NotThisShape("the init's `rank=` and `world_size=` are not both attributes of one namespace")
    namespace = namespaces.pop()
    if namespace not in params[1:]:
        return NotThisShape(f"`{namespace}` is not a parameter of `{worker.name.value}` that the spawn passes")
    outer = spawn_args[params.index(namespace) - 1]
    if not isinstance(outer, cst.Name):
        return NotThisShape(f"the spawn does not pass `{namespace}` as a name of `{spawner.name.value}`")
    written = set(attributes.values())
    found = NamespaceRank(namespace, init_stmt, attributes, outer=outer.value, guard=guard)
    removed: set[int] = {id(spawn_stmt), id(init_stmt)}

    worker_body = _body(worker)
    anchor = guard if guard is not None else init_stmt
    before_init = worker_body[: next(i for i, s in enumerate(worker_body) if s is anchor)]
    if guard is not None:
        code = cst.Module([]).code_for_node
        test = guard.test
        if not (isinstance(test, cst.Attribute) and isinstance(test.value, cst.Name) and test.value.value == namespace):
            return (f"the process group is initialised only under `if {code(test)}:`, which is not a flag of `{namespace}` "
                    "that the launcher's process count could replace")
        for stmt in _statements(_if_body(guard)):
            if stmt is not init_stmt and not isinstance(stmt, cst.If) and not _assigns(stmt, namespace, written) \
                    and not _pins_device(stmt):
                return _at(stmt, f"the block `if {code(test)}:` that initialises the process group also runs "
                           f"`{code(stmt.with_changes(leading_lines=())).strip()}`, which is not the rank or world "
                           "size the launcher provides now")
        # the flag said "this process is one of a group": `accelerator.num_processes > 1` now
        found.flags.append(test.attr.value)
        written.add(test.attr.value)
        removed.add(id(guard))
    if isinstance(spawn_test, cst.Attribute) and isinstance(spawn_test.value, cst.Name) and spawn_test.value.value == outer.value:
        # `if args.multiprocessing_distributed: mp.spawn(...)`: the spawn flag read after the launch
        # (`not args.multiprocessing_distributed or args.rank % ngpus == 0` around a save) meant
        # "several processes were started", which the launcher decides now
        spawn_flag = spawn_test.attr.value
        later = [s for s in worker_body if s is not guard] + [
            s for s in module.body if s is not worker and s is not spawner
        ]
        if spawn_flag not in found.flags and any(_reads_attributes(s, {spawn_flag}) for s in later):
            found.flags.append(spawn_flag)
    for stmt in before_init:
        if _assigns(stmt, namespace, written):
            removed.add(id(stmt))
        elif _reads_attributes(stmt, written):
            return (f"`{worker.name.value}` reads `{namespace}.{sorted(_reads_attributes(stmt, written))[0]}` before "
                    "its process group exists, where the launcher's value is not known yet")
    spawner_statements = list(_statements(_body(spawner)))
    for stmt in spawner_statements:
        if _assigns(stmt, outer.value, written):
            removed.add(id(stmt))
    _remove_dead_bindings(module, spawner_statements, spawn_args, outer.value, removed)

    owned = {id(s) for s in spawner_statements} | {id(s) for s in before_init}
    for stmt in _statements(module.body):
        if id(stmt) in removed or id(stmt) in owned:
            continue
        if isinstance(stmt, cst.SimpleStatementLine) and _assigned_attributes(stmt) & written:
            return f"`.{sorted(_assigned_attributes(stmt) & written)[0]}` is also written outside the launcher"
    for stmt in spawner_statements:
        if id(stmt) not in removed and not isinstance(stmt, cst.If) and _reads_attributes(stmt, written):
            return (f"`{spawner.name.value}` itself reads `{outer.value}."
                    f"{sorted(_reads_attributes(stmt, written))[0]}`, which the launcher computes now")
    for stmt in [*before_init, *spawner_statements]:
        if id(stmt) in removed and stmt is not init_stmt and stmt is not spawn_stmt:
            found.replace[stmt] = []
    for stmt in spawner_statements:
        if isinstance(stmt, cst.If):
            _prune_if(stmt, removed, found.replace)
    for stmt in spawner_statements:
        # an `if` the launcher's computation leaves in place must not test what it no longer sets
        if isinstance(stmt, cst.If) and found.replace.get(stmt) != [] and stmt.test is not spawn_test:
            read = _reads_attributes(stmt.test, written)
            if read:
                return _at(stmt, f"`{spawner.name.value}` itself tests `{outer.value}.{sorted(read)[0]}`, which the "
                           "launcher computes now")
    return found


def statements_of(stmt: cst.BaseStatement) -> list[cst.BaseStatement]:
    """`stmt` and the statements of its `if` / `else` blocks."""
    return list(_statements([stmt]))


def _pins_device(stmt: cst.BaseStatement) -> bool:
    """`torch.cuda.set_device(gpu)` / `torch.accelerator.set_device_index(gpu)` alone on its line."""
    small = _small(stmt)
    if not (isinstance(small, cst.Expr) and isinstance(small.value, cst.Call)):
        return False
    func = small.value.func
    return isinstance(func, cst.Attribute) and func.attr.value in ("set_device", "set_device_index")


def _body(function: cst.FunctionDef) -> Sequence[cst.BaseStatement]:
    body = function.body
    return body.body if isinstance(body, cst.IndentedBlock) else ()


def _statements(block: Sequence[cst.BaseStatement]) -> Iterator[cst.BaseStatement]:
    """Statements of `block` and of the `if` / `else` blocks in it (not loops, functions, classes)."""
    for stmt in block:
        yield stmt
        if isinstance(stmt, cst.If):
            yield from _statements(_if_body(stmt))
            orelse = stmt.orelse
            if isinstance(orelse, cst.Else):
                yield from _statements(orelse.body.body if isinstance(orelse.body, cst.IndentedBlock) else ())
            elif isinstance(orelse, cst.If):
                yield from _statements([orelse])


def _if_body(stmt: cst.If) -> Sequence[cst.BaseStatement]:
    return stmt.body.body if isinstance(stmt.body, cst.IndentedBlock) else ()


def _small(stmt: cst.BaseStatement) -> cst.BaseSmallStatement | None:
    return stmt.body[0] if isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1 else None


def _assigns(stmt: cst.BaseStatement, receiver: str, attributes: set[str]) -> bool:
    """`receiver.attr = ...` / `receiver.attr += ...` for one of `attributes`, alone on its line."""
    small = _small(stmt)
    if isinstance(small, cst.Assign) and len(small.targets) == 1:
        target: cst.BaseExpression = small.targets[0].target
    elif isinstance(small, cst.AugAssign):
        target = small.target
    else:
        return False
    return (
        isinstance(target, cst.Attribute)
        and isinstance(target.value, cst.Name)
        and target.value.value == receiver
        and target.attr.value in attributes
    )


def _assigned_attributes(stmt: cst.SimpleStatementLine) -> set[str]:
    found: set[str] = set()
    for small in stmt.body:
        targets: list[cst.BaseExpression] = []
        if isinstance(small, cst.Assign):
            targets = [t.target for t in small.targets]
        elif isinstance(small, (cst.AugAssign, cst.AnnAssign)):
            targets = [small.target]
        found.update(t.attr.value for t in targets if isinstance(t, cst.Attribute))
    return found


def attribute_read_count(module: cst.Module, attribute: str) -> int:
    """How often `.attribute` is read in the module (assignment targets are not reads)."""
    return len(_attribute_reads(module).get(attribute, ()))


def reads_attributes(node: cst.CSTNode, attributes: set[str]) -> set[str]:
    return _reads_attributes(node, attributes)


def _reads_attributes(node: cst.CSTNode, attributes: set[str]) -> set[str]:
    """Which of `attributes` `node` reads (`x.rank` on any receiver: the namespace travels)."""
    found: set[str] = set()

    class Reads(cst.CSTVisitor):
        def visit_Attribute(self, attribute: cst.Attribute) -> None:
            if attribute.attr.value in attributes:
                found.add(attribute.attr.value)

    walk(node, Reads())
    return found


def _remove_dead_bindings(
    module: cst.Module,
    statements: list[cst.BaseStatement],
    spawn_args: Sequence[cst.BaseExpression],
    receiver: str,
    removed: set[int],
) -> None:
    """Bindings of the spawning function read only by removed statements go too, until none is
    left: `host_name = ...` read by the removed `args.dist_url = f"tcp://{host_name}:..."`,
    `args.ngpus_per_node = ...` read by the removed world size and the replaced spawn's process
    count (its `args`, passed on to the worker, stay read)."""
    # Where the reads are does not change while statements go: found once, counted per question.
    name_loads = [(id(node), _name_loads(node)) for node in [*statements, *spawn_args]]
    attribute_reads: dict[str, list[int]] | None = None
    changed = True
    while changed:
        changed = False
        for stmt in statements:
            small = _small(stmt)
            if id(stmt) in removed or not (isinstance(small, cst.Assign) and len(small.targets) == 1):
                continue
            target = small.targets[0].target
            if isinstance(target, cst.Name):
                reads = sum(loads[target.value] for node, loads in name_loads if node not in removed)
            elif isinstance(target, cst.Attribute) and isinstance(target.value, cst.Name) and target.value.value == receiver:
                if attribute_reads is None:
                    attribute_reads = _attribute_reads(module)
                reads = sum(line not in removed for line in attribute_reads.get(target.attr.value, ()))
            else:
                continue
            if reads == 0:
                removed.add(id(stmt))
                changed = True


class _NameLoads(Visitor):
    """How often each name is loaded (the names an assignment binds are not loads)."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()

    def visit_Assign(self, node: cst.Assign) -> bool:
        walk(node.value, self)
        for target in node.targets:
            if type(target.target) is not cst.Name:
                walk(target.target, self)
        return False

    def visit_Name(self, node: cst.Name) -> None:
        self.counts[node.value] += 1


def _name_loads(node: cst.CSTNode) -> Counter[str]:
    """Loads in one statement of the spawning function (or a spawn argument); of an `if`, in its
    test only: its blocks' statements are in the spawning function's statements themselves."""
    loads = _NameLoads()
    walk(node.test if type(node) is cst.If else node, loads)
    return loads.counts


class _AttributeReads(Visitor):
    """For each attribute name, the statement line of each read of it (0 outside any line): an
    assignment's target attribute is written, not read."""

    def __init__(self) -> None:
        self.lines: dict[str, list[int]] = {}
        self.line = 0

    def visit_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> None:
        self.line = id(node)

    def leave_SimpleStatementLine(self, original_node: cst.SimpleStatementLine) -> None:
        self.line = 0

    def visit_Assign(self, node: cst.Assign) -> bool:
        walk(node.value, self)
        for target in node.targets:
            walk(target.target.value if type(target.target) is cst.Attribute else target.target, self)
        return False

    def visit_Attribute(self, node: cst.Attribute) -> None:
        self.lines.setdefault(node.attr.value, []).append(self.line)


def _attribute_reads(module: cst.Module) -> dict[str, list[int]]:
    """Reads of `.attribute` anywhere in the module, by attribute, with their statement lines (a
    read in a removed line does not count)."""
    reads = _AttributeReads()
    walk(module, reads)
    return reads.lines


def _prune_if(stmt: cst.If, removed: set[int], replace: dict[cst.BaseStatement, list[cst.BaseStatement]]) -> None:
    """An `if` whose blocks lost statements: an emptied `else` goes, an emptied `if` goes whole."""
    kept = [s for s in _if_body(stmt) if id(s) not in removed]
    orelse = stmt.orelse
    else_kept: list[cst.BaseStatement] | None = None
    if isinstance(orelse, cst.Else) and isinstance(orelse.body, cst.IndentedBlock):
        else_kept = [s for s in orelse.body.body if id(s) not in removed]
        if len(else_kept) == len(orelse.body.body) and len(kept) == len(_if_body(stmt)):
            return
    elif orelse is not None or len(kept) == len(_if_body(stmt)):
        return  # an `elif` chain: its statements go one by one (left `pass` where emptied)
    for inner in _if_body(stmt):
        replace.pop(inner, None)
    if isinstance(orelse, cst.Else) and isinstance(orelse.body, cst.IndentedBlock):
        for inner in orelse.body.body:
            replace.pop(inner, None)
    if not kept and not else_kept:
        replace[stmt] = []
        return
    assert isinstance(stmt.body, cst.IndentedBlock)
    if not kept:
        kept = [cst.SimpleStatementLine([cst.Pass()])]
    new_else = None
    if else_kept:
        assert isinstance(orelse, cst.Else) and isinstance(orelse.body, cst.IndentedBlock)
        new_else = orelse.with_changes(body=orelse.body.with_changes(body=else_kept))
    replace[stmt] = [stmt.with_changes(body=stmt.body.with_changes(body=kept), orelse=new_else)]
