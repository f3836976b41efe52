"""Hand the AMP boilerplate (autocast, GradScaler) to `Accelerator(mixed_precision=...)`.

What it does:
    `torch.autocast(...)` / `torch.cuda.amp.autocast(...)` / `torch.amp.autocast(...)` become
    `accelerator.autocast()`; a `GradScaler` and its calls go: `scaler.scale(loss).backward()`
    -> `accelerator.backward(loss)`, `scaler.step(optimizer)` -> `optimizer.step()`,
    `scaler.update()` and `scaler.unscale_(optimizer)` are removed (the Accelerator unscales
    before clipping). A scaler handed to a function (`train_one_epoch(..., scaler)`) keeps its
    binding, unused, so that the call still has a value to pass; its uses in the function are converted. The Accelerator is created with `mixed_precision="fp16"` (a scaler, or an
    fp16 autocast) or `"bf16"` (a bfloat16 autocast, or `torch.autocast("cpu")`, without scaler).
    AMP switched by one flag (`GradScaler(enabled=args.amp)` with `autocast(enabled=args.amp)`,
    also given by position, `torch.cuda.amp.autocast(args.amp)`, whose first parameter is
    `enabled`, or `ctx = autocast() if args.amp else nullcontext()`) becomes
    `Accelerator(mixed_precision="fp16" if args.amp else "no")`; a chosen context keeps its
    choice, with `accelerator.autocast()` as the AMP branch. The condition may also call an
    imported function, the same wherever it is read (`enabled=torch.cuda.is_available()`:
    `Accelerator(mixed_precision="fp16" if torch.cuda.is_available() else "no")`).
    AMP code that is CUDA's own (`torch.cuda.amp.*`, `torch.autocast("cuda", ...)`, a
    `GradScaler()` of CUDA's) does nothing on a machine without CUDA, so its precision is asked
    for only where CUDA is: `mixed_precision="fp16" if torch.cuda.is_available() else "no"`
    (`"fp16" if args.amp and torch.cuda.is_available() else "no"` with a flag). An autocast that
    follows the script's device (`torch.autocast(device.type, ...)`) or the CPU's keeps the plain
    value.

Why:
    The Accelerator owns precision per device: the same script then runs fp16 on GPUs and
    trains as the original did on a CPU (fp32 where CUDA AMP switched itself off; HF Accelerate
    would stop there on a plain "fp16"), and the precision can be changed at launch time.

Example:
    with torch.autocast("cuda", dtype=torch.float16):     with accelerator.autocast():
        loss = model(x).mean()                             ->      loss = model(x).mean()
    scaler.scale(loss).backward()                          accelerator.backward(loss)
    scaler.step(optimizer)                                 optimizer.step()
    scaler.update()

    scaler = GradScaler(enabled=args.amp)                 (removed)
    with autocast(enabled=args.amp):                   ->  with accelerator.autocast():
    (created with `Accelerator(mixed_precision="fp16" if args.amp else "no")`)

Leaves alone:
    AMP code switched by different conditions (`GradScaler(enabled=args.amp)` next to an
    autocast that is always on: with the flag off the original still runs an fp16 forward), by a
    condition the Accelerator's creation cannot read (a name bound later, or the device choice
    itself: `nullcontext() if device_type == "cpu" else torch.autocast(...)`), or scripts that
    use the scaler in other ways (`scaler.state_dict()`, `get_scale()`), a scaler that is optional
    (`scaler = None`, then `if args.fp16: scaler = GradScaler()`, switched by `scaler is not None`),
    or that keep it on an
    object (`self._scaler = GradScaler()` in a loss-scaler class whose `__call__` does the
    backward, unscale, clipping and step, saved in checkpoints through its `state_dict()`): reported,
    and the AMP code is kept as it is (it still works: `accelerator.backward(scaler.scale(loss))`). Files
    that already create an Accelerator. NVIDIA apex AMP (`amp.initialize`, `amp.scale_loss`) is
    not converted: reported, with the fix (remove it and use `Accelerator(mixed_precision="fp16")`
    with `accelerator.backward(loss)`).

Fix safety:
    Safe. A script that clipped gradients without `scaler.unscale_` clipped scaled gradients; the
    migrated one clips the true gradients (reported, since the numbers change).
"""

