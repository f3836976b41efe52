"""Replace hand-written torch.distributed boilerplate with the Accelerator.

What it does:
    - `dist.init_process_group(...)` becomes `accelerator = Accelerator(...)` (the Accelerator
      joins the process group itself; on one process it needs none); a device chosen from the
      rank (`torch.device("cuda", local_rank)`) becomes `accelerator.device`;
      `torch.cuda.set_device(...)` goes; `dist.destroy_process_group()` becomes
      `accelerator.end_training()`. An `assert torch.cuda.is_available()` in the block that
      initialises the group (a module-level script's `if ddp:` branch, taken whenever the launcher
      sets RANK, which asserted CUDA for its NCCL group) goes with the group: the Accelerator picks
      the backend for the device (gloo on CPUs), and the branch's `f"cuda:{local_rank}"` becomes
      the Accelerator's device (AM001), so `accel launch` runs the branch on CPUs as well.
    - `RANK` / `LOCAL_RANK` / `WORLD_SIZE` read from the environment, `dist.get_rank()` and
      `dist.get_world_size()` become `accelerator.process_index` / `local_process_index` /
      `num_processes` (in a function of another module of a unit, AM013, which would take
      `accelerator` as a new parameter for them, they stay as they are when the script keeps its
      own process group, which then exists there as before, and go unrewritten when they only fed
      a removed DistributedSampler: Swin's `data/build.py`); rank-0 checks (`rank == 0`,
      `dist.get_rank() == 0`, `local_rank == 0`)
      become `accelerator.is_main_process` / `accelerator.is_local_main_process`; so do the
      checks of a legacy `--local_rank` flag (default -1), which stays -1 under `accel launch`:
      `args.local_rank in [-1, 0]`, `== 0`, `== -1 or dist.get_rank() == 0` (`migrate.local_rank_flag`).
    - `model = DDP(model, ...)` and `model = nn.DataParallel(model)` go (prepare wraps the model);
      so does a second name a trainer class wraps the model into after building the optimizer
      (`self.ddp_model = DDP(self.model)`, and `self.ddp_model = self.model` without CUDA): prepare
      binds that name, and `self.model` stays the bare module the class saves; also when the wrap is
      written before the last training object (the loader) is built, provided nothing reads that name
      (nor a method of the class is called) between the wrap and the prepare call;
      `model = DDP(model) if args.distributed else model` goes whole, as the same `if` statement does;
      a wrap inside a function of the file whose value home binds to the model (`model = wrap(Net())`
      with `def wrap(m): return DDP(m)`, or a builder's `if args.distributed: model = DDP(model)`
      before `return model`) goes there, when home's call is the function's only call: it then
      returns the bare model, which prepare wraps (its DDP options go to the Accelerator as above);
      `model.module` becomes `accelerator.unwrap_model(model)`.
      The options of a removed `DistributedDataParallel` go to the Accelerator
      (`migrate.ddp_options`): `DDP(model, device_ids=[gpu], broadcast_buffers=False)` gives
      `Accelerator(kwargs_handlers=[DistributedDataParallelKwargs(broadcast_buffers=False)])`
      (`dim`, `broadcast_buffers`, `bucket_cap_mb`, `find_unused_parameters`,
      `gradient_as_bucket_view`, `static_graph`, by keyword or position, when not DDP's default;
      a literal, a module-level constant, or a name of the function creating the Accelerator bound
      before it), so the prepared model's DDP on N processes runs with them; `device_ids` and
      `output_device` go (the Accelerator places the model), `check_reduction` too (DDP ignores it).
      A trainer class handed the model that `main` prepares, which wraps it again in its
      constructor (`self.model = DDP(self.model, device_ids=[gpu])`, the DDP tutorial's shape):
      the wrapper goes (`self.module = DataParallel(module)` becomes `self.module = module`),
      `self.model.module` anywhere in the class (also handed to helpers) becomes
      `accelerator.unwrap_model(self.model)`, and so do the reads of `self.model` that ran before
      the wrap on the bare module (a snapshot loaded by a method the constructor calls first:
      `self.model.load_state_dict(...)`), since the prepared model's own keys carry `module.`.
      `DDP(model, device_ids=[rank])` and `DataParallel(model)` also moved the model's inputs to
      its GPU inside forward; the prepared model does not on one process (it is then the bare
      module on `accelerator.device`, and only N processes wrap it in DDP). An input of a later
      call of the model that is provably built on the CPU (`model(torch.randn(20, 10))`, or a
      name bound to a tensor factory without `device=`) gets `.to(accelerator.device)`; an input
      the file neither builds on the CPU nor shows on the device (a batch of a prepared loader, a
      tensor moved with `.to(...)` / `.cuda()`) is reported at the call. A slice (`idx[:, -n:]`)
      is where its tensor is; a parameter of a plain function of the file is followed to every
      call of that function in the file (`generate(model, idx=encoded)` with `encoded =
      ids.to(device)` is on the device), and reported when some caller passes a value not shown
      on the device. A wrapper under an `if`
      is not followed: the script also ran the model unwrapped, so it moves its inputs itself.
    - The functional `nn.parallel.data_parallel(self.main, input, range(self.ngpu))` in a model's
      `forward` (DCGAN's shape) becomes `self.main(input)` (a written-out tuple of inputs is
      unpacked): each process runs the module on its own device, as the prepared model does,
      instead of scattering its batch over every GPU of the machine. Under `if input.is_cuda and
      self.ngpu > 1: <that> else: <the same direct call>` the `if` becomes that one call. With
      `output_device=` or `module_kwargs=` it is kept and reported (call the module directly).
    - A `DistributedSampler` goes: its `shuffle` moves to the DataLoader (replacing the `shuffle=False`
      that DataLoader required beside a sampler), `sampler.set_epoch(...)`
      and `loader.sampler.set_epoch(...)` go (prepared loaders reshuffle each epoch themselves),
      and the loader is prepared. A `print` of the removed sampler goes with it; a sampler read
      in any other way keeps its binding (no longer given to the loader). Also when a helper of the same file builds the loader
      (`train_loader = build_loader(dataset)` returning `DataLoader(..., sampler=DistributedSampler(...))`),
      or returns it as one element of a tuple (`datasets, train_loader, val_loader =
      build_loader(config)`, also from another module of the unit): the sampler goes inside the
      helper, so the prepared loader is sharded once, not N^2 ways.
    - `dist.barrier()` becomes `accelerator.wait_for_everyone()`.
    - Hand-written sharding becomes the Accelerator's strategy: `model = FSDP(model, ...)` and
      `fully_shard(model)` (with the `fully_shard(block)` loop before it) go, and
      `optimizer = ZeroRedundancyOptimizer(params, optimizer_class=AdamW, lr=...)` becomes
      `AdamW(params, lr=...)`; the Accelerator is created with `strategy="fsdp"` (FULL_SHARD,
      `reshard_after_forward=True`), `"fsdp-zero2"` (SHARD_GRAD_OP, `reshard_after_forward=False`),
      `"ddp"` (NO_SHARD) or `"zero1"`, and `accelerator.prepare` shards the model and the optimizer
      state. The script's own choice wins over `--strategy`. Which shapes and options amount to the
      same training is decided in `migrate.hand_sharding`.
    - An `mp.spawn(worker, args=(a, n), nprocs=n)` launcher becomes the direct call
      `worker(int(os.environ.get("LOCAL_RANK", "0")), a, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))`
      (an argument that passes `nprocs` gets the launcher's process count on this node, as spawn
      started `nprocs` processes on one node: on one node that is the job's process count, on
      several nodes a worker dividing the node's batch by it divides as before), `os.environ["MASTER_ADDR"]`
      / `["MASTER_PORT"]` assignments in the worker or the spawning block go (torchrun sets them),
      and so does `world_size = torch.cuda.device_count()` when only the spawn read it. The worker's
      process group becomes the Accelerator as above; launch the script with
      `accel launch --nproc-per-node N script.py`. The rank is read from the environment at the call
      rather than from the Accelerator inside the worker: it is then the same value spawn passed (the
      process index on its node, which is also a device index) from the worker's first statement on,
      before the Accelerator exists, and the worker's signature stays as it is.
      A setup helper the worker calls first (`ddp_setup(rank, world_size)`, a function of the file
      called only there, that only sets `MASTER_ADDR` / `MASTER_PORT`, pins the GPU and initialises
      the group from the spawn index and the process count) goes, its call becoming
      `accelerator = Accelerator()`.
      The spawn itself becomes a direct call of the worker, reported: the script no longer starts
      its processes, so `python script.py` trains on one process where it used every GPU, and
      `accel launch --nproc-per-node N` starts the N.
      A spawn beside a direct call of the worker (`if ngpus > 1: mp.spawn(worker, nprocs=ngpus,
      args=(ngpus, args)) else: worker(0, 1, args)`, the ImageNet example's launcher) becomes that
      one call in place of the whole `if`: one process without a launcher, N under `accel launch`.
      The direct call must pass the spawn's `args` (the process count may differ); a test other
      than the removed process count (`if args.multiprocessing_distributed:`) is reported: the
      launcher decides now. An index other than 0 or None (`worker(args.gpu, ...)`: the GPU it
      picked) is still passed without a launcher and replaced by `LOCAL_RANK` under `accel launch`
      (`int(environ["LOCAL_RANK"]) if "LOCAL_RANK" in environ else args.gpu`), and reported: the
      worker's CPU paths that test it for None keep working on one process.
      When the spawning function computes the rank, the world size and the rendezvous address into
      the namespace it passes (`args.rank = node * ngpus`, `args.world_size = ...`,
      `args.dist_url = ...`, on SLURM or one node) and the worker joins the group from them
      (`args.rank += gpu`; `init_process_group(init_method=args.dist_url, world_size=args.world_size,
      rank=args.rank)`), those computations go (with the bindings only they read, and an `else` they
      emptied; SLURM signal handlers stay), and the worker sets `args.rank = accelerator.process_index`
      and `args.world_size = accelerator.num_processes` after the Accelerator, for its later reads
      (`migrate.roles.spawn_namespace`).
      The ImageNet example's whole shape: the spawn's branch also scales `args.world_size =
      ngpus * args.world_size` (it goes with the `if`), `main` sets `args.distributed =
      args.world_size > 1 or args.multiprocessing_distributed` (goes), and the worker joins the
      group under `if args.distributed:` with its rank computed inside (`args.rank = args.rank *
      ngpus + gpu`): that whole `if` goes, the Accelerator is created in its place (or earlier, with
      the device), and the worker then sets `args.distributed = accelerator.num_processes > 1`, and so
      does the spawn's flag where the worker reads it (`args.multiprocessing_distributed`, say in the
      save guard `not args.multiprocessing_distributed or args.rank % ngpus_per_node == 0`, which with
      `args.rank = accelerator.process_index` and the node's process count passed for
      `ngpus_per_node` saves on the first process of each node, as before). Every later
      `if args.distributed:` then takes the branch the
      original took with that many processes: the DDP and DataParallel wrappers of the device chain
      go (with their `.cuda()`; an `if`/`else` left empty goes whole), the per-process batch
      `args.batch_size / ngpus_per_node` (`-b` being the batch of one node) divides by the
      launcher's process count on the node, and a
      `DistributedSampler` built only `if args.distributed` (also `DistributedSampler(d) if
      args.distributed else None`) keeps sharding that loader, which is then not prepared (AM004
      says so), with its `set_epoch`. Where every branch that flag leaves ends in a `raise`
      (SimSiam, MoCo: `else: raise NotImplementedError("Only DistributedDataParallel is
      supported.")`), the original also trained as a process group of one, which the runtime does
      not start: one process now raises, and the first `raise` is reported (left training code
      unconverted) with what makes one process train: those `raise` statements replaced by `pass`,
      launched with `accel launch --nproc-per-node 1` (the worker then gets `LOCAL_RANK` 0 as its
      GPU index and moves its batches as before).
    - Without a spawn, a process group joined only under a flag of the script's own options
      (`args.distributed = args.world_size > 1`, then `if args.distributed: init_process_group(...)`)
      that is also read elsewhere: the `init_process_group` becomes the Accelerator as above, and
      `args.distributed = accelerator.num_processes > 1` is set before that `if`, so the flag's other
      branches (the DDP wrapper, a `DistributedSampler(data) if args.distributed else None` that
      then keeps sharding its unprepared loader) follow the launcher, as they followed the group.
      A flag read from the launcher's environment (`ddp = "RANK" in os.environ`) already does.
    - An in-place collective of the script's own (`dist.all_reduce(c)`, `dist.reduce`,
      `dist.broadcast`, also inside a model's forward) runs under `if dist.is_initialized():`: on
      one process the runtime starts no process group, and the collective over one process leaves
      its tensor as it is.

Why:
    The Accelerator owns the process group, the rank and the device, and its prepared objects do
    what the boilerplate did; the migrated script then also runs as plain `python train.py`.

Example:
    dist.init_process_group(backend="nccl")        accelerator = Accelerator()
    local_rank = int(os.environ["LOCAL_RANK"])  ->  local_rank = accelerator.local_process_index
    model = DDP(model, device_ids=[local_rank])     (removed)
    if dist.get_rank() == 0:                        if accelerator.is_main_process:

    dist.init_process_group("gloo")                 accelerator = Accelerator(strategy="fsdp")
    for block in model.blocks:                  ->  (removed)
        fully_shard(block)
    fully_shard(model)                              (removed)

Leaves alone:
    `with torch.cuda.device(i):` for an index that is not the process's rank (`args.gpu_index`)
    that runs before the Accelerator exists (around the call of the function that creates it):
    kept and reported, since inside it every process makes that GPU current (a CUDA context on it
    each, and tensors created on `"cuda"` land there) while the Accelerator gives each process its
    own; the advice is to drop the `with` and keep its body. Where it runs after the Accelerator
    is created, AM001 removes it.
    `mp.spawn` launchers of another shape (`migrate.roles.SpawnLaunch`): the process group set up
    in a helper that does more than the setup above, `rank=` / `world_size=` computed in other ways
    than the spawn index and the process count or the namespace shape above (the namespace's rank
    read (or tested) by the spawning function itself, or read in the worker before its process group exists), the
    worker also called directly (a second launch path) other than as the spawn's `else` above or
    with other arguments, the optimizer built outside the worker,
    `nprocs` used for other things, `args` not a written-out tuple, `join=False`: the whole file
    is refused with the reason (make the worker the entry point, or reshape it so, and run
    again). Hand-written sharding with options that change the training (mixed precision or
    offload policies, `sync_module_states`, meshes and process groups, `consolidate_state_dict()`,
    blocks sharded without the model), sharding that runs only under an `if` (`--fsdp` flags), and
    other uses of FSDP (`FSDP.state_dict_type(...)`, `model.clip_grad_norm_()`, `model.reshard()`):
    the whole file is refused with the reason and the fix.
    A process group built from MPI (a function calling `init_process_group` that reads mpi4py's
    rank or an MPI launcher's variable such as `PMI_RANK`: processes started by `mpiexec`): the
    file, or the whole unit, is refused at that call, with every other place that reads MPI's rank
    reported at its own line and the changes that move it to `accel launch`
    (`migrate/roles/mpi_launch.py`: a partial conversion is wrong at N processes under `accel launch`).
    A DDP option that cannot be carried is reported at the wrap, naming it (the wrap still goes,
    and the prepared model trains with DDP's default for it): any other option (`process_group=`,
    `init_sync=`, `forward_sync_buffers=`, `mixed_precision=`, ...), `**options`, a value reading a
    name of another function than the one creating the Accelerator (`self.find_unused` in a
    trainer's constructor) or a name bound only after the Accelerator is created (`args.x` before
    `args = parser.parse_args()`), two wraps with different values for one option (a GAN's
    generator with `broadcast_buffers=False`, its discriminator without: the Accelerator gives
    every prepared model the same options; those they agree on are carried), and options when the
    Accelerator already takes other `kwargs_handlers`.
    A `DDP(...)` / `DataParallel(...)` outside the function that prepares the model, around that
    model, other than the trainer-class constructor above (in another method or function, under
    a branch, or in a constructor one of whose methods runs both before the wrap, on the bare
    model, and after it): kept, it would wrap the prepared model in a second DDP (gradients
    all-reduced twice, `module.module.` checkpoint keys). The whole file is refused with the line
    and the reason. So is a wrap the training step runs that cannot go whole (`migrate.roles.traps`,
    found from use): a model returned by a helper of the file that wraps it where the wrap cannot
    go there (the helper is called elsewhere too, reads `.module`, or wraps in another shape), a
    function or method home calls that returns a wrap in another way (inside a tuple, or bound to a
    second name: `self.ddp_model = self.wrap(self.model)`), a wrap bound through a tuple (`model, opt = DDP(model), opt`), and a second name read before the
    prepare point; the advice (return the bare model, remove the wrap) migrates when followed.
    Also a process group initialised in another function than the one that
    builds the optimizer (kept: the Accelerator reuses an existing group; the report says how the
    migrated script is launched: where the call runs only when the launcher's variables are set,
    under a test of `os.environ` or after an `if` chain on them whose `else` returns, one process
    without a launcher stays non-distributed as before; where it reads the launcher's environment,
    `env://` or `os.environ[...]`, the script needed torchrun's variables before too; where it
    takes its own values, flags or an address, the Accelerator joins that group with its rank and
    size, as it joins any group that exists before it (under `srun`, say, from `SLURM_PROCID`), so
    the script trains distributed where it did before, and RANK / WORLD_SIZE set beside it must
    agree with it (creating the Accelerator fails otherwise); where the call runs outside
    any `if` after `os.environ.setdefault(...)` of every variable it reads, one plain `python`
    process trains in a group of its own, as before), samplers with options that have no DataLoader equivalent, a loader
    helper whose sampler also shards loaders other than the training one (those loaders keep
    sharding themselves, so the training loader is not prepared either), and other explicit
    collectives (`dist.all_gather` into a list, a collective whose result is used: they still work
    under N processes, where the runtime initialises the process group, but not on one) — each
    reported; not the collectives of a program whose group is created on every run (the
    `setdefault` case above), where they work on one process too.

Fix safety:
    Safe: the prepared objects reproduce the sharding, wrapping and rank logic. Sharding by hand
    and by the runtime differ only in which blocks are gathered together (the runtime shards the
    model's repeated blocks): memory and communication, not the numbers trained. Under
    `--target accelerate` the wrapping goes as well, with a diagnostic: HF Accelerate's
    Accelerator takes no strategy, FSDP is chosen in `accelerate config`.
"""

