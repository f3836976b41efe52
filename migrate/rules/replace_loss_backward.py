"""Replace `loss.backward()` with `accelerator.backward(loss)`.

What it does:
    Rewrites every `<expr>.backward(...)` call on a tensor to `accelerator.backward(<expr>, ...)`,
    whatever the receiver is (`loss`, `(a + b)`, `outputs.loss`). Positional arguments of
    `Tensor.backward` (gradient, retain_graph, create_graph) become keywords. A backward inside
    an optimizer closure (`def closure(): ...; loss.backward(); return loss` for LBFGS) is
    converted too.

Why:
    The Accelerator scales the loss for mixed precision and divides it for gradient accumulation;
    calling `backward` on the tensor directly bypasses both.

Example:
    loss.backward()              ->  accelerator.backward(loss)
    (l1 + l2).backward(retain_graph=True)
                                 ->  accelerator.backward(l1 + l2, retain_graph=True)

Leaves alone:
    `torch.autograd.backward(...)`, calls on the accelerator itself, and any backward in a
    function that cannot receive the accelerator (not called from this file, or called from a
    place that has none): those are reported instead, with the line to fix by hand. Also
    reported: a `.backward()` in a file that builds no optimizer (there is no place to create the
    Accelerator), saying where the file's optimizer comes from when it shows it: a method of an
    object whose class is in another module called on something that is not used as a model (a
    method called on the model the training step calls, `self.optimizer =
    model.configure_optimizers(config)` in minGPT's trainer, whose result is stepped after
    `backward`, is the optimizer over that model, AM004), a function of another module whose
    result is not stepped after a backward or that is handed no model (a factory stepped after
    `backward` over a model argument is the optimizer, AM004), or a parameter the caller fills (`self.optimizer = optimizer` in a constructor). A
    file handed its optimizer that builds its training DataLoader with a `DistributedSampler` and
    wraps the model in `DistributedDataParallel` (minGPT-ddp's trainer) already trains distributed
    under torchrun as it is: a note (not unconverted) names the loader, the sampler and the wrap by
    line, and says how to migrate it with its caller (build the loader without the sampler in the
    script that builds the optimizer, hand it in, give both files in one run). A
    script (a `__main__` guard, or a backward at module level) with no `torch.optim` optimizer has
    nothing to prepare, unless its step updates a module's parameters by hand (below): a script
    that shows no update may only compute gradients (of its inputs, say); otherwise the file reads
    as a library module. Also reported: an optimizer built in a file with no `.backward()` at all
    (the step is hidden in another module, e.g. a trainer).

Parameters updated by hand:
    A step with no optimizer whose update is written by hand over a module's parameters, after
    `backward` (`for p in model.parameters(): p.data.add_(-lr * p.grad)`, `with torch.no_grad():
    for p in model.parameters(): p -= lr * p.grad`, `for name, p in model.named_parameters(): p.data
    -= lr * p.grad`, then `model.zero_grad()` or `p.grad.zero_()`), where the module is one the
    training step calls: the module is prepared alone (`model = accelerator.prepare(model)`, with
    the training loaders, AM004), the backward becomes `accelerator.backward(loss)` and the update
    is kept as it is. The prepared module (DDP on N processes) averages the gradients in
    `backward`, so the hand update reads averaged gradients on every process, as a prepared
    optimizer would, and the copies stay equal (`model.parameters()`, `model.zero_grad()` and
    `model.weight` work on the prepared module). The loop is not wrapped in `accumulate` (AM005):
    there is no optimizer step to skip. Reported, the file left as it is: an update of tensors that
    are no module's parameters (`w = torch.zeros(3, requires_grad=True)`; `w -= lr * w.grad`),
    also beside a module's (nothing would average their gradients: hold them in a module and run
    again, or all-reduce the gradients yourself); an update whose loop draws random values from
    torch's RNG (Langevin noise, `torch.randn_like(p)`: each process would draw its own after the
    prepare call and the copies would drift apart; draw them from a `generator=` seeded alike);
    `--mixed-precision fp16` (nothing would unscale
    the gradients before the update) or a sharding `--strategy`. The report of a refused
    hand-written update also names what else the next run needs: a seed before module-level draws
    the batches are made from (each process would draw its own task), and a stop test on the step's
    loss (reduced by AM011 once migrated; bind it to a name first when the test reads `loss.item()`
    itself).

Training step inside an object the migration cannot read:
    When no `.backward()` shows anywhere and a loop hands the optimizer and a loss computed from a
    forward of the model to an object or a function of a module outside the run
    (`loss_scaler(loss, optimizer, clip_grad=max_norm, parameters=model.parameters())`, timm's
    NativeScaler running the backward, the clipping and the step; `scaled_step(loss, optimizer)`),
    that call is the training step (`migrate/roles/hidden_step.py`): it is kept as it is, its loop
    is a training loop and the model, the optimizer and the loaders are prepared as for a visible
    backward. With the model prepared (DDP on N processes) its plain backward all-reduces the
    gradients as the original's DDP did; its own AMP (the scaler inside it, the autocast around
    the forward) is kept (AM006). `--mixed-precision` and a sharding `--strategy` need the
    backward to go through the Accelerator: the file is then left as it is, reported at the call.
    A call handed the optimizer but nothing computed from a forward of the model is reported (the
    file is left as it is): call `loss.backward()` and `optimizer.step()` where the loss is computed.

Fix safety:
    Safe: `accelerator.backward(loss)` calls `loss.backward()` when no scaling applies.
"""

