"""Save checkpoints, print and show progress bars once, from the main process.

What it does:
    `torch.save(model.state_dict(), path)` (also inside a checkpoint dict, through a name such as
    `weights = model.state_dict()`, and for `model.module`)
    becomes `accelerator.save(accelerator.unwrap_model(model).state_dict(), path)`; the whole
    module, `torch.save(model, path)`, becomes `accelerator.save(accelerator.unwrap_model(model),
    path)` (the file still holds the user's module, as before: not the wrapper); a path naming the
    process's rank keeps `torch.save` (with the unwrapped model): each process saves its own file.
    `print(...)` becomes `accelerator.print(...)`; `tqdm(...)` gets
    `disable=not accelerator.is_local_main_process`; `model.state_dict()` and
    `model.load_state_dict(...)` on a prepared model, after the prepare call, go through
    `accelerator.unwrap_model(model)` (the wrapped model's keys carry a `module.` prefix, and it
    would refuse the single-device script's checkpoint). Only in code that can reach the
    accelerator: the function that creates it, nested functions, and functions that receive it
    (a function of the script that only prints, `test(model, loader)`, is handed it as well; a
    helper of another module of a unit only when it uses it for something else).
    File removals (`os.remove`, `os.unlink`, `shutil.rmtree`) in the block that saves such a
    checkpoint or guards a file write (the snapshot block: `torch.save(model, path)` then
    `for f in glob.glob(prefix + "*"): if f != path: os.remove(f)`) run on the main process only,
    with the `for`/`if`/`with` statements around them that hold nothing else; the save just before
    them joins the same `if accelerator.is_main_process:`. Elsewhere in such a function, a removal
    is reported; in a function that writes nothing from the main process, it is left alone.
    A checkpoint saved and then loaded again in the same function (train, save, reload for
    testing) gets `accelerator.wait_for_everyone()` before the first `torch.load` after the save.
    The script's other file writes, from a short explicit list, run under
    `if accelerator.is_main_process:` (neighbouring statements share one `if`):
    a `torch.save(...)` of something else than the model in the script's own module (a cache of
    computed vectors, an optimizer's state), `torchvision.utils.save_image(...)`,
    `matplotlib.pyplot.savefig(...)` and
    `open(path, <literal mode with w, a or x>)` (the statement holding the call; for `with open(...)
    as f:` the whole block, and `with` blocks around it that hold nothing else). Downloads and
    unpacking (`urllib.request.urlretrieve`, `shutil.unpack_archive`, `.extractall(...)` of a
    tarfile or zipfile) run on the main process only, with the `with` and `if` statements around
    them (`if not os.path.exists(archive): urlretrieve(...)`: only the main process tests and
    fetches), followed by `accelerator.wait_for_everyone()`: every process reads the data after it.
    Not `with accelerator.main_process_first():` (which the runtime has): the others would then run
    the block after the main process, downloading and unpacking again over the files the main
    process is already reading; that idiom suits loaders that skip what is present, and is what a
    dataset built with `download=` gets (`datasets.MNIST(root, train=True, download=True)`,
    CIFAR10/100, the script's own class taking `download=True`): the statement building it (also
    `DataLoader(datasets.MNIST(..., download=True), ...)`) runs under
    `with accelerator.main_process_first():` (neighbouring statements share one `with`): the main
    process downloads and unpacks, the others then find the files and only load them. Built in a
    function that does not hold the accelerator (a helper of another module, `build_dataset(args)`
    of a repository's datasets.py; a Dataset class's constructor), the statements calling it are
    wrapped instead; a `download=download` passed on from a parameter is left to those callers.
    torchtext's legacy data sets download their files when missing without any `download=`
    (`datasets.SNLI.splits(text, label)`, `.iters(...)`): the statement gets the same `with` (in a
    function that cannot reach the accelerator, it is reported). A cache the script makes when it
    is missing (`if os.path.isfile(cache): v = torch.load(cache) else: v = compute(); torch.save(v,
    cache)`, outside loops) runs as a whole under `with accelerator.main_process_first():`, its
    write on the main process: the main process computes (or downloads, `vocab.load_vectors(...)`)
    and writes it, the others then find the file and load it instead of reading it half written.

Why:
    Every process runs the script: without this, each of N processes writes the same checkpoint
    file (image, plot, text file, unpacked archive) at once, prints every line N times and draws N
    progress bars, and N processes removing the same old snapshots race: all but one fail with
    FileNotFoundError. After `prepare` the model
    may be wrapped (DistributedDataParallel): its state dict would carry a `module.` prefix that
    the single-device script cannot load. Only the main process writes the checkpoint: without the
    barrier, the others would read a file it has not finished (or not started) writing.

Example:
    torch.save(model.state_dict(), "net.pt")
    -> accelerator.save(accelerator.unwrap_model(model).state_dict(), "net.pt")
    print(f"loss {loss:.3f}")  ->  accelerator.print(f"loss {loss:.3f}")
    plt.savefig("loss.pdf")    ->  if accelerator.is_main_process:
                                       plt.savefig("loss.pdf")

Leaves alone:
    Prints when the script patches
    `builtins.print` for rank 0 itself (reported), tqdm calls that already pass `disable=`, a model
    built anew after `prepare` (`model = Net()` to reload for inference: it is not wrapped),
    loads after a save inside a rank check or in another branch (a barrier there would hang), and
    prints in methods of a class that never holds the accelerator (an `nn.Module`, or a class of a
    script that creates the Accelerator at module level: nanoGPT's `configure_optimizers` and
    `DataLoaderLite`): under the script's own rank check (`if master_process:`) they are already
    main-process only; any other is reported. A print that formats the process's own rank
    (`print(f"rank {ddp_rank} sample {i}: {text}")`) is each process's on purpose and is kept.
    File writes already under a rank check stay as they are, and so do writes whose path names the
    process's rank (`open(f"rank{rank}.json", "w")`, a rank read by key as in
    `f"rank{results['rank']}.json"` or `os.environ["RANK"]`, directly or through a name bound to
    such a path in the same function): each process writes its own file. Reported (with the line and the fix)
    and left on every process, a write whose statement also calls the prepared model (a
    distributed model's forward may synchronise buffers with the other processes), an
    `accelerator` method, `torch.distributed`, `.backward()` or `.step()` (directly or in a
    function of this file it calls): every process must run those; one that binds a name other
    statements read (`n = f.write(...)`); one whose path is read back in the same function (by a
    call named `*load*`, `*read*` or `open` with the same path expression: the others would read
    a file not yet written; `open` for writing is no read); a writer call in the header of an
    `if`/`for`; and writes in functions of the script that cannot reach the accelerator (an
    nn.Module's methods, callbacks nothing in this file calls). A read in the other branch of an
    `if` around the write, outside loops, is no read back (`if os.path.isfile(cache): v =
    torch.load(cache) else: ...; torch.save(v, cache)`: the main process writes the cache, and no
    process reads it in this run). A removal is reported on the same grounds (also calling the
    prepared model or a collective, binding a name read later). Writes in another module of a unit
    (a logger module's files, often one per rank) are left alone, as its checkpoints are. Other writers (`np.save`, `df.to_csv`, `fig.savefig` on a figure object) are not
    recognised. Reported the same way, a dataset with `download=` built at module level before the
    Accelerator exists, in the header of an `if`/`for` (`for x, y in
    DataLoader(datasets.MNIST(..., download=True))`), in a statement that also calls the prepared
    model, an `accelerator` method or `torch.distributed` (the others wait at the barrier while the
    main process would wait for them), or in a function with no caller that can reach the
    accelerator.

Fix safety:
    Safe: on one process the main process is the only process. The whole module saved through
    `accelerator.unwrap_model` is the module the single-device script saved (`torch.load(path)`
    gives it back). A guarded removal holds no collective and no model call either; the others
    skip removing files that only the main process wrote. On N processes a guarded write
    holds no collective and no model call, and binds nothing the rest of the script reads, so the
    other processes skip only the write; after a guarded download they wait at a barrier placed
    where every process arrives (outside the tests the fetch was under, in the same block), as long
    as the function holding it runs on every process. `main_process_first()` is two barriers
    every process reaches (the others before the block, the main process after it); the wrapped
    statement holds no collective, and one already under a rank check or a `with` that lets one
    process go first (`torch_distributed_zero_first(rank)`, a second run) is left alone.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import libcst as cst

from migrate.analysis import Scope, Site, StmtRef
from migrate.names import dotted_name, target_names
from migrate.edits import EditPlan
from migrate.roles import Roles
from migrate.roles.model import nested_in
from migrate.rules.base import accelerator_call, names_read, reference
from migrate.walk import Visitor, walk

CODE = "AM009"
NAME = "checkpoints-and-output"

# An `if` only some processes pass (a rank check, ours or the script's own).
_RANK_TEST = re.compile(r"main_process|rank|primary|master", re.IGNORECASE)
_TQDM = frozenset({"tqdm.tqdm", "tqdm.auto.tqdm", "tqdm.notebook.tqdm", "tqdm.trange", "tqdm.auto.trange"})


def apply(roles: Roles, plan: EditPlan) -> None:
    if roles.home is None or not roles.models:
        return
    reachable = []
    for scope in roles.facts.scopes:
        can_reach = roles.can_reach(scope)
        saves: list[StmtRef] = []
        if can_reach:
            for call in scope.library_calls:
                if call.qualified == "torch.save":
                    if _checkpoint(roles, plan, scope, call.call):
                        saves.append(call.where)
                elif call.qualified in _TQDM and _reached(roles, plan, scope):
                    _quiet_progress_bar(plan, scope, call.call)
        # after the checkpoints: a `torch.save` they did not convert (a cache, an optimizer's
        # state) is a file write like the others
        guarded = _file_writes(roles, plan, scope)
        _downloading_datasets(roles, plan, scope)
        _implicit_downloads(roles, plan, scope)
        if not can_reach:
            continue
        reachable.append(scope)
        _unwrapped_state_dicts(roles, plan, scope)
        _wait_before_reload(plan, scope, saves)
        _removals(roles, plan, scope, saves, guarded)
    # Prints last: a method whose class now holds `self.accelerator` for its checkpoint or its
    # backward (another method's) prints through it at no cost; a function of the script that only
    # prints is handed the accelerator too (not one of another module of a unit: its helpers keep
    # their signatures).
    for scope in reachable:
        if _reached(roles, plan, scope) or nested_in(scope, roles.facts.module_scope):
            _prints(roles, plan, scope)


def _reached(roles: Roles, plan: EditPlan, scope: Scope) -> bool:
    """`scope` sees `accelerator` without a new parameter only for output: it already uses it, needs
    none, or is a method of a class that is given `self.accelerator` for another method anyway (a
    trainer class handed the accelerator in its constructor, whose `_run_batch` calls backward)."""
    if scope in plan.uses_accelerator or not roles.needs_parameter(scope):
        return True
    return scope.is_method and any(m in plan.uses_accelerator for m in roles.methods_of(scope) or [])


def _wait_before_reload(plan: EditPlan, scope: Scope, saves: list[StmtRef]) -> None:
    """`accelerator.wait_for_everyone()` before the first `torch.load` that follows a checkpoint
    saved by the main process, in the innermost block holding both (not inside a rank check)."""
    if not saves:
        return
    save = min(saves, key=lambda ref: ref.order)
    loads = [c.where for c in scope.library_calls if c.qualified == "torch.load" and c.where.order > save.order]
    if not loads:
        return
    load = min(loads, key=lambda ref: ref.order)
    save_chain, load_chain = [*save.path, save], [*load.path, load]
    depth = 0
    while depth < min(len(save_chain), len(load_chain)) and save_chain[depth].stmt is load_chain[depth].stmt:
        depth += 1
    if depth == len(save_chain) or depth == len(load_chain):
        return  # saved and loaded by one statement
    before = load_chain[depth]
    if save_chain[depth].block is not before.block:
        return  # different branches of one statement: a load on a path without the save
    empty = cst.Module([])
    for outer in save_chain[:depth]:
        if type(outer.stmt) in (cst.If, cst.While) and _RANK_TEST.search(empty.code_for_node(outer.stmt.test)):
            return  # only some processes get here: a barrier would hang
    plan.insert_before.setdefault(before.stmt, []).append(cst.parse_statement("accelerator.wait_for_everyone()\n"))
    plan.change(CODE, before.stmt, "every process waits for the main process to finish the checkpoint before loading it")


def _checkpoint(roles: Roles, plan: EditPlan, scope: Scope, call: cst.Call) -> bool:
    """Convert one `torch.save`; True when it now saves from the main process only."""
    if not call.args:
        return False
    saved = call.args[0].value
    path = _path_of(call, "torch.save")
    per_process = path is not None and _per_process_path(scope, path)
    if type(saved) is cst.Name and roles.all_in(scope, saved.value, roles.models):
        # The whole module, as the script saved it (its format kept), from inside the wrapper.
        model = saved.value

        def unwrapped(updated: cst.Call, model: str = model, per_process: bool = per_process) -> cst.Call:
            args = [updated.args[0].with_changes(value=accelerator_call("unwrap_model", [cst.Arg(cst.Name(model))])),
                    *updated.args[1:]]
            if per_process:
                return updated.with_changes(args=args)
            return updated.with_changes(func=cst.Attribute(cst.Name("accelerator"), cst.Name("save")), args=args)

        plan.calls[call] = unwrapped
        plan.use_accelerator(scope)
        if per_process:
            plan.change(CODE, call, "the whole module saved from inside the wrapper; its path names the "
                        "process's rank, so each process still saves its own file")
            return False
        plan.change(CODE, call, "the whole module saved once, from the unwrapped model, by `accelerator.save`")
        return True
    state_dicts = [c for c in _state_dict_calls(saved) if _model_root(roles, scope, c) is not None]
    if not state_dicts and type(saved) is cst.Name:
        # `weights = model.state_dict(); torch.save(weights, path)`: save once, from the main process.
        bound = [b.value for b in scope.bindings.get(saved.value, []) if b.value is not None]
        if any(_model_root(roles, scope, c) for v in bound for c in _state_dict_calls(v)):
            for value in bound:
                _unwrap_state_dicts(roles, plan, scope, value)
            return _saved_once(plan, scope, call, per_process)
        return False
    if not state_dicts:
        return False
    _unwrap_state_dicts(roles, plan, scope, saved)
    return _saved_once(plan, scope, call, per_process)


def _saved_once(plan: EditPlan, scope: Scope, call: cst.Call, per_process: bool) -> bool:
    """`torch.save` -> `accelerator.save` (the main process saves); a path naming the process's
    rank keeps `torch.save`: each process saves its own file."""
    plan.use_accelerator(scope)
    if per_process:
        plan.change(CODE, call, "checkpoint saved from the unwrapped model; its path names the process's "
                    "rank, so each process still saves its own file")
        return False
    plan.calls[call] = lambda updated: updated.with_changes(func=cst.Attribute(cst.Name("accelerator"), cst.Name("save")))
    plan.change(CODE, call, "checkpoint saved once, from the unwrapped model, by `accelerator.save`")
    return True


def _unwrapped_state_dicts(roles: Roles, plan: EditPlan, scope: Scope) -> None:
    """`model.state_dict()` / `model.load_state_dict(...)` go through `accelerator.unwrap_model`.

    A prepared model may be wrapped (DistributedDataParallel): its own state dict carries a
    `module.` prefix, and it would refuse a checkpoint saved by the single-device script. Only
    after the objects are prepared (or in another function), so `accelerator` exists.
    """
    prepared_at = roles.prepare_after.order if roles.prepare_after is not None else _existing_prepare(roles)
    for site in scope.method_calls:
        func = site.call.func
        assert type(func) is cst.Attribute and type(site.receiver) is cst.Name
        model = site.receiver.value
        if func.attr.value not in ("state_dict", "load_state_dict") or site.call in plan.calls:
            continue
        if not roles.all_in(scope, model, roles.models):
            continue
        if scope is roles.home and (site.where.order <= prepared_at or _rebuilt_after(scope, model, prepared_at, site)):
            continue
        plan.calls[site.call] = lambda updated, model=model: updated.with_changes(
            func=updated.func.with_changes(value=accelerator_call("unwrap_model", [cst.Arg(cst.Name(model))]))
        )
        plan.use_accelerator(scope)
        plan.change(CODE, site.call, f"`{model}.{func.attr.value}` on the unwrapped model")


def _rebuilt_after(scope: Scope, model: str, prepared_at: int, site: Site) -> bool:
    """The model was built anew after `prepare` (`model = Net()` for inference): not prepared, so
    nothing to unwrap."""
    before = [b for b in scope.bindings.get(model, []) if b.where.order < site.where.order]
    if not before:
        return False
    latest = max(before, key=lambda b: b.where.order)
    return (
        latest.where.order > prepared_at
        and type(latest.value) is cst.Call
        and model not in names_read(latest.value)
    )


def _existing_prepare(roles: Roles) -> int:
    """Document order of the home's own `accelerator.prepare(...)` (a script migrated before): a
    state dict loaded before it is the plain model's and stays as it is, so a second run is a no-op."""
    home = roles.home
    if home is None or not home.prepared:
        return 0
    orders = [
        site.where.order
        for site in home.method_calls
        if type(site.call.func) is cst.Attribute and site.call.func.attr.value == "prepare"
        and type(site.receiver) is cst.Name and site.receiver.value == "accelerator"
    ]
    return min(orders, default=0)