from __future__ import annotations

import re

from collections.abc import Sequence

import libcst as cst

from migrate.analysis import Loop, Scope, StmtRef
from migrate.edits import EditPlan
from migrate import ddp_options, local_rank_flag
from migrate.hand_sharding import HandSharding
from migrate.names import instance_attribute, root_name
from migrate.roles import Roles, SpawnLaunch, loader_calls
from migrate.roles.model import nested_in
from migrate.roles.placement import alias_removal
from migrate.roles.traps import wrapped_or_itself
from migrate.rules.base import accelerator_call, prepared_loaders, reference, remove_statement, statement
from migrate.walk import walk

CODE = "AM007"
NAME = "remove-distributed-boilerplate"

_INIT = "torch.distributed.init_process_group"
_DESTROY = "torch.distributed.destroy_process_group"
_BARRIER = "torch.distributed.barrier"
_SET_DEVICE = "torch.cuda.set_device"
_CURRENT_DEVICE = "torch.cuda.device"  # the context manager: `with torch.cuda.device(i):`
_SPAWN = frozenset({"torch.multiprocessing.spawn", "torch.multiprocessing.start_processes"})
_COLLECTIVES = frozenset(
    f"torch.distributed.{name}"
    for name in ("all_reduce", "all_gather", "broadcast", "reduce", "gather", "scatter", "all_gather_object")
)
# In-place collectives that leave their tensor as it is on one process, where the runtime starts
# no process group: guarded by `is_initialized()` they keep their meaning at every process count.
_IDENTITY_AT_ONE = frozenset(f"torch.distributed.{name}" for name in ("all_reduce", "reduce", "broadcast"))
_WRAPPERS = frozenset({
    "torch.nn.parallel.DistributedDataParallel", "torch.nn.DataParallel", "torch.nn.parallel.DataParallel",
    # the defining modules, as `from torch.nn.parallel.distributed import DistributedDataParallel` names them
    "torch.nn.parallel.distributed.DistributedDataParallel", "torch.nn.parallel.data_parallel.DataParallel",
})
_DATA_PARALLEL = frozenset({"torch.nn.parallel.data_parallel", "torch.nn.parallel.data_parallel.data_parallel"})
_SAMPLERS = frozenset({"torch.utils.data.DistributedSampler", "torch.utils.data.distributed.DistributedSampler"})
_RANK_PROPERTY = {
    "torch.distributed.get_rank": "process_index",
    "torch.distributed.get_world_size": "num_processes",
}
_ENV_PROPERTY = {"RANK": "process_index", "LOCAL_RANK": "local_process_index", "WORLD_SIZE": "num_processes"}
_ENV_DEFAULT = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1"}
_MAIN_CHECK = {"process_index": "is_main_process", "local_process_index": "is_local_main_process"}


def apply(roles: Roles, plan: EditPlan) -> None:
    if roles.home is None or not roles.models or roles.accelerator_exists:
        return
    plan.removes_boilerplate = True
    if roles.spawn is not None:
        _convert_spawn(roles.spawn, plan)
    if roles.group_flag is not None:
        guard, flag = roles.group_flag
        text = cst.Module([]).code_for_node(flag)
        assignment = statement(f"{text} = accelerator.num_processes > 1\n").with_changes(leading_lines=guard.leading_lines)
        plan.insert_before[guard] = [*plan.insert_before.get(guard, []), assignment]
        plan.change(CODE, guard, f"`{text}` chose whether to join a process group: it now says whether the launcher "
                    "started several processes (`accelerator.num_processes > 1`), for its reads after this")
    creation_order = _place_creation(roles, plan)
    rank_names: dict[tuple[int, str], str] = {}  # (scope id, name) -> accelerator property
    deferred: list[tuple[Scope, str, cst.Call, StmtRef]] = []  # rank reads of other modules
    removed = roles.spawn.setup.scope if roles.spawn is not None and roles.spawn.setup is not None else None
    for scope in roles.facts.scopes:
        if scope is removed:
            continue
        reach = roles.can_reach(scope)
        _env_rank_bindings(roles, plan, scope, reach, creation_order, rank_names)
        for call in scope.library_calls:
            _library_call(roles, plan, scope, call.qualified, call.call, call.where, reach, deferred)
    for scope in roles.facts.scopes:
        if roles.can_reach(scope):
            _rank_checks(roles, plan, scope, rank_names)
            _module_accesses(roles, plan, scope)
    _local_rank_flag(roles, plan)
    wraps: list[ddp_options.Wrap] = []  # the removed DDP wraps, whose options go to the Accelerator
    removed = _remove_wrappers(roles, plan, wraps)
    _remove_class_wrappers(roles, plan, wraps)
    ddp_options.carry(plan, CODE, wraps, roles.accelerator_scope or roles.home)
    _remove_samplers(roles, plan)
    _other_modules_rank_reads(roles, plan, deferred)
    for name, wrapper, where in removed:  # once the loaders that get prepared are known
        _move_inputs(roles, plan, name, wrapper, where)
    if roles.sharding is not None:
        _convert_hand_sharding(roles, roles.sharding, plan)


