"""Create the Accelerator where every path sees it, and bind the device to `accelerator.device`.

What it does:
    Adds `from runtime import Accelerator` (or `from accelerate import Accelerator` with
    `--target accelerate`) and `accelerator = Accelerator()` in the place the script chose its
    device: `device = torch.device("cuda" if torch.cuda.is_available() else "cpu")` and its
    variants (`"cuda"`, `torch.device("cuda:0")`, an `if torch.cuda.is_available():` block,
    `torch.accelerator.current_accelerator()`) become
    `accelerator = Accelerator()` + `device = accelerator.device`; a device stored on a namespace
    (`args.device = torch.device(...)`) becomes `args.device = accelerator.device`, kept even where
    this module does not read it. The same name chosen again later becomes `accelerator.device`
    too; chosen again by the very next statement (`device = "cpu"` then an `if
    torch.cuda.is_available(): device = "cuda" elif ...` autodetection), that statement goes.
    Without a device choice the
    Accelerator is created at the top of the function that builds the optimizer (or after the
    imports for a module-level loop). Helpers of this file that now use `accelerator` receive it
    as a new trailing parameter (keyword-only when the signature has defaults, `*args` or
    keyword-only parameters), and their call sites in this file pass it; functions of another
    module of a unit (AM013) always take it keyword-only (`*, accelerator`). A class whose
    methods need it and that does not create it takes it in its constructor and keeps it as
    `self.accelerator` (a trainer class handed the objects the script builds and prepares:
    `Trainer(model, train_data, optimizer, gpu_id, save_every, accelerator)`); its other
    methods then print and save through it too.
    The creation is then moved where every path through the scope sees it before its first use:
    - a device chosen in the branches of an `if` (`if args.cuda: device = ... else: device = ...`)
      gets the Accelerator before that `if`, and each branch `device = accelerator.device`;
    - a statement above the device choice that now uses `accelerator` (a `print` turned into
      `accelerator.print`, a call of a helper that now takes or reads it, a notebook cell above the
      one choosing the device: notebooks are migrated as one script in cell order) gets it above;
    - the script's own process-group setup (`init_distributed_mode(args)`, a helper of this file
      that calls `dist.init_process_group`, `utils.init_distributed_mode(args)`) runs first: the
      Accelerator is created right after it and joins the group it made (the runtime, like HF
      Accelerate, reuses an initialised default group). When `accelerator` is needed before that
      call, the placement is reported (the output then fails the accelerator-bound check and is
      not written) rather than initialising the group twice. When that helper also returns the
      device (`device = setup()`, a torchrun script's `init_process_group` + `LOCAL_RANK` +
      `set_device` + `return torch.device("cuda", local_rank)`), the call stays as `setup()`, and
      `accelerator = Accelerator()` + `device = accelerator.device` follow it; the helper itself
      runs before the Accelerator exists and is left as it is.
    A device chosen as a string (`"cuda" if ... else "cpu"`) that the script also uses as a string
    (`"cuda" in device`, `device == "cuda"`, `pin_memory=device == "cuda"`,
    `torch.autocast(device_type=device)`, formatting, dictionary keys; there or in a helper it is
    passed to) becomes `device = accelerator.device.type`, so it stays a string.
    A flag choosing between the accelerator and the CPU (`if use_accel: device =
    torch.device("cuda") else: device = torch.device("cpu")`) becomes
    `Accelerator(cpu=not use_accel)`, so `--no-accel` still means the CPU (an
    `if torch.cuda.is_available():` test needs no flag: the Accelerator checks that itself); so
    does `torch.device("cuda" if args.backend == "gpu" and torch.cuda.is_available() else "cpu")`
    (`cpu=not (<its test>)`). A device chosen first by availability only (`DEVICE =
    torch.device("cuda" if torch.cuda.is_available() else "cpu")` at the top) and chosen again by
    such a flag once the arguments are parsed (under `if __name__ == "__main__":`) gets the
    Accelerator at that second choice, with `cpu=` from its flag; the first choice stays as it is
    (the second replaces it before anything trains). Where `accelerator` is needed before the
    flag's names are bound, the Accelerator is created without `cpu=`, and that is reported.
    Without a device variable, a script whose every device move is switched by one flag (`if
    args.gpu: net = net.cuda()` after building the model and `if args.gpu: images = images.cuda()`
    in the loop, with no `else`) gets `Accelerator(cpu=not args.gpu)`, created where the flag is
    known (before the first such `if` of the function that builds the optimizer): without `-gpu`
    the original trained on the CPU, and so does the migration, the model and its batches always
    together. A device named by a value the user gives (`device = torch.device(args.device)`,
    `--device cpu`) gets `Accelerator(cpu=torch.device(args.device).type == "cpu")`.
    Where one branch asks whether a GPU is there and the other takes the device the user names
    (`if config.device == "auto": ... else: device = config.device`), both branches become
    `accelerator.device` (the Accelerator's `cpu=` follows the named CPU), and the named branch is
    reported: a GPU named by index (`cuda:1`) is no longer honoured, where before the batches would
    have gone to that GPU while the prepared model sat on this process's own.
    A `CUDA_VISIBLE_DEVICES` the script sets itself (`os.environ["CUDA_VISIBLE_DEVICES"] =
    args.gpus`) is kept (one process still uses the GPUs it names) and reported: under `accel
    launch` every process sets the same list, then takes GPU `LOCAL_RANK` among them, so with fewer
    GPUs listed than processes the others fail; the report says to set it outside the script.
    Where that line runs after the Accelerator is created (below the creation, e.g. after the
    module's argument parsing when the script chooses no device), CUDA has already started on the
    Accelerator's GPU and the line picks nothing, even on one process: the report says so.
    A device a class holds on an attribute, chosen in its constructor's own body
    (`self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")` in `__init__`)
    while another method builds the optimizer (`build_model`, which the constructor calls after
    choosing), is the device choice: the constructor creates `self.accelerator = Accelerator()`
    there and `self.device = self.accelerator.device`, so every `.to(self.device)` of the class
    lands where the prepared models are; a flag in that choice (`"cpu" if config.cpu or not
    torch.cuda.is_available() else "cuda"`) becomes `cpu=` as above. The moves of the models to
    that device in the method that prepares (`self.G.to(self.device)` after the optimizers are
    built) are put before `prepare`, which then replaces them (AM002): a model moved after
    `prepare` is at best moved to where it is, and under DDP a model moved after its reducer was
    built fails on its first backward.
    A script that never chooses a device (no device variable, no `.cuda()`, no `.to(...)` but to
    a dtype, no `device=` but `"cpu"`, no `"cuda"`/`"mps"`/`"xpu"` string, no `torch.device`,
    `torch.set_default_device`, `torch.cuda`, `torch.accelerator`, `torch.backends.mps`,
    `torch.mps` or `torch.xpu`) and whose model is fed by something else than a prepared
    DataLoader's batches (none is prepared, or a model is also called outside the loops over the
    prepared loaders: over a loader left whole, `model(torch.Tensor([row]))`; a function defined in
    such a loop or called only from them counts as inside) gets `Accelerator(cpu=True)` (every module of a run migrated together is searched, not only
    the entry: a `main.py` that chooses nothing may import a `solver.py` that does), and the
    change says so: it trained on the CPU, and its CPU
    tensors (`torch.from_numpy(...)` inputs, `torch.zeros(...)` without `device=` in `forward`,
    `.numpy()` on outputs) would meet a model the Accelerator put on the GPU. It still runs as N
    CPU processes under `accel launch`; to use GPUs, remove `cpu=True` and put those tensors on
    `accelerator.device`. Chosen over a diagnostic: the migrated script then does what the
    original did, on every machine, and the message names the one argument to drop for GPUs.

    A device chosen by a GPU index (`torch.cuda.set_device(args.gpu)`, `torch.device(f"cuda:{args.gpu}")`,
    `"cuda:{}".format(gpu)`, `torch.device("cuda", gpu)`, `"cuda:1"`) becomes `accelerator.device` like
    any other choice, and the index is reported: it is no longer honoured (on one process the
    Accelerator takes GPU 0, under `accel launch` each process its own), so `--gpu 1` would train on
    GPU 0; pick the GPU with `CUDA_VISIBLE_DEVICES`. Not for index 0 (what `accelerator.device` is
    on one process) nor for an index read from the process's rank (`f"cuda:{local_rank}"`, a
    spawned worker's own parameter): the Accelerator gives each process its GPU the same way.
    A `with torch.cuda.device(i):` or `with torch.cuda.device_of(tensor):` that runs once the
    Accelerator exists (after its creation in the same function, or in a function only called
    from there) goes, its body kept and dedented (`with torch.cuda.device(i), other():` keeps
    `with other():`): the Accelerator makes each process's own GPU the current device
    (`torch.cuda.set_device(local_rank)`, as HF Accelerate does), where the prepared objects are;
    inside the block every process would make GPU `i` current instead (a CUDA context on that GPU
    each) and a bare `.cuda()` / `"cuda"` in the body would land there, away from the prepared
    model. Without the block they land on the process's own GPU, as the prepared model does. An
    index other than 0 or the process's rank is reported as above: it is no longer honoured.
    A `with` that runs before the Accelerator exists is AM007's (kept and reported).
    A device choice that can pick Apple's `mps` or Intel's `xpu` (`"mps" if
    torch.backends.mps.is_available() else "cpu"`, an `elif` branch choosing `"mps"`,
    `torch.device("xpu")`, `torch.accelerator.current_accelerator()`) becomes `accelerator.device`
    as well, and is reported: the runtime's Accelerator uses CUDA GPUs or the CPU only
    (runtime/state.py), so where the original trained on mps or xpu the migrated script trains on
    the CPU; `--target accelerate` keeps those devices (HF Accelerate picks them), and is not told.
    The options of a `DistributedDataParallel` wrap that AM007 removed are written as
    `Accelerator(kwargs_handlers=[DistributedDataParallelKwargs(...)])`, with the import from the
    target (`runtime` or `accelerate`); an option whose value reads a name not bound yet where the
    Accelerator is created is left out and reported at the wrap (AM007), with the option to write.

Why:
    One Accelerator per process owns the device, the process group and the precision; the rest of
    the migration calls it. Created in one branch only, after a use, or before the script's own
    `init_process_group`, it turns a working script into a NameError, or a torchrun job into
    "trying to initialize the default process group twice".

Example:
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    ->
    accelerator = Accelerator()
    device = accelerator.device

    if args.cuda:                          accelerator = Accelerator()
        device = torch.device("cuda")  ->  if args.cuda:
    else:                                      device = accelerator.device
        device = torch.device("cpu")       else:
                                               device = accelerator.device

    device = torch.device(...)   ->  accum = 4
    accum = 4                        accelerator = Accelerator(gradient_accumulation_steps=accum)
                                     device = accelerator.device

    (a module constant the Accelerator's arguments read, bound right below the device choice by
    lines that only bind names: the Accelerator is created below it; when a line above the device
    choice already needs the Accelerator, it stays there and `accelerator.gradient_accumulation_steps
    = accum` follows the constant)

Leaves alone:
    Files that already create an Accelerator (only missing parameters are threaded), files with no
    training step, and device choices inside loops. An Accelerator created in a class body is
    out of reach of the file's functions by the name `accelerator`: reported, the file left as it is.

Fix safety:
    Safe: the device name is kept, so `torch.zeros(..., device=device)` still lands on the right
    device for each process. A string device kept as `accelerator.device.type` is `"cuda"` without
    an index: `.to("cuda")` and `device="cuda"` mean the current CUDA device, which the runtime
    sets to this process's GPU with `torch.cuda.set_device(local_rank)` when it starts
    (runtime/state.py; HF Accelerate does the same), so each rank still lands on its own GPU.
    A string device only moved (`.to(device)`, `device=device`) becomes `accelerator.device`:
    a torch.device works wherever the string did for those uses.
"""