def _unwrap_state_dicts(roles: Roles, plan: EditPlan, scope: Scope, expr: cst.BaseExpression) -> None:
    for state_call in _state_dict_calls(expr):
        model = _model_root(roles, scope, state_call)
        if model is None:
            continue
        plan.calls[state_call] = lambda updated, model=model: updated.with_changes(
            func=cst.Attribute(
                accelerator_call("unwrap_model", [cst.Arg(cst.parse_expression(model))]), cst.Name("state_dict")
            )
        )


def _state_dict_calls(expr: cst.BaseExpression) -> list[cst.Call]:
    if type(expr) is cst.Call:
        func = expr.func
        if type(func) is cst.Attribute and func.attr.value == "state_dict" and not expr.args:
            return [expr]
        return []
    if type(expr) is cst.IfExp:
        return [*_state_dict_calls(expr.body), *_state_dict_calls(expr.orelse)]
    if type(expr) is cst.Dict:
        found: list[cst.Call] = []
        for element in expr.elements:
            if type(element) is cst.DictElement:
                found.extend(_state_dict_calls(element.value))
        return found
    return []


def _model_root(roles: Roles, scope: Scope, state_call: cst.Call) -> str | None:
    """`m` for `m.state_dict()` / `m.module.state_dict()` when `m` is a prepared model."""
    assert type(state_call.func) is cst.Attribute
    owner = state_call.func.value
    if type(owner) is cst.Attribute and owner.attr.value == "module":
        owner = owner.value
    ref = reference(owner)
    if ref is not None and roles.all_in(scope, ref, roles.models):
        return ref
    return None