from __future__ import annotations

import libcst as cst

from migrate.analysis import Binding, Scope
from migrate.edits import EditPlan
from migrate.roles import Roles
from migrate.positions import start_lines
from migrate.roles.calls import DATALOADER, DISTRIBUTED_SAMPLER, call_name
from migrate.roles.entry import _has_main_guard
from migrate.roles.hand_update import raw_update, reads_grad
from migrate.roles.loaders import random_batches, sampler_values, seeded_before
from migrate.rules.reduce_per_rank_decisions import stop_tests
from migrate.walk import walk

CODE = "AM003"
NAME = "replace-loss-backward"

_POSITIONAL = ("gradient", "retain_graph", "create_graph")


def apply(roles: Roles, plan: EditPlan) -> None:
    unseen: tuple[str, bool] | None = None
    for scope in roles.facts.scopes:
        for site in scope.backwards:
            if site.call in plan.calls:
                continue  # already converted (mixed precision: `scaler.scale(loss).backward()`)
            if roles.home is None:
                if unseen is None:
                    unseen = _optimizer_not_built_here(roles)
                plan.report(CODE, site.call, unseen[0], unconverted=unseen[1])
            elif not roles.can_reach(scope):
                plan.report(
                    CODE,
                    site.call,
                    f"`.backward()` in `{scope.name}` cannot receive the accelerator (no caller in this file "
                    "passes it); add an `accelerator` parameter and call `accelerator.backward(loss)`", unconverted=True,
                )
            else:
                plan.calls[site.call] = _to_accelerator_backward
                plan.use_accelerator(scope)
                plan.change(CODE, site.call, "`.backward()` -> `accelerator.backward(...)`")


def _to_accelerator_backward(call: cst.Call) -> cst.BaseExpression:
    assert isinstance(call.func, cst.Attribute)
    receiver = call.func.value.with_changes(lpar=[], rpar=[]) if _redundant_parens(call.func.value) else call.func.value
    args: list[cst.Arg] = [cst.Arg(receiver)]
    for index, arg in enumerate(call.args):
        if arg.keyword is None and index < len(_POSITIONAL) and not arg.star:
            arg = arg.with_changes(
                keyword=cst.Name(_POSITIONAL[index]),
                equal=cst.AssignEqual(cst.SimpleWhitespace(""), cst.SimpleWhitespace("")),
            )
        args.append(arg)
    args = [a.with_changes(comma=cst.MaybeSentinel.DEFAULT) for a in args]
    return cst.Call(
        func=cst.Attribute(cst.Name("accelerator"), cst.Name("backward")),
        args=args,
    )


def _redundant_parens(expr: cst.BaseExpression) -> bool:
    # `(a + b).backward()` -> `accelerator.backward(a + b)`: the parentheses were only for `.`.
    return bool(getattr(expr, "lpar", None)) and not isinstance(expr, (cst.Tuple, cst.GeneratorExp, cst.Yield))


_NOT_BUILT = "`.backward()` found but no optimizer is built in this file, so there is no place to create the Accelerator"