from __future__ import annotations

import builtins
import re
from collections.abc import Sequence

import libcst as cst

from migrate.analysis import DeviceBinding, Scope, StmtRef
from migrate.edits import EditPlan
from migrate.roles import Roles
from migrate.roles.loaders import home_parameter_passed
from migrate.roles.model import nested_in, transitive_callers
from migrate.roles.placement import flag_choice, is_availability, is_cpu_device, named_branch_choice
from migrate.names import ImportAliases, dotted_name
from migrate.rules.base import names_read, prepared_loaders, reference, statement
from migrate.safety.device_type import used_as_string
from migrate.walk import Visitor, contains, statement_blocks, walk

CODE = "AM001"
NAME = "create-accelerator"

TARGET_MODULES = {"runtime": "runtime", "accelerate": "accelerate"}


def apply(roles: Roles, plan: EditPlan) -> None:
    if not plan.uses_accelerator:
        return
    if not roles.accelerator_exists:
        place = _create(roles, plan, plan.target)
        if place is not None:
            _drop_current_device(roles, plan, place)
    _thread_parameter(roles, plan)


def _create(roles: Roles, plan: EditPlan, target: str) -> tuple[Sequence[cst.BaseStatement], int] | None:
    """Create the Accelerator; return the block and index before which it goes (None: not created)."""
    cpu = _cpu_flag(roles)
    binding = roles.device_binding
    scope = roles.accelerator_scope
    assert scope is not None
    device_value = "accelerator.device"
    if binding is not None and _string_device(roles, scope, binding):
        device_value = "accelerator.device.type"  # the name stays a string (see "Fix safety")
    if plan.create_at is not None:
        # The process group was initialised here (AM007): the Accelerator takes its place.
        default: cst.BaseStatement = plan.create_at
        message = "created the Accelerator where the process group was initialised"
    elif binding is not None:
        default = binding.where.stmt
        message = f"`{binding.name}` is now `{device_value}`"
    elif roles.create_before is not None:
        default = roles.create_before
        message = "created the Accelerator"
        guards = _guarding_flag(roles) if cpu is not None else None
        body = _scope_body(roles, scope)
        # Where the flag is known: before the first `if <flag>:` move of this scope (a helper
        # or a print above it that uses `accelerator` moves the creation up again).
        first = next((g for g in guards or () if _chain(body, g) is not None), None)
        if first is not None:
            default = first
            message = (f"created the Accelerator where `{cst.Module([]).code_for_node(first.test)}` is known: every "
                       f"device move of the script is switched by it, so `cpu={cpu[0]}`")
    else:
        return None
    body = _scope_body(roles, scope)
    chain = _chain(body, default)
    if chain is None:
        return None
    place = _placement(roles, plan, scope, chain, default)
    block, index = place
    # `device = ...` then `accum = 4`, read by `gradient_accumulation_steps=accum` (AM005): created
    # below the constant, with the device choice rebound right after it (`creation_can_follow`)
    after = plan.create_after
    relocated = (
        after is not None and plan.create_at is None and not roles.device_from_setup and index < len(block)
        and block[index] is (binding.where.stmt if binding is not None else roles.create_before)
        and any(stmt is after for stmt in block[index + (binding is not None):])
    )
    if relocated:
        index = next(i for i, stmt in enumerate(block) if stmt is after) + 1
        place = (block, index)
    elif after is not None and "gradient_accumulation_steps" in plan.accelerator_kwargs and any(
            stmt is after for stmt in block[index:]):
        # created higher up (a line above the device choice uses `accelerator`): the constant is not
        # bound yet there, so the number of steps is set right after it, before anything trains
        steps = plan.accelerator_kwargs.pop("gradient_accumulation_steps")
        plan.insert_after[after] = [*plan.insert_after.get(after, []),
                                    statement(f"accelerator.gradient_accumulation_steps = {steps}\n")]
        plan.change(CODE, after, (
            f"`accelerator.gradient_accumulation_steps = {steps}` set once `{steps}` is bound: the Accelerator is "
            "created above it"))
    if cpu is not None and "cpu" not in plan.accelerator_kwargs and _bound_before(cpu[1], scope, block, index):
        plan.accelerator_kwargs["cpu"] = cpu[0]
    elif cpu is not None and "cpu" not in plan.accelerator_kwargs:
        plan.report(CODE, default, (
            f"the device is chosen by `{cst.Module([]).code_for_node(cpu[1])}` (the CPU when `{cpu[0]}`), but "
            "`accelerator` is needed before the names it reads are bound, so the Accelerator is created "
            f"without `cpu={cpu[0]}` and runs on the GPU whenever there is one: create the Accelerator "
            f"where the flag is known with `Accelerator(cpu={cpu[0]})`, or launch with `accel launch --cpu`"), unconverted=True)
    elif binding is None and "cpu" not in plan.accelerator_kwargs and _trains_on_cpu_only(roles, plan):
        plan.accelerator_kwargs["cpu"] = "True"
        plan.change(CODE, default, (
            "the script never chooses a device and no prepared DataLoader moves its batches, so it trains on "
            "CPU tensors: `Accelerator(cpu=True)` keeps it on the CPU (one process each under `accel launch "
            "--nproc-per-node N`); to train on GPUs, remove `cpu=True` and create or move its tensors on "
            "`accelerator.device` (inputs, `torch.zeros(..., device=...)` in `forward`, `.cpu()` before "
            "`.numpy()`)"))
    for name, reads in plan.kwarg_reads.items():
        if name in plan.accelerator_kwargs and not _bound_before(reads, scope, block, index):
            plan.report(CODE, default, (
                f"`{name}={plan.accelerator_kwargs.pop(name)}` reads names that are not bound yet where the "
                f"Accelerator is created, so it was not written: pass `{name}=` to the Accelerator yourself "
                "(or the matching `accel launch` option)"
            ), unconverted=True)
    _ddp_handler(plan, target, scope, block, index)
    kwargs = ", ".join(f"{name}={value}" for name, value in plan.accelerator_kwargs.items())
    create = statement(f"accelerator = Accelerator({kwargs})\n")
    replaced = plan.create_at if plan.create_at is not None else binding.where.stmt if binding is not None else None
    in_place = replaced is not None and index < len(block) and block[index] is replaced
    shared = _shared_line_assign(binding) if binding is not None and plan.create_at is None else None
    if in_place and shared is not None:
        # `device = torch.device(...); model = Net()`: only the device choice is rebound, the
        # line's other statements keep their own edits.
        assert binding is not None and replaced is not None
        plan.insert_before[replaced] = [create, *plan.insert_before.get(replaced, [])]
        plan.replace_small[shared] = _rebind_small(binding.name, device_value)
    elif in_place:
        assert replaced is not None
        new: list[cst.BaseStatement] = [create.with_changes(leading_lines=replaced.leading_lines)]
        if plan.create_at is None:
            new.append(_rebind(binding.name, device_value, replaced))  # type: ignore[union-attr]
        plan.replace_stmt[replaced] = new
        if len(new) > 1:
            plan.rebound[new[1]] = binding.name  # type: ignore[union-attr]
    else:
        created: list[cst.BaseStatement] = [create]
        if relocated and binding is not None:
            rebind = _rebind(binding.name, device_value, binding.where.stmt)
            created.append(rebind)
            plan.rebound[rebind] = binding.name
            plan.replace_stmt[binding.where.stmt] = []
        if index < len(block):
            # The blank lines that set the next statement apart set the creation apart as well.
            if block[index] is not default:
                blank = [line for line in block[index].leading_lines if line.comment is None]
                create = create.with_changes(leading_lines=blank)
                created[0] = create
            plan.insert_before[block[index]] = [*created, *plan.insert_before.get(block[index], [])]
        else:
            plan.insert_after[block[-1]] = [*plan.insert_after.get(block[-1], []), *created]
        if plan.create_at is not None:
            plan.replace_stmt[plan.create_at] = []  # the Accelerator joins the group elsewhere
        if relocated:
            pass  # rebound right after the creation, above
        elif binding is not None and roles.device_from_setup:
            _keep_setup_call(plan, binding, device_value, block, index)
        elif binding is not None and binding.where.stmt is not plan.create_at and shared is not None:
            plan.replace_small[shared] = _rebind_small(binding.name, device_value)
        elif binding is not None and binding.where.stmt is not plan.create_at:
            rebind = _rebind(binding.name, device_value, binding.where.stmt, keep_leading=True)
            plan.replace_stmt[binding.where.stmt] = [rebind]
            plan.rebound[rebind] = binding.name
    if plan.create_at is not None and binding is not None and in_place:
        device = binding.where.stmt
        new_device = _rebind(binding.name, device_value, device, keep_leading=True)
        plan.replace_stmt[device] = [new_device]
        plan.rebound[new_device] = binding.name
    previous = binding
    for later in roles.later_device_bindings:
        stmt = later.where.stmt
        if previous is not None and previous.where.stmt is not plan.create_at and _right_after(previous.where, later.where):
            # `device = "cpu"` then `if torch.cuda.is_available(): device = "cuda" elif ...`:
            # the choice made again at once is the same `accelerator.device`; it goes.
            plan.replace_stmt[stmt] = []
            plan.change(CODE, stmt, f"`{later.name}` chosen again right after: removed, it is `{device_value}` already")
            continue
        previous = later
        later_shared = _shared_line_assign(later)
        if later_shared is not None:
            plan.replace_small[later_shared] = _rebind_small(later.name, device_value)
            plan.change(CODE, stmt, f"`{later.name}` chosen again: now `{device_value}` as well")
            continue
        rebound = _rebind(later.name, device_value, stmt, keep_leading=True)
        plan.replace_stmt[stmt] = [rebound]
        plan.change(CODE, stmt, f"`{later.name}` chosen again: now `{device_value}` as well")
    named = named_branch_choice(binding) if binding is not None else None
    if named is not None and named not in plan.replace_stmt:
        assert binding is not None
        plan.replace_stmt[named] = [_rebind(binding.name, device_value, named, keep_leading=True)]
        plan.report(CODE, named, (
            f"`{binding.name}` as the user names it is now the Accelerator's device as well: the CPU when it names the "
            "CPU (see `cpu=`), else this process's GPU, where the prepared model is; a GPU it names by index "
            "(`cuda:1`) is no longer honoured: pick the GPU with `CUDA_VISIBLE_DEVICES=N`"))
    plan.imports.add((TARGET_MODULES[target], "Accelerator"))
    plan.change(CODE, default, message)
    for chosen in [b for b in (binding, *roles.later_device_bindings) if b is not None]:
        if _report_ignored_index(roles, plan, scope, chosen):
            break  # once: the first place the index is used
    if target == "runtime":
        _report_other_accelerators(roles, plan)
    _report_visible_devices(roles, plan, place)
    return place