def _quiet_progress_bar(plan: EditPlan, scope: Scope, call: cst.Call) -> None:
    if any(arg.keyword is not None and arg.keyword.value == "disable" for arg in call.args):
        return
    if any(arg.star == "**" for arg in call.args):
        return
    disable = cst.Arg(
        keyword=cst.Name("disable"),
        value=cst.UnaryOperation(
            cst.Not(), cst.Attribute(cst.Name("accelerator"), cst.Name("is_local_main_process"))
        ),
        equal=cst.AssignEqual(cst.SimpleWhitespace(""), cst.SimpleWhitespace("")),
    )

    def add_disable(updated: cst.Call) -> cst.Call:
        args = list(updated.args)
        if args and args[-1].comma is cst.MaybeSentinel.DEFAULT:
            args[-1] = args[-1].with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
        return updated.with_changes(args=[*args, disable])

    previous = plan.calls.get(call)
    plan.calls[call] = add_disable if previous is None else (lambda updated: add_disable(previous(updated)))
    plan.use_accelerator(scope)
    plan.change(CODE, call, "progress bar shown by the local main process only")


def _unreachable_method(roles: Roles, scope: Scope) -> str | None:
    """What a method is when its class never holds the accelerator ("an nn.Module": built before
    the Accelerator and never handed one; "a class of the script": the Accelerator is created at
    module level, and nothing threads it into the class), else None."""
    owner = scope.parent
    if not scope.is_method or owner is None or type(owner.node) is not cst.ClassDef:
        return None
    if roles.accelerator_scope in (roles.methods_of(scope) or []):
        return None
    bases = [roles.facts.aliases.qualify(base.value) or "" for base in owner.node.bases]
    if any(base.rsplit(".", 1)[-1] == "Module" for base in bases):
        return "an nn.Module"
    if roles.accelerator_scope is roles.facts.module_scope and not roles.needs_parameter(scope):
        return "a class of the script"
    return None


