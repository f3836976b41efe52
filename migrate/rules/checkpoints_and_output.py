"""Save checkpoints, print and show progress bars once, from the main process.

What it does:
    `torch.save(model.state_dict(), path)` (also inside a checkpoint dict, through a name such as
    `weights = model.state_dict()`, and for `model.module`)
    becomes `accelerator.save(accelerator.unwrap_model(model).state_dict(), path)`; the whole
    module, `torch.save(model, path)`, becomes `accelerator.save(accelerator.unwrap_model(model),
    path)` (the file still holds the user's module, as before: not the wrapper); a path naming the
    process's rank keeps `torch.save` (with the unwrapped model): each process saves its own file;
    so does a buffer in memory (`buffer = io.BytesIO()`; `torch.save(state, buffer)`, then an
    upload or a hash of `buffer`), which the code after it reads back: written on the main process
    only, the others would go on with an empty buffer (and upload it). The same holds for the
    other writes the file guards (AM009's `torch.save` of something else, `np.save`, `savefig`).
    `print(...)` becomes `accelerator.print(...)`; a print of the script's own module where no
    Accelerator is in scope (at module level, `print(config)` under `if __name__ == "__main__":`,
    or in a function that runs before the one, or the other module's class, that creates it) goes
    under `if int(os.environ.get("RANK", "0")) == 0:` (neighbouring prints share one `if`): the
    launcher's rank, which `accelerator.is_main_process` is made from (torchrun, `accel launch` and
    `accelerate launch` set RANK; plain `python` is rank 0), on either target. Not Accelerate's
    `PartialState().print`: creating the process state there would initialise the process group
    before the script's own setup, and fix the device before the Accelerator's `cpu=` is known.
    Only a print that formats and nothing else (its arguments call no function but `str`, `len`,
    `"...".format` and the like: `print(epoch, train_epoch(loader))` trains, on every process) and
    not in an `except` block (an error one process may meet alone); `tqdm(...)` gets
    `disable=not accelerator.is_local_main_process`; `model.state_dict()` on a prepared model,
    after the prepare call, goes through `accelerator.unwrap_model(model)`, and so does
    `model.load_state_dict(...)` under `--target accelerate` (Accelerate's wrapped model's keys
    carry a `module.` prefix, and it would refuse the single-device script's checkpoint; the
    runtime's prepared model takes the user's keys and `module.` ones alike, so its loads stay
    as they are). Only in code that can reach the
    accelerator: the function that creates it, nested functions, and functions that receive it
    (a function of the script that only prints or draws a progress bar, `test(model, loader)` or
    `eval_epoch(...)` over `tqdm(loader)`, is handed it as well; a helper of another module of a
    unit only when it uses it for something else).
    File removals (`os.remove`, `os.unlink`, `shutil.rmtree`), renames and copies (`os.rename`,
    `os.replace`, `shutil.move`, `shutil.copy*`) in the block that saves such a checkpoint, guards
    a file write or a download (the snapshot block: `torch.save(model, path)` then
    `for f in glob.glob(prefix + "*"): if f != path: os.remove(f)`; `torch.save(..., path)` then
    `shutil.copyfile(path, best_path)`; `zf.extractall(folder)` then `shutil.move(unpacked,
    data_file)`) run on the main process only, with the `for`/`if`/`with` statements around them
    that hold nothing else; the save just before them joins the same `if accelerator.is_main_process:`,
    and a download's barrier moves after them (the others read the renamed file). Elsewhere in such
    a function, a removal is reported (a rename or copy is left alone); in a function that writes
    nothing from the main process, it is left alone.
    A function of the script that is one file operation, one that downloads or unpacks, or writes
    a file and renames, copies or removes files (`def fetch(...): if os.path.exists(data): return;
    urlretrieve(...); tar.extractall(...); os.rename(...)`, `def save_checkpoint(state, is_best):
    torch.save(state, f); if is_best: shutil.copyfile(f, best)`), runs whole on the main process:
    each statement calling it (the call alone, its result unused; for a download with the `if`
    and `with` statements around it) goes under `if accelerator.is_main_process:`, a download's
    followed by `accelerator.wait_for_everyone()`, and nothing inside the function is guarded
    again (an early return when the data is there returns on the main process alone, before no
    barrier), nor in the script's functions called only from it (a call of one download function
    inside another is on the main process already). Only when the function holds no collective, no model call and no `global`, and
    every call can reach the accelerator; a call at module level before the Accelerator exists
    (or in a function that cannot reach it) is reported and the function left whole: call it
    after the Accelerator is created.
    A folder made after a test that it is missing (`if not os.path.exists(d): os.makedirs(d)`,
    also `os.mkdir(d)` and `not os.path.isdir(d)`) is made with `os.makedirs(d, exist_ok=True)`:
    every process may find it missing, and all but the first would fail with FileExistsError (on
    one process the test already made sure it is missing; `os.mkdir` with a mode is left alone).
    A checkpoint saved and then loaded again in the same function (train, save, reload for
    testing) gets `accelerator.wait_for_everyone()` before the first `torch.load` after the save,
    or before the first call that hands its path (a name) to a function the migration cannot read
    (`evaluate(model_path, ...)` of an evaluation module: it may load it). So does a checkpoint
    saved by a function of the script, or a method of an instance of a class of the script bound
    in the caller, that the caller calls and then loads back (`keeper = BestKeeper("best.pt")`,
    `keeper.update(val_loss, model)` in the epoch loop, `torch.load("best.pt")` after it): the
    barrier goes before the caller's load. Where the saving method cannot reach the accelerator
    (an early-stopping class whose `__call__` calls its own `save_checkpoint`), the report on its
    `torch.save` names the load of another function that reads the path back and the barrier to
    put before it.
    The script's other file writes, from a short explicit list, run under
    `if accelerator.is_main_process:` (neighbouring statements share one `if`):
    a `torch.save(...)` of something else than the model in the script's own module (a cache of
    computed vectors, an optimizer's state), `torchvision.utils.save_image(...)`,
    `matplotlib.pyplot.savefig(...)`, `numpy.save(...)`, `df.to_csv(...)` (also `to_json`,
    `to_parquet`, `to_pickle`, on a plain name), `X.save_pretrained(path)` (a transformers model,
    tokenizer or config writing its folder; a prepared model saves unwrapped:
    `accelerator.unwrap_model(model).save_pretrained(path)`, the module the single-device script
    saved, where HF Accelerate's DistributedDataParallel has no such method), a PIL image's
    `.save(path)` (an image made by a `PIL.Image` call: `Image.fromarray(pred).save(path)`, or
    `mask = Image.fromarray(pred)` bound only so in that function, then `mask.save(path)`; a
    predicted mask, a sample) and
    `open(path, <literal mode with w, a or x>)` (the statement holding the call; for `with open(...)
    as f:` the whole block, and `with` blocks around it that hold nothing else); so does a status
    line written with `sys.stdout.write(...)`, as a print would. Where no Accelerator is in scope
    (at module level, or in a plain function of the script that runs before or without the one
    that creates it: the `__main__` block's `except KeyboardInterrupt: torch.save(net.state_dict(),
    "INTERRUPTED.pth"); sys.exit(0)` around `train_net(net=net, ...)`), those writes run under
    `if int(os.environ.get("RANK", "0")) == 0:`, the launcher's rank, as prints there do
    (neighbouring ones share one `if`): the model there is the user's own module, whose state dict
    has the user's keys (`prepare` wrapped it inside the function that trains). Launchers hand a
    Ctrl-C to every process (torchrun sends each worker the SIGINT it gets), so every process is
    in the `except KeyboardInterrupt:` block; the others' `sys.exit` needs nothing (no collective;
    the runtime's exit barrier then waits for the write). Reported instead, with advice that can be
    followed there: a write in an `except` block for any other error (one process may meet it
    alone: name the process's rank in the path), one whose file is read back, renamed, copied or
    removed after it in that scope (no barrier exists there), a model saved that a function of
    the script which reaches the accelerator returned (it may be the prepared wrapper: save it in
    that function), a statement running the model handed to that function (a sharded model's
    forward is a collective), a download, and the reasons above. A file written and then read back
    in the same function on every process (the same path expression handed to a call named
    `*load*`/`*read*`/`open`, or to a class or function of the script: `train_df.to_csv("train.csv")`
    then `SpamDataset(csv_file="train.csv")`) is written on the main process and followed by
    `accelerator.wait_for_everyone()` (one after a run of neighbouring writes), so no process
    reads it before it is whole. A file written once per batch of a loop that does not train, over
    a loader prepared for training (`test()` iterating the loader the instance holds, when AM004
    could not keep that loader unprepared for the methods that do not train; a parameter,
    `def dump(model, loader)`, by the loaders its callers pass, not by a training loader of the
    same name), is guarded and reported: the main process sees only its share of the batches, so the other shares' files would
    never be written; the loop needs a loader of its own, left unprepared. Downloads and
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
    of a repository's datasets.py; a Dataset class's constructor, also the script's subclass of a
    library's dataset downloading through `super().__init__(root, download=True)`), the statements
    calling it are wrapped instead; a `download=download` passed on from a parameter is left to those callers.
    torchtext's legacy data sets download their files when missing without any `download=`
    (`datasets.SNLI.splits(text, label)`, `.iters(...)`): the statement gets the same `with` (in a
    function that cannot reach the accelerator, it is reported). A DataLoader's dataset built by a
    function the migration cannot read (`train_set = get_training_set(upscale)` of an absent
    data.py, `load_dataset(name)`; not a class) gets the same `with` where the accelerator is at
    hand: such builders download their files when missing. A cache the script makes when it
    is missing (`if os.path.isfile(cache): v = torch.load(cache) else: v = compute(); torch.save(v,
    cache)`, outside loops) runs as a whole under `with accelerator.main_process_first():`, its
    write on the main process: the main process computes (or downloads, `vocab.load_vectors(...)`)
    and writes it, the others then find the file and load it instead of reading it half written.
    A function the migration cannot read (imported from a module it does not have, `from utils
    import save_checkpoint`, `import utils`, or a name bound by no statement under a star import;
    not the standard library's) is known by its name alone, its last name split at `_`: one that
    saves or writes (`save_checkpoint`, `save_config_file`, `write_summary`, `dump_results`: the
    name starts with save, write or dump, after a private helper's leading `_`: `_save_checkpoint`),
    uploads (`push_to_hub`, `upload_results`: it starts with push or upload; N processes would
    push the same files N times, at once) or draws a progress bar (`progress_bar`), called as a
    statement of its own, runs under `if accelerator.is_main_process:` like the writers above (a
    prepared model handed to a saving one is handed as `accelerator.unwrap_model(model)`, a state
    dict as `accelerator.unwrap_model(model).state_dict()`: it saves what the single-device script
    saved); one whose name says it downloads (a part starting with download or fetch:
    `download_and_load_gpt2`, `maybe_download`, `fetch_data`, `hf_hub_download`), called outside
    loops in a simple statement (not `for batch in fetch_batches(...)`, nor a fetch per batch), is a
    download:
    called as a statement of its own, on the main process followed by
    `accelerator.wait_for_everyone()`; its result used (`settings, params =
    download_and_load_gpt2(model_size, models_dir="gpt2")`), under `with
    accelerator.main_process_first():` (the main process downloads, the others then run it over the
    files already there and load them). One whose name says it makes a folder (`mkdir`,
    `mkdir_if_missing`, `makedirs`, `make_dir`, `create_folder`, `ensure_dir`), most often `if not
    os.path.exists(d): os.mkdir(d)` in a helper module (N processes may all find the folder
    missing, and all but the first then fail with FileExistsError), called as a statement of its
    own (in a `for` loop too, per epoch; not under an `if` or a `while`, whose test a process could
    see otherwise, where a barrier could hang), runs on the main process followed by
    `accelerator.wait_for_everyone()`, as a download does: the folder is there before any process
    writes into it. A save or progress bar whose result is used, or where the
    accelerator cannot reach, is left alone (its name is all the migration knows of it); a download
    whose result is used where the accelerator cannot reach is reported.

Why:
    Every process runs the script: without this, each of N processes writes the same checkpoint
    file (image, plot, text file, unpacked archive) at once, prints every line N times and draws N
    progress bars, and N processes removing the same old snapshots race: all but one fail with
    FileNotFoundError. After `prepare` the model
    may be wrapped (DistributedDataParallel): its state dict would carry a `module.` prefix that
    the single-device script cannot load. Where the original wrapped the model in
    `nn.DataParallel` on every run (not under a condition) and saves its `state_dict()` in the same
    function, its checkpoints always had that prefix and the migrated ones do not: the save is
    reported, so that code loading the file into a DataParallel-wrapped model (an inference
    script) loads it into the bare model instead. Only the main process writes the checkpoint: without the
    barrier, the others would read a file it has not finished (or not started) writing.

Example:
    torch.save(model.state_dict(), "net.pt")
    -> accelerator.save(accelerator.unwrap_model(model).state_dict(), "net.pt")
    print(f"loss {loss:.3f}")  ->  accelerator.print(f"loss {loss:.3f}")
    plt.savefig("loss.pdf")    ->  if accelerator.is_main_process:
                                       plt.savefig("loss.pdf")

Leaves alone:
    Prints when the script patches
    `builtins.print` for rank 0 itself (reported), prints passing a keyword the builtin print does
    not take (`print(..., force=True)`: a rank-0 print installed by a module the script imports,
    asked to print on every process), tqdm calls that already pass `disable=`, a model
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
    such a path in the same function): each process writes its own file; so do writes whose path
    is chosen by `accelerator.is_main_process` (`open(path if accelerator.is_main_process else
    os.devnull, "w")`, the fix the report below advises: only the main process's file is kept). A status line written
    where the accelerator cannot reach is left alone. A `with open(path, "w") as f:` (the builtin
    `open` in a plain write mode, the file not read back in the function) around code every process
    must run (sampling text from the prepared model after training) gets that path choice itself:
    every process runs the block and only the main process writes the file (`os.devnull` spelled
    through the module's `import os`, else `from os import devnull` is added). Reported (with the
    line and the fix) and left on every process, any other write whose statement also calls the prepared model
    (DistributedDataParallel's forward broadcasts the model's buffers from the main process in the
    first forward after a training step, even under `torch.no_grad()`: sampling with the model on
    the main process alone would wait there for the others; the report advises computing on every
    process and writing from the main process, or `open(path if accelerator.is_main_process else
    os.devnull, "w")`), an
    `accelerator` method, `torch.distributed`, `.backward()` or `.step()` (directly or in a
    function of this file it calls): every process must run those; one that binds a name other
    statements read (`n = f.write(...)`); one whose path is read back in the same function under
    an `if` or `while` (their tests may differ between processes: a barrier there could hang);
    a writer call in the header of an
    `if`/`for`; and writes in methods of the script that cannot reach the accelerator (an
    nn.Module's methods, callbacks nothing in this file calls). A read in the other branch of an
    `if` around the write, outside loops, is no read back (`if os.path.isfile(cache): v =
    torch.load(cache) else: ...; torch.save(v, cache)`: the main process writes the cache, and no
    process reads it in this run). A removal is reported on the same grounds (also calling the
    prepared model or a collective, binding a name read later). Writes in another module of a unit
    (a logger module's files, often one per rank) are left alone, as its checkpoints are; but a
    function of such a module that saves with `torch.save` (`save_checkpoint(state)` of utils.py),
    holds no collective or model call and changes nothing its callers see, runs whole on the main
    process: each call of it that is a statement of its own goes under `if
    accelerator.is_main_process:` (every process would otherwise write the same file). Other writers
    (`fig.savefig` on a figure object, `df.head(8).to_csv(...)` on an expression) are not
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
    as the function holding it runs on every process; after a file read back, at a barrier under
    no `if` or `while` but the `__main__` block. A function run whole on the main process holds no
    collective and no model call, and its call binds nothing: the others skip only its files. `main_process_first()` is two barriers
    every process reaches (the others before the block, the main process after it); the wrapped
    statement holds no collective, and one already under a rank check or a `with` that lets one
    process go first (`torch_distributed_zero_first(rank)`, a second run) is left alone.
"""