_DDP_CODE = "AM007"  # remove-distributed-boilerplate removed the wrap and asked for its options


def _ddp_handler(plan: EditPlan, target: str, scope: Scope, block: Sequence[cst.BaseStatement], index: int) -> None:
    """The options of a removed `DistributedDataParallel` wrap (AM007) as
    `kwargs_handlers=[DistributedDataParallelKwargs(...)]`; one that reads a name not bound yet
    where the Accelerator is created is reported at the wrap instead."""
    written: list[str] = []
    for name, (value, wrap) in plan.ddp_kwargs.items():
        code = cst.Module([]).code_for_node(value)
        if not _bound_before(value, scope, block, index):
            unbound = ", ".join(f"`{n}`" for n in names_read(value) if not _bound_before(cst.Name(n), scope, block, index))
            plan.report(_DDP_CODE, wrap, (
                f"`{name}={code}` of the removed `DistributedDataParallel` reads {unbound}, not bound yet where "
                "the Accelerator is created, so the prepared model trains without it: pass "
                f"`kwargs_handlers=[DistributedDataParallelKwargs({name}={code})]` to `Accelerator(...)` yourself, with "
                f"{unbound} known there (move the creation below the statement that binds it, or compute the value "
                "before the creation)"), unconverted=True)
            continue
        written.append(f"{name}={code}")
    if not written:
        return
    if "kwargs_handlers" in plan.accelerator_kwargs:
        wrap = next(iter(plan.ddp_kwargs.values()))[1]
        plan.report(_DDP_CODE, wrap, (
            f"the options `{', '.join(written)}` of the removed `DistributedDataParallel` were not carried: the "
            "Accelerator already takes other `kwargs_handlers`; add `DistributedDataParallelKwargs("
            f"{', '.join(written)})` to that list"), unconverted=True)
        return
    plan.accelerator_kwargs["kwargs_handlers"] = f"[DistributedDataParallelKwargs({', '.join(written)})]"
    plan.imports.add((TARGET_MODULES[target], "DistributedDataParallelKwargs"))


_OTHER_DEVICE = re.compile(r"^(mps|xpu)(:\d*)?$")
_OTHER_MODULES = ("torch.backends.mps.", "torch.mps.", "torch.xpu.")