_RANK_NAME = re.compile(r"(^|_)rank$|^process_index$|^get_rank$", re.IGNORECASE)


def _says_its_rank(call: cst.Call) -> bool:
    """`print(f"rank {ddp_rank} sample {i}: {text}")`: a line each process prints about itself on
    purpose; from the main process only, the others' lines would be lost."""
    finder = _RankNames()
    for arg in call.args:
        walk(arg.value, finder)  # an attribute's name is a Name too: `args.rank`, `dist.get_rank()`
    return finder.found


class _RankNames(Visitor):
    found = False

    def visit_Name(self, node: cst.Name) -> None:
        self.found = self.found or bool(_RANK_NAME.search(node.value))


def _rank_guarded(where: StmtRef) -> bool:
    """Inside an `if` whose test is a rank check (`if master_process:`, `if rank == 0:`)."""
    empty = cst.Module([])
    return any(type(outer.stmt) is cst.If and _RANK_TEST.search(empty.code_for_node(outer.stmt.test))
               for outer in where.path)


def _prints(roles: Roles, plan: EditPlan, scope: Scope) -> None:
    sites = [site for site in scope.calls if site.callee == "print" and not scope.binds("print")]
    if not sites:
        return
    if roles.facts.patches_print:
        plan.report(
            CODE,
            sites[0].call,
            "the script patches `builtins.print` itself (a rank-0 print guard), so prints were left as "
            "they are; remove the patch and use `accelerator.print`",
        )
        return
    what = _unreachable_method(roles, scope)
    if what is not None:
        # Its methods cannot call `accelerator.print` (the safety check would refuse a
        # `self.accelerator` nobody sets): a print under the script's own rank check stays as it
        # is; any other is reported.
        unguarded = [s for s in sites if not _rank_guarded(s.where)]
        if unguarded:
            assert scope.parent is not None
            plan.report(CODE, unguarded[0].call, (
                f"`print` in `{scope.parent.name}.{scope.name}`, a method of {what}, which cannot reach "
                "the accelerator: it prints on every process; put it under the script's main-process check"))
        return
    sites = [s for s in sites if not _says_its_rank(s.call)]
    if not sites:
        return
    for site in sites:
        plan.calls[site.call] = lambda updated: updated.with_changes(
            func=cst.Attribute(cst.Name("accelerator"), cst.Name("print"))
        )
        plan.change(CODE, site.call, "`print` -> `accelerator.print` (main process only)")
    plan.use_accelerator(scope)


# -- other file writes -------------------------------------------------------------------------

# Library calls that write a file (the statement holding one runs on the main process only).
_FILE_WRITERS = frozenset({"torchvision.utils.save_image", "matplotlib.pyplot.savefig"})
# Library calls that download or unpack data every process then reads (main process only, then a
# barrier); `.extractall(...)` (tarfile, zipfile) is recognised as a method.
_FETCHERS = frozenset({"urllib.request.urlretrieve", "shutil.unpack_archive"})
_FETCH_METHODS = frozenset({"extractall"})
# Where the written path sits among a writer's arguments: (position, keyword).
_PATH_ARG = {
    "torchvision.utils.save_image": (1, "fp"),
    "matplotlib.pyplot.savefig": (0, "fname"),
    "open": (0, "file"),
    "torch.save": (1, "f"),
}
# Methods of a model that only read it (no forward): `model.parameters()` in a guarded write is fine.
_READS_MODEL_ONLY = frozenset({
    "state_dict", "parameters", "named_parameters", "buffers", "named_buffers", "modules",
    "named_modules", "children", "named_children",
})
# A call reading a file back: its function's last name.
_READS_BACK = re.compile(r"load|read|^open$", re.IGNORECASE)


@dataclass(eq=False)
class _Write:
    what: str  # "`plt.savefig(...)`", for messages
    call: cst.Call
    where: StmtRef
    fetch: bool  # a download or unpack every process then reads
    path: cst.BaseExpression | None
    removal: bool = False  # `os.remove(...)`: its unit may be a `for` or an `if`


def _file_writes(roles: Roles, plan: EditPlan, scope: Scope) -> list[StmtRef]:
    """Run the script's own file writes (`save_image`, `plt.savefig`, `with open(path, "w")`, a
    `torch.save` of something else than the model) and downloads (`.extractall(...)`,
    `urlretrieve`) on the main process only, or report them. Returns the statements guarded."""
    if type(scope.node) is cst.ClassDef:
        return []
    # Left as they are: writes already under a rank check (a second run sees our own `if`), and
    # `open(f"rank{rank}.json", "w")`: each process writes its own file.
    writes = [
        w for w in _find_writes(plan, scope, roles.facts.module_scope)
        if not _rank_guarded(_fetch_unit(w.where) if w.fetch else _unit(w.where))
        and not (w.path is not None and _per_process_path(scope, w.path))
    ]
    guarded: list[StmtRef] = []
    if not writes:
        return guarded
    method = _unreachable_method(roles, scope)
    if not roles.can_reach(scope) or method is not None:
        if not nested_in(scope, roles.facts.module_scope):
            return guarded  # another module of a unit (a logger's files): not the script's own writes
        first = writes[0]
        kind = f", a method of {method}," if method is not None else ""
        plan.report(CODE, first.call, (
            f"{first.what} in `{scope.qualname}`{kind} which cannot reach the accelerator, runs on every process "
            "(each writes the same file at once): run it on the main process only "
            "(`if accelerator.is_main_process:`, passing `accelerator` in)"), unconverted=True)
        return guarded
    done: set[cst.BaseStatement] = set()
    for write in writes:
        unit = _fetch_unit(write.where) if write.fetch else _unit(write.where)
        if unit.stmt in done:
            continue
        done.add(unit.stmt)
        if unit.stmt in plan.main_process_only:
            continue
        problem = _why_not_guarded(roles, scope, write, unit)
        if problem is not None:
            plan.report(CODE, write.call, f"{write.what} runs on every process (each writes the same file at once) "
                        f"and cannot run on the main process only: {problem}", unconverted=True)
            continue
        if unit.stmt in plan.replace_stmt:
            continue
        plan.main_process_only.add(unit.stmt)
        plan.use_accelerator(scope)
        guarded.append(unit)
        if not write.fetch and write.path is not None:
            _cache_first(roles, plan, scope, unit, write.path)
        if write.fetch:
            barrier = cst.parse_statement("accelerator.wait_for_everyone()\n")
            plan.insert_after[unit.stmt] = [*plan.insert_after.get(unit.stmt, []), barrier]
            plan.change(CODE, unit.stmt, f"{write.what} on the main process only; the others wait for it "
                        "(`accelerator.wait_for_everyone()`) before reading what it wrote")
        else:
            plan.change(CODE, unit.stmt, f"{write.what} on the main process only")
    return guarded


