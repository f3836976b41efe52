"""The `Roles` record: what each training object is, and how names reach it.

`origins` follows a name through assignments, enclosing scopes, parameters (via the module's own
call sites) and `self.` attributes to the bindings it can refer to; `can_reach` and
`needs_parameter` say whether a scope sees `accelerator` or must be handed it. Finders record what
they cannot resolve through `cannot_prepare` (AM004), which also tells later finders that a
training object was left unprepared."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING

import libcst as cst

from migrate.analysis import (
    Binding,
    CallSite,
    DeviceBinding,
    Facts,
    Loop,
    Scope,
    StmtRef,
    is_device_choice,
)
from migrate.hand_sharding import HandSharding
from migrate.names import call_argument, instance_attribute
from migrate.roles.calls import is_accelerator_device, is_move_call, is_self_move
from migrate.roles.setup_device import binds_setup_device, initialises_group

if TYPE_CHECKING:
    from migrate.roles.class_wrappers import ClassWrapper
    from migrate.roles.full_batch import SharedRows, SharedSelection
    from migrate.roles.sequence_streams import SharedStreams
    from migrate.roles.spawn import SpawnLaunch


Origin = tuple[Scope, str]


# The codes of the rules whose shapes the finders refuse; each rule documents the refusal.
ACCELERATOR = "AM001"  # create_accelerator
BACKWARD = "AM003"  # replace_loss_backward
PREPARE = "AM004"  # prepare_training_objects
MIXED_PRECISION = "AM006"  # convert_mixed_precision
DISTRIBUTED = "AM007"  # remove_distributed_boilerplate


@dataclass(eq=False)
class WrappedOptimizer:
    """`optimizer = ScheduledOptim(torch.optim.Adam(model.parameters()), d_model, warmup)`: a
    one-statement binding of an object that takes the optimizer as one of its arguments."""

    binding: Binding
    wrapper: cst.Call
    inner: cst.Call  # the optimizer, an argument of `wrapper`


@dataclass(eq=False)
class ObjectBuilder:
    """A function that builds the model and its optimizer and returns them in a tuple, unpacked by
    every caller (`dataset, model, optimizer = load_train_objs()`): the positions of the optimizer
    and of the models it optimizes (`migrate.roles.optimizers.training_object_builders`)."""

    scope: Scope
    optimizer: int
    models: tuple[int, ...]


@dataclass(eq=False)
class InstanceFed:
    """A loop of `scope` over `source` hands each batch to `feed` (`model.set_input(data)`) and
    trains through `train` (`model.optimize_parameters()`), methods of an instance of `cls`."""

    scope: Scope
    loop: Loop
    source: str
    instance: str
    cls: Scope
    feed: cst.Call
    train: cst.Call
    built: Binding  # `model = Pix2PixModel(opt)`


@dataclass(eq=False)
class Finding:
    """Something a rule must report rather than rewrite.

    `unconverted`: the rule that reports it knows it left training code unconverted (as it was, or
    partly converted) in a way the migrated script does not train correctly on N processes without
    the user's change: an object not prepared, a loader left unsharded, a file left as it is. Advice
    about code that is correct as it is (kept AMP, a device index no longer honoured, N times the
    evaluation work) leaves it False. It decides the file's outcome (`FileResult.outcome`: partial
    or refused) and `--check`'s exit code."""

    code: str
    node: cst.CSTNode
    message: str
    unconverted: bool = False
    # the `--target`s it applies to (None: every target); e.g. a prepared model's `module.` keys
    # exist under HF Accelerate's DDP only, the runtime's prepared model has the user's keys
    targets: tuple[str, ...] | None = None


