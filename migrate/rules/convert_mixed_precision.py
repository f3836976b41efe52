"""Hand the AMP boilerplate (autocast, GradScaler) to `Accelerator(mixed_precision=...)`.

What it does:
    `torch.autocast(...)` / `torch.cuda.amp.autocast(...)` / `torch.amp.autocast(...)` become
    `accelerator.autocast()`; a `GradScaler` and its calls go: `scaler.scale(loss).backward()`
    -> `accelerator.backward(loss)`, `scaler.step(optimizer)` -> `optimizer.step()`,
    `scaler.update()` and `scaler.unscale_(optimizer)` are removed (the Accelerator unscales
    before clipping). The Accelerator is created with `mixed_precision="fp16"` (a scaler, or an
    fp16 autocast) or `"bf16"` (a bfloat16 autocast without scaler).

Why:
    The Accelerator owns precision per device: the same script then runs fp16 on GPUs and
    stays correct on a CPU, and the precision can be changed at launch time.

Example:
    with torch.autocast("cuda", dtype=torch.float16):     with accelerator.autocast():
        loss = model(x).mean()                             ->      loss = model(x).mean()
    scaler.scale(loss).backward()                          accelerator.backward(loss)
    scaler.step(optimizer)                                 optimizer.step()
    scaler.update()

Leaves alone:
    Scripts whose autocast is switched by a variable (`enabled=args.amp`) or chosen by a
    condition (`ctx = nullcontext() if device_type == "cpu" else torch.autocast(...)`), or that use the scaler
    in other ways (`scaler.state_dict()`, `get_scale()`): reported, and the AMP code is kept as
    it is (it still works: `accelerator.backward(scaler.scale(loss))`). Files that already create
    an Accelerator.

Fix safety:
    Safe. A script that clipped gradients without `scaler.unscale_` clipped scaled gradients; the
    migrated one clips the true gradients (reported, since the numbers change).
"""

from __future__ import annotations

import libcst as cst

from migrate.analysis import Scope
from migrate.edits import EditPlan
from migrate.roles import Roles
from migrate.rules.base import accelerator_call
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
    precision = _precision(roles, scalers, autocasts, plan)
    if precision is None:
        return
    uses = _scaler_uses(roles, scalers, plan)
    if uses is None:
        return
    for scope, call in autocasts:
        plan.calls[call.call] = lambda updated: accelerator_call("autocast", [])
        plan.use_accelerator(scope)
        plan.change(CODE, call.call, "autocast -> `accelerator.autocast()`")
    for scope, name in scalers:
        for binding in scope.bindings[name]:
            plan.replace_stmt[binding.where.stmt] = []
            plan.change(CODE, binding.where.stmt, f"GradScaler `{name}` removed: the Accelerator scales fp16 losses")
    for scope, site, method in uses:
        _convert_use(plan, scope, site, method)
    _report_unscaled_clipping(roles, plan, scalers, uses)
    plan.accelerator_kwargs["mixed_precision"] = f'"{precision}"'
    plan.removes_boilerplate = True


def _chosen_by_condition(module: cst.Module, calls: list[cst.Call]) -> cst.Call | None:
    """The first autocast call inside a conditional expression (`autocast() if c else nullcontext()`)."""
    wanted = {id(c) for c in calls}
    found: list[cst.Call] = []

    class Finder(cst.CSTVisitor):
        def visit_IfExp(self, node: cst.IfExp) -> None:
            for branch in (node.body, node.orelse):
                if id(branch) in wanted and isinstance(branch, cst.Call):
                    found.append(branch)

    walk(module, Finder())
    return found[0] if found else None


def _precision(roles: Roles, scalers: set, autocasts: list, plan: EditPlan) -> str | None:  # type: ignore[type-arg]
    dtypes: set[str] = set()
    switched = _chosen_by_condition(roles.facts.module, [call.call for _, call in autocasts])
    if switched is not None:
        # A prepared model runs its forward under the Accelerator's precision on every step:
        # `accelerator.autocast() if cond else nullcontext()` would be mixed precision always.
        plan.report(CODE, switched, "autocast is chosen by a condition (`... if cond else nullcontext()`); the AMP "
                    "code was kept as it is: pass `mixed_precision=` to the Accelerator (or `accel launch "
                    "--mixed-precision`) instead")
        return None
    for _, call in autocasts:
        for arg in call.call.args:
            keyword = arg.keyword.value if arg.keyword else None
            if keyword == "enabled" and not (isinstance(arg.value, cst.Name) and arg.value.value == "True"):
                plan.report(CODE, call.call, "autocast is switched by `enabled=`; the AMP code was kept as it is: "
                            "pass `mixed_precision=` to the Accelerator (or `accel launch --mixed-precision`) instead")
                return None
            if keyword == "dtype":
                dtypes.add(roles.facts.aliases.qualify(arg.value) or "")
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
                    "Accelerator does not expose; the AMP code was kept as it is",
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