from __future__ import annotations

import libcst as cst

from migrate.analysis import Scope
from migrate.edits import EditPlan
from migrate.roles import Roles
from migrate.rules.base import accelerator_call, names_read, remove_statement
from migrate.walk import walk

CODE = "AM006"
NAME = "convert-mixed-precision"

_SCALERS = frozenset(
    {"torch.cuda.amp.GradScaler", "torch.amp.GradScaler", "torch.amp.grad_scaler.GradScaler", "torch.cpu.amp.GradScaler"}
)
_AUTOCASTS = frozenset(
    {"torch.autocast", "torch.cuda.amp.autocast", "torch.amp.autocast", "torch.cpu.amp.autocast", "torch.amp.autocast_mode.autocast"}
)
_CLIPPERS = frozenset({"torch.nn.utils.clip_grad_norm_", "torch.nn.utils.clip_grad.clip_grad_norm_"})
_REMOVED = ("update", "unscale_")


def apply(roles: Roles, plan: EditPlan) -> None:
    if roles.home is None or not roles.models or roles.accelerator_exists:
        return
    facts = roles.facts
    scalers = {
        (scope, name)
        for scope in facts.scopes
        for name, bindings in scope.bindings.items()
        for b in bindings
        if isinstance(b.value, cst.Call) and facts.aliases.qualify(b.value.func) in _SCALERS
    }
    autocasts = [(scope, c) for scope in facts.scopes for c in scope.library_calls if c.qualified in _AUTOCASTS]
    if not scalers and not autocasts:
        return
    if _held_by_an_object(plan, scalers) or _held_by_the_hidden_step(roles, plan, autocasts):
        return
    precision = _precision(roles, scalers, autocasts, plan)
    if precision is None:
        return
    switch = _switch(roles, scalers if precision == "fp16" else set(), autocasts, plan)
    if switch is False:
        return
    uses = _scaler_uses(roles, scalers, plan)
    if uses is None:
        return
    for scope, call in autocasts:
        plan.calls[call.call] = lambda updated: accelerator_call("autocast", [])
        plan.use_accelerator(scope)
        plan.change(CODE, call.call, "autocast -> `accelerator.autocast()`")
    for scope, name in scalers:
        if _passed_on(scope, name):
            continue  # `train_one_epoch(..., scaler)`: the callee's converted uses no longer touch it
        for binding in scope.bindings[name]:
            if remove_statement(plan, binding.where.stmt, binding.value):
                plan.change(CODE, binding.where.stmt, f"GradScaler `{name}` removed: the Accelerator scales fp16 losses")
    for scope, site, method in uses:
        _convert_use(plan, scope, site, method)
    _report_unscaled_clipping(roles, plan, scalers, uses)
    condition = _code(switch) if switch is not None else None
    on_cuda = _cuda_condition(roles, scalers, autocasts)
    if on_cuda is not None and condition != on_cuda:
        condition = on_cuda if condition is None else f"{_and_operand(switch)} and {on_cuda}"
    if condition is None:
        plan.accelerator_kwargs["mixed_precision"] = f'"{precision}"'
    else:
        plan.accelerator_kwargs["mixed_precision"] = f'"{precision}" if {condition} else "no"'
        if switch is not None:
            plan.kwarg_reads["mixed_precision"] = switch
    plan.removes_boilerplate = True


def _passed_on(scope: Scope, name: str) -> bool:
    """The scaler is handed to a function as an argument (`train_one_epoch(..., scaler)`): its
    binding stays, so that the call and the function's parameter keep a value."""

    class Finder(cst.CSTVisitor):
        found = False

        def visit_Arg(self, node: cst.Arg) -> None:
            if isinstance(node.value, cst.Name) and node.value.value == name:
                Finder.found = True

    walk(scope.node, Finder())
    return Finder.found