@dataclass(eq=False)
class Roles:
    facts: Facts
    home: Scope | None = None
    models: list[str] = field(default_factory=list)
    optimizers: list[str] = field(default_factory=list)
    loaders: list[str] = field(default_factory=list)
    # (method, parameter): a loader bound where home cannot prepare it, handed once to a method of
    # home's class that trains on it (`trainer.fit(loader)`); prepared at the top of that method
    received_loaders: list[tuple[Scope, str]] = field(default_factory=list)
    # loader -> the call that builds it, a function the migration cannot read (`get_loader(...)` of
    # a module not given): prepared with the others (the runtime's prepare shares out a non-DataLoader's
    # batches on N processes), its batches keep their moves; reported instead under --target accelerate
    unread_loaders: dict[str, str] = field(default_factory=dict)
    # loader -> the report for --target accelerate: an iterator shown not to be a DataLoader that makes
    # batches of its own (a torchtext `BucketIterator`, a class of this file): prepared (the runtime
    # shares out its batches by position on N processes), its batches keep their moves
    iterable_loaders: dict[str, str] = field(default_factory=dict)
    # loader -> the note that its unread factory shards by rank itself (`distributed=...`): not prepared
    self_sharded: dict[str, cst.CSTNode] = field(default_factory=dict)
    # method -> (attribute, local name, its reads there): training loaders the instance holds
    # (`self.celeba_loader`) that a method which does not train also reads (`test()`): prepared on
    # entry to each training method into a local, not where the models are, so the instance keeps
    # the user's loader (migrate/roles/loaders.py, `loaders_for_training_only`)
    method_loaders: dict[Scope, list[tuple[str, str, list[cst.Attribute]]]] = field(default_factory=dict)
    schedulers: list[str] = field(default_factory=list)
    epoch_schedulers: list[str] = field(default_factory=list)  # stepped per epoch: not prepared
    rank_sampled: dict[str, cst.CSTNode] = field(default_factory=dict)  # loaders with a DistributedSampler
    eval_loops: list[tuple[Scope, Loop, str]] = field(default_factory=list)  # (scope, loop, home loader)
    # (scope, loop, home loader): loops without backward over a loader of home that a function the
    # migration cannot read builds and that is not prepared (`train_dl, valid_dl, ... = get_data(opts)`
    # of a module not given): it may share out its samples by rank itself (a DistributedSampler inside,
    # a DataLoader over a datapipe, which torch shards once a process group exists) or not (AM011)
    unread_eval_loops: list[tuple[Scope, Loop, str]] = field(default_factory=list)
    accelerator_scope: Scope | None = None
    accelerator_exists: bool = False
    device_binding: DeviceBinding | None = None  # replaced by `accelerator.device` (AM001)
    later_device_bindings: list[DeviceBinding] = field(default_factory=list)  # same name, rebound too
    # `device = setup()`: the device binding is a call of the script's own process-group setup
    # helper (`migrate.roles.setup_device`); the call stays, the Accelerator is created after it
    device_from_setup: bool = False
    create_before: cst.BaseStatement | None = None  # where `accelerator = Accelerator()` goes otherwise
    prepare_after: StmtRef | None = None
    # the loop (`for fold in range(K):`) whose every iteration builds all the objects prepared at
    # prepare_after and trains them: the prepare call runs once per iteration, after
    # `accelerator.free_memory()` drops the previous iteration's (migrate/roles/placement.py)
    prepare_per_iteration: StmtRef | None = None
    # home, which builds every object it prepares, is a function called in a loop (one fold per
    # call): its prepare call runs once per call, after `accelerator.free_memory()` too
    prepare_repeated: bool = False
    # (statement, names): the models (and the optimizers built by then) prepared in a call of their
    # own right before that statement, which holds the first load of their state after a removed
    # hand wrap (`model = DDP(model)` ... `model.load_state_dict(ckpt["model"])`, `module.` keys);
    # the other objects stay at prepare_after (migrate/roles/placement.py, `_early_prepare`)
    early_prepare: tuple[StmtRef, list[str]] | None = None
    early_load: cst.Call | None = None  # that first load (reported instead under --target accelerate)
    # alias -> model: a second name the model is wrapped into by hand after prepare_after
    # (`self.ddp_model = DDP(self.model)` beside `self.ddp_model = self.model`); prepare binds the
    # alias, and the model's own name keeps the bare module its checkpoints are saved from
    model_aliases: dict[str, str] = field(default_factory=dict)
    # alias -> prepared name: a plain alias the training step uses, bound before prepare_after
    # (`net = model` ... `net(x)`); bound again right after the prepare call (migrate/roles/step_aliases.py)
    step_aliases: dict[str, str] = field(default_factory=dict)
    # optimizer -> its wrapped form (`optimizer = ScheduledOptim(Adam(...), ...)`): prepared as the
    # inner optimizer, then wrapped again after the prepare call (AM004)
    wrapped_optimizers: dict[str, "WrappedOptimizer"] = field(default_factory=dict)
    # functions building the model and optimizer into a returned tuple, by id of their scope: the
    # caller that unpacks it is home
    object_builders: dict[int, ObjectBuilder] = field(default_factory=dict)
    # no DataLoader feeds the training step: its batches come from this function of the file, which
    # draws them from torch's global RNG (`get_batch()` over `torch.randn`), with the module-level
    # bindings it reads that are drawn from that RNG too (the task: `W_target = torch.randn(...)`);
    # AM004 seeds the processes apart after the prepare call so that each draws its own batches
    random_batches: "tuple[str, list[Binding]] | None" = None
    # the same, where the module-level draws the batches are made from are not seeded (`W_target =
    # torch.randn(4, 1)`): alike on every process only when drawn after the runtime's Accelerator is
    # created (runtime/rng.py), which AM004 checks once the Accelerator is placed; reported otherwise
    unseeded_task: "tuple[str, list[Binding]] | None" = None
    # the training step updates a prepared model's parameters by hand (`p.data.add_(-lr * p.grad)` over
    # `model.parameters()`), with no optimizer (the models are prepared alone) or beside the optimizer's
    # models (migrate/roles/hand_update.py)
    hand_updated: bool = False
    # no DataLoader feeds the training step directly: a loop over a loader hands each batch to an
    # instance of a class of the file (`model.set_input(data)`) and trains through a method of it
    # (`model.optimize_parameters()`); reported (AM004) once the Accelerator's place is known
    instance_fed: "InstanceFed | None" = None
    # no DataLoader feeds the training step: its loss selects its samples from a full-batch output
    # with a fixed index or mask (`output[idx_train]`, migrate/roles/full_batch.py); AM004 takes
    # this process's share of them (`accelerator.share_selection`)
    shared_selection: "SharedSelection | None" = None
    # no DataLoader feeds the training step: truncated BPTT over the streams (rows) of one batchified
    # tensor, the state carried across slices (migrate/roles/sequence_streams.py); AM004 takes this
    # process's share of the streams (`accelerator.share_streams`) and sizes the state from it
    shared_streams: "SharedStreams | None" = None
    # no DataLoader feeds the training step: it trains on every row of fixed tensors at once
    # (`criterion(model(inputs), targets)`, migrate/roles/full_batch.py); AM004 takes this process's
    # share of the rows (`accelerator.share_selection(len(inputs))`)
    shared_rows: "SharedRows | None" = None
    findings: list[Finding] = field(default_factory=list)
    refused: bool = False  # the file is reported, not rewritten
    # processes started by MPI (`migrate/roles/mpi_launch.py`): refused, and a unit is left whole
    # with each finding reported in its own module
    started_by_mpi: bool = False
    unprepared: bool = False  # a training object was found that cannot be prepared (reported by `cannot_prepare`)
    spawn: "SpawnLaunch | None" = None  # an understood `mp.spawn` launcher (AM007 converts it)
    sharding: "HandSharding | None" = None  # hand-written FSDP / fully_shard / ZeRO that AM007 converts
    # `if args.distributed: init_process_group(...)` in the scope that creates the Accelerator, the
    # flag read elsewhere too: AM007 sets it to `accelerator.num_processes > 1` before that `if`
    group_flag: "tuple[cst.If, cst.BaseExpression] | None" = None
    # `self.model = DDP(self.model)` in a trainer class handed the prepared model: AM007 removes it
    class_wrappers: list["ClassWrapper"] = field(default_factory=list)
    # `loss_scaler(loss, optimizer, clip_grad=...)`: an object the migration cannot read that is
    # handed the loss and the optimizer and runs the backward and the step, where no `.backward()`
    # shows anywhere (`migrate.roles.hidden_step`): the training step, kept as it is
    hidden_steps: list[tuple[Scope, CallSite]] = field(default_factory=list)
    # (model of home, the wrapper call, its statement in the helper, the helper): a hand wrap inside
    # a function of the file whose return value home binds to the model (`model = wrap(Net())`,
    # `def wrap(m): return DDP(m)`), removed there by AM007 (`migrate.roles.traps.refuse_kept_wraps`)
    helper_wraps: list[tuple[str, cst.Call, StmtRef, Scope]] = field(default_factory=list)
    _training_functions: set[Scope] = field(default_factory=set)
    _called_objects: dict[tuple[int, str], "Scope | None"] = field(default_factory=dict)
    # `can_reach` per (scope, accelerator scope), by ids: every rule asks it of every scope.
    _reaches: dict[tuple[int, int], bool] = field(default_factory=dict)

    @property
    def training_only_loaders(self) -> set[str]:
        """The attributes prepared in the training methods (`method_loaders`), not in home."""
        return {attribute for found in self.method_loaders.values() for attribute, _, _ in found}

    def cannot_prepare(self, node: cst.CSTNode, message: str) -> None:
        """A training object that `accelerator.prepare(...)` will not take: reported as the
        prepare rule's diagnostic, saying what to prepare by hand."""
        self.unprepared = True
        self.findings.append(Finding(PREPARE, node, message, unconverted=True))

    # -- name resolution ---------------------------------------------------------------------

    def origins(self, scope: Scope, name: str, _seen: frozenset[tuple[int, str]] = frozenset()) -> set[Origin] | None:
        """Bindings `name` can refer to in `scope`, or None when one of them cannot be known."""
        key = (id(scope), name)
        if key in _seen:
            return set()
        seen = _seen | {key}
        if name.startswith("self."):
            return self._attribute_origins(scope, name, seen)
        current: Scope | None = scope
        while current is not None:
            if current.binds(name):
                found: set[Origin] = set()
                for binding in current.bindings.get(name, []):
                    if not is_self_move(binding):
                        found.add((current, name))
                if not found and name not in current.params:
                    # Bound here by self-moves only (`model = DDP(model)` with no `model = Net()`):
                    # the name is still this scope's, as it is once the wrapper becomes `prepare`.
                    found.add((current, name))
                if name in current.params:
                    from_callers = self._param_origins(current, name, seen)
                    if from_callers is None:
                        return None
                    found |= from_callers
                    if not from_callers and not current.bindings.get(name):
                        found.add((current, name))  # a parameter nobody here passes: itself
                return found
            current = _enclosing_function_or_module(current)
        return None

    def _attribute_origins(self, scope: Scope, name: str, seen: frozenset[tuple[int, str]]) -> set[Origin] | None:
        """`self.model` in a method: bound in some method of the class (usually `__init__`).

        `self.model = model` forwards to what `model` is in that method (a constructor parameter:
        what the callers of the class pass)."""
        methods = self.methods_of(scope)
        if methods is None:
            return None
        found: set[Origin] = set()
        for method in methods:
            for binding in method.bindings.get(name, []):
                if is_self_move(binding):
                    continue
                value = binding.value
                inner = value.func.value if is_move_call(value) else value
                key = _keyword_read(method, inner)
                if key is not None and method is not self.home:
                    # `self.model = kwargs['model']` in a constructor taking `**kwargs`: what its
                    # callers pass as `model=`.
                    sub = self._keyword_origins(method, key, seen)
                    if sub is None:
                        return None
                    found |= sub
                # In the function that prepares (home), the attribute itself is what gets prepared.
                elif isinstance(inner, cst.Name) and method is not self.home:
                    sub = self.origins(method, inner.value, seen)
                    if sub is None:
                        return None
                    found |= sub
                else:
                    found.add((method, name))
        return found or None

    def _keyword_origins(self, scope: Scope, key: str, seen: frozenset[tuple[int, str]]) -> set[Origin] | None:
        """What every caller of `scope` passes as `key=` into its `**kwargs`; None when a caller
        passes something else (or unpacks a mapping), or no caller is known."""
        sites = self.call_sites(scope)
        if not sites or not self._is_callable_unit(scope):
            return None
        found: set[Origin] = set()
        for caller, call in sites:
            if any(arg.star for arg in call.args):
                return None
            arg = next((a.value for a in call.args if a.keyword is not None and a.keyword.value == key), None)
            if not isinstance(arg, cst.Name):
                return None
            sub = self.origins(caller, arg.value, seen)
            if sub is None:
                return None
            found |= sub
        return found

    def methods_of(self, scope: Scope) -> list[Scope] | None:
        """The methods of the class `scope` is a method of (None when it is not a method)."""
        if not scope.is_method or scope.parent is None:
            return None
        return list(self._functions_by_parent.get(id(scope.parent), ()))

    @cached_property
    def _functions_by_parent(self) -> dict[int, list[Scope]]:
        """The functions defined directly in each scope (by the scope's id), in the order of
        `facts.scopes` (`methods_of` asks for a class's methods many times per module)."""
        index: dict[int, list[Scope]] = {}
        for scope in self.facts.scopes:
            if scope.parent is not None and scope.is_function:
                index.setdefault(id(scope.parent), []).append(scope)
        return index

    def _param_origins(self, scope: Scope, name: str, seen: frozenset[tuple[int, str]]) -> set[Origin] | None:
        if not self._is_callable_unit(scope):
            return None
        index = scope.params.index(name)
        if scope.is_method:
            index -= 1  # `self` is not passed by the caller
            if index < 0:
                return None
        found: set[Origin] = set()
        sites = self.call_sites(scope)
        if scope.is_method and not self._is_constructor(scope):
            sites = [*sites, *self.instance_calls(scope)]
        for caller, call in sites:
            arg = call_argument(call, index, name)
            if (isinstance(arg, cst.Attribute) and type(arg.value) is cst.Name and arg.value.value == "self"
                    and caller.is_method and not scope.is_method):
                # a method handing its attribute to a plain function of the module: `_fit(self.model, ...)`
                passed = f"self.{arg.attr.value}"
            elif isinstance(arg, cst.Name):
                passed = arg.value
            else:
                return None
            sub = self.origins(caller, passed, seen)
            if sub is None:
                return None
            found |= sub
        return found

    def call_sites(self, function: Scope) -> list[tuple[Scope, cst.Call]]:
        """Where this module calls `function` (a plain function, or a class's `__init__`)."""
        if self._is_constructor(function):
            assert function.parent is not None
            callee = function.parent.name
        elif function.is_function and not function.is_method:
            return [
                (scope, site.call)
                for scope, site in self._calls_by_callee.get(function.name, ())
                if self.facts.resolve(site.callee, scope) is function
            ]
        elif function.is_method:
            siblings = self.methods_of(function) or []
            callee = f"self.{function.name}"
            return [(s, site.call) for s in siblings for site in s.calls if site.callee == callee]
        else:
            return []
        return [(scope, site.call) for scope, site in self._calls_by_callee.get(callee, ())]

    def called_in_loop(self, function: Scope) -> bool:
        """A plain function of this module called inside a loop (`for fold in range(K): run(fold)`)."""
        if not function.is_function or function.is_method:
            return False
        return any(site.where.in_loop for scope, site in self._calls_by_callee.get(function.name, ())
                   if self.facts.resolve(site.callee, scope) is function)

    def instance_calls(self, method: Scope) -> list[tuple[Scope, cst.Call]]:
        """Calls of `method` on an instance of its class bound in the caller's own scope:
        `simclr = SimCLR(model=model, ...)` then `simclr.train(train_loader)` in `main`. What the
        caller passes is what the method's parameter holds (`train_loader` of main)."""
        cls = method.parent
        assert cls is not None
        found: list[tuple[Scope, cst.Call]] = []
        for scope in self.facts.scopes:
            for site in scope.method_calls:
                func = site.call.func
                if not (isinstance(func, cst.Attribute) and func.attr.value == method.name):
                    continue
                assert isinstance(site.receiver, cst.Name)
                bindings = scope.bindings.get(site.receiver.value, [])
                if bindings and all(
                    isinstance(b.value, cst.Call) and isinstance(b.value.func, cst.Name)
                    and self.facts.classes.get(b.value.func.value) is cls
                    for b in bindings
                ):
                    found.append((scope, site.call))
        return found

    @cached_property
    def _calls_by_callee(self) -> dict[str, list[tuple[Scope, CallSite]]]:
        """The call sites of each callee name, in the order of `facts.scopes` and of their calls
        (`call_sites` asks for one name at a time, many times per module)."""
        index: dict[str, list[tuple[Scope, CallSite]]] = {}
        for scope in self.facts.scopes:
            for site in scope.calls:
                index.setdefault(site.callee, []).append((scope, site))
        return index

    def _is_constructor(self, scope: Scope) -> bool:
        return (
            scope.is_method
            and scope.name == "__init__"
            and scope.parent is not None
            and self.facts.classes.get(scope.parent.name) is scope.parent
        )

    def _is_callable_unit(self, scope: Scope) -> bool:
        return scope.is_function

    def constructor_of(self, method: Scope) -> Scope | None:
        methods = self.methods_of(method) or []
        return next((m for m in methods if self._is_constructor(m)), None)

    def is_device(self, scope: Scope, expr: cst.BaseExpression) -> bool:
        if is_device_choice(expr, self.facts.aliases) or is_accelerator_device(expr):
            return True
        if self._held_device(scope, expr):
            return True
        name = expr.value if isinstance(expr, cst.Name) else instance_attribute(expr)
        if name is None:
            return False
        found = self.origins(scope, name)
        if not found:
            return False
        return all(_binds_device(s, n) or binds_setup_device(self.facts, s, n) for s, n in found)

    def _held_device(self, scope: Scope, expr: cst.BaseExpression) -> bool:
        """`args.device` where `args` is the namespace on which some function stored the device
        choice (`args.device = torch.device(...)`), passed down unchanged."""
        if not (isinstance(expr, cst.Attribute) and isinstance(expr.value, cst.Name)) or expr.value.value == "self":
            return False
        held = f"{expr.value.value}.{expr.attr.value}"
        here = self.origins(scope, expr.value.value)
        return bool(here) and any(
            d.name == held and self.origins(owner, expr.value.value) == here
            for owner in self.facts.scopes
            for d in owner.devices
        )

    def all_in(self, scope: Scope, name: str, names: list[str]) -> bool:
        """True when every binding `name` may refer to is one of home's `names`."""
        found = self.origins(scope, name)
        return bool(found) and all(s is self.home and n in names for s, n in found)

    # -- reach -----------------------------------------------------------------------------

    def can_reach(self, scope: Scope, _pending: frozenset[int] = frozenset()) -> bool:
        target = self.accelerator_scope
        if target is None:
            return False
        if _pending:
            return self._reach(scope, target, _pending)
        key = (id(scope), id(target))
        found = self._reaches.get(key)
        if found is None:
            found = self._reaches[key] = self._reach(scope, target, _pending)
        return found

    def _reach(self, scope: Scope, target: Scope, _pending: frozenset[int]) -> bool:
        if scope is not target and scope is not self.home and not scope.backwards and initialises_group(scope):
            # The script's own setup helper (`device = setup()`) keeps its process group and runs
            # before the Accelerator, which joins that group after it: it cannot use `accelerator`.
            return False
        if nested_in(scope, target):
            return True
        if target is self.facts.module_scope and not self._of_another_module(scope):
            return True
        if id(scope) in _pending:
            return True
        if scope.is_method:
            # A method reaches `self.accelerator`: created in a method of its class, or handed to
            # the class's constructor by callers that have it.
            methods = self.methods_of(scope) or []
            holder = next((m for m in methods if nested_in(target, m)), None)
            if holder is not None:
                # The constructor runs before any other method: it sees `self.accelerator` only when
                # it creates it, or calls the method that does (`self.build_model()`).
                return not self._is_constructor(scope) or holder is scope or any(
                    site.callee == f"self.{holder.name}" for site in scope.calls)
            constructor = self.constructor_of(scope)
            if constructor is None:
                return False
            scope = constructor
            if id(scope) in _pending:
                return True  # a method of the class builds an instance of it: already being decided
        if not scope.is_function or not self._is_callable_unit(scope):
            return False
        callers = self.call_sites(scope)
        pending = _pending | {id(scope)}
        return bool(callers) and all(self.can_reach(caller, pending) for caller, _ in callers)

    def needs_parameter(self, scope: Scope) -> bool:
        target = self.accelerator_scope
        if target is None or nested_in(scope, target):
            return False
        if target is self.facts.module_scope and not self._of_another_module(scope):
            return False
        if not scope.is_function:
            return False  # module level of another module (a unit's): no parameter to add
        if scope.is_method and any(nested_in(target, m) for m in self.methods_of(scope) or []):
            return False  # the class holds it as `self.accelerator`
        outer = scope.parent
        while outer is not None and outer.is_function:
            if outer.is_method and any(nested_in(target, m) for m in self.methods_of(outer) or []):
                return False  # a function nested in such a method reads `self.accelerator` from it
            outer = outer.parent
        return True

    def _of_another_module(self, scope: Scope) -> bool:
        """A scope of another module of a unit (`reduce_tensor` of utils.py): a global
        `accelerator` of the entry's module level does not reach it."""
        return not nested_in(scope, self.facts.module_scope)

    def holds_accelerator(self, scope: Scope) -> bool:
        """True for a method whose class keeps the accelerator as `self.accelerator`."""
        return scope.is_method and (
            any(nested_in(self.accelerator_scope, m) for m in self.methods_of(scope) or [])  # type: ignore[arg-type]
            or self.needs_parameter(scope)
        )

    # -- training loops --------------------------------------------------------------------

    def is_training_loop(self, loop: Loop) -> bool:
        if loop.has_backward:
            return True
        scope = loop.scope or self.facts.module_scope
        return any(self.runs(callee, scope) in self._training_functions for callee in loop.callees)

    def calls_training(self, site: CallSite, scope: Scope) -> bool:
        """The call (made in `scope`) runs a function that calls backward, directly or not."""
        return self.runs(site.callee, scope) in self._training_functions

    def runs(self, callee: str, scope: Scope) -> Scope | None:
        """What a call of `callee` made in `scope` runs: the function Python resolves it to, or, for
        a name holding an instance of a class of this file (or of the cross-module view), that
        class's `__call__`: `loss_scaler(loss, optimizer, ...)`, timm's NativeScaler shape, whose
        `__call__` does backward, clipping and step."""
        found = self.facts.resolve(callee, scope)
        if found is not None or callee.startswith("self."):
            return found
        key = (id(scope), callee)
        if key not in self._called_objects:
            self._called_objects[key] = self._call_method(scope, callee)
        return self._called_objects[key]

    def _call_method(self, scope: Scope, name: str) -> Scope | None:
        if not scope.binds(name) and not any(s.binds(name) for s in _enclosing_scopes(scope)):
            return None  # a builtin or an imported callable: nothing of this view
        methods: set[Scope] = set()
        for origin_scope, origin in self.origins(scope, name) or ():
            for binding in origin_scope.bindings.get(origin, []):
                value = binding.value
                cls = self.facts.classes.get(value.func.value) if (
                    isinstance(value, cst.Call) and isinstance(value.func, cst.Name)) else None
                if cls is None:
                    return None  # one of its values is not an instance of a known class
                method = next((s for s in self.facts.scopes
                               if s.parent is cls and s.is_function and s.name == "__call__"), None)
                if method is None:
                    return None
                methods.add(method)
        return next(iter(methods)) if len(methods) == 1 else None


