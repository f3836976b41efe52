"""Hand-written sharding: `FSDP(model, ...)`, `fully_shard(module, ...)`, `ZeroRedundancyOptimizer(...)`.

Read by the roles once, like an `mp.spawn` launcher: either the calls amount to one of the
runtime's strategies, and AM007 converts them (the wrapping goes, `accelerator.prepare` shards
the model with `Accelerator(strategy=...)`, a ZeroRedundancyOptimizer becomes the optimizer class
it wrapped), or the file is refused with the reason and what to do. "Amount to" means the same
training up to the order of floating-point sums:

- `FSDP(model)` with `sharding_strategy` FULL_SHARD (the default) is "fsdp", SHARD_GRAD_OP is
  "fsdp-zero2", NO_SHARD is "ddp". `device_id`, `auto_wrap_policy`, `use_orig_params` and the
  prefetch / rate-limit options only decide where and when parameters are gathered (the runtime
  places the model and shards its repeated blocks itself), not what is computed.
- `fully_shard(model)` (after optional `fully_shard(block)` calls in a loop over the model's
  modules) is "fsdp", with `reshard_after_forward=False` "fsdp-zero2".
- `ZeroRedundancyOptimizer(params, optimizer_class=C, **defaults)` is "zero1" with `C(params,
  **defaults)`; `parameters_as_bucket_view` only changes the memory layout.

Refused: sharding that runs only under a condition (`if args.fsdp:`; the strategy is one for the
whole run), options that change the numbers or the placement (`mixed_precision` / `mp_policy`,
`cpu_offload` / `offload_policy`, `sync_module_states`, `param_init_fn`, process groups and
meshes, hybrid sharding, `overlap_with_ddp`), a submodule sharded without the model itself (its
other parameters would never be reduced), calls in another function than the one building the
optimizer, two different strategies, `consolidate_state_dict()` (it does not exist on the plain
optimizer the script gets on one process), and other uses of FSDP (`FSDP.state_dict_type(...)`,
`model.clip_grad_norm_()`, `model.reshard()`: they act on the hand-wrapped model only).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import libcst as cst

from migrate.names import root_name

if TYPE_CHECKING:
    from migrate.analysis import LibraryCall, Scope
    from migrate.roles import Finding, Roles

FSDP = frozenset({
    "torch.distributed.fsdp.FullyShardedDataParallel",
    "torch.distributed.fsdp.fully_sharded_data_parallel.FullyShardedDataParallel",
})
FULLY_SHARD = frozenset({
    "torch.distributed.fsdp.fully_shard",
    "torch.distributed.fsdp._fully_shard.fully_shard",
    "torch.distributed._composable.fsdp.fully_shard",
    "torch.distributed._composable.fsdp.fully_shard.fully_shard",
})
ZERO = frozenset({
    "torch.distributed.optim.ZeroRedundancyOptimizer",
    "torch.distributed.optim.zero_redundancy_optimizer.ZeroRedundancyOptimizer",
})
# Methods of FSDP1 / FSDP2 modules that a plain module (one process) or an FSDP2 module lacks.
_FSDP_METHODS = frozenset({"clip_grad_norm_", "summon_full_params", "reshard", "unshard",
                           "set_requires_gradient_sync", "set_is_last_backward", "set_reshard_after_backward",
                           "set_modules_to_forward_prefetch", "set_modules_to_backward_prefetch"})
# Option values, judged where they are passed (`mp_policy=MixedPrecisionPolicy(...)`).
_OPTION_CLASSES = frozenset({"MixedPrecisionPolicy", "MixedPrecision", "CPUOffloadPolicy", "OffloadPolicy",
                             "CPUOffload"})
_FSDP_STRATEGIES = {"FULL_SHARD": "fsdp", "SHARD_GRAD_OP": "fsdp-zero2", "NO_SHARD": "ddp"}
# Options that only decide where and when parameters are gathered: the runtime decides those.
_FSDP_LAYOUT = frozenset({"device_id", "auto_wrap_policy", "use_orig_params", "limit_all_gathers",
                          "forward_prefetch", "backward_prefetch"})
_ADVICE = {
    "mixed_precision": 'use `Accelerator(mixed_precision="bf16")` (the runtime\'s fsdp gathers parameters '
                       "in bf16 and reduces gradients in fp32) and remove this option",
    "mp_policy": 'use `Accelerator(mixed_precision="bf16")` (the runtime\'s fsdp gathers parameters in '
                 "bf16 and reduces gradients in fp32) and remove this option",
    "cpu_offload": "use `Accelerator(strategy=FSDPStrategy(cpu_offload=True))` (GPU only) and remove this option",
    "offload_policy": "use `Accelerator(strategy=FSDPStrategy(cpu_offload=True))` (GPU only) and remove this option",
    "sync_module_states": "seed the model's initialisation identically on every rank (`torch.manual_seed`) "
                          "and remove this option",
}


@dataclass(eq=False)
class HandSharding:
    """What AM007 converts: the strategy, the statements that go, the ZeRO constructors to unwrap."""

    strategy: str
    removed: list[tuple[cst.BaseStatement, cst.CSTNode, str]] = field(default_factory=list)
    optimizers: list[tuple[cst.Call, cst.BaseExpression, list[cst.Arg]]] = field(default_factory=list)


def find(roles: "Roles") -> "HandSharding | Finding | None":
    """The file's hand-written sharding when AM007 can convert it, a refusal saying why not, or None."""
    sites = [(scope, call) for scope in roles.facts.scopes for call in scope.library_calls
             if call.qualified in FSDP | FULLY_SHARD | ZERO]
    if not sites:
        return None
    home = roles.home
    found = HandSharding(strategy="")
    strategies: dict[str, cst.CSTNode] = {}
    blocks: list[LibraryCall] = []
    roots: list[LibraryCall] = []
    for scope, site in sites:
        name = site.qualified.rsplit(".", 1)[1]
        if scope is not home:
            where = f"`{home.name}`" if home is not None else "the function that builds the optimizer"
            return _refusal(roles, site.call, f"`{name}` is called in `{scope.name}`, not in {where} where the "
                            "training objects are prepared")
        condition = _condition(site)
        if condition is not None:
            test = cst.Module([]).code_for_node(condition.test)
            return _refusal(roles, site.call, f"`{name}` runs only when `{test}` holds: the runtime's strategy "
                            f"is one for the whole run (write `Accelerator(strategy=\"fsdp\" if {test} else "
                            "\"ddp\")` yourself, or shard unconditionally)")
        if site.qualified in FSDP:
            why = _fsdp(roles, scope, site, found, strategies)
        elif site.qualified in ZERO:
            why = _zero(roles, scope, site, found, strategies)
        else:
            why = _fully_shard(roles, site, blocks, roots)
        if why is not None:
            return _refusal(roles, site.call, why)
    if blocks or roots:
        why = _fully_shard_strategy(roles, blocks, roots, found, strategies)
        if why is not None:
            return _refusal(roles, (blocks or roots)[0].call, why)
    other = _other_fsdp_use(roles)
    if other is not None:
        return _refusal(roles, other[0], other[1])
    if len(set(strategies)) > 1:
        first, second = sorted(strategies)[:2]
        return _refusal(roles, strategies[second], f"the script shards as `{first}` and as `{second}`; the "
                        "runtime runs one strategy")
    found.strategy = next(iter(strategies))
    return found