def _place_creation(roles: Roles, plan: EditPlan) -> int:
    """Create the Accelerator where the process group was initialised; return its order."""
    target = roles.accelerator_scope
    assert target is not None
    setup = roles.spawn.setup if roles.spawn is not None else None
    if setup is not None:
        # `ddp_setup(rank, world_size)` in the spawned worker: the call becomes the Accelerator and
        # the helper goes (its environment, device and process group are the launcher's and the
        # Accelerator's now).
        plan.create_at = setup.call_stmt
        plan.create_at_order = setup.order
        helper = setup.scope.node
        assert isinstance(helper, cst.FunctionDef)
        plan.replace_stmt[helper] = []
        plan.change(CODE, setup.call_stmt, f"`{setup.scope.name}(...)` -> `accelerator = Accelerator()`: the "
                    f"launcher sets the address, the Accelerator the device and the process group (`{setup.scope.name}` removed)")
        return setup.order
    namespace = roles.spawn.namespace if roles.spawn is not None else None
    for call in target.library_calls:
        if call.qualified != _INIT or not _standalone(call.where, call.call) or call.where.in_loop:
            continue
        if namespace is not None and namespace.guard is not None and call.where.path and call.where.path[0].stmt is namespace.guard:
            # `if args.distributed: ...; init_process_group(...)` goes whole (`_convert_spawn`): the
            # Accelerator takes the place of the whole `if`, or is created before it with the device
            guard = call.where.path[0]
            plan.replace_stmt[call.where.stmt] = []
            plan.change(CODE, call.call, "process group initialisation removed: the Accelerator joins the launcher's group")
            device = roles.device_binding
            if device is not None and device.where.order < guard.order:
                return device.where.order
            plan.create_at = guard.stmt
            plan.create_at_order = guard.order
            _forget_init_arguments(target, call.call, plan)
            return guard.order
        _drop_cuda_assert(roles, plan, call.where)
        device = roles.device_binding
        if device is not None and device.where.order < call.where.order:
            plan.replace_stmt[call.where.stmt] = []
            plan.change(CODE, call.call, "process group initialisation removed: the Accelerator joins it")
            return device.where.order
        plan.create_at = call.where.stmt
        plan.create_at_order = call.where.order
        _forget_init_arguments(target, call.call, plan)
        plan.change(CODE, call.call, "`init_process_group` -> `accelerator = Accelerator()`")
        return call.where.order
    if roles.device_binding is not None:
        return roles.device_binding.where.order
    return 0  # created at the top of its scope


def _drop_cuda_assert(roles: Roles, plan: EditPlan, init: StmtRef) -> None:
    """`assert torch.cuda.is_available(), "DDP needs CUDA"` in the block that initialises the process
    group (nanoGPT's `if ddp:` branch, taken whenever the launcher sets RANK): the script's own group
    was NCCL's, which needs CUDA; the Accelerator picks the backend (gloo on CPUs), so under `accel
    launch` on CPUs the kept assert would stop a migration that runs. It goes with the group."""
    aliases = roles.facts.aliases
    for stmt in init.block.body:
        if stmt is init.stmt:
            return
        if not (type(stmt) is cst.SimpleStatementLine and len(stmt.body) == 1 and type(stmt.body[0]) is cst.Assert):
            continue
        test = stmt.body[0].test
        if type(test) is cst.Call and not test.args and aliases.qualify(test.func) == "torch.cuda.is_available":
            plan.replace_stmt[stmt] = []
            plan.change(CODE, stmt, "`assert torch.cuda.is_available()` beside the process group's setup removed: "
                        "the Accelerator picks the backend for the device (gloo on CPUs), so the group no longer needs CUDA")


def _functional_data_parallel(plan: EditPlan, call: cst.Call, where: StmtRef) -> None:
    """`nn.parallel.data_parallel(self.main, input, range(self.ngpu))` (in a model's `forward`, DCGAN's
    shape) -> `self.main(input)`: each process runs its module on its own device, as the prepared
    model does, instead of scattering its batch over every GPU of the machine (N processes would
    each use them all). Under `if input.is_cuda and self.ngpu > 1: <that> else: <the direct call>`
    both branches are then the same call: the `if` becomes it. With `output_device=` (the result
    gathered elsewhere) or `module_kwargs=` it is reported instead."""
    positional = [a for a in call.args if a.keyword is None]
    named = {a.keyword.value: a for a in call.args if a.keyword is not None}
    module = named["module"].value if "module" in named else positional[0].value if positional else None
    inputs = named["inputs"].value if "inputs" in named else positional[1].value if len(positional) > 1 else None
    odd = sorted(set(named) - {"module", "inputs", "device_ids", "dim"}) + (["output_device"] if len(positional) > 3 else [])
    if module is None or inputs is None or any(a.star for a in call.args) or odd:
        why = f" with `{'`, `'.join(odd)}`" if odd else ""
        plan.report(CODE, call, (
            f"`data_parallel(...)`{why} was kept: it splits each batch over this machine's GPUs inside one process, "
            "so under `accel launch` every process would use them all. Call the module directly (`module(inputs)`: "
            "each process then runs it on its own device"
            + ("; move the output yourself where `output_device` put it" if "output_device" in odd or len(positional) > 3 else "")
            + ") and launch N processes with `accel launch --nproc-per-node N`"), unconverted=True)
        return
    if type(inputs) is cst.Tuple:
        args = [cst.Arg(e.value, star="*" if type(e) is cst.StarredElement else "") for e in inputs.elements]
    else:
        args = [cst.Arg(inputs)]
    direct = cst.Call(module, args)
    stmt = where.stmt
    parent = where.path[-1].stmt if where.path else None
    if type(parent) is cst.If and _same_branches_after(parent, stmt, call, direct):
        assert type(parent.orelse) is cst.Else and type(parent.orelse.body) is cst.IndentedBlock
        kept = parent.orelse.body.body[0]
        plan.replace_stmt[parent] = [kept.with_changes(leading_lines=parent.leading_lines)]
        test = cst.Module([]).code_for_node(parent.test)
        plan.change(CODE, call, (
            f"`data_parallel(...)` -> the module called directly, and `if {test}:` with it (both branches were then "
            "the same call): each process runs its module on its own device; run N processes with `accel launch "
            "--nproc-per-node N` instead of splitting each batch over the GPUs"))
        return
    plan.calls[call] = lambda updated, direct=direct: direct
    plan.change(CODE, call, (
        "`data_parallel(...)` -> the module called directly: each process runs it on its own device; run N "
        "processes with `accel launch --nproc-per-node N` instead of splitting each batch over the GPUs"))


def _same_branches_after(node: cst.If, stmt: cst.BaseStatement, call: cst.Call, direct: cst.Call) -> bool:
    """`if <test without calls>: <stmt> else: <one statement>`, the else's statement the code of `stmt`
    with `call` replaced by `direct`."""
    orelse = node.orelse
    if not (type(node.body) is cst.IndentedBlock and len(node.body.body) == 1 and node.body.body[0] is stmt
            and type(orelse) is cst.Else and type(orelse.body) is cst.IndentedBlock and len(orelse.body.body) == 1):
        return False
    if any(type(n) is cst.Call for n in _nodes(node.test)):
        return False
    other = orelse.body.body[0]
    if not (type(stmt) is cst.SimpleStatementLine and type(other) is cst.SimpleStatementLine):
        return False
    empty = cst.Module([])
    replaced = stmt.deep_replace(call, direct)
    assert isinstance(replaced, cst.SimpleStatementLine)
    code = [empty.code_for_node(small) for small in replaced.body]
    return code == [empty.code_for_node(small) for small in other.body]


def _nodes(node: cst.CSTNode) -> list[cst.CSTNode]:
    found = [node]
    for child in node.children:
        found.extend(_nodes(child))
    return found


def _forget_init_arguments(scope: Scope, call: cst.Call, plan: EditPlan) -> None:
    """`backend = "nccl" if ... else "gloo"` fed only the removed `init_process_group(backend)`
    (or `policy = partial(...)` only the removed `FSDP(model, auto_wrap_policy=policy)`)."""
    for arg in call.args:
        if type(arg.value) is cst.Name:
            for binding in scope.bindings.get(arg.value.value, []):
                stmt = binding.where.stmt
                if type(stmt) is cst.SimpleStatementLine and len(stmt.body) == 1:
                    plan.rebound[stmt] = arg.value.value


def _library_call(
    roles: Roles,
    plan: EditPlan,
    scope: Scope,
    qualified: str,
    call: cst.Call,
    where: StmtRef,
    reach: bool,
    deferred: list[tuple[Scope, str, cst.Call, StmtRef]],
) -> None:
    if qualified in _SPAWN:
        return  # converted by `_convert_spawn` (the roles refuse the shapes it cannot convert)
    if qualified in _DATA_PARALLEL:
        _functional_data_parallel(plan, call, where)
        return
    if qualified in _IDENTITY_AT_ONE and _standalone(where, call) and type(call.func) is cst.Attribute:
        if not _guarded(where):
            _guard_collective(plan, where.stmt, call, call.func)
    elif qualified in _COLLECTIVES:
        if not _group_on_every_run(roles):
            plan.report(CODE, call, "explicit collective kept: it works under the runtime's process group, but "
                        "fails on a single process started without torchrun; prefer `accelerator.reduce/gather`")
    elif qualified == _INIT and where.stmt is not plan.create_at and where.stmt not in plan.replace_stmt:
        if _reads_mpi(roles, scope):
            plan.report(CODE, call, f"process group initialised in `{scope.name}` from MPI's rank and size; it was "
                        "kept (the runtime reuses an existing group), but it is wrong under `accel launch` (torchrun), "
                        "which the migrated script is launched with: every process is MPI's rank 0 of 1, so the "
                        "processes never form one group (the init waits for a rendezvous no process serves, or each "
                        "process trains alone). Read "
                        "RANK / WORLD_SIZE (and LOCAL_RANK for a device) from the environment torchrun sets instead of "
                        "MPI, here and wherever this module reads MPI's rank, and launch with `accel launch`", unconverted=True)
        else:
            message = _kept_init_message(scope, call, where)
            # one note per function: a group set up in each branch of an `if` (gloo on Windows, nccl elsewhere)
            if not any(finding.message == message for finding in plan.findings):
                plan.report(CODE, call, message)
    elif qualified == _CURRENT_DEVICE and type(where.stmt) is cst.With and any(
            item.item is call for item in where.stmt.items) and call.args \
            and not re.search(r"rank", cst.Module([]).code_for_node(call.args[0].value), re.IGNORECASE):
        index = cst.Module([]).code_for_node(call.args[0].value)
        plan.report(CODE, call, (
            f"`with torch.cuda.device({index}):` kept: inside it every process makes GPU `{index}` its "
            "current device (each opens a CUDA context there, and a tensor created on `\"cuda\"` without an "
            "index lands on that GPU, not beside the prepared model), while the Accelerator gives each process "
            "its own GPU: remove the `with` and keep its body (pick a GPU with `CUDA_VISIBLE_DEVICES=N`)"))
    elif not reach:
        return
    elif qualified == _SET_DEVICE and _standalone(where, call):
        plan.replace_stmt[where.stmt] = []
        plan.change(CODE, call, "`torch.cuda.set_device` removed: the Accelerator sets the device")
    elif qualified == _DESTROY:
        plan.calls[call] = lambda updated: accelerator_call("end_training", [])
        plan.use_accelerator(scope)
        plan.change(CODE, call, "`destroy_process_group()` -> `accelerator.end_training()`")
    elif qualified == _BARRIER:
        plan.calls[call] = lambda updated: accelerator_call("wait_for_everyone", [])
        plan.use_accelerator(scope)
        plan.change(CODE, call, "`dist.barrier()` -> `accelerator.wait_for_everyone()`")
    elif qualified in _RANK_PROPERTY and call not in plan.calls:
        if roles.needs_parameter(scope):
            deferred.append((scope, qualified, call, where))  # see `_other_modules_rank_reads`
        else:
            _rank_read(plan, scope, qualified, call)