def _held_by_an_object(plan: EditPlan, scalers: set) -> bool:  # type: ignore[type-arg]
    """A GradScaler kept on an object (`self._scaler = GradScaler()` in a loss-scaler class whose
    `__call__` scales, unscales, clips and steps): reported, and all of the AMP code is kept.

    The object's scaler is correct at N processes as it is (it unscales and checks for inf/nan the
    gradients the prepared model already all-reduced, so every process skips the same steps), and
    its `state_dict()` goes into the script's checkpoints. Removing it would change those
    checkpoints, and an autocast converted without it would run fp16 without loss scaling."""
    held = sorted(name for scope, name in scalers if "." in name)
    if not held:
        return False
    scope, name = next((s, n) for s, n in sorted(scalers, key=lambda item: item[1]) if n == held[0])
    owner = f"`{scope.parent.name}`" if scope.is_method and scope.parent is not None else "an object"
    plan.report(CODE, scope.bindings[name][0].where.stmt, (
        f"the GradScaler is held by {owner} (`{name}`), a loss-scaler object: the AMP code (its scaler and "
        "the autocasts) was kept as it is, and is correct under `accelerator.prepare` (the scaler unscales and "
        "checks gradients the prepared model already synchronised); its backward and clipping go through the "
        "accelerator. To hand precision to the Accelerator instead, remove the scaler object and use "
        "`Accelerator(mixed_precision=\"fp16\")` with `accelerator.backward(loss)`"))
    return True


def _held_by_the_hidden_step(roles: Roles, plan: EditPlan, autocasts: list) -> bool:  # type: ignore[type-arg]
    """The training step runs in an object the migration cannot read (`loss_scaler(loss, optimizer,
    ...)`, timm's NativeScaler, `migrate.roles.hidden_step`): its own GradScaler scales the loss of
    the autocast forward, so the autocasts are kept as they are (converted, they would run fp16
    under an Accelerator whose own scaler the hidden step never uses). Reported at the first one."""
    if not roles.hidden_steps:
        return False
    if autocasts:
        step = roles.hidden_steps[0][1]
        code = " ".join(cst.Module([]).code_for_node(step.call.func).split())
        plan.report(CODE, autocasts[0][1].call, (
            f"the training step runs inside `{code}(...)`, an object the migration cannot read that is handed "
            "the loss and the optimizer (a loss scaler scaling the loss for this autocast itself): the AMP code "
            "was kept as it is, and is correct under `accelerator.prepare` (its backward all-reduces through the "
            "prepared model). To hand precision to the Accelerator instead, replace the call by `loss.backward()`, "
            "the clipping (`torch.nn.utils.clip_grad_norm_`) and `optimizer.step()` and run the migration again: "
            "the autocast then goes to `Accelerator(mixed_precision=...)`"))
    return True


def _chosen_by_condition(module: cst.Module, calls: list[cst.Call]) -> dict[int, cst.BaseExpression]:
    """id(autocast call) -> the condition under which it is chosen, for autocast calls that are a
    branch of a conditional expression (`autocast() if c else nullcontext()`: `c`; in the `else`
    branch: `not c`)."""
    wanted = {id(c) for c in calls}
    found: dict[int, cst.BaseExpression] = {}

    class Finder(cst.CSTVisitor):
        def visit_IfExp(self, node: cst.IfExp) -> None:
            if id(node.body) in wanted:
                found[id(node.body)] = node.test
            if id(node.orelse) in wanted:
                found[id(node.orelse)] = cst.UnaryOperation(cst.Not(), _parenthesized(node.test))

    walk(module, Finder())
    return found


def _parenthesized(test: cst.BaseExpression) -> cst.BaseExpression:
    if isinstance(test, (cst.Name, cst.Attribute, cst.Call, cst.Subscript)) or test.lpar:
        return test
    return test.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])


# Autocasts whose first positional parameter is `enabled` (`torch.cuda.amp.autocast(cuda)`, YOLOv5's
# shape); `torch.autocast` / `torch.amp.autocast` take the device type first.
_ENABLED_FIRST = frozenset({"torch.cuda.amp.autocast", "torch.cpu.amp.autocast"})


def _enabled(call: cst.Call, qualified: str = "") -> cst.BaseExpression | None:
    """The `enabled=` argument (or the first positional one of an autocast that takes `enabled`
    first) unless it is absent or the literal `True`."""
    for index, arg in enumerate(call.args):
        if (arg.keyword is not None and arg.keyword.value == "enabled") or (
                index == 0 and arg.keyword is None and not arg.star and qualified in _ENABLED_FIRST):
            if isinstance(arg.value, cst.Name) and arg.value.value == "True":
                return None
            return arg.value
    return None


