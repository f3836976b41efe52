"""The training loaders, the evaluation loops, and what is left unsharded.

A loader is a training loader when a training loop iterates it and every name it may refer to is
bound in home: a `DataLoader(...)`, a same-file helper returning one, a constructor argument, or a
parameter. A loader built with a DistributedSampler is recorded in `rank_sampled` (AM007 decides
whether its sampler goes). A loop over anything else, and a training step that no DataLoader feeds,
are reported (AM004) with what to prepare or which batch function must take the rank."""

from __future__ import annotations

import libcst as cst

from migrate.analysis import Binding, Loop, Scope, Site
from migrate.roles.calls import DATALOADER, DISTRIBUTED_SAMPLER, call_name, is_move_call
from migrate.roles.model import PREPARE, Finding, Roles
from migrate.roles.streams import training_stream
from migrate.walk import walk


def find_loaders(roles: Roles) -> None:
    home = roles.home
    assert home is not None
    for scope in roles.facts.scopes:
        for loop in scope.loops:
            if loop.source is None or not roles.is_training_loop(loop):
                continue
            found = roles.origins(scope, loop.source)
            if found is None:
                roles.cannot_prepare(
                    loop.node,
                    f"training loop iterates `{loop.source}`, but not every caller passes a named loader "
                        "from this file; it is not prepared, so every process would see all the data: "
                        "prepare the loader where it is built",
                )
            for origin_scope, name in found or ():
                if origin_scope is not home and _hands_back_objects(roles, home):
                    # `model, optimizer = build()` indexed or passed on whole: preparing in `build`
                    # would leave this loader out, and the class using them would never see the
                    # accelerator; one precise refusal instead of a half migration
                    roles.refused = True
                    roles.findings = [Finding(PREPARE, loop.node, (
                        f"training loop iterates `{loop.source}`, built in `{origin_scope.qualname}`, while the model "
                        f"and the optimizer are built in `{home.qualname}`, which returns them: no one function holds "
                        "all three to prepare them together, so the file was left as it is: unpack what "
                        f"`{home.name}()` returns into plain names where the loader is built (`model, optimizer = "
                        f"{home.name}()`) and run again, or create the Accelerator there and pass the model, the "
                        "optimizer and the loader to `accelerator.prepare(...)` by hand"), unconverted=True)]
                    return
                if origin_scope is not home:
                    roles.cannot_prepare(
                        loop.node,
                        f"training loop iterates `{loop.source}`, which is not bound in `{home.name}` "
                            "(where the model and optimizer are prepared); prepare it yourself",
                    )
                elif name in roles.loaders:
                    continue
                elif _shards_by_rank(roles, home, name):
                    roles.loaders.append(name)
                    roles.rank_sampled[name] = loop.node
                elif name in home.params or any(
                    call_name(roles, b.value, DATALOADER)
                    or _is_parameter_value(home, b.value)
                    or built_by_helper(roles, b.value)
                    or _returned_element(roles, b) is not None
                    for b in home.bindings.get(name, [])
                ):
                    roles.loaders.append(name)
                else:
                    roles.cannot_prepare(
                        loop.node,
                        f"training loop iterates `{name}`, which is not a recognised DataLoader; "
                            "it is not prepared, so every process would see all the data: "
                            "build it with torch.utils.data.DataLoader or prepare it yourself",
                    )


def _hands_back_objects(roles: Roles, home: Scope) -> bool:
    """Home is a plain function that returns its optimizer (alone, or in a tuple or list): its caller
    trains with what it builds (`return model, optimizer`)."""
    if not home.is_function or home.is_method:
        return False
    for value in home.returns:
        elements = [e.value for e in value.elements] if isinstance(value, (cst.Tuple, cst.List)) else [value]
        if any(isinstance(e, cst.Name) and e.value in roles.optimizers for e in elements):
            return True
    return False


def _shards_by_rank(roles: Roles, home: Scope, loader: str) -> bool:
    """A DataLoader built with a DistributedSampler (inline or through a name) shards itself, also
    when a helper function of this file builds it (`loader = build_loader(dataset)`)."""
    return any(
        any(call_name(roles, v, DISTRIBUTED_SAMPLER) for v in sampler_values(roles, scope, call))
        for scope, call in loader_calls(roles, home, loader)
    )


def loader_calls(roles: Roles, home: Scope, loader: str) -> list[tuple[Scope, cst.Call]]:
    """The `DataLoader(...)` calls that build `loader` of home, with the scope each sits in: home's
    own, or those a same-file helper returns (`return DataLoader(...)`, or a name bound to one)."""
    found: list[tuple[Scope, cst.Call]] = []
    for binding in home.bindings.get(loader, []):
        value = binding.value
        if not isinstance(value, cst.Call):
            found.extend(_returned_element(roles, binding) or ())
            continue
        if call_name(roles, value, DATALOADER):
            found.append((home, value))
        elif built_by_helper(roles, value):
            assert isinstance(value.func, cst.Name)
            helper = roles.facts.function_called(value)
            assert helper is not None
            for returned in helper.returns:
                values = (
                    [b.value for b in helper.bindings.get(returned.value, [])]
                    if isinstance(returned, cst.Name)
                    else [returned]
                )
                found.extend((helper, v) for v in values if isinstance(v, cst.Call) and call_name(roles, v, DATALOADER))
    return found