def _rank_read(plan: EditPlan, scope: Scope, qualified: str, call: cst.Call) -> None:
    prop = _RANK_PROPERTY[qualified]
    plan.calls[call] = lambda updated, prop=prop: cst.Attribute(cst.Name("accelerator"), cst.Name(prop))
    plan.use_accelerator(scope)
    plan.change(CODE, call, f"`{qualified.rsplit('.', 1)[1]}()` -> `accelerator.{prop}`")


def _other_modules_rank_reads(
    roles: Roles, plan: EditPlan, deferred: list[tuple[Scope, str, cst.Call, StmtRef]]
) -> None:
    """`dist.get_rank()` / `dist.get_world_size()` in a function of another module of the unit
    that would need `accelerator` as a new parameter for them (Swin's `data/build.py`
    `build_loader(config)`): left as they are when the script keeps its own process group (the
    group then exists there exactly when it did in the original, and the runtime reuses it), or
    when the statement goes with a removed DistributedSampler (`num_tasks = dist.get_world_size()`
    read only by the sampler: the rebound name is then removed as unused). Otherwise rewritten as
    in the entry: one process started without torchrun has no group. A function of this module
    that would need the parameter is decided here too, after the samplers are removed: a read that
    goes with a removed sampler (`DistributedSampler(ds, num_replicas=dist.get_world_size())` in
    a loader helper) hands the helper no `accelerator` it would never use."""
    if not deferred:
        return
    kept_group = any(
        call.qualified == _INIT and call.where.stmt is not plan.create_at and call.where.stmt not in plan.replace_stmt
        for scope in roles.facts.scopes
        for call in scope.library_calls
    )
    for scope, qualified, call, where in deferred:
        other_module = not nested_in(scope, roles.facts.module_scope)
        if (kept_group and other_module) or call in plan.calls or _goes_with_removed_statements(plan, scope, where):
            continue
        _rank_read(plan, scope, qualified, call)


def _goes_with_removed_statements(plan: EditPlan, scope: Scope, where: StmtRef) -> bool:
    """The read's statement is removed, or binds a name (`global_rank = dist.get_rank()`, which
    cleanup removes once unread) that only removed statements read (the sampler's binding)."""
    stmt = where.stmt
    if plan.replace_stmt.get(stmt) == []:
        return True
    name = plan.rebound.get(stmt)
    if name is None:
        return False
    finder = _NameReads(name, cst.Name(name))
    walk(scope.node, finder)
    reads = [s for s in finder.statements if s is not stmt]
    return all(plan.replace_stmt.get(s) == [] for s in reads)


def _guarded(where: StmtRef) -> bool:
    """Directly inside `if <...>.is_initialized():` (the guard written by hand, or by a first run)."""
    parent = where.path[-1].stmt if where.path else None
    test = parent.test if type(parent) is cst.If else None
    return type(test) is cst.Call and type(test.func) is cst.Attribute and test.func.attr.value == "is_initialized"


def _guard_collective(plan: EditPlan, stmt: cst.BaseStatement, call: cst.Call, func: cst.Attribute) -> None:
    """`dist.all_reduce(c)` -> `if dist.is_initialized(): dist.all_reduce(c)` (same spelling of the module)."""
    assert type(stmt) is cst.SimpleStatementLine
    test = cst.Call(cst.Attribute(func.value.deep_clone(), cst.Name("is_initialized")))  # not the call's own node
    inner = stmt.with_changes(leading_lines=[])
    plan.replace_stmt[stmt] = [cst.If(test=test, body=cst.IndentedBlock([inner]), leading_lines=stmt.leading_lines)]
    name = func.attr.value
    plan.change(CODE, call, f"`{name}` runs only when a process group exists: on one process the runtime starts "
                f"none, and `{name}` over one process leaves the tensor as it is")


def _convert_spawn(spawn: SpawnLaunch, plan: EditPlan) -> None:
    """`mp.spawn(worker, args=(a, n), nprocs=n)` -> `worker(<LOCAL_RANK>, a, <LOCAL_WORLD_SIZE>)`."""
    environ = spawn.environ
    if environ is None:
        plan.imports.add(("os", "environ"))
        environ = "environ"
    rank = cst.parse_expression(f'int({environ}.get("LOCAL_RANK", "0"))')
    direct_rank = spawn.fallback.rank if spawn.fallback is not None else None
    if direct_rank is not None and not (type(direct_rank) is cst.Integer and direct_rank.value == "0"):
        # `else: worker(args.gpu, ...)`: without a launcher the call is the direct one, as before (`args.gpu`
        # is None on a CPU run, which the worker's CPU paths test); launched, each process its local rank
        rank = cst.parse_expression(
            f'int({environ}["LOCAL_RANK"]) if "LOCAL_RANK" in {environ} else {cst.Module([]).code_for_node(direct_rank)}')
    # spawn starts the processes of one node, `nprocs` of them: the launcher's count on this node
    # (`ngpus_per_node`, by which the ImageNet example divides the node's batch), not the job's
    size = cst.parse_expression(f'int({environ}.get("LOCAL_WORLD_SIZE", "1"))')
    args = [cst.Arg(rank), *(cst.Arg(size if i in spawn.world_size_args else a) for i, a in enumerate(spawn.args))]
    stmt = spawn.stmt
    assert type(stmt) is cst.SimpleStatementLine
    direct = stmt.with_changes(body=[cst.Expr(cst.Call(cst.Name(spawn.worker.name), args))])
    count = spawn.nprocs.value if type(spawn.nprocs) is cst.Integer else "N"
    fallback = spawn.fallback
    if fallback is None:
        plan.replace_stmt[stmt] = [direct]
        plan.report(CODE, spawn.call, (
            "the script started its processes itself (`mp.spawn`); it now runs as one process of a launch: "
            f"`python script.py` trains on one process, `accel launch --nproc-per-node {count} script.py` on "
            f"{count}"))
    else:
        # `if ngpus > 1: mp.spawn(...) else: worker(0, ...)`: both paths are the one call, which
        # runs as one process without a launcher and as one of N under `accel launch`.
        plan.replace_stmt[fallback.stmt] = [direct.with_changes(leading_lines=fallback.stmt.leading_lines)]
        plan.change(CODE, fallback.call, f"the direct call of `{spawn.worker.name}` and the spawn are now one call: "
                    f"one process without a launcher, N under `accel launch --nproc-per-node {count}`")
        if spawn.nprocs_binding is None or not any(
            type(n) is cst.Name and n.value == cst.Module([]).code_for_node(spawn.nprocs)
            for n in _names_in(fallback.stmt.test)
        ):
            test = cst.Module([]).code_for_node(fallback.stmt.test)
            plan.report(CODE, fallback.stmt, (
                f"`if {test}:` chose between spawning processes and one direct call; the launcher decides now: "
                f"`python script.py` runs one process, `accel launch --nproc-per-node N script.py` runs N, "
                f"whatever `{test}` is"))
        rank = fallback.rank
        if not (type(rank) is cst.Integer and rank.value == "0") and not (type(rank) is cst.Name and rank.value == "None"):
            text = cst.Module([]).code_for_node(rank)
            plan.report(CODE, fallback.call, (
                f"the direct call passed `{text}` as the worker's index; it still does without a launcher "
                f"(`python script.py`), and under `accel launch` each process passes its `LOCAL_RANK` instead, "
                f"as the spawn passed its index: there `{text}` no longer picks the GPU (pick GPUs with "
                "`CUDA_VISIBLE_DEVICES`)"))
    plan.change(CODE, spawn.call, f"`mp.spawn` -> `{spawn.worker.name}(...)` called directly, its rank from "
                f"`LOCAL_RANK`: launch the script with `accel launch --nproc-per-node {count}`")
    if spawn.nprocs_binding is not None:
        plan.replace_stmt[spawn.nprocs_binding] = []
        plan.change(CODE, spawn.nprocs_binding, "process count removed: the launcher's `--nproc-per-node` replaces it")
    for master in spawn.master_env:
        plan.replace_stmt[master] = []
        plan.change(CODE, master, "`MASTER_ADDR` / `MASTER_PORT` assignment removed: the launcher sets them")
    namespace = spawn.namespace
    if namespace is not None:
        for stmt, replacement in namespace.replace.items():
            plan.replace_stmt[stmt] = replacement
            plan.change(CODE, stmt, "rank / world size / rendezvous computation removed: the launcher provides them")
        if namespace.guard is not None:
            # `if args.distributed: <rank computation>; init_process_group(...)` goes whole: the
            # Accelerator takes its place (or is created before it), the namespace then gets the
            # launcher's values
            plan.replace_stmt[namespace.guard] = []
            plan.insert_after[namespace.guard] = [*namespace.assignments(), *plan.insert_after.get(namespace.guard, [])]
            flags = ", ".join(f"`{namespace.namespace}.{flag}`" for flag in namespace.flags)
            plan.change(CODE, namespace.guard, f"{flags} now say whether the launcher started several processes "
                        "(`accelerator.num_processes > 1`)")
            _report_one_process_raises(plan, spawn.worker, namespace)
        else:
            plan.insert_after[namespace.init] = [*namespace.assignments(), *plan.insert_after.get(namespace.init, [])]
        names = " and ".join(f"`{namespace.namespace}.{namespace.attributes[k]}`" for k in ("rank", "world_size"))
        plan.change(CODE, namespace.init, f"{names} from the accelerator, for the reads after it")


def _report_one_process_raises(plan: EditPlan, worker: Scope, namespace) -> None:  # type: ignore[no-untyped-def]
    """`if args.distributed: ... else: raise NotImplementedError("Only DistributedDataParallel is
    supported.")` in the worker (SimSiam, MoCo): the original also ran as a process group of one
   , but `args.distributed` is now
    `accelerator.num_processes > 1`, and the runtime starts no group on one process: there every
    branch the flag leaves raises. Reported at the first `raise`, with what makes one process train."""
    flags = set(namespace.flags)
    code = cst.Module([]).code_for_node

    def raises(block: cst.BaseSuite) -> cst.Raise | None:
        body = block.body if isinstance(block, cst.IndentedBlock) else []
        last = body[-1] if body else None
        if isinstance(last, cst.SimpleStatementLine) and isinstance(last.body[-1], cst.Raise):
            return last.body[-1]
        return None

    for stmt in worker.node.body.body if isinstance(worker.node, cst.FunctionDef) else []:
        if not (isinstance(stmt, cst.If) and isinstance(stmt.test, cst.Attribute) and isinstance(stmt.test.value, cst.Name)
                and stmt.test.value.value == namespace.namespace and stmt.test.attr.value in flags):
            continue
        found: list[cst.Raise] = []
        branch = stmt.orelse
        while isinstance(branch, cst.If):  # `elif args.gpu is not None: ... raise ...`
            found.append(raises(branch.body))
            branch = branch.orelse
        found.append(raises(branch.body) if isinstance(branch, cst.Else) else None)
        if any(r is None for r in found):
            continue
        flag = f"{namespace.namespace}.{stmt.test.attr.value}"
        plan.report(CODE, found[0], (
            f"on one process `{flag}` is now False (`accelerator.num_processes > 1`: the runtime starts no "
            f"process group there), and every branch `if {flag}:` leaves ends in "
            f"`{code(found[0]).strip()}`, so the migrated script cannot train on one process, where the original "
            "ran as a process group of one: to train on one process, "
            "replace those `raise` statements with `pass` (the prepared model needs no DistributedDataParallel "
            "there) and launch with `accel launch --nproc-per-node 1`, which passes the worker its `LOCAL_RANK` "
            "as the GPU index"), unconverted=True)
        return