def _binds_device(scope: Scope, name: str) -> bool:
    if any(d.name == name for d in scope.devices):
        return True
    return any(b.value is not None and is_accelerator_device(b.value) for b in scope.bindings.get(name, []))


def _enclosing_scopes(scope: Scope) -> list[Scope]:
    found, current = [], _enclosing_function_or_module(scope)
    while current is not None:
        found.append(current)
        current = _enclosing_function_or_module(current)
    return found


def _keyword_read(scope: Scope, expr: cst.BaseExpression | None) -> str | None:
    """`kwargs["model"]` / `kwargs.get("model")` / `kwargs.pop("model")` on the `**kwargs` of
    `scope`'s function: "model"."""
    node = scope.node
    star = node.params.star_kwarg if isinstance(node, cst.FunctionDef) else None
    if not isinstance(star, cst.Param):
        return None
    kwargs = star.name.value
    key: cst.BaseExpression | None = None
    if type(expr) is cst.Subscript and type(expr.value) is cst.Name and expr.value.value == kwargs \
            and len(expr.slice) == 1 and type(expr.slice[0].slice) is cst.Index:
        key = expr.slice[0].slice.value
    elif type(expr) is cst.Call and type(expr.func) is cst.Attribute and type(expr.func.value) is cst.Name \
            and expr.func.value.value == kwargs and expr.func.attr.value in ("get", "pop") and len(expr.args) == 1:
        key = expr.args[0].value
    if type(key) is cst.SimpleString and isinstance(key.evaluated_value, str):
        return key.evaluated_value
    return None


def _enclosing_function_or_module(scope: Scope) -> Scope | None:
    parent = scope.parent
    while parent is not None and isinstance(parent.node, cst.ClassDef):
        parent = parent.parent
    return parent


def nested_in(scope: Scope, target: Scope) -> bool:
    current: Scope | None = scope
    while current is not None:
        if current is target:
            return True
        current = current.parent
    return False


def transitive_callers(
    units: list[Scope], seeds: set[Scope], runs: Callable[[str, Scope], Scope | None]
) -> set[Scope]:
    """`seeds` and every scope of `units` that calls one of them, directly or through others of
    `units`; a call site of a unit runs `runs(site.callee, unit)`. Each call site is resolved once
    (a fixed point over all units would resolve every site again on each round)."""
    callers: dict[int, list[Scope]] = {}
    for unit in units:
        if unit in seeds:
            continue
        for site in unit.calls:
            callee = runs(site.callee, unit)
            if callee is not None:
                callers.setdefault(id(callee), []).append(unit)
    found = set(seeds)
    pending = list(seeds)
    while pending:
        for caller in callers.get(id(pending.pop()), ()):
            if caller not in found:
                found.add(caller)
                pending.append(caller)
    return found