from __future__ import annotations

import libcst as cst

from migrate.analysis import LibraryCall, Scope, Site, StmtRef
from migrate.edits import EditPlan
from migrate.roles import Roles
from migrate.roles.model import nested_in
from migrate.roles.calls import is_expression_statement
from migrate.rules.base import accelerator_call, names_read, reference
from migrate.rules.download_main_process_first import (
    _downloading_datasets,
    _implicit_downloads,
    _unreadable_downloads,
    _unread_datasets,
)
from migrate.rules.guard_file_operations import (
    _RANK_NAME,
    _RANK_TEST,
    _file_writes,
    _folders_made_once,
    _path_of,
    _per_process_path,
    in_memory,
    rank_guarded,
    _removals,
    _unreachable_method,
    _unreadable_function,
    _whole_file_operations,
    launcher_rank_test,
)
from migrate.walk import Visitor, walk

CODE = "AM009"
NAME = "checkpoints-and-output"

_TQDM = frozenset({"tqdm.tqdm", "tqdm.auto.tqdm", "tqdm.notebook.tqdm", "tqdm.trange", "tqdm.auto.trange"})


def apply(roles: Roles, plan: EditPlan) -> None:
    if roles.home is None or not roles.models:
        return
    reachable = []
    # Functions of the script that are one file operation (download, unpack, rename; save, copy):
    # their calls run on the main process only, so nothing inside them is guarded again.
    whole = _whole_file_operations(roles, plan)
    saving: set[int] = set()  # scopes whose checkpoint now saves from the main process only
    for scope in roles.facts.scopes:
        can_reach = roles.can_reach(scope)
        saves: list[StmtRef] = []
        if can_reach:
            for call in scope.library_calls:
                if call.qualified == "torch.save":
                    if _checkpoint(roles, plan, scope, call.call):
                        saves.append(call.where)
                        _report_data_parallel_keys(roles, plan, scope, call)
        if saves:
            saving.add(id(scope))
        if id(scope) in whole:
            # it runs on the main process only: its checkpoints still save the unwrapped model, but
            # nothing in it is guarded again, and no barrier goes inside it (the others never come)
            if can_reach:
                _unwrapped_state_dicts(roles, plan, scope)
            continue
        # after the checkpoints: a `torch.save` they did not convert (a cache, an optimizer's
        # state) is a file write like the others
        guarded, barriers = _file_writes(roles, plan, scope)
        _folders_made_once(roles, plan, scope)
        _downloading_datasets(roles, plan, scope)
        _implicit_downloads(roles, plan, scope)
        _unreadable_downloads(roles, plan, scope)
        _unread_datasets(roles, plan, scope)
        if not can_reach:
            continue
        reachable.append(scope)
        _unwrapped_state_dicts(roles, plan, scope)
        _wait_before_reload(roles, plan, scope, saves)
        _removals(roles, plan, scope, saves, guarded, barriers)
    # A checkpoint saved by a function or method of the script (an early-stopping or best-model
    # keeper called in the epoch loop) and loaded back by its caller after the loop: the caller
    # waits for the main process's save too.
    for scope in reachable:
        if id(scope) not in saving:
            _wait_before_reload(roles, plan, scope, _saving_calls(roles, scope, saving))
    # Progress bars and prints last: a method whose class now holds `self.accelerator` for its
    # checkpoint or its backward (another method's) prints through it at no cost; a function of the
    # script that only prints or draws a progress bar (`eval_epoch` over `tqdm(loader)`) is handed
    # the accelerator too (not one of another module of a unit: its helpers keep their signatures).
    for scope in reachable:
        if _reached(roles, plan, scope) or nested_in(scope, roles.facts.module_scope):
            for call in scope.library_calls:
                if call.qualified in _TQDM:
                    _quiet_progress_bar(plan, scope, call.call)
            _prints(roles, plan, scope)
    # Prints of the script's own module where no Accelerator is in scope: at module level or in a
    # function that runs before (or without) the one that creates it (`print(config)` under
    # `if __name__ == "__main__":`, the Accelerator created in another module's class).
    for scope in roles.facts.scopes:
        if (scope is roles.facts.module_scope or (scope.is_function and not scope.is_method)) \
                and nested_in(scope, roles.facts.module_scope) and not roles.can_reach(scope):
            _launcher_rank_prints(roles, plan, scope)