def _returned_element(roles: Roles, binding: Binding) -> list[tuple[Scope, cst.Call]] | None:
    """`datasets, train_loader, val_loader = build_loader(config)` where every `return` of that
    function (of this module, or of another module of the unit) is a tuple whose element at the
    name's position is a `DataLoader(...)` or a name bound to one: those calls, with the helper's
    scope; None for anything else."""
    unpacked = unpacked_call(binding)
    if unpacked is None:
        return None
    call, index = unpacked
    helper = roles.facts.function_called(call)
    if helper is None or helper.is_method or not helper.returns:
        return None
    found: list[tuple[Scope, cst.Call]] = []
    for returned in helper.returns:
        if not isinstance(returned, cst.Tuple) or index >= len(returned.elements):
            return None
        element = returned.elements[index]
        if isinstance(element, cst.StarredElement):
            return None
        value = element.value
        values = [b.value for b in helper.bindings.get(value.value, [])] if isinstance(value, cst.Name) else [value]
        calls = [v for v in values if isinstance(v, cst.Call) and call_name(roles, v, DATALOADER)]
        if not calls or len(calls) != len(values):
            return None
        found.extend((helper, c) for c in calls)
    return found


def unpacked_call(binding: Binding) -> tuple[cst.Call, int] | None:
    """(call, position) for a name bound by unpacking a call: `a, loader = f(...)` -> (f(...), 1)."""
    stmt = binding.where.stmt
    if binding.value is not None or binding.is_loop_target or not isinstance(stmt, cst.SimpleStatementLine):
        return None
    assign = stmt.body[0] if len(stmt.body) == 1 else None
    if not (isinstance(assign, cst.Assign) and len(assign.targets) == 1 and isinstance(assign.value, cst.Call)):
        return None
    target = assign.targets[0].target
    if not isinstance(target, (cst.Tuple, cst.List)):
        return None
    for index, element in enumerate(target.elements):
        if isinstance(element, cst.StarredElement):
            return None
        if isinstance(element.value, cst.Name) and element.value.value == binding.name:
            return assign.value, index
    return None


def sampler_values(roles: Roles, scope: Scope, call: cst.Call) -> list[cst.BaseExpression | None]:
    """What the `sampler=` / `batch_sampler=` argument of a DataLoader call is bound to in `scope`."""
    for arg in call.args:
        if arg.keyword is None or arg.keyword.value not in ("sampler", "batch_sampler"):
            continue
        if isinstance(arg.value, cst.Name):
            return [b.value for b in scope.bindings.get(arg.value.value, [])]
        return [arg.value]
    return []


def built_by_helper(roles: Roles, value: cst.BaseExpression | None) -> bool:
    """`loader = make_loader(...)` where that function of this file returns a DataLoader."""
    if not (isinstance(value, cst.Call) and isinstance(value.func, cst.Name)):
        return False
    helper = roles.facts.function_called(value)
    if helper is None or not helper.returns:
        return False
    for returned in helper.returns:
        if call_name(roles, returned, DATALOADER):
            continue
        if isinstance(returned, cst.Name) and any(
            call_name(roles, b.value, DATALOADER) for b in helper.bindings.get(returned.value, [])
        ):
            continue
        return False
    return True


def _is_parameter_value(home: Scope, value: cst.BaseExpression | None) -> bool:
    """`self.loader = loader` where `loader` is a parameter of home (a constructor argument)."""
    return isinstance(value, cst.Name) and value.value in home.params


def prefer_attributes(roles: Roles) -> None:
    """In a method, an object kept as `self.model = model` is prepared (and known) as `self.model`:
    the methods that train use the attribute, not the constructor's local name."""
    home = roles.home
    assert home is not None
    if not home.is_method:
        return
    for group in (roles.models, roles.loaders):
        group[:] = [kept_as_attribute(home, name) or name for name in group]


def kept_as_attribute(home: Scope, name: str) -> str | None:
    """`self.model` when `home` stores the local `model` as `self.model = model`."""
    if name.startswith("self."):
        return None
    for attribute, bindings in home.bindings.items():
        if not attribute.startswith("self."):
            continue
        for binding in bindings:
            value = binding.value
            if is_move_call(value):  # `self.model = model.to(device)`
                assert isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute)
                value = value.func.value
            if isinstance(value, cst.Name) and value.value == name:
                return attribute
    return None