def _switch(roles: Roles, scalers: set, autocasts: list, plan: EditPlan) -> cst.BaseExpression | None | bool:  # type: ignore[type-arg]
    """The one condition that switches all of the AMP code, None when nothing is switched, False
    (reported) when the switches differ or cannot be read where the Accelerator is created.

    `GradScaler(enabled=c)`, `autocast(enabled=c)` and `autocast() if c else nullcontext()` with
    the same `c` everywhere mean mixed precision exactly when `c` holds: that is
    `Accelerator(mixed_precision="fp16" if c else "no")`; so does a scaler that is always on next
    to an autocast switched by `c`. A scaler switched by a flag next to an
    autocast that is always on (fp16 forward, unscaled backward when the flag is off) has no
    Accelerator equivalent. (With bf16 a scaler does nothing: its switch is not asked for.)"""
    switches: list[tuple[Scope, cst.CSTNode, cst.BaseExpression | None]] = []
    for scope, name in scalers:
        for binding in scope.bindings[name]:
            if not isinstance(binding.value, cst.Call):
                # `scaler = None` then `if args.fp16: scaler = GradScaler()`, with `scaler is not
                # None` as the switch elsewhere: no `enabled=` to read the switch from.
                plan.report(CODE, binding.where.stmt, f"the GradScaler `{name}` is also bound to something else "
                            f"here (`{_code(binding.value) if binding.value is not None else name}`), so whether "
                            "mixed precision is on cannot be read from it; the AMP code was kept as it is (it "
                            "still trains the same on N processes): to convert it, build the scaler once as "
                            "`GradScaler(enabled=flag)`, pass the same `enabled=flag` to the autocast and keep only the "
                            "scaler's side of each `is None` test of it")
                return False
            enabled = _enabled(binding.value)
            # A scaler that is always on only multiplies fp32 gradients by a power of two and
            # back when the autocast is off: exact, so it does not switch anything.
            if enabled is not None or not autocasts:
                switches.append((scope, binding.value, enabled))
    chosen = _chosen_by_condition(roles.facts.module, [call.call for _, call in autocasts])
    for scope, call in autocasts:
        enabled, condition = _enabled(call.call, call.qualified), chosen.get(id(call.call))
        if enabled is not None and condition is not None:
            plan.report(CODE, call.call, "autocast is both chosen by a condition and switched by `enabled=`; the "
                        "AMP code was kept as it is: pass `mixed_precision=` to the Accelerator instead")
            return False
        switches.append((scope, call.call, enabled if enabled is not None else condition))
    conditions = {_code(c) for _, _, c in switches if c is not None}
    if not conditions:
        return None
    if len(conditions) > 1 or any(c is None for _, _, c in switches):
        shown = " and ".join(f"`{c}`" for c in sorted(conditions))
        node = next(n for _, n, c in switches if c is not None)
        plan.report(CODE, node, f"the AMP code is switched by {shown} but not all of it by the same condition "
                    "(e.g. `GradScaler(enabled=flag)` next to an autocast that is always on): no single "
                    "`mixed_precision=` does the same, so it was kept as it is; switch the autocast and the scaler "
                    "by the same flag, or pass `mixed_precision=` to the Accelerator yourself")
        return False
    scope, node, condition = next((s, n, c) for s, n, c in switches if c is not None)
    assert condition is not None
    if not all(_readable_at_creation(roles, plan, s, c) for s, _, c in switches if c is not None):
        scope_made = roles.accelerator_scope
        created = "the module level" if scope_made is None or scope_made.qualname == "<module>" \
            else f"`{scope_made.qualname}`"
        plan.report(CODE, node, f"the AMP code is switched by `{_code(condition)}`, a value the migration does not "
                    f"trace to {created}, where the Accelerator is created; it was kept as it is (it trains "
                    "the same under `prepare`): to convert it, pass `mixed_precision=` to the Accelerator from the "
                    "same flag (or use `accel launch --mixed-precision`) and drop the scaler and autocast")
        return False
    return condition