# Calls a print's arguments may make and still only format (a print that also runs something,
# `print(epoch, trainer.train_epoch(loader))`, must run on every process).
_FORMATTING = frozenset({"str", "repr", "len", "round", "int", "float", "vars", "sorted", "type", "format", "abs"})


def _environ_spelling(module: cst.CSTNode) -> str | None:
    """How the module's own top-level imports spell `os.environ` (`os.environ`, `system.environ`
    for `import os as system`, `environ` for `from os import environ`); None when they import
    neither (the import aliases of a unit are merged over its modules: not those)."""
    if not isinstance(module, cst.Module):
        return None
    for stmt in module.body:
        if type(stmt) is not cst.SimpleStatementLine:
            continue
        for small in stmt.body:
            if type(small) is cst.Import:
                for alias in small.names:
                    if type(alias.name) is cst.Name and alias.name.value == "os":
                        local = alias.asname.name if alias.asname is not None else alias.name
                        if type(local) is cst.Name:
                            return f"{local.value}.environ"
            elif type(small) is cst.ImportFrom and type(small.module) is cst.Name and small.module.value == "os" \
                    and not isinstance(small.names, cst.ImportStar):
                for alias in small.names:
                    if type(alias.name) is cst.Name and alias.name.value == "environ":
                        local = alias.asname.name if alias.asname is not None else alias.name
                        if type(local) is cst.Name:
                            return local.value
    return None