def _keeps_group(plan: EditPlan, scope: Scope) -> bool:
    """`scope` initialises the process group the migration keeps (the script's own setup helper,
    `device = setup()`): it runs before the Accelerator exists, which joins that group after it,
    so its rank reads (`int(os.environ["LOCAL_RANK"])`, `dist.get_rank()`) stay as they are."""
    return any(
        c.qualified == _INIT and c.where.stmt is not plan.create_at and c.where.stmt not in plan.replace_stmt
        for c in scope.library_calls
    )


def _names_in(node: cst.CSTNode) -> list[cst.Name]:
    found: list[cst.Name] = []

    class Names(cst.CSTVisitor):
        def visit_Name(self, name: cst.Name) -> None:
            found.append(name)

    walk(node, Names())
    return found


def _env_rank_bindings(
    roles: Roles, plan: EditPlan, scope: Scope, reach: bool, creation_order: int, rank_names: dict[tuple[int, str], str]
) -> None:
    """`local_rank = int(os.environ["LOCAL_RANK"])` and `rank = dist.get_rank()`."""
    if _keeps_group(plan, scope):
        return  # runs before the Accelerator exists: its reads keep the environment
    for name, bindings in scope.bindings.items():
        for binding in bindings:
            value = binding.value
            if value is None:
                continue
            variable = _env_variable(roles, value)
            if variable is not None:
                prop = _ENV_PROPERTY[variable]
                rank_names[(id(scope), name)] = prop
                if reach and (scope is not roles.accelerator_scope or binding.where.order > creation_order):
                    rebound = _rebind(binding.where.stmt, name, prop)
                    plan.replace_stmt[binding.where.stmt] = [rebound]
                    plan.rebound[rebound] = name
                    plan.use_accelerator(scope)
                    plan.change(CODE, binding.where.stmt, f"`{name}` from `accelerator.{prop}`")
                else:
                    _default_env_read(plan, binding.where.stmt, variable)
            elif type(value) is cst.Call and roles.facts.aliases.qualify(value.func) in _RANK_PROPERTY:
                rank_names[(id(scope), name)] = _RANK_PROPERTY[roles.facts.aliases.qualify(value.func) or ""]
                stmt = binding.where.stmt
                if type(stmt) is cst.SimpleStatementLine and len(stmt.body) == 1:
                    plan.rebound[stmt] = name  # `rank = dist.get_rank()`: goes if nothing reads it


def _env_variable(roles: Roles, value: cst.BaseExpression) -> str | None:
    """"LOCAL_RANK" for `int(os.environ["LOCAL_RANK"])`, `os.environ.get("RANK", 0)`, ..."""
    if type(value) is cst.Call and type(value.func) is cst.Name and value.func.value == "int" and value.args:
        value = value.args[0].value
    key: cst.BaseExpression | None = None
    if type(value) is cst.Subscript and roles.facts.aliases.qualify(value.value) == "os.environ":
        element = value.slice[0].slice
        key = element.value if type(element) is cst.Index else None
    elif (
        type(value) is cst.Call
        and type(value.func) is cst.Attribute
        and value.func.attr.value == "get"
        and roles.facts.aliases.qualify(value.func.value) == "os.environ"
        and value.args
    ):
        key = value.args[0].value
    if type(key) is cst.SimpleString and key.evaluated_value in _ENV_PROPERTY:
        return str(key.evaluated_value)
    return None


def _rebind(stmt: cst.BaseStatement, name: str, prop: str) -> cst.BaseStatement:
    new = cst.parse_statement(f"{name} = accelerator.{prop}\n")
    if type(stmt) is cst.SimpleStatementLine:
        new = new.with_changes(leading_lines=stmt.leading_lines, trailing_whitespace=stmt.trailing_whitespace)
    return new


def _default_env_read(plan: EditPlan, stmt: cst.BaseStatement, variable: str) -> None:
    """Before the Accelerator exists, keep the read but give it torchrun's single-process value."""

    class Subscripts(cst.CSTVisitor):
        def visit_Subscript(self, node: cst.Subscript) -> None:
            if type(node.value) is cst.Attribute and node.value.attr.value == "environ":
                key = node.slice[0].slice
                if type(key) is cst.Index:
                    found.append((node, key.value))

    found: list[tuple[cst.Subscript, cst.BaseExpression]] = []
    walk(stmt, Subscripts())
    for node, key in found:
        plan.subscripts[node] = lambda updated, node=node, key=key: cst.Call(
            func=cst.Attribute(node.value, cst.Name("get")),
            args=[cst.Arg(key), cst.Arg(cst.SimpleString(f'"{_ENV_DEFAULT[variable]}"'))],
        )
        plan.change(CODE, node, f"`{variable}` read with torchrun's single-process default")


def _rank_checks(roles: Roles, plan: EditPlan, scope: Scope, rank_names: dict[tuple[int, str], str]) -> None:
    for comparison, operand, equal in scope.zero_comparisons:
        prop = None
        if type(operand) is cst.Name:
            found = roles.origins(scope, operand.value)
            props = {rank_names.get((id(s), n)) for s, n in found or ()}
            prop = props.pop() if len(props) == 1 else None
        elif type(operand) is cst.Call:
            prop = _RANK_PROPERTY.get(roles.facts.aliases.qualify(operand.func) or "")
        check = _MAIN_CHECK.get(prop or "")
        if check is None:
            continue
        test: cst.BaseExpression = cst.Attribute(cst.Name("accelerator"), cst.Name(check))
        if not equal:
            test = cst.UnaryOperation(cst.Not(), test)
        plan.comparisons[comparison] = test.with_changes(lpar=comparison.lpar, rpar=comparison.rpar)
        if type(operand) is cst.Call:
            plan.calls.pop(operand, None)
        plan.use_accelerator(scope)
        plan.change(CODE, comparison, f"rank check -> `accelerator.{check}`")


def _local_rank_flag(roles: Roles, plan: EditPlan) -> None:
    """`args.local_rank in [-1, 0]` and the like (`migrate.local_rank_flag`)."""
    for check in local_rank_flag.find(roles.facts):
        node = check.node
        if not roles.can_reach(check.scope):
            plan.report(CODE, node, "the `--local_rank` flag stays -1 under `accel launch`, so this check is the same on "
                        f"every process, and `{check.scope.name}` cannot reach the accelerator: test "
                        f"{check.meaning} instead", unconverted=True)
            continue
        if type(node) is cst.BooleanOperation:
            plan.bool_ops[node] = check.replacement
        else:
            plan.comparisons[node] = check.replacement
        plan.use_accelerator(check.scope)
        plan.change(CODE, node, f"`--local_rank` check -> {check.meaning}")


def _module_accesses(roles: Roles, plan: EditPlan, scope: Scope) -> None:
    for attribute, _ in scope.module_accesses:
        assert type(attribute.value) is cst.Name
        model = attribute.value.value
        if not roles.all_in(scope, model, roles.models):
            continue
        plan.attributes[attribute] = lambda updated, model=model: accelerator_call(
            "unwrap_model", [cst.Arg(cst.Name(model))]
        )
        plan.use_accelerator(scope)
        plan.change(CODE, attribute, f"`{model}.module` -> `accelerator.unwrap_model({model})`")


def _remove_class_wrappers(roles: Roles, plan: EditPlan, wraps: list[ddp_options.Wrap]) -> None:
    """`self.model = DDP(self.model, ...)` in a trainer class handed the prepared model
    (`migrate.roles.class_wrappers`): the statement goes, `self.model.module` and the reads of
    `self.model` that ran before the wrap (on the bare module) become `accelerator.unwrap_model(self.model)`."""
    for wrapper in roles.class_wrappers:
        inner = wrapper.call.args[0].value
        if instance_attribute(inner) == wrapper.attribute:
            plan.replace_stmt[wrapper.stmt] = []  # `self.model = DDP(self.model)`
        else:
            # `self.module = DataParallel(module)`: the attribute is bound here only, to what it wrapped
            plan.calls[wrapper.call] = lambda updated: updated.args[0].value
        plan.change(CODE, wrapper.call, f"`{wrapper.attribute}` no longer wrapped by hand: `accelerator.prepare` "
                    "wraps the model it is given")
        if roles.facts.aliases.qualify(wrapper.call.func) in ddp_options.DDP:
            wraps.append(ddp_options.Wrap(wrapper.call, wrapper.constructor, wrapper.attribute))
        for method, node in wrapper.module_reads:
            inner = node.value
            plan.attributes[node] = lambda updated, inner=inner: accelerator_call("unwrap_model", [cst.Arg(inner)])
            plan.use_accelerator(method)
            plan.change(CODE, node, f"`{wrapper.attribute}.module` -> `accelerator.unwrap_model({wrapper.attribute})`")
        for method, node in wrapper.bare_reads:
            plan.attributes[node] = lambda updated, node=node: accelerator_call("unwrap_model", [cst.Arg(node)])
            plan.use_accelerator(method)
            plan.change(CODE, node, f"`{wrapper.attribute}` before the removed wrapper was the bare module: "
                        f"`accelerator.unwrap_model({wrapper.attribute})`")


