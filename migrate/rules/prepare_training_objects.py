"""Pass the model(s), optimizer(s), training loader(s) and scheduler(s) to `accelerator.prepare`.

What it does:
    Inserts one `model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer,
    loader, scheduler)` in the function (or module) that builds the optimizer, right after the last
    of those objects is bound and before the training loop uses them. Models are the owners of the
    parameters given to a `torch.optim` optimizer; loaders are the `DataLoader`s (built here, or
    returned by a helper function of this file) that a training loop (one that calls
    `.backward()`, directly or through a helper of this file) iterates; schedulers
    are prepared only when they are stepped inside that per-batch loop. Attributes are followed
    like names: when a method builds the optimizer from `self.model.parameters()`, the attributes
    of that class (`self.model`, `self.optimizer`, `self.train_loader`) are prepared in that method,
    `self.model, self.optimizer, self.train_loader = self.accelerator.prepare(...)`; objects built
    outside a class and passed to it are prepared where they are built, before the call.
    An optimizer may also be built indirectly: by a `torch.optim.Optimizer` subclass defined in
    this file (`LARS(model.parameters())`), or by a function or method of this file that returns
    one (`optimizer = model.configure_optimizers(...)`: the receiver is the model;
    `optimizer = create_optimizer(args, model)`: the argument whose `.parameters()` it uses). The
    optimizer is then prepared where that call binds it, never inside the factory. A receiver or
    argument that names the hand-wrapped model's module (`raw_model = model.module if ddp else
    model`, nanoGPT; `model_without_ddp`, DeiT) stands for the model: `model` is prepared, once.
    Parameter groups built by a function of this file (or of another module, when the run migrates
    the modules together, AM013) that takes a model's `.parameters()` / `.named_parameters()` are
    followed to the model passed to it:
    `optimizer = AdamW(param_groups(model, wd))`, or `groups = param_groups(model, wd)` then
    `AdamW(groups)`, prepares `model`.

Why:
    `prepare` places the model on the device and wraps it for data parallelism, shards each loader
    so every sample reaches exactly one process, and makes optimizer and scheduler steps respect
    gradient accumulation.

Example:
    model = Net()
    optimizer = torch.optim.AdamW(model.parameters())
    +model, optimizer, train_loader = accelerator.prepare(model, optimizer, train_loader)

Leaves alone:
    Evaluation loaders (their batches keep their `.to(device)`), schedulers stepped once per epoch
    (prepared, they would advance once per optimizer step and process), frozen models that feed
    no optimizer. Objects created inside a loop or in another function than the optimizer, an
    attribute the class never sets (`self.model` assigned from outside), and an optimizer over
    `self.parameters()` (the class itself is the model) are reported instead. Test modules (importing unittest or pytest, or defining a
    `...TestCase`) and library modules (no entry point, no DataLoader built or iterated) are
    reported and left as they are: their models and data come from elsewhere. An optimizer built
    in a class body (`class Setup: optimizer = SGD(...)`, run once when the class is defined) is
    reported and the file left as it is: no placement of `prepare` there is right for its methods.
    Also reported: `torch.compile(model)` before the prepare call (it would compile the unwrapped
    model: compile the prepared one), a training loop over something that is not a recognised
    `DataLoader` or over a loader not bound where the model is prepared (it is not prepared, so
    every process would see all the data), a loader still sharded by a `DistributedSampler`
    (when AM007 is off: preparing it would shard twice), and a training step that no DataLoader
    feeds (every process would train on the same data; when the batches come from a function of
    this file, `X, Y = get_batch()`, or an object of a class of this file, `x, y =
    train_loader.next_batch()`, the report names it as the one that must draw this process's
    share; an object built with torchrun's global rank, nanoGPT's `DataLoaderLite(...,
    process_rank=ddp_rank, ...)`, already does, and is not reported; built with `LOCAL_RANK`,
    it is, since the local rank repeats on every node). An optimizer factory whose model cannot be told is reported and the file left as it is
    (prepared alone, the optimizer would step a model that is neither placed nor synchronised).
    A `torch.optim` optimizer whose model cannot be told (its parameter groups come from a library's
    helper, `AdamW(groups)` after `groups = timm_groups(model, wd)`, or from tensors of no model) is
    prepared without a model and reported at its line, naming what its parameters come from: no
    model is guessed, and on N processes each process would train its own copy until the model is
    added to `accelerator.prepare(...)` by hand.
    An optimizer wrapped in another object (`optimizer = ScheduledOptim(torch.optim.Adam(...),
    d_model, warmup)`, the name's only binding, a statement of its own) is bound as the inner
    optimizer, prepared, and wrapped again right after the prepare call (`optimizer =
    ScheduledOptim(optimizer, d_model, warmup)`), so the wrapper's schedule steps the prepared
    optimizer; other wrapped shapes (never bound, rebound, inside an expression) are reported.
    A copy of the model trained in its place (`learner = maml.clone()` in the training loop, then
    `learner(x)` directly or through a helper of this file, and a backward, the model itself never
    called in that loop) refuses the file: the prepared model is DDP on N processes, and a method it
    does not have runs on the wrapped module, so the copy's forward is never DDP's and no gradient
    is averaged (the runtime's check raises GradientSyncError). So does an optimizer rebound to
    another library's distributed optimizer (`optimizer = cherry.optim.Distributed(params,
    opt=optimizer)`, `hvd.DistributedOptimizer(optimizer, ...)`): it averages gradients with its own
    collectives, beside the ones DDP would add.
    A second training section in the same scope that builds its optimizer again after the prepare
    call (a notebook-style file training a baseline, then another model) is reported and the
    file left as it is: that section's model would train unprepared.

Fix safety:
    Safe on one process: the prepared loader yields the same batches in the same order.
"""