def _report_other_accelerators(roles: Roles, plan: EditPlan) -> None:
    """A device choice that may pick Apple's `mps` or Intel's `xpu` (`"mps" if
    torch.backends.mps.is_available() else "cpu"`, an `elif` branch, `torch.device("xpu")`,
    `torch.accelerator.current_accelerator()`): the runtime's Accelerator uses CUDA GPUs or the CPU
    only (runtime/state.py), so on such a machine the migrated script trains on the CPU where the
    original used that device. Reported once (not with `--target accelerate`: HF Accelerate picks
    mps and xpu itself)."""
    aliases = roles.facts.aliases
    found: list[tuple[cst.CSTNode, str]] = []

    class Others(Visitor):
        def visit_SimpleString(self, node: cst.SimpleString) -> None:
            text = node.evaluated_value
            if isinstance(text, str) and _OTHER_DEVICE.match(text):
                found.append((node, f'"{text}"'))

        def visit_FormattedString(self, node: cst.FormattedString) -> None:
            first = node.parts[0] if node.parts else None
            if type(first) is cst.FormattedStringText and first.value.startswith(("mps:", "xpu:")):
                found.append((node, first.value.split(":")[0]))

        def visit_Call(self, node: cst.Call) -> None:
            qualified = aliases.qualify(node.func) or ""
            if qualified.startswith(_OTHER_MODULES):
                found.append((node, f"`{qualified}()`"))
            elif qualified == "torch.accelerator.current_accelerator":
                found.append((node, "`torch.accelerator.current_accelerator()`"))

    for chosen in (roles.device_binding, *roles.later_device_bindings):
        if chosen is None:
            continue
        node = chosen.value if chosen.value is not None else chosen.where.stmt
        walk(node, Others())
        if found:
            break
    if not found:
        return
    node, what = found[0]
    device = "mps" if "mps" in what else "xpu" if "xpu" in what else "mps or xpu"
    named = {"mps": "Apple's `mps`", "xpu": "Intel's `xpu`"}.get(device, "Apple's `mps` or Intel's `xpu`")
    plan.report(CODE, node, (
        f"the script's device choice can pick {named} ({what}); it is now `accelerator.device`, and the "
        "runtime's Accelerator uses CUDA GPUs or the CPU only, so on a machine where the original trained on "
        f"{device} the migrated script trains on the CPU instead (slower). To keep that device, migrate with "
        "`--target accelerate` (HF Accelerate picks mps and xpu)"))


def _report_visible_devices(roles: Roles, plan: EditPlan, place: tuple[Sequence[cst.BaseStatement], int]) -> None:
    """`os.environ["CUDA_VISIBLE_DEVICES"] = args.gpus` in the script: kept (on one process it still
    picks the GPU), and reported once: under `accel launch --nproc-per-node N` every process sets
    the same list before the Accelerator takes GPU `LOCAL_RANK` among the visible ones, so with
    fewer GPUs listed than processes the extra processes fail. Set where it runs after the
    Accelerator is created (a statement below the creation in its block, the module's `argparse`
    then `os.environ[...] = args.gpu`), the line picks nothing any more: the Accelerator has made
    its GPU current, and CUDA reads the variable once, when it starts; reported so, with the
    change that keeps the choice (set it outside the script)."""
    aliases = roles.facts.aliases
    found: list[cst.CSTNode] = []

    class Sets(Visitor):
        def visit_Assign(self, node: cst.Assign) -> None:
            for target in node.targets:
                sub = target.target
                if (type(sub) is cst.Subscript and aliases.qualify(sub.value) == "os.environ" and len(sub.slice) == 1
                        and type(sub.slice[0].slice) is cst.Index
                        and type(sub.slice[0].slice.value) is cst.SimpleString
                        and sub.slice[0].slice.value.evaluated_value == "CUDA_VISIBLE_DEVICES"):
                    found.append(node)

    for module in [s.node for s in roles.facts.scopes if s.parent is None] or [roles.facts.module]:
        walk(module, Sets())
    block, index = place
    if found and any(type(stmt) not in (cst.FunctionDef, cst.ClassDef) and contains(stmt, found[0])
                     for stmt in block[index:]):
        plan.report(CODE, found[0], (
            "the script sets `CUDA_VISIBLE_DEVICES` itself, but this line runs after the Accelerator is created, "
            "which has already started CUDA on this process's GPU (CUDA reads the variable once, when it starts): "
            "it no longer picks the GPUs, even on one process, which now trains on the first GPU. Set it outside "
            "the script instead (`CUDA_VISIBLE_DEVICES=1 python script.py`, `CUDA_VISIBLE_DEVICES=0,1 accel launch "
            "--nproc-per-node 2 script.py`) and remove this line"))
    elif found:
        plan.report(CODE, found[0], (
            "the script sets `CUDA_VISIBLE_DEVICES` itself; kept, so one process still uses the GPUs it names, but under "
            "`accel launch --nproc-per-node N` every process sets the same list and then takes GPU `LOCAL_RANK` among "
            "them: with fewer GPUs listed than processes the others fail. Set it outside the script instead "
            "(`CUDA_VISIBLE_DEVICES=0,1 accel launch --nproc-per-node 2 script.py`) and remove this line"))



def _keep_setup_call(
    plan: EditPlan, binding: DeviceBinding, device_value: str, block: Sequence[cst.BaseStatement], index: int
) -> None:
    """`device = setup()` (`migrate.roles.setup_device`): the call stays for its process-group setup,
    and the name is bound to `accelerator.device` right after the Accelerator created after it."""
    stmt = binding.where.stmt
    assert type(stmt) is cst.SimpleStatementLine and type(binding.value) is cst.Call
    plan.replace_stmt[stmt] = [stmt.with_changes(body=[cst.Expr(binding.value)])]
    rebind = _rebind(binding.name, device_value, stmt)
    plan.rebound[rebind] = binding.name
    if index < len(block):
        plan.insert_before[block[index]] = [*plan.insert_before[block[index]], rebind]
    else:
        plan.insert_after[block[-1]] = [*plan.insert_after[block[-1]], rebind]
    plan.change(CODE, stmt, f"`{binding.name}` from the setup helper is now `{device_value}`, created after the setup")


_RANK = re.compile(r"rank", re.IGNORECASE)
# Context managers that make a GPU the current CUDA device for their block.
_CURRENT_DEVICE = frozenset({"torch.cuda.device", "torch.cuda.device_of"})


def _drop_current_device(roles: Roles, plan: EditPlan, place: tuple[Sequence[cst.BaseStatement], int]) -> None:
    """`with torch.cuda.device(i):` / `with torch.cuda.device_of(t):` that runs once the
    Accelerator exists: the item goes (its body is kept, dedented, when it was the only item). The
    Accelerator makes each process's own GPU current (`torch.cuda.set_device(local_rank)`, as HF
    Accelerate does), where the prepared objects are; inside the block every process would make GPU
    `i` current instead (a CUDA context on it each), and a bare `"cuda"` / `.cuda()` in the body
    would land there, away from the prepared model. A GPU named by an index that is neither 0 nor
    the process's rank is reported: that index is no longer honoured."""
    empty = cst.Module([])
    for scope in roles.facts.scopes:
        if not roles.can_reach(scope):
            continue
        for call in scope.library_calls:
            stmt = call.where.stmt
            if call.qualified not in _CURRENT_DEVICE or type(stmt) is not cst.With or stmt in plan.main_process_only \
                    or stmt in plan.main_process_first or stmt in plan.replace_stmt:
                continue
            item = next((i for i in stmt.items if i.item is call.call and i.asname is None), None)
            if item is None or (scope is roles.accelerator_scope and not _after_creation(place, call.where)):
                continue
            plan.unwrap_with.setdefault(stmt, set()).add(item)
            # AM007's advice to remove it, given before the Accelerator's place was known, is done
            plan.findings = [f for f in plan.findings if f.node is not call.call]
            text = empty.code_for_node(call.call)
            plan.change(CODE, call.call, f"`with {text}:` removed, its body kept: the Accelerator makes this "
                        "process's own GPU the current device, where the prepared objects are")
            index = empty.code_for_node(call.call.args[0].value) if call.call.args else "0"
            if call.qualified == "torch.cuda.device" and index not in ("0", "None", "-1") \
                    and not _RANK.search(index) and index not in scope.params:
                flag = f" (`{index}` set to 1, say, trains on GPU 0)" if re.fullmatch(r"args\.\w+", index) else ""
                plan.report(CODE, call.call, (
                    f"`with {text}:` removed: every process now runs its body on its own GPU (GPU 0 on one "
                    f"process), so the index `{index}` is no longer honoured{flag}: pick the GPU with "
                    "`CUDA_VISIBLE_DEVICES=N`"))