def _in_handler(where: StmtRef) -> bool:
    """The statement runs in an `except` block: an error one process may meet alone, which that
    process must still report."""
    for ref in where.path:
        if type(ref.stmt) in (cst.Try, cst.TryStar):
            for handler in ref.stmt.handlers:  # type: ignore[union-attr]
                found: list[bool] = []

                class Find(Visitor):
                    def on_visit(self, node: cst.CSTNode) -> bool:
                        if node is where.stmt:
                            found.append(True)
                        return not found

                walk(handler, Find())
                if found:
                    return True
    return False


def _only_formats(call: cst.Call) -> bool:
    """The print's arguments call nothing but formatting builtins and `"...".format(...)`."""
    found: list[cst.CSTNode] = []

    class Effects(Visitor):
        def visit_Call(self, node: cst.Call) -> None:
            func = node.func
            if type(func) is cst.Name and func.value in _FORMATTING:
                return
            if type(func) is cst.Attribute and func.attr.value == "format" and type(func.value) is cst.SimpleString:
                return
            found.append(node)

        def visit_NamedExpr(self, node: cst.NamedExpr) -> None:
            found.append(node)

    for arg in call.args:
        walk(arg, Effects())
    return not found


def _launcher_rank_prints(roles: Roles, plan: EditPlan, scope: Scope) -> None:
    """`print(...)` as a statement of its own -> `if int(os.environ.get("RANK", "0")) == 0:
    print(...)`: the launcher's rank, which the Accelerator's `is_main_process` is made from (RANK
    is set by torchrun, `accel launch` and `accelerate launch`; plain `python` sets none: rank 0).
    Creating process state here instead (Accelerate's `PartialState().print`) would initialise the
    process group before the script's own setup or the Accelerator's `cpu=` choice."""
    sites = [site for site in scope.calls if site.callee == "print" and not scope.binds("print")]
    if not sites or roles.facts.patches_print:
        return
    for site in sites:
        stmt = site.where.stmt
        if rank_guarded(site.where) or _says_its_rank(site.call) or _patched_print_call(site.call) \
                or not is_expression_statement(stmt, site.call) or stmt in plan.replace_stmt \
                or stmt in plan.main_process_only or stmt in plan.launcher_rank_only \
                or any(outer.stmt in plan.launcher_rank_only for outer in site.where.path) \
                or not _only_formats(site.call) or _in_handler(site.where):
            continue
        # neighbouring prints (and file writes run there, guard_file_operations) share one `if`
        plan.launcher_rank_only[stmt] = launcher_rank_test(roles, plan)
        plan.change(CODE, site.call, "`print` runs where no Accelerator exists yet: on the launcher's rank 0 only "
                    "(`RANK`, which `accelerator.is_main_process` is made from)")