_CUDA_ONLY_AUTOCASTS = frozenset({"torch.cuda.amp.autocast"})
_CUDA_ONLY_SCALERS = frozenset({"torch.cuda.amp.GradScaler"})
_DEVICE_TYPED = frozenset({"torch.autocast", "torch.amp.autocast", "torch.amp.autocast_mode.autocast",
                           "torch.amp.GradScaler", "torch.amp.grad_scaler.GradScaler"})


def _cuda_condition(roles: Roles, scalers: set, autocasts: list) -> str | None:  # type: ignore[type-arg]
    """`torch.cuda.is_available()` when every piece of the AMP code is CUDA's own, else None.

    `torch.cuda.amp.autocast()`, `torch.autocast("cuda", ...)` and `GradScaler()` (CUDA's by
    default) do nothing on a machine without CUDA: there the original trains in fp32, while a
    plain `mixed_precision="fp16"` would run fp16 on the CPU (or, under HF Accelerate, stop with
    "fp16 mixed precision requires a GPU"). An autocast that follows the script's device
    (`torch.autocast(device.type, ...)`) or the CPU's is not CUDA-only: it keeps the plain value.
    """
    facts = roles.facts
    calls = [call.call for _, call in autocasts]
    for scope, name in scalers:
        calls.extend(b.value for b in scope.bindings[name] if isinstance(b.value, cst.Call))
    for call in calls:
        qualified = facts.aliases.qualify(call.func) or ""
        if qualified in _CUDA_ONLY_AUTOCASTS or qualified in _CUDA_ONLY_SCALERS:
            continue
        if qualified not in _DEVICE_TYPED:
            return None
        device = next((a.value for i, a in enumerate(call.args)
                       if (a.keyword is None and i == 0) or (a.keyword is not None and a.keyword.value
                                                             in ("device_type", "device"))), None)
        if device is None and "GradScaler" in qualified:
            continue  # `torch.amp.GradScaler()`: "cuda" by default
        if not (isinstance(device, cst.SimpleString) and device.evaluated_value == "cuda"):
            return None
    torch_names = facts.aliases.local_names_for("torch")
    if not torch_names:
        return None  # no name for torch to test CUDA with: the plain value, as on a GPU machine
    name = "torch" if "torch" in torch_names else torch_names[0]
    return f"{name}.cuda.is_available()"


def _and_operand(switch: cst.BaseExpression) -> str:
    """`switch` as the left operand of an `and` (parenthesised when it binds looser)."""
    code = _code(switch)
    return f"({code})" if isinstance(switch, (cst.BooleanOperation, cst.IfExp, cst.Lambda)) else code


def _readable_at_creation(roles: Roles, plan: EditPlan, scope: Scope, condition: cst.BaseExpression) -> bool:
    """Every name `condition` reads in `scope` is the same binding where the Accelerator is created,
    and is bound there before it: a parameter, a module-level name, or a statement above the device
    choice (or the process-group initialisation the Accelerator replaces) of the same function."""
    target = roles.accelerator_scope
    if target is None:
        return False
    created: int | None = None
    if plan.create_at is not None:
        created = plan.create_at_order
    elif roles.device_binding is not None:
        created = roles.device_binding.where.order
    for name in names_read(condition):
        here, there = roles.origins(scope, name), roles.origins(target, name)
        if here is None and there is None and roles.facts.aliases.qualify(cst.Name(name)) is not None:
            continue  # an imported module or function (`torch.cuda.is_available()`): the same everywhere
        if not here or here != there:
            return False
        for origin_scope, origin_name in there:
            if origin_scope is target and not isinstance(target.node, cst.Module) and origin_name in target.params:
                continue
            if origin_scope is not target:
                if origin_scope is roles.facts.module_scope:
                    continue
                return False
            bindings = target.bindings.get(origin_name, [])
            if created is None or not bindings or any(b.where.order >= created for b in bindings):
                return False
    return True