def _after_creation(place: tuple[Sequence[cst.BaseStatement], int], where: StmtRef) -> bool:
    """In the function that creates the Accelerator: the statement at `where` runs after the
    creation, which goes before `block[index]`: it, or a statement holding it, is that statement
    or a later one of the same block."""
    block, index = place
    later = {id(stmt) for stmt in block[index:]}
    return any(id(ref.stmt) in later for ref in (*where.path, where))


def _report_ignored_index(roles: Roles, plan: EditPlan, scope: Scope, chosen: DeviceBinding) -> bool:
    """A device choice that named a GPU by index (`torch.cuda.set_device(args.gpu)`,
    `torch.device(f"cuda:{args.gpu}")`, `"cuda:1"`) is now `accelerator.device`: the index is no
    longer honoured. Reported, unless the index is the process's rank (a DDP script: the
    Accelerator gives each process its GPU the same way) or 0 (what `accelerator.device` is on one
    process)."""
    aliases = roles.facts.aliases
    empty = cst.Module([])
    found: list[tuple[cst.CSTNode, str]] = []

    class Indices(Visitor):
        def visit_Call(self, node: cst.Call) -> None:
            qualified = aliases.qualify(node.func) or ""
            if qualified in ("torch.cuda.set_device", "torch.accelerator.set_device_index") and node.args:
                found.append((node, empty.code_for_node(node.args[0].value)))
            elif qualified == "torch.device" and node.args:
                index = next((a.value for i, a in enumerate(node.args) if (i == 1 and a.keyword is None)
                              or (a.keyword is not None and a.keyword.value == "index")), None)
                text = empty.code_for_node(index) if index is not None else _index_in_device_string(node.args[0].value)
                if text is not None:
                    found.append((node, text))

    walk(chosen.where.stmt, Indices())
    params = set(scope.params)
    for node, index in found:
        if index in ("0", "'0'", '"0"') or _RANK.search(index) or index in params:
            continue
        bound = scope.bindings.get(index, [])
        if any(b.value is not None and _RANK.search(empty.code_for_node(b.value)) for b in bound):
            continue  # `device_id = rank % torch.cuda.device_count()`
        flag = f" (`--{index.split('.', 1)[1]} 1`, say, would still train on GPU 0)" if re.fullmatch(r"args\.\w+", index) else ""
        plan.report(CODE, node, (
            f"the device was chosen by index `{index}`; it is now `accelerator.device` (GPU 0 on one process, "
            f"each process its own GPU under `accel launch`), so that index is no longer honoured{flag}: pick the "
            "GPU with `CUDA_VISIBLE_DEVICES=N` (`CUDA_VISIBLE_DEVICES=1 python script.py`), or let `accel launch "
            "--nproc-per-node N` give each process its GPU"))
        return True
    return False


def _index_in_device_string(expr: cst.BaseExpression) -> str | None:
    """The index of `"cuda:1"`, `f"cuda:{gpu}"`, `"cuda:{}".format(gpu)`, `"cuda:%d" % gpu` or
    `"cuda:" + str(gpu)` (as written), else None."""
    empty = cst.Module([])
    if type(expr) is cst.SimpleString:
        text = expr.evaluated_value
        if isinstance(text, str) and re.fullmatch(r"(cuda|xpu):\d+", text):
            return text.split(":", 1)[1]
        return None
    if type(expr) is cst.FormattedString:
        parts = expr.parts
        if (len(parts) == 2 and type(parts[0]) is cst.FormattedStringText and parts[0].value in ("cuda:", "xpu:")
                and type(parts[1]) is cst.FormattedStringExpression):
            return empty.code_for_node(parts[1].expression)
        return None
    if type(expr) is cst.Call and type(expr.func) is cst.Attribute and expr.func.attr.value == "format" \
            and type(expr.func.value) is cst.SimpleString and expr.args:
        if str(expr.func.value.evaluated_value).startswith(("cuda:", "xpu:")):
            return empty.code_for_node(expr.args[0].value)
        return None
    if type(expr) is cst.BinaryOperation and type(expr.left) is cst.SimpleString \
            and str(expr.left.evaluated_value) in ("cuda:", "xpu:"):
        right = expr.right
        if type(right) is cst.Call and type(right.func) is cst.Name and right.func.value == "str" and right.args:
            right = right.args[0].value
        return empty.code_for_node(right)
    if type(expr) is cst.BinaryOperation and type(expr.operator) is cst.Modulo and type(expr.left) is cst.SimpleString \
            and str(expr.left.evaluated_value).startswith(("cuda:", "xpu:")):
        return empty.code_for_node(expr.right)
    return None


def _cpu_flag(roles: Roles) -> tuple[str, cst.BaseExpression] | None:
    """`not (<test>)` (or `<test>`), and the test, when a flag picks between the accelerator and the CPU:
    `if use_accel: device = torch.device("cuda") else: device = torch.device("cpu")`, or
    `device = torch.device("cuda" if args.backend == "gpu" else "cpu")`.

    Both branches become `accelerator.device`, so without `Accelerator(cpu=...)` the CPU branch
    (`--no-accel`, `--cpu`) would silently run on the GPU. Only when the test is more than an
    availability check (`if torch.cuda.is_available():` needs no flag: the Accelerator checks)."""
    first = roles.device_binding
    if first is None:
        guarded = _guarding_flag(roles)
        if guarded is None:
            return None
        test = guarded[0].test
        text = cst.Module([]).code_for_node(test)
        simple = type(test) in (cst.Name, cst.Attribute, cst.Call, cst.Subscript)
        return (f"not {text}" if simple else f"not ({text})"), test
    choice = flag_choice(first, roles.later_device_bindings)
    if choice is None:
        return None
    flag, cpu_when_true = choice
    test = cst.Module([]).code_for_node(flag)
    if cpu_when_true:
        return test, flag
    simple = type(flag) in (cst.Name, cst.Attribute, cst.Call, cst.Subscript)
    return (f"not {test}" if simple else f"not ({test})"), flag


def _guarding_flag(roles: Roles) -> list[cst.If] | None:
    """The `if <flag>:` statements (in document order) that hold every device choice of the run,
    when there is no device variable and one flag switches each move on: `if args.gpu: net =
    net.cuda()` after building the model and `if args.gpu: images = images.cuda()` in the loop
    (`-gpu` off: the original trains on the CPU). The Accelerator then takes `cpu=not <flag>`, so
    the model and its batches are on the CPU together, or on the GPU together, as before. None when
    a device is chosen outside such a statement, when the statements test different flags, when
    one has an `else`/`elif`, or when the test only asks whether a GPU is there (the Accelerator
    checks that itself)."""
    modules = [s.node for s in roles.facts.scopes if s.parent is None] or [roles.facts.module]
    aliases = roles.facts.aliases
    guards: list[cst.If] = []

    class Guards(Visitor):
        # The innermost `if`s holding a device choice (`if __name__ == "__main__":` holds the
        # `if args.gpu:` that holds the move): an `if` counts when no `if` inside it did.
        def __init__(self) -> None:
            self.found_before: list[int] = []

        def visit_If(self, node: cst.If) -> None:
            self.found_before.append(len(guards))

        def leave_If(self, node: cst.If) -> None:
            if (self.found_before.pop() != len(guards) or node.orelse is not None or is_availability(node.test)
                    or _is_main_guard(node)):
                return
            inside = _DeviceChoice(aliases)
            walk(node.body, inside)
            if inside.found:
                guards.append(node)

    for module in modules:
        walk(module, Guards())
    empty = cst.Module([])
    if not guards or len({empty.code_for_node(g.test) for g in guards}) != 1:
        return None
    skipped = {id(g) for g in guards}

    class Outside(_DeviceChoice):
        def visit_If(self, node: cst.If) -> bool:
            return not self.found and id(node) not in skipped

    outside = Outside(aliases)
    for module in modules:
        walk(module, outside)
        if outside.found:
            return None
    return guards


# Device APIs: a script using any of them chose where it runs.
_DEVICE_MODULES = ("torch.cuda", "torch.accelerator", "torch.backends.mps", "torch.mps", "torch.xpu")
_DEVICE_CALLS = frozenset({"torch.set_default_device", "torch.device"})
_DEVICE_STRING = re.compile(r"^(cuda|mps|xpu)(:\d+)?$")