def _optimizer_not_built_here(roles: Roles) -> tuple[str, bool]:
    """What the file shows of where its optimizer comes from, and what to do about it: a method
    of an object whose class is in another module (`model.configure_optimizers(config)`), a
    function of another module (`create_optimizer_v2(model, ...)`), a parameter filled by the
    caller (`Trainer(model, optimizer, ...)`); otherwise a library module's wording. With whether
    the backward is training code left unconverted (`Finding.unconverted`): all but a script's
    backward with no optimizer and no update at all, which may only compute gradients (of the inputs)."""
    for scope, binding in _optimizer_bindings(roles):
        value = binding.value
        assert value is not None
        shown = " ".join(cst.Module([]).code_for_node(value).split())
        if len(shown) > 60 and type(value) is cst.Call:
            shown = cst.Module([]).code_for_node(value.func) + "(...)"
        code = f"{binding.name} = {shown}"
        if type(value) is cst.Call and type(value.func) is cst.Attribute:
            method = value.func.attr.value
            receiver = cst.Module([]).code_for_node(value.func.value)
            qualified = roles.facts.aliases.qualify(value.func)
            if qualified is None:
                by_hand = ("create the Accelerator, pass the model, the optimizer and the training DataLoader to "
                           "`accelerator.prepare(...)` right after that call, and call `accelerator.backward(loss)` here")
                seen = (f"{_NOT_BUILT} here: the optimizer comes from `{code}`, a method `{method}()` of `{receiver}` "
                        "that no class of this file defines (the model's class, in another module?)")
                if _has_main_guard(roles.facts.module) or scope is roles.facts.module_scope:
                    # the script itself: a unit with the model's module would have followed the method
                    # (migrate/crossmodule/unit.py), so that module is not one the run holds or reads
                    return (f"{seen}. A `{method}()` of a class defined in a module of the project is followed "
                            "when that module is in the run or imported from this script's folder; this one was "
                            f"not found there (an installed package?): {by_hand}"), True
                return (
                    f"{seen}. Migrate this file together with the module that defines that class and the script "
                    "that runs this code (give them in one run, e.g. the project's folder): a "
                    f"`{method}()` that returns a `torch.optim` optimizer over the model's parameters is then "
                    "followed to the model, which is prepared with it right after that call, as in one file. "
                    f"Otherwise {by_hand}"
                ), True
        if type(value) is cst.Call:
            qualified = roles.facts.aliases.qualify(value.func)
            shown = f" (`{qualified}`)" if qualified is not None else ""
            return (
                f"{_NOT_BUILT} here: the optimizer comes from `{code}`, a function of another module{shown}, "
                "which the migration does not follow into: create the Accelerator before that call, pass the "
                "model, the optimizer and the training DataLoader to `accelerator.prepare(...)` right after it, "
                "and call `accelerator.backward(loss)` here (or build the optimizer in this file, "
                "`torch.optim.X(model.parameters(), ...)`, and run the migration again)"
            ), True
        if type(value) is cst.Name and value.value in scope.params:
            distributed = _trains_distributed(roles)
            if distributed is not None:
                return (
                    f"`.backward()` found but no optimizer is built in this file: it comes from `{code}`, the "
                    f"parameter `{value.value}` of `{scope.qualname}`, built by the code that calls it. {distributed}"
                ), False
            return (
                f"{_NOT_BUILT} here: the optimizer comes from `{code}`, the parameter `{value.value}` of "
                f"`{scope.qualname}`, built by the code that calls it. Migrate this file together with the "
                "script that builds the optimizer and calls it (give them in one run, e.g. the project's "
                "folder), or prepare the model, the optimizer and the training DataLoader there and call "
                "`accelerator.backward(loss)` here"
            ), True
    update = _hand_written_update(roles)
    script = _has_main_guard(roles.facts.module) or any(
        scope is roles.facts.module_scope and scope.backwards for scope in roles.facts.scopes
    )
    raw = raw_update(roles)
    if raw is not None and raw.draws:
        return (
            "`.backward()` found but there is no `torch.optim` optimizer in this file to prepare, so it was left "
            f"as it is: `{raw.shown}` updates a module's parameters by hand in a loop that draws random values "
            "from torch's RNG; with the module prepared the gradients would be averaged, but on N processes each "
            "process would draw its own values, so the copies of the model would drift apart. Draw them from a "
            "generator seeded alike on every process (`g = torch.Generator().manual_seed(0)` before the loop, "
            "`torch.randn(p.shape, generator=g)` in the update) and run the migration again: the module is then "
            "prepared, and every process adds the same values to the same averaged gradients"
        ), True
    if raw is not None:
        return (
            "`.backward()` found but there is no `torch.optim` optimizer in this file to prepare, so it was left "
            f"as it is: `{raw.shown}` updates by hand a tensor that is no module's parameter (made with "
            "`requires_grad=True`, or not traced to the `.parameters()` of a module the training step calls), so "
            "there is nothing to prepare, and on N processes its gradient would never be averaged across "
            "processes: each process would train its own copy. Hold such tensors in a module (as "
            "`torch.nn.Parameter` attributes of a `torch.nn.Module` whose `forward` computes the output from "
            "them), call that module in the step and update `for p in module.parameters(): ...`"
            f"{_also_to_change(roles)} and run the migration again (the module is then prepared, and its "
            "gradients averaged before the update), or all-reduce the gradients yourself before the update "
            "(`torch.distributed.all_reduce(p.grad)`, then divide by the number of processes)"
        ), True
    if update is not None:
        return (
            "`.backward()` found but there is no `torch.optim` optimizer in this file to prepare, so it was left "
            f"as it is: the parameters are updated by hand (`{update}`), and nothing prepares the model, so on N "
            "processes that update would never see gradients averaged across processes: each process would "
            "train its own copy of the model. Use an optimizer (`optimizer = torch.optim.SGD(model.parameters(), "
            "lr=...)`, with `optimizer.zero_grad()` and `optimizer.step()` in place of the update)"
            f"{_also_to_change(roles)} and run the migration again, or all-reduce the gradients yourself before "
            "the update (`torch.distributed.all_reduce(p.grad)`, then divide by the number of processes)"
        ), True
    if script:
        return (
            "`.backward()` found but no `torch.optim` optimizer is built in this script, so there is nothing to "
            "prepare and it was left as it is (a backward that only computes gradients, of the inputs say, needs "
            "no migration); if it trains, build its optimizer here (`torch.optim.X(model.parameters(), ...)`) and "
            "run the migration again"
        ), False
    return (
        "`.backward()` found but no optimizer is built in this file (a library module?), so there is no place "
        "to create the Accelerator; create one where the optimizer is built, prepare the training objects and "
        "call `accelerator.backward(loss)` here"
    ), True