def _reached(roles: Roles, plan: EditPlan, scope: Scope) -> bool:
    """`scope` sees `accelerator` without a new parameter only for output: it already uses it, needs
    none, or is a method of a class that is given `self.accelerator` for another method anyway (a
    trainer class handed the accelerator in its constructor, whose `_run_batch` calls backward)."""
    if scope in plan.uses_accelerator or not roles.needs_parameter(scope):
        return True
    return scope.is_method and any(m in plan.uses_accelerator for m in roles.methods_of(scope) or [])


def _wait_before_reload(roles: Roles, plan: EditPlan, scope: Scope, saves: list[StmtRef]) -> None:
    """`accelerator.wait_for_everyone()` before the first `torch.load` that follows a checkpoint
    saved by the main process, in the innermost block holding both (not inside a rank check); or
    before the first call handing the checkpoint's path (a name) to a function of a module the
    migration cannot read (`evaluate(model_path, ...)`), which may load it."""
    if not saves:
        return
    save = min(saves, key=lambda ref: ref.order)
    loads = [c.where for c in scope.library_calls if c.qualified == "torch.load" and c.where.order > save.order]
    loads += _path_handed_on(roles, scope, saves)
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


def _saving_calls(roles: Roles, scope: Scope, saving: set[int]) -> list[StmtRef]:
    """The statements of `scope` that call a function of the script, or a method of an instance of
    a class of the script bound in `scope` (`keeper = BestKeeper(path)` ... `keeper.update(loss,
    model)`), whose checkpoint now saves from the main process only (`saving`, by scope id)."""
    found: list[StmtRef] = []
    for site in scope.calls:
        called = roles.facts.function_called(site.call)
        if called is not None and id(called) in saving:
            found.append(site.where)
    for site in scope.method_calls:
        assert isinstance(site.receiver, cst.Name) and isinstance(site.call.func, cst.Attribute)
        bindings = scope.bindings.get(site.receiver.value, [])
        if len(bindings) != 1 or type(bindings[0].value) is not cst.Call:
            continue
        func = bindings[0].value.func  # type: ignore[union-attr]
        cls = roles.facts.classes.get(func.value) if type(func) is cst.Name else None
        method = site.call.func.attr.value
        if cls is not None and any(s.parent is cls and s.name == method and id(s) in saving for s in roles.facts.scopes):
            found.append(site.where)
    return found