def _trains_on_cpu_only(roles: Roles, plan: EditPlan) -> bool:
    """The script never chooses a device and no prepared DataLoader moves its batches: it trained on
    the CPU, and `Accelerator()` would put the model on the GPU beside CPU inputs.

    Any of these counts as a device choice: a `.cuda()` call, a `.to(...)` with anything but a dtype
    (`torch.float64`, `x.dtype`), a `device=` argument other than `"cpu"`, a `"cuda"`/`"mps"`/`"xpu"`
    string, `torch.device(...)`, `torch.set_default_device`, or anything of `torch.cuda`,
    `torch.accelerator`, `torch.backends.mps`, `torch.mps`, `torch.xpu`."""
    if roles.later_device_bindings:
        return False
    # (an iterator that is no DataLoader, prepared, yields its batches unmoved: not a device choice)
    prepared = [n for n in (*prepared_loaders(roles, plan), *plan.eval_loaders) if n not in roles.iterable_loaders]
    if prepared and not _model_fed_elsewhere(roles, set(prepared)):
        return False
    finder = _DeviceChoice(roles.facts.aliases)
    # Every module of the run, not only the entry: a script whose `main.py` builds nothing but
    # whose `solver.py` chooses `self.device` and moves every tensor there trains on the GPU.
    for module in [s.node for s in roles.facts.scopes if s.parent is None] or [roles.facts.module]:
        walk(module, finder)
        if finder.found:
            return False
    return True


def _model_fed_elsewhere(roles: Roles, prepared: set[str]) -> bool:
    """A model is called outside the loops over the prepared loaders (`prepared`, names in home):
    on a loader left whole (`for x, y in test_loader: preds.append(model(x).numpy())`), or on a
    tensor the script makes (`model(torch.Tensor([row]))`). In a script that never chooses a device
    those inputs stay on the CPU, beside a model `Accelerator()` would put on the GPU. A function
    defined in such a loop (an LBFGS closure), or called only from such loops (`step(model, x, y)`),
    runs on its batches."""
    home = roles.home
    models: set[tuple[int, str]] = set()
    for name in roles.models:
        models.add((id(home), name))
        models.update((id(origin), bound) for origin, bound in roles.origins(home, name) or ())
    fed: set[int] = set()  # ids of the `for` nodes over prepared loaders
    for scope in roles.facts.scopes:
        for loop in scope.loops:
            if loop.source is None:
                continue
            if scope is home and loop.source in prepared:
                fed.add(id(loop.node))
                continue
            if scope is not home and home_parameter_passed(roles, home, scope, loop.source) in prepared:
                fed.add(id(loop.node))  # `train_epoch(loader, ...)` called by home with its prepared parameter
                continue
            found = roles.origins(scope, loop.source)
            if found and all(origin is home and name in prepared for origin, name in found):
                fed.add(id(loop.node))
    walks = {}
    for scope in roles.facts.scopes:
        if isinstance(scope.node, cst.ClassDef):
            continue
        calls = _ModelCalls(roles, scope, fed, models)
        walk(scope.node.body if isinstance(scope.node, cst.FunctionDef) else scope.node, calls)
        walks[id(scope)] = calls
    inside = {i for calls in walks.values() for i in calls.fed_functions}
    for scope in roles.facts.scopes:
        calls = walks.get(id(scope))
        if calls is None or not calls.outside or id(scope.node) in inside:
            continue
        if scope.is_function and _called_in_loops_only(roles, scope, fed):
            continue
        return True
    return False


def _called_in_loops_only(roles: Roles, function: Scope, fed: set[int]) -> bool:
    """Every call of `function` in this file (at least one) is inside a loop of `fed`."""
    sites = [*roles.call_sites(function), *(roles.instance_calls(function) if function.is_method else [])]
    if not sites:
        return False
    for caller, call in sites:
        loops = [site.loops for site in (*caller.calls, *caller.method_calls) if site.call is call]
        if not loops or not any(id(loop.node) in fed for loop in loops[0]):
            return False
    return True


class _ModelCalls(cst.CSTVisitor):
    """Whether `scope` calls a model (a name bound where a model is) outside the loops in `fed`
    (ids of `for` nodes), not looking
    into nested functions and classes (scopes of their own)."""

    def __init__(self, roles: Roles, scope: Scope, fed: set[int], models: set[tuple[int, str]]) -> None:
        self.roles = roles
        self.scope = scope
        self.fed = fed
        self.models = models  # (id of scope, name): where the models are bound
        self.depth = 0
        self.outside = False
        self.fed_functions: set[int] = set()  # functions defined inside a loop of `fed`

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        if self.depth:
            self.fed_functions.add(id(node))
        return False

    def visit_ClassDef(self, node: cst.ClassDef) -> bool:
        return False

    def visit_Lambda(self, node: cst.Lambda) -> bool:
        return False

    def visit_For(self, node: cst.For) -> None:
        if id(node) in self.fed:
            self.depth += 1

    def leave_For(self, original_node: cst.For) -> None:
        if id(original_node) in self.fed:
            self.depth -= 1

    def visit_Call(self, node: cst.Call) -> None:
        if self.depth or self.outside:
            return
        ref = reference(node.func)
        if ref is None:
            return
        found = self.roles.origins(self.scope, ref) or set()
        if any((id(origin), name) in self.models for origin, name in found):
            self.outside = True


class _DeviceChoice(Visitor):
    """`_trains_on_cpu_only`'s search for a device choice; it stops descending once one is found."""

    def __init__(self, aliases: ImportAliases) -> None:
        self.aliases = aliases
        self.found = False

    def visit_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> bool:
        return not self.found

    def visit_IndentedBlock(self, node: cst.IndentedBlock) -> bool:
        return not self.found

    def visit_Call(self, node: cst.Call) -> None:
        func = node.func
        if type(func) is cst.Attribute and func.attr.value == "cuda":
            self.found = True
        elif type(func) is cst.Attribute and func.attr.value == "to":
            self.found = self.found or not all(_is_dtype(arg, self.aliases) for arg in node.args)
        elif (self.aliases.qualify(func) or "") in _DEVICE_CALLS:
            self.found = True

    def visit_Arg(self, node: cst.Arg) -> None:
        if node.keyword is not None and node.keyword.value == "device" and not is_cpu_device(node.value):
            self.found = True

    def visit_Attribute(self, node: cst.Attribute) -> bool:
        qualified = self.aliases.qualify(node) or ""
        if any(qualified == m or qualified.startswith(m + ".") for m in _DEVICE_MODULES):
            self.found = True
            return False
        # `a.b.c` holds only `a.b` and names, whose qualified names are prefixes of this one's: no
        # device module either
        return dotted_name(node) is None

    def visit_SimpleString(self, node: cst.SimpleString) -> None:
        raw = node.value
        if "\\" not in raw and "cuda" not in raw and "mps" not in raw and "xpu" not in raw:
            return  # evaluating the literal is the cost here; without an escape it spells what it holds
        value = node.evaluated_value
        if isinstance(value, str) and _DEVICE_STRING.match(value):
            self.found = True


def _is_dtype(arg: cst.Arg, aliases: ImportAliases) -> bool:
    """`torch.float64`, `dtype=torch.half`, `x.dtype`: a `.to(...)` argument that is no device."""
    if arg.keyword is not None:
        return arg.keyword.value in ("dtype", "non_blocking", "copy", "memory_format")
    value = arg.value
    if type(value) is cst.Name and value.value in ("True", "False"):
        return True
    if type(value) is cst.Attribute and value.attr.value == "dtype":
        return True
    qualified = aliases.qualify(value) or ""
    return qualified.startswith("torch.") and qualified.removeprefix("torch.") in _DTYPES


_DTYPES = frozenset({
    "float", "float16", "float32", "float64", "double", "half", "bfloat16", "int", "int8", "int16",
    "int32", "int64", "long", "short", "uint8", "bool", "complex64", "complex128", "cfloat", "cdouble",
})