from __future__ import annotations

import libcst as cst

from migrate.edits import EditPlan
from migrate.roles import Roles
from migrate.roles.model import WrappedOptimizer
from migrate.rules.base import assignment, indent_of, prepared_loaders

CODE = "AM004"
NAME = "prepare-training-objects"


def apply(roles: Roles, plan: EditPlan) -> None:
    home = roles.home
    if home is None or not (roles.models or roles.optimizers):
        return
    for name, loop in roles.rank_sampled.items():
        if name not in plan.unsharded_loaders:
            plan.report(
                CODE,
                loop,
                f"`{name}` already shards the data by rank (DistributedSampler); preparing it would shard "
                "twice, so it was not prepared: drop the sampler (keep its shuffle on the DataLoader) and "
                "add the loader to `accelerator.prepare(...)`",
            )
    loaders = prepared_loaders(roles, plan)
    names = [
        n
        for n in (*roles.models, *roles.optimizers, *loaders, *plan.eval_loaders, *roles.schedulers)
        if n not in home.prepared
    ]
    if not names or home.prepared:
        return
    if not roles.can_reach(home):
        # An Accelerator the script already creates elsewhere (`def main(): accelerator = ...`)
        # that the code building the optimizer cannot see: a prepare call there would be a NameError.
        created = roles.accelerator_scope.name if roles.accelerator_scope is not None else "?"
        built = home.bindings[roles.optimizers[0]][0].where.stmt if roles.optimizers else home.node
        plan.report(CODE, built, (
            f"{', '.join(names)} are built where the script's Accelerator (created in `{created}`) cannot "
            "be seen, so they were not prepared: build them where the Accelerator is created, or pass it "
            "in, and add them to `accelerator.prepare(...)`"
        ))
        return
    where = roles.prepare_after
    # a model a trainer trains through a hand-wrapped alias is prepared into the alias
    bound = {model: alias for alias, model in roles.model_aliases.items()}
    targets = [bound.get(n, n) for n in names]
    stmt = assignment(targets, "accelerator.prepare", names, indent_of(home, where))
    if where is not None:
        plan.insert_after.setdefault(where.stmt, []).append(stmt)
        anchor = where.stmt
    else:
        anchor = roles.create_before
        if anchor is None:
            return
        plan.insert_before.setdefault(anchor, []).append(stmt)
    for name in names:
        wrapped = roles.wrapped_optimizers.get(name)
        if wrapped is not None:
            _rewrap(plan, name, wrapped, anchor, after=where is not None)
    plan.use_accelerator(home)
    plan.change(CODE, anchor, f"prepare {', '.join(names)}")


def _rewrap(plan: EditPlan, name: str, wrapped: WrappedOptimizer, anchor: cst.BaseStatement, after: bool) -> None:
    """`optimizer = ScheduledOptim(Adam(...), 8, 4)` -> `optimizer = Adam(...)`, prepared, then
    `optimizer = ScheduledOptim(optimizer, 8, 4)` right after the prepare call: the wrapper keeps
    its schedule and steps the prepared optimizer (which skips steps while accumulating and
    unscales fp16 gradients)."""
    stmt = wrapped.binding.where.stmt
    assert isinstance(stmt, cst.SimpleStatementLine) and isinstance(stmt.body[0], cst.Assign)
    assign = stmt.body[0]
    plan.replace_stmt[stmt] = [stmt.with_changes(body=[assign.with_changes(value=wrapped.inner)])]
    args = [cst.Arg(cst.Name(name), keyword=a.keyword, equal=a.equal, comma=a.comma) if a.value is wrapped.inner else a
            for a in wrapped.wrapper.args]
    targets = [target.deep_clone() for target in assign.targets]  # the first statement keeps the originals
    rewrapped = wrapped.wrapper.with_changes(args=args)
    again = cst.SimpleStatementLine([assign.with_changes(targets=targets, value=rewrapped)])
    (plan.insert_after if after else plan.insert_before).setdefault(anchor, []).append(again)
    plan.change(CODE, stmt, f"`{name}` prepared as the optimizer it wraps, then wrapped again after the prepare call")