def _path_handed_on(roles: Roles, scope: Scope, saves: list[StmtRef]) -> list[StmtRef]:
    """Calls after a save that pass its path, a name bound once in this scope, to a function the
    migration cannot read (`evaluate(model_path, make_env, ...)` of an evaluation module)."""
    paths: dict[str, int] = {}
    for site in scope.library_calls:
        if site.qualified == "torch.save" and site.where in saves:
            path = _path_of(site.call, "torch.save")
            if type(path) is cst.Name and len(scope.bindings.get(path.value, [])) == 1:
                paths[path.value] = min(paths.get(path.value, site.where.order), site.where.order)
    found: list[StmtRef] = []
    for site in (*scope.calls, *scope.library_calls):
        after = [name for name, order in paths.items() if site.where.order > order]
        if not after or not any(type(a.value) is cst.Name and a.value.value in after for a in site.call.args):
            continue
        if _unreadable_function(roles, scope, site.call) is not None:
            found.append(site.where)
    return found


def _checkpoint(roles: Roles, plan: EditPlan, scope: Scope, call: cst.Call) -> bool:
    """Convert one `torch.save`; True when it now saves from the main process only."""
    if not call.args:
        return False
    saved = call.args[0].value
    path = _path_of(call, "torch.save")
    # a path naming the process's rank, or a buffer in memory (`io.BytesIO()`, then uploaded):
    # each process writes its own
    buffered = in_memory(roles, scope, path)
    per_process = path is not None and (buffered or _per_process_path(scope, path))
    own = ("it is written to a buffer in memory, which the code after it reads, so each process still "
           "writes its own" if buffered else "its path names the process's rank, so each process still saves its own file")
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
            plan.change(CODE, call, f"the whole module saved from inside the wrapper; {own}")
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
            return _saved_once(plan, scope, call, own if per_process else None)
        return False
    if not state_dicts:
        return False
    _unwrap_state_dicts(roles, plan, scope, saved)
    return _saved_once(plan, scope, call, own if per_process else None)