def _remove_wrappers(roles: Roles, plan: EditPlan, wraps: list[ddp_options.Wrap]) -> list[tuple[str, cst.Call, StmtRef]]:
    """`model = DDP(model, ...)`: the statement goes (and an `if` that only held it). Returns the
    removed wrappers that moved the model's inputs to its GPU (`_move_inputs`)."""
    home = roles.home
    assert home is not None
    moving: list[tuple[str, cst.Call, StmtRef]] = []
    for name in roles.models:
        for binding in home.bindings.get(name, []):
            value = binding.value
            # `model = nn.DataParallel(model).cuda()`: the move goes with the wrapper (prepare moves it)
            moved = value
            while (type(value) is cst.Call and type(value.func) is cst.Attribute and value.func.attr.value in ("cuda", "to")
                   and type(value.func.value) is cst.Call):
                value = value.func.value
            conditional = wrapped_or_itself(roles, value, name)
            if conditional is not None:
                value = moved = conditional  # `model = DDP(model) if args.distributed else model`
            if not (type(value) is cst.Call and roles.facts.aliases.qualify(value.func) in _WRAPPERS):
                continue
            if not value.args:
                continue
            inner = value.args[0].value
            stmt = binding.where.stmt
            if conditional is not None:
                if not remove_statement(plan, stmt, binding.value):
                    continue  # not a statement of its own: the roles refused the file (`refuse_kept_wraps`)
            elif root_name(inner) == name and type(inner) is cst.Name:
                parent = binding.where.path[-1].stmt if binding.where.path else None
                if type(parent) is cst.If and parent.orelse is None and _only_statement(parent, stmt):
                    plan.replace_stmt[parent] = []
                elif not remove_statement(plan, stmt, moved):
                    plan.calls[value] = lambda updated: updated.args[0].value
            else:
                plan.calls[value] = lambda updated: updated.args[0].value
            plan.change(CODE, value, f"`{name}` no longer wrapped by hand: `accelerator.prepare` wraps it")
            if roles.facts.aliases.qualify(value.func) in ddp_options.DDP:
                wraps.append(ddp_options.Wrap(value, home, name))
            _drop_emptied_if(plan, binding.where)
            # Under an `if` (`if torch.cuda.device_count() > 1:`), the script also ran its model
            # unwrapped, so it moves the inputs itself.
            if _moves_inputs(roles, value) and conditional is None and not any(type(ref.stmt) is cst.If for ref in binding.where.path):
                moving.append((name, value, binding.where))
    for name, value, where, helper in roles.helper_wraps:
        # `def wrap(m): return DDP(m)` / `if args.distributed: model = DDP(model)` in a helper whose
        # value home binds to the model: the helper returns the bare model, prepare wraps it
        small = where.stmt.body[0]  # type: ignore[attr-defined]
        if isinstance(small, cst.Return):
            plan.calls[value] = lambda updated: updated.args[0].value
        else:
            parent = where.path[-1].stmt if where.path else None
            if type(parent) is cst.If and parent.orelse is None and _only_statement(parent, where.stmt):
                plan.replace_stmt[parent] = []
            else:
                plan.replace_stmt[where.stmt] = []
        plan.change(CODE, value, f"`{name}` (returned by `{helper.qualname}`) no longer wrapped by hand: "
                    "`accelerator.prepare` wraps it")
        if roles.facts.aliases.qualify(value.func) in ddp_options.DDP:
            wraps.append(ddp_options.Wrap(value, helper, name))
        if _moves_inputs(roles, value) and not any(type(ref.stmt) is cst.If for ref in where.path):
            bound = [b.where for b in home.bindings.get(name, []) if b.value is not None
                     and roles.facts.function_called(b.value) is helper]  # type: ignore[arg-type]
            if bound:
                moving.append((name, value, bound[0]))
    _unwrap_aliases(roles, plan, wraps)
    return moving


def _drop_emptied_if(plan: EditPlan, where: StmtRef) -> None:
    """`if args.distributed: model = DDP(model) else: model = DataParallel(model)`: an `if` / `else`
    whose every statement goes, goes whole (rather than two `pass` branches)."""
    parent = where.path[-1].stmt if where.path else None
    if type(parent) is not cst.If or type(parent.orelse) is not cst.Else:
        return
    blocks = [parent.body, parent.orelse.body]
    if all(type(b) is cst.IndentedBlock and all(plan.replace_stmt.get(s) == [] for s in b.body) for b in blocks):
        plan.replace_stmt[parent] = []


# Tensor factories that build on the CPU unless given `device=`.
_CPU_FACTORIES = frozenset(
    f"torch.{name}"
    for name in ("randn", "rand", "randint", "randperm", "zeros", "ones", "empty", "full", "tensor", "arange",
                 "linspace", "eye", "from_numpy", "Tensor", "FloatTensor", "LongTensor")
)


def _moves_inputs(roles: Roles, wrapper: cst.Call) -> bool:
    """The wrapper moved the model's inputs to its GPU inside forward: `DDP(model, device_ids=[i])`
    (DDP's scatter to `device_ids[0]`; without device_ids DDP moves nothing) and
    `DataParallel(model)` (scatters to its GPUs whenever CUDA is available)."""
    qualified = roles.facts.aliases.qualify(wrapper.func) or ""
    if qualified.endswith(".DataParallel"):
        return True
    ids = next((a.value for a in wrapper.args if a.keyword is not None and a.keyword.value == "device_ids"), None)
    if ids is None:
        positional = [a for a in wrapper.args if a.keyword is None and not a.star]
        ids = positional[1].value if len(positional) > 1 else None
    return ids is not None and not (type(ids) is cst.Name and ids.value == "None")


def _move_inputs(roles: Roles, plan: EditPlan, name: str, wrapper: cst.Call, wrapped_at: StmtRef) -> None:
    """The removed wrapper moved `name`'s inputs to the model's GPU; the prepared model does not on
    one process (no DDP there: a CPU input meets a CUDA model). A call of the model after the
    wrapper whose input is provably built on the CPU (`model(torch.randn(20, 10))`, or a name
    bound to such a tensor) gets `.to(accelerator.device)`; an input the file neither builds on the
    CPU nor shows on the device (moved, or a batch of a prepared loader) is reported at the call."""
    loaders = [*prepared_loaders(roles, plan), *plan.eval_loaders]
    shown = cst.Module([]).code_for_node(wrapper)
    if len(shown) > 60 or "\n" in shown:
        shown = cst.Module([]).code_for_node(wrapper.func) + "(...)"
    for scope in roles.facts.scopes:
        sites = [(s.call, s.where, s.loops) for s in scope.calls if roles.all_in(scope, s.callee, [name])]
        sites += [
            (s.call, s.where, s.loops) for s in scope.method_calls
            if type(s.call.func) is cst.Attribute and s.call.func.attr.value == "forward"
            and type(s.receiver) is cst.Name and roles.all_in(scope, s.receiver.value, [name])
        ]
        for call, where, loops in sites:
            if scope is roles.home and where.order <= wrapped_at.order:
                continue
            kinds = [_placement(roles, scope, arg, where, loops, loaders) for arg in call.args]
            cpu = [i for i, kind in enumerate(kinds) if kind == "cpu"]
            unknown = [call.args[i].value for i, kind in enumerate(kinds) if kind == "unknown"]
            callee = cst.Module([]).code_for_node(call.func)
            if cpu and (call in plan.calls or not roles.can_reach(scope)):
                unknown = [call.args[i].value for i in cpu] + unknown
            elif cpu:
                plan.calls[call] = lambda updated, cpu=cpu: _inputs_to_device(updated, cpu)
                plan.use_accelerator(scope)
                moved = ", ".join(f"`{cst.Module([]).code_for_node(call.args[i].value)}`" for i in cpu)
                plan.change(CODE, call, f"{moved} built on the CPU and given to `{callee}(...)`: moved with "
                            f"`.to(accelerator.device)`, as `{shown}` moved it inside forward (the prepared model "
                            "does not move its inputs)")
            if unknown:
                inputs = ", ".join(f"`{cst.Module([]).code_for_node(u)}`" for u in unknown)
                plan.report(CODE, call, (
                    f"`{shown}` moved the inputs of `{callee}(...)` to the model's GPU inside forward; the prepared "
                    "model does not on one process (it is then the bare module on `accelerator.device`), and this "
                    f"file does not show {inputs} on the device (a batch of a prepared DataLoader, or a tensor moved "
                    "with `.to(...)`): on one GPU a CPU tensor would meet the CUDA model. Move it with "
                    "`.to(accelerator.device)` before the call"
                ), unconverted=True)


def _placement(
    roles: Roles, scope: Scope, arg: cst.Arg, where: StmtRef, loops: tuple[Loop, ...], loaders: list[str],
    depth: int = 0,
) -> str:
    """'cpu' (a tensor built on the CPU), 'placed' (moved, built on a device, or a batch of a
    prepared loader) or 'unknown', for an argument of a model call."""
    if arg.star:
        return "unknown"
    return _value_placement(roles, scope, arg.value, where, loops, loaders, depth)


def _value_placement(
    roles: Roles, scope: Scope, value: cst.BaseExpression, where: StmtRef, loops: tuple[Loop, ...],
    loaders: list[str], depth: int,
) -> str:
    """Where a value used at `where` lives: a slice of a tensor (`idx[:, -n:]`) lives where the tensor
    does; a name where its bindings above put it; a parameter of a plain function of this file where
    every call of it in the file puts the argument (`generate(model, idx=encoded)` with `encoded =
    ids.to(device)`): 'placed' only when every caller's is."""
    while type(value) is cst.Subscript:
        value = value.value
    if type(value) is not cst.Name:
        return _built_on(roles, value)
    for loop in loops:
        if value.value in loop.batch_names and loop.source is not None and roles.all_in(scope, loop.source, loaders):
            return "placed"
    before = [b for b in scope.bindings.get(value.value, []) if b.where.order < where.order]
    if not before:
        if value.value in scope.params and depth < 3:
            return _passed_placement(roles, scope, value.value, loaders, depth + 1)
        return "unknown"
    kinds = set()
    for b in before:
        bound = b.value if b.value is not None else _unpacked_value(b.where.stmt, b.name)
        if b.is_loop_target:
            kinds.add("unknown")
        elif type(bound) in (cst.Name, cst.Subscript) and depth < 3:
            kinds.add(_value_placement(roles, scope, bound, b.where, loops, loaders, depth + 1))
        else:
            kinds.add(_built_on(roles, bound))
    if "placed" in kinds:
        # moved once (`x = x.cuda()`), then transformed (`x, y = mixup(x, y)`): still there
        return "placed"
    return "cpu" if kinds == {"cpu"} else "unknown"


def _passed_placement(roles: Roles, scope: Scope, name: str, loaders: list[str], depth: int) -> str:
    """Where the callers of the plain function `scope` put its parameter `name`: the same for
    every call of it in the file, else 'unknown' (so is a function no call of the file reaches)."""
    if not scope.is_function or scope.is_method:
        return "unknown"
    index = scope.params.index(name)
    kinds = set()
    for caller in roles.facts.scopes:
        for site in caller.calls:
            if site.callee != scope.name or roles.facts.resolve(site.callee, caller) is not scope:
                continue
            args = site.call.args
            arg = next((a for a in args if a.keyword is not None and a.keyword.value == name), None)
            positional = [a for a in args if a.keyword is None]
            if arg is None and not any(a.star for a in positional) and index < len(positional):
                arg = positional[index]
            if arg is None:
                return "unknown"
            kinds.add(_placement(roles, caller, arg, site.where, site.loops, loaders, depth))
    if len(kinds) != 1:
        return "unknown"
    return kinds.pop()


def _unpacked_value(stmt: cst.BaseStatement, name: str) -> cst.BaseExpression | None:
    """The element bound to `name` by `x, y = x.to(device), y.to(device)` (same-length tuples)."""
    if type(stmt) is not cst.SimpleStatementLine or len(stmt.body) != 1 or type(stmt.body[0]) is not cst.Assign:
        return None
    assign = stmt.body[0]
    value = assign.value
    if len(assign.targets) != 1 or type(value) not in (cst.Tuple, cst.List):
        return None
    target = assign.targets[0].target
    if type(target) not in (cst.Tuple, cst.List) or len(target.elements) != len(value.elements):
        return None
    for element, item in zip(target.elements, value.elements):
        if type(element.value) is cst.Name and element.value.value == name and type(item) is cst.Element:
            return item.value
    return None


def _built_on(roles: Roles, value: cst.BaseExpression | None) -> str:
    if type(value) is not cst.Call:
        return "unknown"
    func = value.func
    if type(func) is cst.Attribute and func.attr.value in ("to", "cuda"):
        return "placed"
    if roles.facts.aliases.qualify(func) in _CPU_FACTORIES:
        return "placed" if any(a.keyword is not None and a.keyword.value == "device" for a in value.args) else "cpu"
    return "unknown"