# Calls that remove files (`os.remove(path)`, `shutil.rmtree(folder)`): the path is the first argument.
_REMOVERS = frozenset({"os.remove", "os.unlink", "shutil.rmtree"})


def _removals(roles: Roles, plan: EditPlan, scope: Scope, saves: list[StmtRef], guarded: list[StmtRef]) -> None:
    """File removals in the block of a checkpoint or a file the main process alone now writes (the
    snapshot block: save, then remove the older snapshots) run on the main process only, with the
    `for`/`if`/`with` statements around them that hold nothing else; the save just before them joins
    the same `if`. A removal elsewhere in a function that writes from the main process is reported."""
    removals = [c for c in scope.library_calls if c.qualified in _REMOVERS and c.call.args]
    if not removals or not (saves or guarded):
        return
    anchors = [*saves, *guarded]
    for removal in removals:
        unit = _removal_unit(removal.where)
        path = removal.call.args[0].value
        if _rank_guarded(unit) or _per_process_path(scope, path) or unit.stmt in plan.main_process_only:
            continue
        what = f"`{removal.qualified}(...)`"
        if not any(anchor.block is unit.block for anchor in anchors):
            plan.report(CODE, removal.call, (
                f"{what} runs on every process, in a function whose checkpoints or files the main process "
                "alone now writes: N processes removing the same files race (FileNotFoundError); run it "
                "under `if accelerator.is_main_process:` if it removes those files"), unconverted=True)
            continue
        problem = _why_not_guarded(roles, scope, _Write(what, removal.call, removal.where, False, None, True), unit)
        if problem is not None:
            plan.report(CODE, removal.call, (
                f"{what} runs on every process (N processes removing the same files race: FileNotFoundError) "
                f"and cannot run on the main process only: {problem}"), unconverted=True)
            continue
        if unit.stmt in plan.replace_stmt:
            continue
        plan.main_process_only.add(unit.stmt)
        plan.use_accelerator(scope)
        plan.change(CODE, unit.stmt, f"{what} on the main process only, which alone writes the files it removes")
        # The save right before it (`accelerator.save(...)`, main process only already) joins its `if`.
        body = list(unit.block.body)
        index = next(i for i, stmt in enumerate(body) if stmt is unit.stmt)
        for save in saves:
            if index and save.block is unit.block and save.stmt is body[index - 1] \
                    and type(save.stmt) is cst.SimpleStatementLine and save.stmt not in plan.replace_stmt \
                    and _why_not_guarded(roles, scope, _Write("", removal.call, save, False, None), save) is None:
                plan.main_process_only.add(save.stmt)


def _removal_unit(where: StmtRef) -> StmtRef:
    """The statement to guard for a removal: the one holding the call, with the `for`, `if` (without
    `else`) and `with` statements around it that hold nothing else (`for f in glob.glob(prefix +
    "*"): if f != path: os.remove(f)`). Not the `__main__` block nor a rank check."""
    unit = where
    empty = cst.Module([])
    while unit.path:
        outer = unit.path[-1]
        stmt = outer.stmt
        if type(stmt) not in (cst.For, cst.If, cst.With) or type(stmt.body) is not cst.IndentedBlock:
            break
        if len(stmt.body.body) != 1 or stmt.body.body[0] is not unit.stmt:
            break
        if type(stmt) in (cst.For, cst.If) and stmt.orelse is not None:
            break
        if type(stmt) is cst.If and ("__name__" in empty.code_for_node(stmt.test)
                                     or _RANK_TEST.search(empty.code_for_node(stmt.test))):
            break
        unit = outer
    return unit


_EXISTS = frozenset({"os.path.isfile", "os.path.exists"})


def _cache_first(roles: Roles, plan: EditPlan, scope: Scope, unit: StmtRef, path: cst.BaseExpression) -> None:
    """A cache (`if os.path.isfile(cache): v = torch.load(cache) else: v = compute(); torch.save(v,
    cache)`): the whole `if` runs under `with accelerator.main_process_first():`, so the main process
    computes (or downloads) and writes it, and the others then find the file and load it instead
    of computing it again (or reading it half written). Outside loops and rank checks, without a
    collective or a model call in the `if`."""
    empty = cst.Module([])
    text = empty.code_for_node(path)
    chain = [*unit.path, unit]
    for outer, inner in zip(reversed(chain[:-1]), reversed(chain[1:])):
        node = outer.stmt
        if type(node) is not cst.If:
            continue
        if outer.in_loop or _rank_guarded(outer) or _goes_first(outer) or type(node.orelse) is not cst.Else:
            return
        test = node.test
        negated = type(test) is cst.UnaryOperation and type(test.operator) is cst.Not
        if negated:
            assert type(test) is cst.UnaryOperation
            test = test.expression
        if not (type(test) is cst.Call and roles.facts.aliases.qualify(test.func) in _EXISTS and test.args
                and empty.code_for_node(test.args[0].value) == text):
            continue
        written_in = node.body if negated else node.orelse.body
        if inner.block is not written_in:
            return
        if node in plan.main_process_first or node in plan.replace_stmt or _hazard(roles, scope, node, set()):
            return
        plan.main_process_first.add(node)
        plan.change(CODE, node, (
            "the cache is made under `with accelerator.main_process_first():`: the main process computes and "
            "writes it, the others then load it"))
        return


# Implicit downloads: torchtext's legacy data sets fetch and unpack their files when missing.
_IMPLICIT_DOWNLOAD = re.compile(r"^torchtext\.(legacy\.)?datasets\.\w+\.(splits|iters)$")


