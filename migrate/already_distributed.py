"""What a refusal adds when the script already trains on several processes as it is.

A refused file is left as it is; when it is already a distributed script, the refusal also says so
and how it is started, read from the code (never from its names):

- it spawns its own processes (`mp.spawn`): started by itself, not by a launcher; the flags of its
  command line that switch the spawn on (the `if args.flag:` around it) and that the worker's
  `init_process_group(...)` reads (`init_method=args.dist_url`, `world_size=args.world_size`, ...)
  are named with their own help text;
- it initialises its process group from the launcher's environment (`init_process_group()` without
  an `init_method`, `env://`, `os.environ["RANK"]` read before it, or under a test of the
  environment), here or in a module of its run: it runs under `torchrun --nproc-per-node N` (and
  `accel launch --nproc-per-node N`, which sets the same variables); on GPUs only when its backend
  is NCCL;
- it uses `torch.distributed` (a DDP wrapper, a collective, `destroy_process_group`) but sets its
  process group up outside the modules read: the note says so, for the case that setup reads
  torchrun's variables.

Nothing is said for a module without an entry point (a trainer class others import), a notebook,
a script that is not distributed, one whose group takes values of its own that
no launcher sets, or one whose processes MPI starts (those cases have their own report in AM007)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import PurePath

import libcst as cst

from migrate.analysis import Facts
from migrate.walk import Visitor, contains, walk

_INIT = "torch.distributed.init_process_group"
_SPAWNERS = frozenset({"torch.multiprocessing.spawn", "torch.multiprocessing.start_processes"})
_DDP = frozenset({"torch.nn.parallel.DistributedDataParallel", "torch.nn.parallel.distributed.DistributedDataParallel"})


def note(modules: Sequence[Facts], path: str) -> str | None:
    """The sentence a refusal of the script at `path` (its modules: the script first) ends with,
    or None when it does not already run distributed as it is."""
    if not modules or path.endswith(".ipynb") or not _is_script(modules[0]):
        return None  # a module others import (a trainer class) is not started by itself
    script = PurePath(path).name
    entry = modules[0]
    spawn = _first_call(entry, _SPAWNERS)
    inits = [(facts, scope, c) for facts in modules for scope in facts.scopes for c in scope.library_calls
             if c.qualified == _INIT]
    if spawn is not None:
        return _spawn_note(entry, spawn, inits, script)
    if inits:
        facts, scope, init = inits[0]
        from migrate.roles.mpi_launch import started_by_mpi

        if started_by_mpi(facts.aliases, scope):
            return None  # mpiexec starts it: its AM007 refusal says how to move it to a launcher
        from migrate.rules.remove_distributed_boilerplate import _launcher_gate, _reads_launcher_env

        how = _launcher_gate(init.where)
        how = how and f"its process group is set up only {how}"
        if how is None:
            # `rank=` / `world_size=` given: the group reads the environment only where they do
            given = {a.keyword.value for a in init.call.args if a.keyword is not None}
            call = init.call.with_changes(args=[a for a in init.call.args if a.keyword is None or a.keyword.value not in
                                                ("rank", "world_size")]) if given & {"rank", "world_size"} else init.call
            reads = _reads_launcher_env(call, init.where) if call is init.call else _environ_read(init)
            how = reads and f"its process group reads the launcher's environment ({reads})"
        if how is None:
            return None
        where = " on N GPUs (its backend is NCCL, which needs CUDA)" if _nccl(init.call) else ""
        sets = _sets_address(facts)
        if "MASTER_PORT" in sets:
            # torchrun's agent serves the rendezvous on the port it sets: a port of the script's own
            # sends the workers to a store nobody serves, and init_process_group waits forever
            return (f"The script already trains distributed: {how}, but it sets the rendezvous itself "
                    f"({'; '.join(f'`{code}`' for code in sets.values())}), which overrides the port the launcher "
                    f"serves, so under `torchrun`/`accel launch` its processes would wait for each other forever: "
                    f"delete {'those assignments' if len(sets) > 1 else 'that assignment'}, then it runs under "
                    f"`accel launch --nproc-per-node N {script}`{where}")
        if sets:
            where += " on one node (it sets MASTER_ADDR itself)"
        return (f"The script already trains distributed as it is: {how}, so it runs unchanged under "
                f"`torchrun --nproc-per-node N {script}`{where}; `accel launch --nproc-per-node N {script}` sets the "
                "same variables")
    used = next((c for facts in modules for scope in facts.scopes for c in scope.library_calls
                 if c.qualified.startswith("torch.distributed.") or c.qualified in _DDP), None)
    if used is None:
        return None
    return (f"The script already uses torch.distributed (`{used.qualified}`) and sets its process group up outside "
            "the code read here: where that setup reads torchrun's variables (RANK, WORLD_SIZE, LOCAL_RANK), it "
            f"runs unchanged under `torchrun --nproc-per-node N {script}` (or `accel launch --nproc-per-node N "
            f"{script}`, which sets the same variables)")


def _is_script(facts: Facts) -> bool:
    """The module is started itself: an `if __name__ == "__main__":` guard, a module-level training
    step, or module-level calls of its own functions."""
    from migrate.roles.entry import _has_main_guard

    module = facts.module_scope
    return (_has_main_guard(facts.module) or bool(module.backwards)
            or any(facts.resolve(site.callee, module) is not None for site in module.calls))


def _environ_read(init) -> str | None:  # type: ignore[no-untyped-def]
    """`local_rank = int(os.environ["LOCAL_RANK"])` at the top of the function, before the init."""
    top = init.where.path[0] if init.where.path else init.where
    for stmt in top.block.body:
        if stmt is top.stmt:
            break
        if type(stmt) is cst.SimpleStatementLine and "environ[" in cst.Module([]).code_for_node(stmt):
            code = " ".join(cst.Module([]).code_for_node(stmt.body[0]).split())
            return f"`{code}` reads `os.environ[...]`, a KeyError without the launcher"
    return None


def _sets_address(facts: Facts) -> dict[str, str]:
    """`os.environ["MASTER_ADDR"] = ...` / `["MASTER_PORT"] = ...` in the module: key -> the statement."""
    found: dict[str, str] = {}

    class Sets(Visitor):
        def visit_Assign(self, node: cst.Assign) -> None:
            for target in node.targets:
                sub = target.target
                if (type(sub) is cst.Subscript and facts.aliases.qualify(sub.value) == "os.environ"
                        and len(sub.slice) == 1 and type(sub.slice[0].slice) is cst.Index
                        and type(sub.slice[0].slice.value) is cst.SimpleString
                        and sub.slice[0].slice.value.evaluated_value in ("MASTER_ADDR", "MASTER_PORT")):
                    key = sub.slice[0].slice.value.evaluated_value
                    found.setdefault(key, " ".join(cst.Module([]).code_for_node(node).split()))

    walk(facts.module, Sets())
    return found


def _first_call(facts: Facts, names: frozenset[str]):  # type: ignore[no-untyped-def]
    return next((c for scope in facts.scopes for c in scope.library_calls if c.qualified in names), None)


def _nccl(call: cst.Call) -> bool:
    backend = next((a.value for i, a in enumerate(call.args)
                    if (a.keyword is None and i == 0) or (a.keyword is not None and a.keyword.value == "backend")), None)
    return type(backend) is cst.SimpleString and str(backend.evaluated_value).lower() == "nccl"


def _spawn_note(entry: Facts, spawn, inits, script: str) -> str:  # type: ignore[no-untyped-def]
    """`mp.spawn`: started by itself; the flags that switch the spawn on and that its group reads."""
    flags = _flags(entry.module)
    switch: list[str] = []
    tests: list[str] = []
    for ref in spawn.where.path:
        if type(ref.stmt) is cst.If:
            taken = contains(ref.stmt.body, spawn.call)
            named = [f for f in _namespace_reads(ref.stmt.test) if f in flags]
            if "__name__" in cst.Module([]).code_for_node(ref.stmt.test):
                continue  # the script's own entry guard
            if taken and named:
                switch += named
            else:
                code = " ".join(cst.Module([]).code_for_node(ref.stmt.test).split())
                tests.append(f"`{code}`" if taken else f"`not ({code})`")
    group: list[str] = []
    for _facts, _scope, init in inits[:1]:
        for arg in init.call.args:
            if arg.keyword is not None:
                group += [f for f in _namespace_reads(arg.value) if f in flags and f not in group]
    text = ("The script already trains on several processes as it is, started by itself rather than by a launcher: "
            "it spawns them with `mp.spawn`")
    if switch:
        text += " when started with " + ", ".join(_shown(flags[f]) for f in switch)
    if tests:
        text += (" and " if switch else " when ") + " and ".join(tests) + " holds"
    if group:
        text += ", and they join their process group as " + ", ".join(_shown(flags[f]) for f in group) + " say"
    command = " ".join([f"python {script}", *(flags[f][0] for f in switch),
                        *(f"{flags[f][0]} ..." for f in group)])
    return text + f" (`{command}`" + (", with values that agree)" if group else ")")


def _shown(flag: tuple[str, str | None]) -> str:
    option, help_text = flag
    if not help_text:
        return f"`{option}`"
    help_text = " ".join(help_text.split())
    if len(help_text) > 70:
        help_text = help_text[:67].rstrip() + "..."
    return f"`{option}` ({help_text!r})"


def _namespace_reads(node: cst.CSTNode) -> list[str]:
    """`args.flag` attributes read in `node` (any receiver: the parsed namespace is passed on)."""
    found: list[str] = []

    class Reads(Visitor):
        def visit_Attribute(self, attribute: cst.Attribute) -> None:
            if type(attribute.value) is cst.Name and attribute.attr.value not in found:
                found.append(attribute.attr.value)

    walk(node, Reads())
    return found



def _flags(module: cst.Module) -> dict[str, tuple[str, str | None]]:
    """The command line's options by destination: `parser.add_argument("--dist-url", help=...)` ->
    {"dist_url": ("--dist-url", help)}."""
    found: dict[str, tuple[str, str | None]] = {}

    class Options(Visitor):
        def visit_Call(self, call: cst.Call) -> None:
            if not (type(call.func) is cst.Attribute and call.func.attr.value == "add_argument"):
                return
            options = [a.value.evaluated_value for a in call.args if a.keyword is None
                       and type(a.value) is cst.SimpleString and isinstance(a.value.evaluated_value, str)]
            named = {a.keyword.value: a.value for a in call.args if a.keyword is not None}
            longs = [o for o in options if o.startswith("--")]
            if not longs:
                return
            dest_node = named.get("dest")
            dest = (dest_node.evaluated_value if type(dest_node) is cst.SimpleString
                    else longs[0][2:].replace("-", "_"))
            help_node = named.get("help")
            help_text = help_node.evaluated_value if isinstance(help_node, (cst.SimpleString, cst.ConcatenatedString)) else None
            if isinstance(dest, str):
                found.setdefault(dest, (longs[0], help_text if isinstance(help_text, str) else None))

    walk(module, Options())
    return found