def _inputs_to_device(call: cst.Call, indices: list[int]) -> cst.Call:
    device = cst.Attribute(cst.Name("accelerator"), cst.Name("device"))
    args = list(call.args)
    for index in indices:
        value = args[index].value
        moved = cst.Call(func=cst.Attribute(value, cst.Name("to")), args=[cst.Arg(device)])
        args[index] = args[index].with_changes(value=moved)
    return call.with_changes(args=args)


def _unwrap_aliases(roles: Roles, plan: EditPlan, wraps: list[ddp_options.Wrap]) -> None:
    """`self.ddp_model = DDP(self.model, ...)` / `self.ddp_model = self.model` after the prepare
    call (`roles.model_aliases`): the alias is what `accelerator.prepare` binds now, so its
    bindings go; `self.model` stays the bare module the trainer saves."""
    home = roles.home
    assert home is not None
    for alias, model in roles.model_aliases.items():
        bindings = home.bindings.get(alias, [])
        for binding in bindings:
            removed = alias_removal(binding.where, bindings)
            assert binding.value is not None and removed is not None
            plan.replace_stmt[removed] = []
            plan.change(CODE, binding.value, f"`{alias}` is the prepared `{model}`: `accelerator.prepare` binds it "
                        "(and wraps it when several processes train)")
            value = binding.value
            if type(value) is cst.Call and roles.facts.aliases.qualify(value.func) in ddp_options.DDP:
                wraps.append(ddp_options.Wrap(value, home, alias))


def _convert_hand_sharding(roles: Roles, sharding: HandSharding, plan: EditPlan) -> None:
    """FSDP / fully_shard go and ZeroRedundancyOptimizer becomes its optimizer class (see
    `migrate.hand_sharding` for which shapes amount to which strategy); the Accelerator gets it."""
    home = roles.home
    assert home is not None
    for stmt, node, message in sharding.removed:
        plan.replace_stmt[stmt] = []
        plan.change(CODE, node, message)
        if type(node) is cst.Call:
            _forget_init_arguments(home, node, plan)  # `policy = partial(...)` fed only `FSDP(model, policy)`
    for call, klass, kept in sharding.optimizers:
        keep = [index for index, arg in enumerate(call.args) if any(arg is k for k in kept)]
        plan.calls[call] = lambda updated, klass=klass, keep=keep: updated.with_changes(
            func=klass, args=_ending_as(updated.args, [updated.args[i] for i in keep])
        )
        plan.change(CODE, call, f"`ZeroRedundancyOptimizer` -> `{cst.Module([]).code_for_node(klass)}`: "
                    f"`Accelerator(strategy=\"{sharding.strategy}\")` shards its state in `accelerator.prepare`")
    if plan.target != "runtime":
        node = sharding.removed[0][1] if sharding.removed else sharding.optimizers[0][0]
        plan.report(CODE, node, f"the hand-written sharding was converted for `{sharding.strategy}`, but HF "
                    "Accelerate's Accelerator has no strategy argument: choose FSDP (or DeepSpeed ZeRO) in "
                    "`accelerate config`, or the script trains with plain DDP", unconverted=True)
        return
    plan.accelerator_kwargs["strategy"] = f'"{sharding.strategy}"'


def _ending_as(original: Sequence[cst.Arg], args: list[cst.Arg]) -> list[cst.Arg]:
    """`args` whose last one ends as the original last one did (its comma, its line break)."""
    if args and original:
        args[-1] = args[-1].with_changes(comma=original[-1].comma)
    return args


def _only_statement(parent: cst.If, stmt: cst.BaseStatement) -> bool:
    body = parent.body
    return type(body) is cst.IndentedBlock and len(body.body) == 1 and body.body[0] is stmt


def _remove_samplers(roles: Roles, plan: EditPlan) -> None:
    home = roles.home
    assert home is not None
    for loader in roles.rank_sampled:
        for scope, value in loader_calls(roles, home, loader):
            if scope is not home and not _only_builds_training_loaders(roles, scope, value):
                plan.report(
                    CODE,
                    value,
                    f"`{scope.name}` builds loaders with a DistributedSampler for more than the training loop; "
                    f"the sampler was kept and `{loader}` not prepared (preparing it would shard it twice): drop "
                    "the sampler (the DataLoader then shuffles as the sampler did: `shuffle=True`, unless the sampler had `shuffle=False`) and prepare every loader it builds",
                )
                continue
            for index, arg in enumerate(value.args):
                if arg.keyword is None or arg.keyword.value != "sampler":
                    continue
                converted = _sampler_shuffle(roles, plan, scope, arg.value)
                if converted is None:
                    continue
                shuffle, sampler_name = converted
                has_shuffle = any(a.keyword is not None and a.keyword.value == "shuffle" for a in value.args)
                plan.calls[value] = lambda updated, index=index, shuffle=shuffle, has_shuffle=has_shuffle: (
                    _swap_sampler(updated, index, shuffle, has_shuffle)
                )
                plan.unsharded_loaders.add(loader)
                plan.change(CODE, value, f"DistributedSampler removed from `{loader}`; prepare shards it")
                if sampler_name is not None:
                    _remove_sampler_uses(roles, plan, sampler_name)
        if loader in plan.unsharded_loaders:
            _remove_loader_set_epoch(roles, plan, loader)


def _only_builds_training_loaders(roles: Roles, helper: Scope, built: cst.Call) -> bool:
    """Every call of `helper` binds the loader `built` (a `DataLoader(...)` of the helper) to a
    training loader that shards by rank (and will be prepared), directly (`loader = make(...)`)
    or as one element of what it returns (`datasets, loader, val_loader = build_loader(config)`):
    removing that loader's sampler then unshards nothing that stays unprepared."""
    sites = roles.call_sites(helper)
    if not sites:
        return False
    for caller, call in sites:
        if caller is not roles.home:
            return False
        bound = [n for n, bs in caller.bindings.items() for b in bs
                 if b.value is call or (b.value is None and _unpacks(b, call))]
        takes = [n for n in bound if any(v is built for _, v in loader_calls(roles, caller, n))]
        if not takes or not all(n in roles.rank_sampled for n in takes):
            return False
    return True


def _unpacks(binding, call: cst.Call) -> bool:  # type: ignore[no-untyped-def]
    stmt = binding.where.stmt
    return (type(stmt) is cst.SimpleStatementLine and len(stmt.body) == 1
            and type(stmt.body[0]) is cst.Assign and stmt.body[0].value is call)


def _remove_loader_set_epoch(roles: Roles, plan: EditPlan, loader: str) -> None:
    """`loader.sampler.set_epoch(epoch)`: the sampler is gone, and the prepared loader reshuffles itself."""
    for scope in roles.facts.scopes:
        if not scope.is_function and scope is not roles.facts.module_scope:
            continue
        for stmt in _own_statements(scope.node):
            small = stmt.body[0] if len(stmt.body) == 1 else None
            if not (type(small) is cst.Expr and type(small.value) is cst.Call):
                continue
            func = small.value.func
            if not (
                type(func) is cst.Attribute
                and func.attr.value == "set_epoch"
                and type(func.value) is cst.Attribute
                and func.value.attr.value == "sampler"
            ):
                continue
            ref = reference(func.value.value)
            if ref is not None and roles.all_in(scope, ref, [loader]):
                plan.replace_stmt[stmt] = []
                plan.change(CODE, small.value, "`set_epoch` removed: prepared loaders reshuffle each epoch")


def _own_statements(node: cst.CSTNode) -> list[cst.SimpleStatementLine]:
    """Simple statements of a function or module, not those of functions and classes inside it."""
    finder = _OwnStatements(node)
    walk(node, finder)
    return finder.found


class _OwnStatements(cst.CSTVisitor):
    def __init__(self, node: cst.CSTNode) -> None:
        self.node = node
        self.found: list[cst.SimpleStatementLine] = []

    def visit_SimpleStatementLine(self, stmt: cst.SimpleStatementLine) -> bool:
        self.found.append(stmt)
        return False

    def visit_FunctionDef(self, inner: cst.FunctionDef) -> bool:
        return inner is self.node

    def visit_ClassDef(self, inner: cst.ClassDef) -> bool:
        return False


def _sampler_shuffle(
    roles: Roles, plan: EditPlan, home: Scope, sampler: cst.BaseExpression
) -> tuple[cst.BaseExpression, str | None] | None:
    """The shuffle the DataLoader takes over from a DistributedSampler bound in `home` (the scope
    the DataLoader call is in); the sampler's binding is removed."""
    name = sampler.value if type(sampler) is cst.Name else None
    calls = [b.value for b in home.bindings.get(name, [])] if name is not None else [sampler]
    if len(calls) != 1 or type(calls[0]) is not cst.Call:
        return None
    call = calls[0]
    if roles.facts.aliases.qualify(call.func) not in _SAMPLERS:
        return None
    shuffle: cst.BaseExpression = cst.Name("True")
    for arg in call.args[1:]:
        keyword = arg.keyword.value if arg.keyword is not None else None
        if keyword == "shuffle":
            shuffle = arg.value.deep_clone()  # the sampler may stay: one node object in one place
        elif keyword not in ("num_replicas", "rank", "seed"):  # the prepared loader shares its own seed
            plan.report(CODE, call, f"DistributedSampler option `{keyword or 'positional'}` has no DataLoader "
                        "equivalent; the sampler was kept and the loader not prepared")
            return None
    if name is not None and not _drop_sampler_reads(plan, home, name, sampler):
        return shuffle, name  # read elsewhere: the binding stays, the loader no longer uses it
    if name is not None:
        for binding in home.bindings[name]:
            if binding.value is None:
                plan.replace_stmt[binding.where.stmt] = []
            else:  # kept when it shares a line it cannot be taken out of alone
                remove_statement(plan, binding.where.stmt, binding.value)
    return shuffle, name


class _NameReads(cst.CSTVisitor):
    """The statements of a scope that read `name` (its own nested scopes included)."""

    def __init__(self, name: str, skipped: cst.CSTNode) -> None:
        self.name, self.skipped = name, skipped
        self.statements: list[cst.BaseStatement] = []
        self._current: list[cst.BaseStatement] = []

    def visit_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> None:
        self._current.append(node)

    def leave_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> None:
        self._current.pop()

    def visit_Arg(self, node: cst.Arg) -> bool:
        return node.value is not self.skipped  # `DataLoader(..., sampler=sampler)`: the use being replaced

    def visit_Attribute(self, node: cst.Attribute) -> bool:
        return not (node.attr.value == "set_epoch" and type(node.value) is cst.Name)  # removed with it

    def visit_AssignTarget(self, node: cst.AssignTarget) -> bool:
        return False

    def visit_Name(self, node: cst.Name) -> None:
        if node.value == self.name:
            statement = self._current[-1] if self._current else None
            if statement is not None and statement not in self.statements:
                self.statements.append(statement)


def _drop_sampler_reads(plan: EditPlan, home: Scope, name: str, sampler: cst.BaseExpression) -> bool:
    """The statements that read the removed sampler besides its loader: a `print(...)` of it
    (`print("Sampler_train = %s" % str(sampler_train))`) goes with it; any other read keeps the
    binding (False), so that no name is read after the rewrite removed it."""
    finder = _NameReads(name, sampler)
    walk(home.node, finder)
    bound = {id(b.where.stmt) for b in home.bindings.get(name, [])}
    reads = [stmt for stmt in finder.statements if id(stmt) not in bound]
    if not all(_only_prints(stmt) for stmt in reads):
        return False
    for stmt in reads:
        plan.replace_stmt[stmt] = []
        plan.change(CODE, stmt, f"the print of the removed DistributedSampler `{name}` removed")
    return True