def _implicit_downloads(roles: Roles, plan: EditPlan, scope: Scope) -> None:
    """`datasets.SNLI.splits(text, label)` (torchtext's legacy API downloads the data set when it
    is missing): under `with accelerator.main_process_first():` where the accelerator is at hand,
    else reported."""
    for site in scope.library_calls:
        if not _IMPLICIT_DOWNLOAD.match(site.qualified) or _rank_guarded(site.where) or _goes_first(site.where):
            continue
        what = f"`{cst.Module([]).code_for_node(site.call.func)}(...)` downloads the data set when it is missing"
        if roles.can_reach(scope) and not roles.needs_parameter(scope) and _unreachable_method(roles, scope) is None:
            _first_on_main_process(roles, plan, scope, site.call, site.where.stmt, what)
        else:
            plan.report(CODE, site.call, (
                f"{what}, in `{scope.qualname}`, where the accelerator cannot reach: every process would download "
                "it into the same folder at once; build it under `with accelerator.main_process_first():` (or "
                "download it once before launching)"), unconverted=True)


def _downloading_datasets(roles: Roles, plan: EditPlan, scope: Scope) -> None:
    """A dataset built with `download=` (`datasets.MNIST(root, download=True)`, the script's own
    class taking it, also inside `DataLoader(...)`): the statement runs under
    `with accelerator.main_process_first():` (neighbours share one `with`); in a function that does
    not hold the accelerator, the statements calling it do (`build_dataset(args)` of another module,
    a Dataset class's constructor); otherwise it is reported."""
    if type(scope.node) is cst.ClassDef:
        return
    seen: set[cst.Call] = set()
    found: list[tuple[cst.Call, StmtRef]] = []
    for site in (*scope.library_calls, *scope.calls, *scope.method_calls):
        if site.call not in seen and _downloads(scope, site.call):
            seen.add(site.call)
            found.append((site.call, site.where))
    for call, where in sorted(found, key=lambda f: f[1].order):
        if _rank_guarded(where) or _goes_first(where):
            continue  # the script lets one process go first itself (or a second run)
        if not _first_where_called(roles, plan, scope, call, where, frozenset()):
            place = f"in `{scope.qualname}`, where the accelerator cannot reach"
            if scope is roles.facts.module_scope and roles.accelerator_scope is not None:
                place = f"at module level, before the Accelerator (created in `{roles.accelerator_scope.qualname}`) exists"
            plan.report(CODE, call, (
                f"this dataset is built with `download=` {place}, so every process downloads and unpacks it into the same folder at once: build it "
                "under `with accelerator.main_process_first():` (or download it once before launching)"), unconverted=True)


def _first_where_called(
    roles: Roles, plan: EditPlan, scope: Scope, call: cst.Call, where: StmtRef, seen: frozenset[int]
) -> bool:
    """Put the statement holding `call` under `with accelerator.main_process_first():` where the
    accelerator is at hand, or else the statements that call `scope` (recursively); False when some
    path cannot be wrapped (no caller in the files migrated, a caller that cannot reach it)."""
    if roles.can_reach(scope) and not roles.needs_parameter(scope) and _unreachable_method(roles, scope) is None:
        what = "this dataset is built with `download=`" if not seen else \
            f"`{cst.Module([]).code_for_node(call.func)}(...)` builds a dataset with `download=`"
        _first_on_main_process(roles, plan, scope, call, where.stmt, what)
        return True
    if not scope.is_function or id(scope) in seen or len(seen) > 4:
        return False
    callers = roles.call_sites(scope)
    if not callers:
        return False
    ok = True
    for caller, outer in callers:
        site = next((s for s in (*caller.calls, *caller.library_calls, *caller.method_calls) if s.call is outer), None)
        if site is None:
            ok = False
        elif not (_rank_guarded(site.where) or _goes_first(site.where)):
            ok = _first_where_called(roles, plan, caller, outer, site.where, seen | {id(scope)}) and ok
    return ok


def _first_on_main_process(
    roles: Roles, plan: EditPlan, scope: Scope, call: cst.Call, stmt: cst.BaseStatement, what: str
) -> None:
    """Run `stmt` under `with accelerator.main_process_first():`, or report why it cannot."""
    if stmt in plan.main_process_first or stmt in plan.main_process_only:
        return
    problem: str | None = None
    if type(stmt) is not cst.SimpleStatementLine:
        problem = ("the call is part of the header of a compound statement; build it in a statement of its "
                   "own under `with accelerator.main_process_first():`")
    elif stmt in plan.replace_stmt:
        problem = "another rule rewrites this statement; put it under `with accelerator.main_process_first():`"
    else:
        hazard = _hazard(roles, scope, stmt, set())
        if hazard is not None:
            problem = (f"the statement also {hazard}, which may wait for the other processes while they "
                       "wait for the main process; build the dataset in a statement of its own under "
                       "`with accelerator.main_process_first():`")
    if problem is not None:
        plan.report(CODE, call, (
            f"{what}: every process downloads and unpacks it into the same folder at once, and it cannot "
            f"be built by the main process first: {problem}"), unconverted=True)
        return
    plan.main_process_first.add(stmt)
    plan.use_accelerator(scope)
    plan.change(CODE, stmt, (
        f"{what}: built under `with accelerator.main_process_first():` (the main process downloads, "
        "the others then find the files)"))


def _downloads(scope: Scope, call: cst.Call) -> bool:
    """`download=True` (or any value but a literal False/None) among the call's keywords. Not a
    parameter of the function passed on (`download=download`): its callers decide."""
    for arg in call.args:
        if arg.keyword is not None and arg.keyword.value == "download":
            value = arg.value
            return not (type(value) is cst.Name and (value.value in ("False", "None") or value.value in scope.params))
    return False


def _goes_first(where: StmtRef) -> bool:
    """Inside a `with` that already lets one process go first (`accelerator.main_process_first()`,
    a script's own `torch_distributed_zero_first(rank)`)."""
    empty = cst.Module([])
    return any(
        type(outer.stmt) is cst.With
        and any(_FIRST_CONTEXT.search(empty.code_for_node(item.item)) for item in outer.stmt.items)
        for outer in where.path
    )


_FIRST_CONTEXT = re.compile(r"_first\b|main_process|rank|master|primary", re.IGNORECASE)


def _per_process_path(scope: Scope, path: cst.BaseExpression) -> bool:
    """The path names the process's rank (`f"rank{rank}.json"`, `args.local_rank`,
    `accelerator.process_index`), directly or through a name bound to such a value in this scope:
    each process writes a file of its own."""
    values = [path]
    if type(path) is cst.Name:
        values.extend(b.value for b in scope.bindings.get(path.value, []) if b.value is not None)
    return any(_mentions_rank(value) for value in values)


def _mentions_rank(node: cst.CSTNode) -> bool:
    finder = _RankReads()
    walk(node, finder)
    return finder.found