def _also_to_change(roles: Roles) -> str:
    """What else the script needs for the migration to train right on N processes once it has an
    optimizer: module-level draws the batches are made from with no seed before them (each process
    would draw its own task), and what the migration then does by itself (seeds the batches apart,
    reduces a step's loss that stops the loop)."""
    sites = [(scope, site) for scope in roles.facts.scopes for site in scope.backwards]
    if not sites:
        return ""
    scope, site = sites[0]
    random = random_batches(roles, scope, site)
    unseeded = [b for b in random[1] if not seeded_before(roles, b)] if random is not None else []
    stops = stop_tests(site)
    if not unseeded and not stops:
        return ""
    lines = start_lines(roles.facts.module, [*(b.where.stmt for b in unseeded), *(stmt for stmt, _, _ in stops)])
    parts: list[str] = []
    if unseeded and random is not None:
        names = ", ".join(f"`{b.name}` (line {lines[b.where.stmt]})" for b in unseeded)
        parts.append(
            f"seed torch's RNG the same on every process before {names}, which `{random[0]}()` makes the batches "
            "from (`torch.manual_seed(0)` above them, any fixed number): drawn with no seed, torch seeds each "
            "process at random, so each would train on a different task; the migration then seeds the processes "
            f"apart after the prepare call, so that each draws its own batches from `{random[0]}()`")
    for stmt, bound, name in stops:
        test = " ".join(cst.Module([]).code_for_node(stmt.test).split())
        if bound is None:
            parts.append(
                f"bind the loss before the stop test `if {test}:` (line {lines[stmt]}), `step_loss = {name}.item()`, "
                "and test `step_loss`: the migration then reduces it across processes before it decides, so that "
                "every process leaves the loop at the same step")
        else:
            parts.append(
                f"the stop test `if {test}:` (line {lines[stmt]}) reads this process's loss of the step; the migration "
                f"reduces `{name}` across processes (mean) before it decides, so that every process leaves the loop "
                "at the same step (nothing to change there)")
    return "; " + "; ".join(parts) + ";"


_DDP = frozenset({"torch.nn.parallel.DistributedDataParallel", "torch.nn.parallel.distributed.DistributedDataParallel"})