def _precision(roles: Roles, scalers: set, autocasts: list, plan: EditPlan) -> str | None:  # type: ignore[type-arg]
    dtypes: set[str] = set()
    for _, call in autocasts:
        for index, arg in enumerate(call.call.args):
            keyword = arg.keyword.value if arg.keyword else None
            if keyword == "dtype":
                dtypes.add(roles.facts.aliases.qualify(arg.value) or "")
            elif keyword == "device_type" or (keyword is None and index == 0):
                if isinstance(arg.value, cst.SimpleString) and arg.value.evaluated_value == "cpu":
                    if not any(a.keyword is not None and a.keyword.value == "dtype" for a in call.call.args):
                        dtypes.add("torch.bfloat16")  # a CPU autocast's default dtype
    if dtypes - {"torch.float16", "torch.half", "torch.bfloat16"}:
        plan.report(CODE, autocasts[0][1].call, "autocast dtype not recognised; the AMP code was kept as it is")
        return None
    if dtypes == {"torch.bfloat16"}:
        # A GradScaler next to a bfloat16 autocast (often `enabled=` only on CUDA) has nothing to
        # do: bf16 keeps fp32's exponent range. It goes with the rest of the AMP code.
        return "bf16"
    if "torch.bfloat16" in dtypes:
        plan.report(CODE, autocasts[0][1].call, "mixes bfloat16 and float16 autocasts; kept as it is")
        return None
    return "fp16"


def _scaler_uses(roles: Roles, scalers: set, plan: EditPlan) -> list[tuple[Scope, cst.Call, str]] | None:  # type: ignore[type-arg]
    """Every use of a scaler as (scope, call, method), or None when one cannot be converted."""
    uses: list[tuple[Scope, cst.Call, str]] = []
    for scope in roles.facts.scopes:
        for site in scope.method_calls:
            assert isinstance(site.receiver, cst.Name) and isinstance(site.call.func, cst.Attribute)
            found = roles.origins(scope, site.receiver.value)
            if not found or not found <= scalers:
                continue
            method = site.call.func.attr.value
            if method not in ("scale", "step", *_REMOVED) or not roles.can_reach(scope):
                plan.report(
                    CODE,
                    site.call,
                    f"the GradScaler is also used as `{site.receiver.value}.{method}(...)` here, which the "
                    "migration does not convert (it would read `accelerator.scaler`, absent without fp16); the AMP "
                    "code was kept as it is, and trains the same under `prepare`",
                )
                return None
            uses.append((scope, site.call, method))
    return uses


def _convert_use(plan: EditPlan, scope: Scope, call: cst.Call, method: str) -> None:
    if method == "scale":
        # `scaler.scale(loss).backward()` is recorded as a backward of `scaler.scale(loss)`:
        # find that backward call and make it `accelerator.backward(loss)`.
        for site in scope.backwards:
            if site.receiver is call and call.args:
                inner = call.args[0].value
                plan.calls[site.call] = lambda updated, inner=inner: accelerator_call("backward", [cst.Arg(inner)])
                plan.use_accelerator(scope)
                plan.change(CODE, site.call, "`scaler.scale(loss).backward()` -> `accelerator.backward(loss)`")
        return
    if method == "step" and call.args:
        optimizer = call.args[0].value
        plan.calls[call] = lambda updated, optimizer=optimizer: cst.Call(func=cst.Attribute(optimizer, cst.Name("step")))
        plan.change(CODE, call, "`scaler.step(optimizer)` -> `optimizer.step()`")
        return
    for site in scope.method_calls:
        if site.call is call:
            stmt = site.where.stmt
            if isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1:
                plan.replace_stmt[stmt] = []
                plan.change(CODE, call, f"`scaler.{method}(...)` removed")


def _report_unscaled_clipping(roles: Roles, plan: EditPlan, scalers: set, uses: list) -> None:  # type: ignore[type-arg]
    if not scalers or any(method == "unscale_" for _, _, method in uses):
        return
    for scope in roles.facts.scopes:
        for call in scope.library_calls:
            if call.qualified in _CLIPPERS:
                plan.report(
                    CODE,
                    call.call,
                    "the original clipped the *scaled* gradients (no `scaler.unscale_` before clipping); the "
                    "migrated script clips the true gradients, as intended: expect different numbers",
                )


def _code(node: cst.CSTNode) -> str:
    return cst.Module(body=[]).code_for_node(node)