def _other_fsdp_use(roles: "Roles") -> tuple[cst.CSTNode, str] | None:
    """A use of FSDP besides the wrapping (`FSDP.state_dict_type(...)`, `model.clip_grad_norm_()`):
    it would no longer do what it did once `accelerator.prepare` shards the model."""
    for scope in roles.facts.scopes:
        for site in scope.library_calls:
            name = site.qualified
            if (name.startswith("torch.distributed.fsdp.") and name not in FSDP | FULLY_SHARD
                    and not name.startswith("torch.distributed.fsdp.wrap.")
                    and name.rsplit(".", 1)[1] not in _OPTION_CLASSES):
                short = cst.Module([]).code_for_node(site.call.func)
                fix = ("get the full state dict with `accelerator.get_state_dict(model)` (every process calls it) "
                       "or save it with `accelerator.save_model(model, folder)`"
                       if "statedict" in name.lower().replace("_", "") else "remove it")
                return site.call, f"`{short}(...)` works on the hand-wrapped model only: {fix}"
        for method in scope.method_calls:
            func = method.call.func
            if (isinstance(method.receiver, cst.Name) and method.receiver.value in roles.models
                    and isinstance(func, cst.Attribute) and func.attr.value in _FSDP_METHODS):
                return method.call, (f"`{method.receiver.value}.{func.attr.value}(...)` is a method of the hand-wrapped "
                                     "FSDP model, not of the prepared one on every number of processes: use "
                                     "`accelerator.clip_grad_norm_(model.parameters(), ...)` / `accelerator.accumulate(model)`")
    return None


def _refusal(roles: "Roles", node: cst.CSTNode, why: str) -> "Finding":
    from migrate.roles import Finding

    return Finding("AM007", node, f"the script shards the model by hand; it was left as it is: {why}. Remove "
                   "the hand-written sharding and migrate with `accel-migrate --strategy fsdp` (or zero1), "
                   "or change it as said and run accel-migrate again", unconverted=True)