def _bound_before(test: cst.BaseExpression, scope: Scope, block: Sequence[cst.BaseStatement], index: int) -> bool:
    """Every name the flag's test reads is bound before the Accelerator is created there: in an
    earlier statement of the same block, as a parameter, or (in a function) at the module's top
    level. Otherwise `cpu=` would read a name not yet assigned; then no flag is written."""
    earlier: set[str] = set(scope.params)
    for stmt in block[:index]:
        earlier |= _bound_names(stmt)
    if type(scope.node) is cst.Module and block is not scope.node.body and block:
        # A block nested at module level (`if __name__ == "__main__":`): the module's statements
        # above the one holding it have run (its imports among them).
        for stmt in scope.node.body:
            if _contains(stmt, block[0]):
                break
            earlier |= _bound_names(stmt)
    if type(scope.node) is not cst.Module:
        # A function runs after its module's top level: names bound there (imports included) count.
        module_scope = scope
        while module_scope.parent is not None:
            module_scope = module_scope.parent
        assert type(module_scope.node) is cst.Module
        for stmt in module_scope.node.body:
            earlier |= _bound_names(stmt)
    return all(name in earlier or name in _BUILTINS for name in names_read(test))


_BUILTINS = frozenset(dir(builtins))  # `None`, `len`: bound everywhere


def _bound_names(stmt: cst.BaseStatement) -> set[str]:
    names: set[str] = set()
    if type(stmt) in (cst.FunctionDef, cst.ClassDef):
        return {stmt.name.value}
    if type(stmt) is not cst.SimpleStatementLine:
        return names  # a compound statement may not run its bindings: not counted
    for small in stmt.body:
        if type(small) is cst.Assign:
            for target in small.targets:
                names |= {n for n in names_read(target.target)} if type(target.target) in (cst.Name, cst.Tuple) else set()
        elif type(small) in (cst.AnnAssign, cst.AugAssign) and type(small.target) is cst.Name:
            names.add(small.target.value)
        elif type(small) in (cst.Import, cst.ImportFrom) and type(small.names) is not cst.ImportStar:
            for alias in small.names:
                bound = alias.asname.name if alias.asname else alias.name
                names.add(cst.Module([]).code_for_node(bound).split(".")[0])
    return names


def _shared_line_assign(binding: DeviceBinding) -> cst.BaseSmallStatement | None:
    """The `name = value` of a device choice that shares its line with other statements
    (`device = torch.device(...); model = Net()`), else None."""
    stmt = binding.where.stmt
    if type(stmt) is not cst.SimpleStatementLine or len(stmt.body) < 2:
        return None
    for small in stmt.body:
        if type(small) in (cst.Assign, cst.AnnAssign) and small.value is binding.value:
            return small
    return None


def _rebind_small(name: str, value: str) -> cst.BaseSmallStatement:
    # `name` may be held on a namespace (`args.device`): parsed, not made a Name
    return cst.Assign(targets=[cst.AssignTarget(cst.parse_expression(name))], value=cst.parse_expression(value))


def _right_after(first: StmtRef, then: StmtRef) -> bool:
    """`then` is the statement after `first` in the same block (nothing runs in between)."""
    if first.block is not then.block:
        return False
    body = first.block.body
    return any(stmt is first.stmt and body[i + 1] is then.stmt for i, stmt in enumerate(body[:-1]))


def _rebind(name: str, value: str, original: cst.BaseStatement, keep_leading: bool = False) -> cst.BaseStatement:
    new = statement(f"{name} = {value}\n")
    if type(original) is cst.SimpleStatementLine:
        new = new.with_changes(trailing_whitespace=original.trailing_whitespace)
    if keep_leading:
        new = new.with_changes(leading_lines=original.leading_lines)
    return new


# -- where every path sees it -------------------------------------------------------------------

Chain = list[tuple[Sequence[cst.BaseStatement], int]]  # (block, index) from the scope's body down
_INIT_HELPERS = re.compile(r"^(init_distributed(_mode)?|init_dist(ributed)?_?\w*|setup_dist(ributed)?|ddp_setup|setup_ddp|dist_init)$")
_INIT = "torch.distributed.init_process_group"
_INIT_NAME = _INIT.rsplit(".", 1)[-1]


def _scope_body(roles: Roles, scope: Scope) -> Sequence[cst.BaseStatement]:
    node = scope.node
    if type(node) is cst.Module:
        return node.body
    assert type(node) is cst.FunctionDef
    return node.body.body if type(node.body) is cst.IndentedBlock else ()


def _chain(body: Sequence[cst.BaseStatement], target: cst.BaseStatement) -> Chain | None:
    for index, stmt in enumerate(body):
        if stmt is target:
            return [(body, index)]
        for block in statement_blocks(stmt):
            inner = _chain(block, target)
            if inner is not None:
                return [(body, index), *inner]
    return None


def _is_main_guard(stmt: cst.BaseStatement) -> bool:
    if not (type(stmt) is cst.If and type(stmt.test) is cst.Comparison):
        return False
    test = stmt.test
    return (
        type(test.left) is cst.Name
        and test.left.value == "__name__"
        and len(test.comparisons) == 1
        and type(test.comparisons[0].comparator) is cst.SimpleString
    )


def _placement(
    roles: Roles, plan: EditPlan, scope: Scope, chain: Chain, default: cst.BaseStatement
) -> tuple[Sequence[cst.BaseStatement], int]:
    """The block and index before which `accelerator = Accelerator()` goes, so that every path
    through the scope sees it before its first use and after the process group the script's
    own helper initialises."""
    # A device chosen in a branch (`if args.cuda: device = ...`): before the outermost statement
    # holding it (inside the `if __name__ == "__main__":` guard of a module-level script).
    level = 0
    if len(chain) > 1 and _is_main_guard(chain[0][0][chain[0][1]]):
        level = 1
    level = min(level, len(chain) - 1)
    if len(chain) == 1:
        level = 0
    # A use before that point (a helper called first, a print above the device choice, a notebook
    # cell above the one choosing the device) moves it up: the outermost such use wins.
    users = _global_users(roles, plan) if scope is roles.facts.module_scope else set()
    edited = _edited(plan)
    for depth in range(level + 1):
        block, stop = chain[depth]
        first = next((i for i in range(stop) if _uses(block[i], roles, plan, users, default, edited)), None)
        if first is not None:
            level, chain = depth, [*chain[:depth], (block, first)]
            break
    block, index = chain[level]
    # The script's own process-group setup (`init_distributed_mode(args)`) runs first: created
    # before it, the Accelerator would join a group the helper then initialises a second time.
    initialisers = _group_initialisers(roles)
    inits = [
        i for i in range(index, len(block))
        if plan.replace_stmt.get(block[i], True) != [] and _initialises_group(roles, block[i], plan.create_at, initialisers)
    ]
    if inits:
        last = inits[-1]
        device = roles.device_binding.where.stmt if roles.device_binding is not None else None
        if roles.device_from_setup:
            device = None  # `device = setup()` is the setup itself: rebound after the Accelerator
        if any(_uses(block[i], roles, plan, users, default, edited) or (device is not None and _contains(block[i], device))
               for i in range(index, last + 1)):
            plan.report(CODE, block[last], (
                "the process group is initialised here (`init_process_group`, or the script's own setup "
                "helper), but `accelerator` is needed before this line, so the Accelerator cannot be "
                "created after it (created before, it would initialise the group twice): remove this "
                "`init_process_group` and let the Accelerator join the group"
            ), unconverted=True)
        return block, last + 1
    return block, index


def _contains(stmt: cst.BaseStatement, target: cst.BaseStatement) -> bool:
    return stmt is target or any(_chain(block, target) is not None for block in statement_blocks(stmt))


def _uses(
    stmt: cst.BaseStatement, roles: Roles, plan: EditPlan, users: set[Scope], default: cst.BaseStatement, edited: set[int]
) -> bool:
    """True when the rewritten `stmt` reads `accelerator` when it runs (defs and classes: later).
    `edited`: `_edited(plan)`."""
    finder = _AcceleratorUse(roles, plan, users, default, edited)
    walk(stmt, finder)
    return finder.found


class _AcceleratorUse(cst.CSTVisitor):
    def __init__(
        self, roles: Roles, plan: EditPlan, users: set[Scope], default: cst.BaseStatement, edited: set[int]
    ) -> None:
        self.roles = roles
        self.plan = plan
        self.edited = edited
        self.users = users
        self.default = default
        self.found = False

    def on_visit(self, node: cst.CSTNode) -> bool:
        if self.found or type(node) in (cst.FunctionDef, cst.ClassDef, cst.Lambda):
            return False
        if node is not self.default and id(node) in self.edited and _edit_uses(node, self.plan):
            self.found = True
        elif (
            type(node) is cst.Call
            and type(node.func) is cst.Name
            and self.roles.facts.function_called(node) in self.users
        ):
            self.found = True
        return not self.found