def _trains_distributed(roles: Roles) -> str | None:
    """A file that builds its training DataLoader with a `DistributedSampler` and wraps the model it
    is handed in `DistributedDataParallel` (minGPT-ddp's trainer): it already trains distributed
    under torchrun as it is. What to tell the user, with the lines; None when it does not."""
    wraps = [call for scope in roles.facts.scopes for call in scope.library_calls if call.qualified in _DDP]
    if not wraps:
        return None
    for scope in roles.facts.scopes:
        for library_call in scope.library_calls:
            if not call_name(roles, library_call.call, DATALOADER):
                continue
            samplers = [v for v in sampler_values(roles, scope, library_call.call) if call_name(roles, v, DISTRIBUTED_SAMPLER)]
            if not samplers:
                continue
            assert samplers[0] is not None
            bound = _loader_binding(roles, scope, library_call.call)
            anchor = bound.where.stmt if bound is not None else library_call.where.stmt
            lines = start_lines(roles.facts.module, [anchor, samplers[0], wraps[0].where.stmt])
            named = f"`{bound.name}`, " if bound is not None else ""
            epochs = ", drop its `sampler.set_epoch(...)` calls here" if _calls_set_epoch(roles.facts.module) else ""
            return (
                "This file already trains distributed as it is, and was left so: it builds its training "
                f"DataLoader here ({named}line {lines[anchor]}) with a `DistributedSampler` (line {lines[samplers[0]]}), "
                "which gives each process its share of the data, and wraps the model in `DistributedDataParallel` "
                f"(line {lines[wraps[0].where.stmt]}), which averages the gradients: run it under torchrun or "
                "`accel launch` as before. To use the Accelerator instead, build that DataLoader without the sampler "
                "(with `shuffle=True` on the DataLoader, unless the sampler had `shuffle=False`) in the script that builds the optimizer, hand the loader to this code in place of "
                f"what it builds it from{epochs}, and migrate "
                "this file together with that script in one run (give both, e.g. the project's folder): the loader is "
                "then prepared there with the model and the optimizer, and the `DistributedDataParallel` wrap goes"
            )
    return None


def _loader_binding(roles: Roles, scope: Scope, call: cst.Call) -> Binding | None:
    """Where the DataLoader built by `call` is bound: its own binding, or the first binding of a call
    of the function that returns it (`self.train_loader = self._prepare_dataloader(train_dataset)`)."""
    for bindings in scope.bindings.values():
        for binding in bindings:
            if binding.value is call:
                return binding
    if not scope.is_function or not any(r is call for r in scope.returns):
        return None
    found = [
        binding
        for other in roles.facts.scopes
        for bindings in other.bindings.values()
        for binding in bindings
        if type(binding.value) is cst.Call
        and cst.Module([]).code_for_node(binding.value.func) in (scope.name, f"self.{scope.name}")
    ]
    return min(found, key=lambda b: b.where.order) if found else None


def _calls_set_epoch(module: cst.Module) -> bool:
    found: list[cst.Attribute] = []

    class Finder(cst.CSTVisitor):
        def visit_Attribute(self, node: cst.Attribute) -> None:
            if node.attr.value == "set_epoch":
                found.append(node)

    walk(module, Finder())
    return bool(found)


def _hand_written_update(roles: Roles) -> str | None:
    """The first statement that reads a parameter's `.grad` to change it (`param.data.add_(-lr *
    param.grad)`, `p -= lr * p.grad`): a hand-written update step."""
    found: list[str] = []

    class Finder(cst.CSTVisitor):
        def visit_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> bool:
            if found:
                return False
            for small in node.body:
                if reads_grad(small) and (
                    type(small) is cst.AugAssign
                    or (type(small) is cst.Expr and type(small.value) is cst.Call
                        and type(small.value.func) is cst.Attribute
                        and small.value.func.attr.value.endswith("_"))
                ):
                    found.append(" ".join(cst.Module([]).code_for_node(small).split()))
                    break
            return False

    walk(roles.facts.module, Finder())
    return found[0] if found else None


def _optimizer_bindings(roles: Roles) -> list[tuple[Scope, Binding]]:
    """Bindings of a name that says it holds an optimizer (`optimizer`, `self.optim`, `opt_g`),
    first the ones whose object the file steps (`optimizer.step()`)."""
    stepped: set[str] = set()
    for scope in roles.facts.scopes:
        for site in scope.method_calls:
            func = site.call.func
            if type(func) is cst.Attribute and func.attr.value == "step" and type(site.receiver) is cst.Name:
                stepped.add(site.receiver.value)
        for stmt_call in scope.calls:
            if stmt_call.callee.startswith("self.") and stmt_call.callee.endswith(".step"):
                stepped.add(stmt_call.callee.removesuffix(".step"))
    found = [
        (scope, binding)
        for scope in roles.facts.scopes
        for name, bindings in scope.bindings.items()
        if "optim" in name.lower().rpartition(".")[2] or name.rpartition(".")[2] in ("opt", "optim")
        for binding in bindings
        if binding.value is not None and not (type(binding.value) is cst.Name and binding.value.value == "None")
    ]
    return sorted(found, key=lambda pair: (pair[1].name.rpartition(".")[2] not in stepped
                                           and pair[1].name not in stepped, pair[1].where.order))