def _saved_once(plan: EditPlan, scope: Scope, call: cst.Call, own: str | None) -> bool:
    """`torch.save` -> `accelerator.save` (the main process saves); a path naming the process's
    rank, or a buffer in memory, keeps `torch.save` (`own` says which): each process writes its own."""
    plan.use_accelerator(scope)
    if own is not None:
        plan.change(CODE, call, f"checkpoint saved from the unwrapped model; {own}")
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
        if func.attr.value == "load_state_dict" and plan.target != "accelerate":
            continue  # the runtime's prepared model takes the user's keys and DDP's `module.` ones alike
        if not roles.all_in(scope, model, roles.models):
            continue
        if scope is roles.home and (site.where.order <= prepared_at or _rebuilt_after(scope, model, prepared_at, site)):
            continue
        plan.calls[site.call] = lambda updated, model=model: updated.with_changes(
            func=updated.func.with_changes(value=accelerator_call("unwrap_model", [cst.Arg(cst.Name(model))]))
        )
        plan.use_accelerator(scope)
        plan.change(CODE, site.call, f"`{model}.{func.attr.value}` on the unwrapped model")


_DATA_PARALLEL = frozenset({
    "torch.nn.DataParallel", "torch.nn.parallel.DataParallel", "torch.nn.parallel.data_parallel.DataParallel",
})