def find_eval_loops(roles: Roles) -> None:
    """Loops without backward over DataLoaders built in home (evaluation loaders, or the training
    loader itself): candidates for gather_for_metrics."""
    home = roles.home
    assert home is not None
    for scope in roles.facts.scopes:
        for loop in scope.loops:
            if loop.source is None or roles.is_training_loop(loop):
                continue
            found = roles.origins(scope, loop.source)
            if not found or any(origin_scope is not home for origin_scope, _ in found):
                continue
            names = sorted(name for _, name in found)
            # every loader the loop can iterate is one of home's (a function evaluating both the
            # training loader and a test loader): the loop is decided once, for all of them
            if all(any(call_name(roles, b.value, DATALOADER) for b in home.bindings.get(n, [])) for n in names):
                roles.eval_loops.extend((scope, loop, name) for name in names)


def report_unsharded_training(roles: Roles) -> None:
    """A training step that no DataLoader feeds (tensors, a `get_batch()` helper) is not sharded."""
    if roles.loaders or roles.unprepared:  # its own report says more
        return
    found = [(scope, site) for scope in roles.facts.scopes for site in scope.backwards]
    if not found:
        return
    scope, site = found[0]
    stream = training_stream(roles, scope)
    if stream is not None and stream.ranked_by == "torch":
        return  # its shard is this process's: the Accelerator joins the process group it reads
    if stream is not None and stream.ranked_by == "mpi":
        assert stream.rank_read is not None
        roles.findings.append(Finding(PREPARE, stream.rank_read, (
            f"the training batches come from `{stream.function}()`, which takes this process's shard from MPI "
            "here; under `accel launch` (torchrun) MPI does not start the processes, so every process would be "
            "MPI's rank 0 of 1 and train on the same data: take the shard from `torch.distributed.get_rank()` "
            "and `get_world_size()` (the Accelerator's process group)"), unconverted=True))
        return
    if stream is not None and stream.ranked_by == "local":
        assert stream.rank_read is not None
        roles.findings.append(Finding(PREPARE, stream.rank_read, (
            f"the training batches come from `{stream.drawn}`, a `{stream.function}` built with the local rank "
            "(`LOCAL_RANK`), which repeats on every machine: on more than one node the processes of each node "
            f"would train on the same batches. Build `{stream.function}` with the global rank, "
            "`accelerator.process_index` (torchrun's `RANK`), and `accelerator.num_processes`"), unconverted=True))
        return
    source = stream.function if stream is not None else _batch_function(roles, scope, site)
    if source is not None:
        drawn = stream.drawn if stream is not None and stream.drawn else f"{source}()"
        message = (
            f"no DataLoader feeds this training step: its batches come from `{drawn}`, which every process "
            "would run alike, so all of them would train on the same data. Make "
            f"`{source}` draw this process's share: pass it `accelerator.process_index` and "
            "`accelerator.num_processes` (a per-rank seed for its random offsets, or a strided part of the "
            "data), or build the batches with a torch.utils.data.DataLoader (prepared, it shards them)"
        )
    else:
        message = (
            "no DataLoader feeds this training step, so every process would train on the same data: build "
            "the batches with a torch.utils.data.DataLoader (prepared, it shards them), or select this "
            "process's share with `accelerator.process_index` / `accelerator.num_processes`"
        )
    roles.findings.append(Finding(PREPARE, site.call, message, unconverted=True))


def _batch_function(roles: Roles, scope: Scope, site: Site) -> str | None:
    """The function of this module called in the training loop to produce the batch
    (`X, Y = get_batch("train")`), if there is one."""
    if not site.loops:
        return None
    loop = site.loops[-1]
    functions = {s.name for s in roles.facts.scopes if s.is_function and s.parent is roles.facts.module_scope}
    for call in scope.calls:
        stmt = call.where.stmt
        if call.callee not in functions or loop not in call.loops:
            continue
        if not (isinstance(stmt, cst.SimpleStatementLine) and any(
            isinstance(small, cst.Assign) and small.value is call.call for small in stmt.body
        )):
            continue
        # A source of batches is called with what stays the same across iterations
        # (`get_batch("train")`); `detach(states)` or `fast_adapt(batch, ...)` work on this
        # iteration's values, so they are not where the data comes from.
        read = {n.value for a in call.call.args for n in _names_in(a.value)}
        if not any(_bound_in_loop(b, loop) for n in read for b in scope.bindings.get(n, [])):
            return call.callee
    return None


def _names_in(node: cst.CSTNode) -> list[cst.Name]:
    finder = _Names()
    walk(node, finder)
    return finder.found


class _Names(cst.CSTVisitor):
    def __init__(self) -> None:
        self.found: list[cst.Name] = []

    def visit_Name(self, name: cst.Name) -> None:
        self.found.append(name)


def _bound_in_loop(binding: Binding, loop: Loop) -> bool:
    return binding.where.stmt is loop.node or any(ref.stmt is loop.node for ref in binding.where.path)