# The plan's fields `_edit_uses` reads: the edits that may add a use of `accelerator`.
# tests/migrate/test_roles_shortcuts.py checks that it names exactly the fields `_edit_uses` reads.
_USING_EDITS = ("new_args", "main_process_only", "main_process_first", "calls", "attributes", "subscripts",
                "comparisons", "if_tests", "wrap_loop_body", "replace_stmt", "insert_before", "insert_after")


def _edited(plan: EditPlan) -> set[int]:
    """The ids of the nodes `_edit_uses` may find a use of `accelerator` at (a node's own hash is a
    Python call: one id test per node instead of a lookup in each field)."""
    return {id(node) for name in _USING_EDITS for node in getattr(plan, name)}


def _edit_uses(node: cst.CSTNode, plan: EditPlan) -> bool:
    if node in plan.new_args or node in plan.main_process_only or node in plan.main_process_first:
        # the latter two: `if accelerator.is_main_process:`, `with accelerator.main_process_first():`
        return True
    produced: list[cst.CSTNode] = []
    try:
        for edits in (plan.calls, plan.attributes, plan.subscripts):
            if node in edits:
                produced.append(edits[node](node))  # type: ignore[index,arg-type]
    except Exception:  # an edit that needs the updated node: assume it uses the accelerator
        return True
    for exprs in (plan.comparisons, plan.if_tests, plan.wrap_loop_body):
        if node in exprs:
            produced.append(exprs[node])  # type: ignore[index]
    for stmts in (plan.replace_stmt, plan.insert_before, plan.insert_after):
        produced.extend(stmts.get(node, []))  # type: ignore[call-overload]
    empty = cst.Module([])
    return any(re.search(r"\baccelerator\b", empty.code_for_node(p)) for p in produced)


def _global_users(roles: Roles, plan: EditPlan) -> set[Scope]:
    """Functions that read the module-level `accelerator`, directly or through others they call."""
    functions = roles.facts.plain_functions()
    return transitive_callers(functions, {fn for fn in functions if fn in plan.uses_accelerator}, roles.facts.resolve)


def _initialises_group(
    roles: Roles, stmt: cst.BaseStatement, replaced: cst.BaseStatement | None, initialisers: set[Scope]
) -> bool:
    """`init_distributed_mode(args)`, `utils.init_distributed_mode(args)`, `setup()` of this file
    that calls `init_process_group` (one of `initialisers`), or `init_process_group` itself (not
    `replaced`: the one AM007 turns into the Accelerator): a call that sets up the default process group."""
    finder = _GroupSetup(roles, replaced, initialisers)
    walk(stmt, finder)
    return finder.found


class _GroupSetup(Visitor):
    def __init__(self, roles: Roles, replaced: cst.BaseStatement | None, initialisers: set[Scope]) -> None:
        self.roles = roles
        self.replaced = replaced
        self.initialisers = initialisers
        self.found = False

    def visit_Call(self, node: cst.Call) -> bool:
        if self.found:
            return False
        func = node.func
        name = func.value if type(func) is cst.Name else func.attr.value if type(func) is cst.Attribute else ""
        called = self.roles.facts.function_called(node) if type(func) is cst.Name else None
        if called is not None and called in self.initialisers:
            self.found = True
        elif (type(func) is not cst.Attribute or name == _INIT_NAME) and self.roles.facts.aliases.qualify(func) == _INIT:
            # (a dotted name qualifies to a name ending in its own last part)
            self.found = True  # `if ddp: init_process_group(...)` below the device choice
        elif called is None and _INIT_HELPERS.match(name):
            self.found = True
        return not self.found

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        return False

    def visit_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> bool:
        # the init AM007 turns into the Accelerator itself
        return not self.found and node is not self.replaced


def _group_initialisers(roles: Roles) -> set[Scope]:
    functions = roles.facts.plain_functions()
    return transitive_callers(
        functions, {fn for fn in functions if any(c.qualified == _INIT for c in fn.library_calls)}, roles.facts.resolve
    )


def _string_device(roles: Roles, scope: Scope, binding: DeviceBinding) -> bool:
    """A device chosen as a string (`"cuda" if ... else "cpu"`, or an `if` assigning strings) that
    the script also uses as a string (`"cuda" in device`, `device == "cuda"`, `device_type=device`)."""
    if binding.value is not None:
        values = [binding.value]
    else:
        values = [
            stmt.body[0].value
            for block in statement_blocks(binding.where.stmt)
            for stmt in block
            if type(stmt) is cst.SimpleStatementLine and type(stmt.body[0]) is cst.Assign
        ]
    if not values or not all(type(v) in (cst.SimpleString, cst.IfExp, cst.FormattedString) and _is_str(v) for v in values):
        return False
    node = scope.node
    assert type(node) in (cst.Module, cst.FunctionDef)
    return used_as_string(roles.facts.module, node, binding.name)


def _is_str(expr: cst.BaseExpression) -> bool:
    if type(expr) is cst.IfExp:
        return _is_str(expr.body) and _is_str(expr.orelse)
    return type(expr) in (cst.SimpleString, cst.FormattedString, cst.ConcatenatedString)


def _thread_parameter(roles: Roles, plan: EditPlan) -> None:
    """Give every function that now uses `accelerator` (and its callers, as needed) a parameter."""
    threaded: set[int] = set()
    for scope in [*plan.uses_accelerator, roles.accelerator_scope]:
        # Methods reach it as `self.accelerator` (created in a method, or stored by `__init__`).
        if scope is not None and scope.is_method and type(scope.node) is cst.FunctionDef:
            plan.self_accelerator.add(scope.node)
        elif scope is not None and scope.is_function and not roles.needs_parameter(scope):
            # a function nested in a method reads the method's `self.accelerator`
            method = _enclosing_method(scope)
            if method is not None and type(method.node) is cst.FunctionDef:
                plan.self_accelerator.add(method.node)
    pending = [s for s in plan.uses_accelerator if roles.needs_parameter(s)]
    while pending:
        scope = pending.pop()
        if scope.is_method:
            constructor = roles.constructor_of(scope)
            if constructor is None:
                continue
            # A method that builds an instance (`return Runner(self.model)`) passes `self.accelerator`.
            if type(scope.node) is cst.FunctionDef:
                plan.self_accelerator.add(scope.node)
            scope = constructor
            assert type(scope.node) is cst.FunctionDef
            plan.self_accelerator.add(scope.node)
            plan.stores_accelerator.add(scope.node)
        if id(scope) in threaded:
            continue
        threaded.add(id(scope))
        if "accelerator" in scope.params:
            continue
        if type(scope.node) is not cst.FunctionDef:
            # Module-level code or a class body that does not see the Accelerator: nothing to add a
            # parameter to. Its uses then fail the accelerator-bound check and are not written.
            where = scope.node if type(scope.node) is cst.ClassDef else roles.facts.module.body[0]
            plan.report(CODE, where, (
                f"`accelerator` is needed in {'class ' + scope.name if type(scope.node) is cst.ClassDef else 'module-level code'}, "
                f"which cannot see the Accelerator created in `{roles.accelerator_scope.name if roles.accelerator_scope else '?'}`: "
                "create it at module level, or move this code into the function that creates it"
            ), unconverted=True)
            continue
        # A function of another module of the unit takes it by keyword (`*, accelerator`): a caller
        # the unit does not see (a package wrapper, another script) fails on a missing keyword
        # instead of binding its own next argument to it, and no flag of a wrapper swallows it.
        keyword_only = not scope.simple_signature or not nested_in(scope, roles.facts.module_scope)
        plan.new_params[scope.node] = keyword_only
        plan.change(CODE, scope.node, f"`{scope.name}` takes `accelerator` as a new parameter")
        for caller, call in roles.call_sites(scope):
            plan.new_args[call] = keyword_only or _has_keywords(call)
            if roles.needs_parameter(caller):
                pending.append(caller)


def _enclosing_method(scope: Scope) -> Scope | None:
    outer = scope.parent
    while outer is not None and outer.is_function:
        if outer.is_method:
            return outer
        outer = outer.parent
    return None


def _has_keywords(call: cst.Call) -> bool:
    return any(arg.keyword is not None or arg.star == "**" for arg in call.args)