class _RankReads(Visitor):
    """A rank read by name (`rank`, `args.local_rank`, `get_rank()`), or by key: `results["rank"]`,
    `os.environ["RANK"]`, `os.environ.get("LOCAL_RANK")`, `os.getenv("RANK")`."""

    found = False

    def visit_Name(self, node: cst.Name) -> None:
        self.found = self.found or bool(_RANK_NAME.search(node.value))

    def visit_Subscript(self, node: cst.Subscript) -> None:
        if len(node.slice) == 1 and type(node.slice[0].slice) is cst.Index:
            self.found = self.found or _rank_key(node.slice[0].slice.value)

    def visit_Call(self, node: cst.Call) -> None:
        name = node.func.attr.value if type(node.func) is cst.Attribute else getattr(node.func, "value", None)
        if name in ("get", "getenv") and node.args:
            self.found = self.found or _rank_key(node.args[0].value)


def _rank_key(key: cst.BaseExpression) -> bool:
    value = key.evaluated_value if type(key) is cst.SimpleString else None
    return isinstance(value, str) and bool(_RANK_NAME.search(value))


def _find_writes(plan: EditPlan, scope: Scope, module_scope: Scope) -> list[_Write]:
    found: list[_Write] = []
    for call in scope.library_calls:
        if call.qualified == "torch.save" and call.call.args and call.call not in plan.calls \
                and nested_in(scope, module_scope):
            # not a checkpoint of the model (those are `accelerator.save` now): a cache, an
            # optimizer's state
            found.append(_Write("`torch.save(...)`", call.call, call.where, False, _path_of(call.call, call.qualified)))
        elif call.qualified in _FILE_WRITERS:
            short = call.qualified.rsplit(".", 1)[-1]
            found.append(_Write(f"`{short}(...)`", call.call, call.where, False, _path_of(call.call, call.qualified)))
        elif call.qualified in _FETCHERS:
            short = call.qualified.rsplit(".", 1)[-1]
            found.append(_Write(f"`{short}(...)`", call.call, call.where, True, None))
    for site in scope.method_calls:
        func = site.call.func
        assert type(func) is cst.Attribute
        if func.attr.value in _FETCH_METHODS:
            found.append(_Write(f"`.{func.attr.value}(...)`", site.call, site.where, True, None))
    if not scope.binds("open"):
        for site in scope.calls:
            if site.callee == "open" and _writes_mode(site.call):
                mode = _mode(site.call)
                found.append(_Write(f"`open(..., {mode})`", site.call, site.where, False, _path_of(site.call, "open")))
    return sorted(found, key=lambda w: w.where.order)


def _mode(call: cst.Call) -> str | None:
    """The mode of `open(path, mode)` as written (`'w'`), when it is given."""
    for index, arg in enumerate(call.args):
        keyword = arg.keyword.value if arg.keyword is not None else None
        if keyword == "mode" or (keyword is None and index == 1 and not arg.star):
            return cst.Module([]).code_for_node(arg.value)
    return None


def _writes_mode(call: cst.Call) -> bool:
    """`open(path, "w")` (also "a", "x", "wb", `mode="w"`): a mode given as a literal that writes."""
    for index, arg in enumerate(call.args):
        keyword = arg.keyword.value if arg.keyword is not None else None
        if keyword == "mode" or (keyword is None and index == 1 and not arg.star):
            value = arg.value
            return (type(value) is cst.SimpleString and isinstance(value.evaluated_value, str)
                    and bool(set(value.evaluated_value) & set("wax")))
    return False


def _path_of(call: cst.Call, qualified: str) -> cst.BaseExpression | None:
    position, keyword = _PATH_ARG[qualified]
    for index, arg in enumerate(call.args):
        if (arg.keyword is None and not arg.star and index == position) or (
                arg.keyword is not None and arg.keyword.value == keyword):
            return arg.value
    return None


def _unit(where: StmtRef) -> StmtRef:
    """The statement to guard: the one holding the call, or the `with` blocks around it that hold
    nothing else (`with requests.get(url) as r: with tarfile.open(fileobj=r.raw) as t:
    t.extractall()` downloads once, not only unpacks once)."""
    unit = where
    while unit.path:
        outer = unit.path[-1]
        if type(outer.stmt) is not cst.With or type(outer.stmt.body) is not cst.IndentedBlock:
            break
        if len(outer.stmt.body.body) != 1 or outer.stmt.body.body[0] is not unit.stmt:
            break
        unit = outer
    return unit


def _fetch_unit(where: StmtRef) -> StmtRef:
    """For a download or unpack: the statement with the `with` and `if` statements around it
    (`if not os.path.exists(archive): urlretrieve(url, archive)`), so that only the main process
    tests and fetches, and the barrier after it is outside any test a process could see otherwise
    (another process would find the archive the main process is writing, skip a barrier inside the
    `if`, and the processes' barriers would no longer pair). Not above a loop, nor the
    `if __name__ == "__main__":` block."""
    unit = where
    empty = cst.Module([])
    while unit.path:
        outer = unit.path[-1]
        if type(outer.stmt) is cst.If and (
                "__name__" in empty.code_for_node(outer.stmt.test) or _RANK_TEST.search(empty.code_for_node(outer.stmt.test))):
            break  # the `__main__` block, or a rank check (ours, on a second run): stays around it
        if type(outer.stmt) not in (cst.With, cst.If) or not any(s is outer.stmt for s in outer.block.body):
            break
        unit = outer
    return unit


def _why_not_guarded(roles: Roles, scope: Scope, write: _Write, unit: StmtRef) -> str | None:
    """Why the statement cannot run on the main process only (None: it can)."""
    stmt = unit.stmt
    if type(stmt) not in (cst.SimpleStatementLine, cst.With) and not ((write.fetch or write.removal) and type(stmt) is cst.If) \
            and not (write.removal and type(stmt) is cst.For):
        return ("the call is part of the header of a compound statement; write the file in a statement of "
                "its own under `if accelerator.is_main_process:`")
    hazard = _hazard(roles, scope, stmt, set())
    if hazard is not None and write.removal:
        return (f"the statement also {hazard}, which may wait for the other processes (a collective; a "
                "distributed model's forward may synchronise buffers), so every process must run it: keep "
                "that on every process and remove the files in a statement of its own under "
                "`if accelerator.is_main_process:`")
    if hazard is not None:
        return (f"the statement also {hazard}, which may wait for the other processes (a collective; a "
                "distributed model's forward may synchronise buffers), so every process must run it: keep "
                "that on every process and write from the main process only (compute first, then "
                "`if accelerator.is_main_process:` around the write, or "
                "`open(path if accelerator.is_main_process else os.devnull, ...)`)")
    bound = _bound_and_read_elsewhere(scope, stmt)
    if bound is not None:
        return (f"it binds `{bound}`, which other statements read on every process; bind it on every "
                "process and write the file under `if accelerator.is_main_process:`")
    if write.path is not None:
        reader = _reads_back(scope, unit, write.path)
        if reader is not None:
            return (f"`{reader}` reads the file back on every process (a process other than the main one "
                    "would read a file not yet written): write it under `if accelerator.is_main_process:` "
                    "and call `accelerator.wait_for_everyone()` before reading it")
    return None