def _only_prints(stmt: cst.BaseStatement) -> bool:
    return (
        type(stmt) is cst.SimpleStatementLine
        and len(stmt.body) == 1
        and type(stmt.body[0]) is cst.Expr
        and type(stmt.body[0].value) is cst.Call
        and type(stmt.body[0].value.func) is cst.Name
        and stmt.body[0].value.func.value == "print"
    )


def _swap_sampler(call: cst.Call, index: int, shuffle: cst.BaseExpression, has_shuffle: bool) -> cst.Call:
    args = list(call.args)
    if has_shuffle:
        # `shuffle=False` stood beside the sampler because DataLoader refuses both: the order was the
        # sampler's (DistributedSampler shuffles by default), so its shuffle replaces the loader's
        args = [
            a.with_changes(value=shuffle) if a.keyword is not None and a.keyword.value == "shuffle" else a
            for a in args
        ]
        removed = args.pop(index)
        if args and index == len(args):  # the last argument takes the removed one's comma and line break
            args[-1] = args[-1].with_changes(comma=removed.comma)
    else:
        args[index] = args[index].with_changes(keyword=cst.Name("shuffle"), value=shuffle)
    return call.with_changes(args=args)


def _remove_sampler_uses(roles: Roles, plan: EditPlan, sampler: str) -> None:
    for scope in roles.facts.scopes:
        for site in scope.method_calls:
            if not (type(site.receiver) is cst.Name and site.receiver.value == sampler):
                continue
            assert type(site.call.func) is cst.Attribute
            if site.call.func.attr.value != "set_epoch":
                continue
            stmt = site.where.stmt
            shared = type(stmt) is cst.SimpleStatementLine and len(stmt.body) > 1 and any(
                type(small) is cst.Expr and small.value is site.call for small in stmt.body)
            if _standalone(site.where, site.call) or shared:
                remove_statement(plan, stmt, site.call)  # `sampler.set_epoch(epoch); print(epoch)`: the print stays
                plan.change(CODE, site.call, "`set_epoch` removed: prepared loaders reshuffle each epoch")


def _standalone(where: StmtRef, call: cst.Call) -> bool:
    stmt = where.stmt
    return (
        type(stmt) is cst.SimpleStatementLine
        and len(stmt.body) == 1
        and type(stmt.body[0]) is cst.Expr
        and stmt.body[0].value is call
    )


def _kept_init_message(scope: Scope, call: cst.Call, where: StmtRef) -> str:
    """What a kept `init_process_group` means for how the migrated script is launched. An
    Accelerator created after the call joins the group it made, with the group's rank and world
    size, whatever launched the processes; RANK / WORLD_SIZE in the environment that contradict the
    group make creating it fail (runtime/state.py). Without a group, it reads torchrun's variables,
    and without those it is one process."""
    head = f"process group initialised in `{scope.name}`; it was kept (the Accelerator reuses an existing group)"
    gate = _launcher_gate(where)
    if gate is not None:
        return (
            f"{head}. It runs only when the launcher's variables are set ({gate}): on one process started "
            "without a launcher the script runs non-distributed, as before, and wherever it runs (under `accel "
            "launch` or torchrun, or another launcher whose variables it reads) the Accelerator joins this group, "
            "with its rank and world size"
        )
    defaults = _defaults_launcher_env(call, where)
    if defaults is not None:
        return (
            f"{head}. It sets a world of 1 where no launcher set the variables it reads ({defaults}), so one "
            "process started with plain `python` trains in a group of its own, as before, and under `accel launch "
            "--nproc-per-node N` (torchrun) the group takes the launcher's RANK and WORLD_SIZE and the Accelerator "
            "joins it"
        )
    env = _reads_launcher_env(call, where)
    if env is not None:
        return (
            f"{head}. It reads the launcher's environment ({env}), so the script needed torchrun's variables "
            "before the migration too, and still does: launch it with `accel launch --nproc-per-node N` (or "
            "torchrun); to drop the setup, let the Accelerator create the group"
        )
    return (
        f"{head}, from values of its own, not from the launcher's environment: the Accelerator joins this group "
        "with its rank and world size, so the script trains distributed wherever it did before (a launcher "
        "passing these values); where RANK / WORLD_SIZE are also set (`accel launch`, torchrun), they must "
        "agree with the group's, or creating the Accelerator fails naming both"
    )


def _launcher_gate(where: StmtRef) -> str | None:
    """How the call is skipped when no launcher's variables are set: inside an `if` that tests the
    environment (`if "RANK" in os.environ:`), or after one whose branch returns (`else: return`)."""
    levels = [*where.path, where]
    for ref in where.path:
        if type(ref.stmt) is cst.If:
            test = _environment_test(ref.stmt)
            if test is not None:
                return f"under the test `{test}`"
    for ref in levels:
        for stmt in ref.block.body:
            if stmt is ref.stmt:
                break
            if type(stmt) is cst.If and _else_returns(stmt):
                test = _environment_test(stmt)
                if test is not None:
                    return f"after the `if` chain testing `{test}`, whose `else` returns"
    return None


def _environment_test(stmt: cst.If) -> str | None:
    """The first test of an `if`/`elif` chain that reads the environment (`"RANK" in os.environ`)."""
    node: cst.If | cst.Else | None = stmt
    while type(node) is cst.If:
        if "environ" in _code(node.test):
            return _code(node.test)
        node = node.orelse
    return None


def _else_returns(stmt: cst.If) -> bool:
    """The chain's last branch is an `else` that returns."""
    node: cst.If | cst.Else | None = stmt
    while type(node) is cst.If:
        node = node.orelse
    if type(node) is not cst.Else or type(node.body) is not cst.IndentedBlock:
        return False
    return any(
        type(inner) is cst.SimpleStatementLine and any(type(small) is cst.Return for small in inner.body)
        for inner in node.body.body
    )


def _reads_launcher_env(call: cst.Call, where: StmtRef) -> str | None:
    """How the group's setup depends on the launcher's variables: the default `env://` init
    method (MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE), or `os.environ[...]` read before it at the
    top of its function (a KeyError without them)."""
    method = next((a.value for a in call.args if a.keyword is not None and a.keyword.value == "init_method"), None)
    positional = [a for a in call.args if a.keyword is None and not a.star]
    if method is None and len(positional) < 2 and not any(
        a.keyword is not None and a.keyword.value == "store" for a in call.args
    ):
        return "`init_process_group` without an `init_method` reads MASTER_ADDR, MASTER_PORT, RANK and WORLD_SIZE"
    if type(method) is cst.SimpleString and method.evaluated_value == "env://":
        return "`init_method='env://'` reads MASTER_ADDR and MASTER_PORT"
    top = where.path[0] if where.path else where
    for stmt in top.block.body:
        if stmt is top.stmt:
            break
        if type(stmt) is cst.SimpleStatementLine and "environ[" in _code(stmt):
            shown = _code(stmt)
            if len(shown) > 80 and len(stmt.body) == 1 and type(stmt.body[0]) is cst.Assign:
                shown = f"{_code(stmt.body[0].targets[0].target)} = ..."
            return f"`{shown}` reads `os.environ[...]`, a KeyError without them"
    return None


_RENDEZVOUS = ("MASTER_ADDR", "MASTER_PORT")


def _defaults_launcher_env(call: cst.Call, where: StmtRef) -> str | None:
    """The group is created on every run, a world of 1 without a launcher: the call runs outside any
    `if` of its function, and the variables it reads (MASTER_ADDR and MASTER_PORT, and RANK and
    WORLD_SIZE unless `rank=` / `world_size=` are given without an `os.environ[...]` read) are given
    defaults before it at the top of the function (`os.environ.setdefault("RANK", "0")`). The
    `os.environ.setdefault(...)` calls, shown, or None."""
    if any(type(ref.stmt) is cst.If and not _every_branch_initialises(ref.stmt) for ref in where.path):
        return None
    keywords = {a.keyword.value: a.value for a in call.args if a.keyword is not None}
    if any(a.keyword is None for a in call.args[1:]) or "store" in keywords:
        return None
    method = keywords.get("init_method")
    if method is not None and not (type(method) is cst.SimpleString and method.evaluated_value == "env://"):
        return None
    needed = set(_RENDEZVOUS)
    for name in ("rank", "world_size"):
        given = keywords.get(name)
        if given is None:
            needed.add(name.upper())
        elif "environ[" in _code(given):
            return None
    top = where.path[0] if where.path else where
    defaulted: list[str] = []
    for stmt in top.block.body:
        if stmt is top.stmt:
            break
        unset = _set_when_unset(stmt)
        if unset is not None:
            defaulted.append(unset)
            continue
        if type(stmt) is not cst.SimpleStatementLine:
            continue
        for small in stmt.body:
            value = small.value if type(small) is cst.Expr else None
            if (type(value) is cst.Call and _code(value.func) == "os.environ.setdefault" and value.args
                    and type(value.args[0].value) is cst.SimpleString):
                defaulted.append(value.args[0].value.evaluated_value)
    if not needed <= set(defaulted):
        return None
    return ", ".join(f"`{name}`" for name in defaulted if name in needed) + " by default"


def _set_when_unset(stmt: cst.BaseStatement) -> str | None:
    """`if "MASTER_ADDR" not in os.environ: os.environ["MASTER_ADDR"] = "localhost"`: the variable's
    name (a default, as `os.environ.setdefault` gives), else None."""
    if type(stmt) is not cst.If or stmt.orelse is not None or type(stmt.test) is not cst.Comparison:
        return None
    test = stmt.test
    if len(test.comparisons) != 1 or type(test.comparisons[0].operator) is not cst.NotIn \
            or type(test.left) is not cst.SimpleString or _code(test.comparisons[0].comparator) != "os.environ":
        return None
    name = test.left.evaluated_value
    body = stmt.body.body if type(stmt.body) is cst.IndentedBlock else ()
    for line in body:
        for small in line.body if type(line) is cst.SimpleStatementLine else ():
            if type(small) is cst.Assign and any(
                    _code(t.target) in (f'os.environ["{name}"]', f"os.environ['{name}']") for t in small.targets):
                return str(name)
    return None


def _every_branch_initialises(stmt: cst.If) -> bool:
    """`if platform.system() == "Windows": init_process_group("gloo", ...) else:
    init_process_group("nccl", ...)`: every branch creates the group (so it exists on every run)."""
    branches: list[cst.BaseSuite] = [stmt.body]
    orelse = stmt.orelse
    while type(orelse) is cst.If:
        branches.append(orelse.body)
        orelse = orelse.orelse
    if orelse is None:
        return False
    branches.append(orelse.body)
    return all("init_process_group(" in cst.Module([]).code_for_node(branch) for branch in branches)


def _group_on_every_run(roles: Roles) -> bool:
    """The program creates its process group on every run, a world of 1 under plain `python`
    (`_defaults_launcher_env`): its explicit collectives work on one process too."""
    return any(_defaults_launcher_env(c.call, c.where) is not None
               for scope in roles.facts.scopes for c in scope.library_calls if c.qualified == _INIT)


def _code(node: cst.CSTNode) -> str:
    return " ".join(cst.Module([]).code_for_node(node).split())


def _reads_mpi(roles: Roles, scope: Scope) -> bool:
    """The function reads mpi4py (`MPI.COMM_WORLD.rank`): its ranks are MPI's, not the launcher's."""
    found = False

    class Finder(cst.CSTVisitor):
        def visit_Attribute(self, node: cst.Attribute) -> bool:
            nonlocal found
            found = found or (roles.facts.aliases.qualify(node) or "").startswith("mpi4py.")
            return not found

    walk(scope.node, Finder())
    return found