def _keywords(call: cst.Call, skip: int) -> dict[str, cst.BaseExpression] | str:
    """Keyword arguments after `skip` positional ones, or why the call is not of that shape."""
    found: dict[str, cst.BaseExpression] = {}
    for index, arg in enumerate(call.args):
        if arg.star:
            return "its arguments are unpacked (`*` / `**`)"
        if arg.keyword is None:
            if index >= skip:
                return f"argument {index + 1} is positional: pass it by name"
            continue
        found[arg.keyword.value] = arg.value
    return found


def _refused_option(name: str) -> str:
    advice = _ADVICE.get(name, "the runtime has no equivalent; remove it if the script does not depend on it")
    return f"the option `{name}=` changes what is trained or where: {advice}"


def _fsdp(roles: "Roles", scope: "Scope", site: "LibraryCall", found: HandSharding,
          strategies: dict[str, cst.CSTNode]) -> str | None:
    """`model = FSDP(model, ...)`: the statement goes."""
    call = site.call
    stmt = site.where.stmt
    target = _assigned_name(stmt, call)
    first = call.args[0].value if call.args else None
    if target is None or not isinstance(first, cst.Name) or first.value != target or target not in roles.models:
        return "`FullyShardedDataParallel(...)` is not a statement `model = FSDP(model, ...)` of its own"
    if site.where.in_loop:
        return "the model is wrapped inside a loop"
    options = _keywords(call, 1)
    if isinstance(options, str):
        return options
    strategy = "fsdp"
    for name, value in options.items():
        if name == "sharding_strategy":
            member = value.attr.value if isinstance(value, cst.Attribute) else None
            if member not in _FSDP_STRATEGIES:
                return (f"`sharding_strategy={cst.Module([]).code_for_node(value)}` has no runtime strategy "
                        "(FULL_SHARD is fsdp, SHARD_GRAD_OP fsdp-zero2, NO_SHARD ddp)")
            strategy = _FSDP_STRATEGIES[member]
        elif name not in _FSDP_LAYOUT:
            return _refused_option(name)
    strategies.setdefault(strategy, call)
    found.removed.append((stmt, call, f"`{target}` no longer wrapped in FullyShardedDataParallel by hand: "
                          f"`accelerator.prepare` shards it (`Accelerator(strategy=\"{strategy}\")`)"))
    return None


def _fully_shard(roles: "Roles", site: "LibraryCall", blocks: list["LibraryCall"],
                 roots: list["LibraryCall"]) -> str | None:
    """`fully_shard(model)` (a root) or `fully_shard(block)` in a loop over the model's modules."""
    call = site.call
    stmt = site.where.stmt
    if not _is_expression_statement(stmt, call):
        return "the result of `fully_shard(...)` is used: call it as a statement of its own"
    first = call.args[0].value if call.args else None
    if isinstance(first, cst.Name) and first.value in roles.models and not site.where.in_loop:
        roots.append(site)
        return None
    loop = _sharding_loop(site)
    if loop is None or not isinstance(first, cst.Name) or not _loop_names(loop, first.value):
        return "`fully_shard` is applied to a submodule outside a loop over the model's modules"
    if root_name(_loop_source(loop)) not in roles.models:
        return "the loop that shards blocks does not iterate over the model's modules"
    blocks.append(site)
    return None


def _fully_shard_strategy(roles: "Roles", blocks: list["LibraryCall"], roots: list["LibraryCall"],
                          found: HandSharding, strategies: dict[str, cst.CSTNode]) -> str | None:
    if not roots:
        return ("blocks are sharded but not the model itself, so the parameters outside them are never "
                "reduced across ranks: shard the model too (`fully_shard(model)`) or not at all")
    flavours = set()
    for site in [*blocks, *roots]:
        options = _keywords(site.call, 1)
        if isinstance(options, str):
            return options
        for name, value in options.items():
            if name != "reshard_after_forward":
                return _refused_option(name)
            if not (isinstance(value, cst.Name) and value.value in ("True", "False")):
                return "`reshard_after_forward=` is not True or False"
            if site in blocks or not blocks:  # the root's own value does not matter when blocks are sharded
                flavours.add(value.value)
        if "reshard_after_forward" not in options and (site in blocks or not blocks):
            flavours.add("True")
    if len(flavours) > 1:
        return "blocks are sharded with different `reshard_after_forward` values; the runtime uses one"
    strategy = "fsdp-zero2" if flavours == {"False"} else "fsdp"
    strategies.setdefault(strategy, roots[0].call)
    for site in roots:
        model = cst.ensure_type(site.call.args[0].value, cst.Name).value
        found.removed.append((site.where.stmt, site.call, f"`fully_shard({model})` removed: `accelerator.prepare` "
                              f"shards it (`Accelerator(strategy=\"{strategy}\")`)"))
    loops = {id(loop): loop for site in blocks if (loop := _sharding_loop(site)) is not None}
    for loop in loops.values():
        found.removed.append((loop, loop, "the loop sharding blocks by hand removed: the runtime shards the "
                              "model's repeated blocks itself"))
    return None