def _hazard(roles: Roles, scope: Scope, node: cst.CSTNode, seen: set[int]) -> str | None:
    """What in `node` every process must run: a call of a prepared model (a distributed model's
    forward may synchronise buffers), an `accelerator` method or `torch.distributed` call (a
    collective), a backward or optimizer step, or such a thing in a function of this file it calls."""
    finder = _Calls()
    walk(node, finder)
    aliases = roles.facts.aliases
    for call in finder.calls:
        func = call.func
        target = reference(func)
        if target is None and type(func) is cst.Attribute and func.attr.value not in _READS_MODEL_ONLY:
            owner = func.value
            if type(owner) is cst.Attribute and owner.attr.value == "module":
                owner = owner.value  # `model.module.decode(...)`
            target = reference(owner)  # `model.generate(...)`, `accelerator.gather(...)`
        if target is not None and (target in roles.models or roles.all_in(scope, target, roles.models)):
            return f"runs the prepared model `{target}`"
        if target in ("accelerator", "self.accelerator") and type(func) is cst.Attribute \
                and func.attr.value not in ("print", "save"):
            return f"calls `{target}.{func.attr.value}`"
        qualified = aliases.qualify(func) or ""
        if qualified.startswith("torch.distributed."):
            return f"calls `{qualified}`"
        if type(func) is cst.Attribute and func.attr.value in ("backward", "step"):
            return f"calls `.{func.attr.value}()`"
        callee = roles.facts.function_called(call)
        if callee is not None and id(callee) not in seen:
            seen.add(id(callee))
            inner = _hazard(roles, callee, callee.node, seen)
            if inner is not None:
                return f"calls `{callee.qualname}`, which {inner}"
    return None


class _Calls(Visitor):
    def __init__(self) -> None:
        self.calls: list[cst.Call] = []

    def visit_Call(self, node: cst.Call) -> None:
        self.calls.append(node)


class _Names(Visitor):
    """Names bound in a statement, and every name read."""

    def __init__(self) -> None:
        self.bound: list[str] = []
        self.read: list[cst.Name] = []

    def visit_AssignTarget(self, node: cst.AssignTarget) -> None:
        self.bound.extend(target_names(node.target))

    def visit_AugAssign(self, node: cst.AugAssign) -> None:
        self.bound.extend(target_names(node.target))

    def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
        self.bound.extend(target_names(node.target))

    def visit_AsName(self, node: cst.AsName) -> None:
        self.bound.extend(target_names(node.name))

    def visit_For(self, node: cst.For) -> None:
        self.bound.extend(target_names(node.target))

    def visit_NamedExpr(self, node: cst.NamedExpr) -> None:
        self.bound.extend(target_names(node.target))

    def visit_Name(self, node: cst.Name) -> None:
        self.read.append(node)


def _bound_and_read_elsewhere(scope: Scope, stmt: cst.BaseStatement) -> str | None:
    """A name the statement binds that a statement outside it reads (on the other processes it
    would never be bound). Reads inside another `with ... as <name>` that binds it anew do not count
    (`with open(a, "w") as f:` then `with open(b, "w") as f:`)."""
    inside = _Names()
    walk(stmt, inside)
    bound = set(inside.bound)
    if not bound:
        return None
    own = {id(n) for n in inside.read}

    class Reads(Visitor):
        found: str | None = None
        shadowed: list[set[str]] = []

        def visit_With(self, node: cst.With) -> bool:
            if node is stmt:
                return False
            names = {n for item in node.items if item.asname is not None for n in target_names(item.asname.name)}
            self.shadowed.append(names)
            return True

        def leave_With(self, node: cst.With) -> None:
            if node is not stmt:
                self.shadowed.pop()

        def visit_For(self, node: cst.For) -> bool:
            # `for f in ...:` binds `f` anew: reads in its body are of that binding
            self.shadowed.append(set(target_names(node.target)) if node is not stmt else set())
            return True

        def leave_For(self, node: cst.For) -> None:
            self.shadowed.pop()

        def visit_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> bool:
            return node is not stmt

        def visit_Name(self, node: cst.Name) -> None:
            if self.found is None and node.value in bound and id(node) not in own \
                    and not any(node.value in names for names in self.shadowed):
                self.found = node.value

    reads = Reads()
    reads.shadowed = []
    walk(scope.node, reads)
    return reads.found


def _reads_back(scope: Scope, unit: StmtRef, path: cst.BaseExpression) -> str | None:
    """A call outside the statement, in the same scope, that reads a file at the same path
    expression (`torch.load`, `np.load`, `Image.open`, `open(path)`): the written file read back.
    Not a read in the other branch of an `if` around the write outside any loop (`if
    os.path.isfile(cache): v = torch.load(cache) else: ...; torch.save(v, cache)`): a process
    that writes never reads it in this run."""
    stmt = unit.stmt
    empty = cst.Module([])
    text = empty.code_for_node(path)
    found: list[str] = []
    # `if` statements around the write (outside loops) -> the branch holding it
    branches: dict[int, cst.CSTNode] = {}
    chain = [*unit.path, unit]
    for outer, inner in zip(chain, chain[1:]):
        node = outer.stmt
        if type(node) is not cst.If or outer.in_loop:
            continue
        if inner.block is node.body:
            branches[id(node)] = node.body
        elif type(node.orelse) is cst.Else and inner.block is node.orelse.body:
            branches[id(node)] = node.orelse

    class Reads(Visitor):
        def visit_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> bool:
            return node is not stmt

        def visit_With(self, node: cst.With) -> bool:
            return node is not stmt

        def visit_If(self, node: cst.If) -> bool:
            branch = branches.get(id(node))
            if branch is None:
                return True
            walk(node.test, self)
            walk(branch, self)
            return False

        def visit_Call(self, node: cst.Call) -> None:
            name = dotted_name(node.func) or ""
            if found or not _READS_BACK.search(name.rsplit(".", 1)[-1]):
                return
            if name == "open" and _writes_mode(node):
                return  # `open(log_file, "a")` after `open(log_file, "w")`: written again, not read
            if any(empty.code_for_node(arg.value) == text for arg in node.args):
                found.append(name)

    walk(scope.node, Reads())
    return found[0] if found else None