def _report_data_parallel_keys(roles: Roles, plan: EditPlan, scope: Scope, save: LibraryCall) -> None:
    """`model = nn.DataParallel(model)` on every run (not under a condition), then `torch.save(
    model.state_dict(), path)` in the same function: the original's checkpoint always had keys
    with a `module.` prefix, the migrated one the bare model's. Code that loads it into a
    DataParallel-wrapped model (an inference script: `nn.DataParallel(net).load_state_dict(
    torch.load(path))`) would refuse it; reported at the save, with the change to make there."""
    if not save.call.args:
        return
    for state_call in _state_dict_calls(save.call.args[0].value):
        func = state_call.func
        assert type(func) is cst.Attribute
        if type(func.value) is not cst.Name:
            continue
        model = func.value.value
        if not roles.all_in(scope, model, roles.models) and model not in roles.models:
            continue
        wraps = [b for b in scope.bindings.get(model, [])
                 if b.where.order < save.where.order and type(b.value) is cst.Call
                 and roles.facts.aliases.qualify(b.value.func) in _DATA_PARALLEL]
        if not wraps or wraps[-1].where.path:
            continue  # never wrapped here, or wrapped under a condition (the keys depended on the machine)
        plan.report(CODE, save.call, (
            f"the original wrapped `{model}` in `nn.DataParallel` on every run, so this checkpoint's keys started with "
            f"`module.`; the migrated script saves the bare model's keys (`accelerator.unwrap_model({model})`, the same "
            "weights): code that loads this file into a DataParallel-wrapped model (`nn.DataParallel(net)"
            ".load_state_dict(torch.load(path))`) must now load it into the bare model before wrapping it "
            "(`net.load_state_dict(torch.load(path))`)"))
        return


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
    """Document order of the home's own (last) `accelerator.prepare(...)` (a script migrated before):
    a state dict loaded before it is the plain model's, or the prepared model's between an early
    `model, optimizer = accelerator.prepare(model, optimizer)` and the loaders' own call (AM004's
    placement before a resume), and stays as it is, so a second run is a no-op."""
    home = roles.home
    if home is None or not home.prepared:
        return 0
    orders = [
        site.where.order
        for site in home.method_calls
        if type(site.call.func) is cst.Attribute and site.call.func.attr.value == "prepare"
        and type(site.receiver) is cst.Name and site.receiver.value == "accelerator"
    ]
    return max(orders, default=0)


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



_PRINT_KEYWORDS = {"sep", "end", "file", "flush"}


def _patched_print_call(call: cst.Call) -> bool:
    """`print(..., force=True)`: a keyword the builtin print does not take, so `print` here is a
    replacement installed elsewhere (DINO's and DeiT's `setup_for_distributed` print only on the
    main process unless `force=True`): the call asks to print on every process, and stays."""
    return any(a.keyword is not None and a.keyword.value not in _PRINT_KEYWORDS for a in call.args)


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
        unguarded = [s for s in sites if not rank_guarded(s.where)]
        if unguarded:
            assert scope.parent is not None
            plan.report(CODE, unguarded[0].call, (
                f"`print` in `{scope.parent.name}.{scope.name}`, a method of {what}, which cannot reach "
                "the accelerator: it prints on every process; put it under the script's main-process check"))
        return
    sites = [s for s in sites if not _says_its_rank(s.call) and not _patched_print_call(s.call)]
    if not sites:
        return
    for site in sites:
        plan.calls[site.call] = lambda updated: updated.with_changes(
            func=cst.Attribute(cst.Name("accelerator"), cst.Name("print"))
        )
        plan.change(CODE, site.call, "`print` -> `accelerator.print` (main process only)")
    plan.use_accelerator(scope)