def _zero(roles: "Roles", scope: "Scope", site: "LibraryCall", found: HandSharding,
          strategies: dict[str, cst.CSTNode]) -> str | None:
    """`opt = ZeroRedundancyOptimizer(params, optimizer_class=C, **defaults)` -> `C(params, **defaults)`."""
    call = site.call
    target = _assigned_name(site.where.stmt, call)
    if target is None or target not in roles.optimizers:
        return "`ZeroRedundancyOptimizer(...)` is not a statement `optimizer = ZeroRedundancyOptimizer(...)` of its own"
    positional = [a for a in call.args if a.keyword is None and not a.star]
    if any(a.star for a in call.args) or len(positional) > 2 or not positional:
        return "pass the parameters first and everything else by name"
    klass = positional[1].value if len(positional) > 1 else None
    kept = [positional[0]]
    for arg in call.args[len(positional):]:
        name = arg.keyword.value if arg.keyword is not None else ""
        if name == "optimizer_class":
            klass = arg.value
        elif name in ("process_group", "overlap_with_ddp"):
            return _refused_option(name)
        elif name != "parameters_as_bucket_view":
            kept.append(arg)
    if klass is None:
        return "`optimizer_class=` is missing"
    for other in roles.facts.scopes:
        for method in other.method_calls:
            if (isinstance(method.receiver, cst.Name) and method.receiver.value == target
                    and isinstance(method.call.func, cst.Attribute)
                    and method.call.func.attr.value == "consolidate_state_dict"):
                return (f"`{target}.consolidate_state_dict()` gathers the sharded state by hand: save with "
                        "`accelerator.save_state(folder)` instead (each rank writes its shard), remove the "
                        "consolidation")
    strategies.setdefault("zero1", call)
    found.optimizers.append((call, klass, kept))
    return None


def _condition(site: "LibraryCall") -> cst.If | None:
    """The `if` the call runs under (not the type filter inside a loop that shards blocks)."""
    path = [ref.stmt for ref in site.where.path]
    loop = _sharding_loop(site)
    if loop is not None:
        path = path[:next(i for i, stmt in enumerate(path) if stmt is loop)]
    return next((stmt for stmt in reversed(path) if isinstance(stmt, cst.If)), None)


def _assigned_name(stmt: cst.BaseStatement, call: cst.Call) -> str | None:
    if not (isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1):
        return None
    small = stmt.body[0]
    if isinstance(small, cst.Assign) and small.value is call and len(small.targets) == 1:
        target = small.targets[0].target
        return target.value if isinstance(target, cst.Name) else None
    return None


def _is_expression_statement(stmt: cst.BaseStatement, call: cst.Call) -> bool:
    return (isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1
            and isinstance(stmt.body[0], cst.Expr) and stmt.body[0].value is call)


def _sharding_loop(site: "LibraryCall") -> cst.For | None:
    """The `for` directly around the call (through one `if` without `else`), when the loop only shards."""
    path = [ref.stmt for ref in site.where.path]
    if path and isinstance(path[-1], cst.If) and path[-1].orelse is None:
        path = path[:-1]
    if not path or not isinstance(path[-1], cst.For):
        return None
    loop = path[-1]
    return loop if _only_shards(loop.body) else None


def _only_shards(block: cst.BaseSuite) -> bool:
    if not isinstance(block, cst.IndentedBlock):
        return False
    for stmt in block.body:
        if isinstance(stmt, cst.If) and stmt.orelse is None and _only_shards(stmt.body):
            continue
        if not (isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1
                and isinstance(stmt.body[0], cst.Expr) and isinstance(stmt.body[0].value, cst.Call)):
            return False
        func = stmt.body[0].value.func
        if not (isinstance(func, cst.Name) and func.value == "fully_shard") and not (
                isinstance(func, cst.Attribute) and func.attr.value == "fully_shard"):
            return False
    return True


def _loop_names(loop: cst.For, name: str) -> bool:
    """`for name in ...` or `for i, name in enumerate(...)` / `.named_modules()`."""
    target = loop.target
    if isinstance(target, cst.Name):
        return target.value == name
    return isinstance(target, cst.Tuple) and any(
        isinstance(e.value, cst.Name) and e.value.value == name for e in target.elements)


def _loop_source(loop: cst.For) -> cst.BaseExpression:
    """`model.layers` of `for b in model.layers`, `enumerate(model.layers)`, `model.modules()`."""
    source = loop.iter
    while isinstance(source, cst.Call):
        if isinstance(source.func, cst.Name) and source.args:
            source = source.args[0].value  # enumerate(...), reversed(...)
        elif isinstance(source.func, cst.Attribute):
            source = source.func.value  # model.modules(), model.named_children()
        else:
            break
    return source
