"""Prepare evaluation loaders and pass the per-sample tensors that feed a metric through `gather_for_metrics`.

What it does:
    For an evaluation loop (no backward) over a DataLoader built next to the model (torch's, or
    whatever callable built the loaders the training step draws its batches from:
    `torch_geometric.loader.DataLoader`, say), finds the
    statements that accumulate a metric across batches (`correct += (pred == y).sum().item()`,
    `total += y.size(0)`, `preds.append(pred)`, `meter.update(loss.item(), x.size(0))`) and traces
    what they read back to per-sample tensors: batch values and model outputs (and values derived
    from them element by element, such as `pred = out.argmax(1)`). A scalar that a metric reads
    (`loss = criterion(out, y)`, then `test_loss += loss.item()`) is never gathered: the gather is
    placed before the line that computes it, so it is computed from every process's samples. The
    inserted statement is `out, y = accelerator.gather_for_metrics((out, y))`; a model call inside
    a metric (`preds.append(model(x).argmax(-1))`) is wrapped in place. The loader is then
    prepared with the training objects and its batch moves go.
    When the loop (or the code after it) also reads a gathered name for something else than the
    metric (`if i == 0: save(torch.cat([x[:8], recon.view(batch_size, ...)]))`, the last batch
    after the loop, a model call wrapped in place that reads a batch the metric counts), the
    gathered values are bound to new names that only the metric's lines read
    (`gathered_out, gathered_y = accelerator.gather_for_metrics((out, y))`), and the rest of the
    loop keeps this process's tensors: rebound in place, they would hold N processes' samples.
    The training loader is evaluated the same way (`evaluate(model, train_loader)` for a training
    accuracy), when the loop runs with autograd off (`with torch.no_grad():`, or a function
    decorated `@torch.no_grad()`), or when it calls the model only inside `with torch.no_grad():`
    blocks of its body and nothing in it can train (no `backward`, `step` or `zero_grad`, no
    optimizer, no function of the script, no other call handed the model): prepared for
    training, it is sharded in any case. A function's `model = model.eval()` (or `.train()`)
    still names the model it was handed. One function
    called with several loaders (the training loader and a test loader) is converted once, for all.
    A prepared model called under a rank check (`if args.rank == 0:`, `if
    accelerator.is_main_process:`, either branch), with autograd off (`with torch.no_grad():` or a
    function decorated `@torch.no_grad()`), is called as `accelerator.unwrap_model(model)(x)`; so is
    a model passed there to a function of this file that calls it (`evaluate(model, val_loader)`
    under the check becomes `evaluate(accelerator.unwrap_model(model), val_loader)`, when the call or
    the function runs without autograd).
    A value computed element by element with the batch's own values (`(ema.module(x).argmax(1) ==
    y)`, `net(x)[:, 1] - y`; not `@`) holds one value per sample whatever the other side is (a
    scalar broadcasts), so its sum is a sum over samples. When the other side is a call it cannot
    see into (a module it does not know is a model: a weight-averaged copy handed to the
    evaluation), the batch's inputs are gathered with the labels, and the call runs on every
    process's samples: the value each process computes is the one-process value.
    A loop over a loader that runs before the loader is prepared (a loop of the training function
    above the prepare point, or a function whose every call hands it the loader before that point:
    a baseline evaluation, teacher outputs collected before the student exists) sees the loader as
    built, all of it on every process: each process computes the one-process value, so it is left
    as it is, neither gathered nor reported. An evaluation function whose metric is gathered for
    its calls after the prepare point and that is also called before it, handed the loader
    (`print("before", evaluate(model, loader))` before the optimizer is built), gets a sharded copy
    there: `evaluate(model, accelerator.prepare_data_loader(loader))`. Each process evaluates its
    share and the gather counts every sample once, as in the later calls (over the loader as built
    it would count each sample N times); the loader itself is still prepared with the training
    objects.

Why:
    The prepared model's forward is DistributedDataParallel's on N processes, and it broadcasts the
    model's buffers (BatchNorm's running statistics) from the main process: a collective. Run by
    some processes only, it is answered by the others' next collective (the prepared loader's
    shuffle seed at the next epoch, the next step's gradients): gloo aborts with a collective
    mismatch, NCCL hangs. The unwrapped module computes the same outputs from this process's own
    parameters and buffers (the broadcast sends the main process's to the others: on the main
    process it changes nothing), without a collective.
    A prepared loader gives each process a share of the evaluation set; the gathered values cover
    all of it, exactly once (the padding that evens out the last batch is dropped), so
    `correct / len(loader.dataset)` stays right on any number of processes, and every process
    computes the same value (an LR plateau, early stop or best-model choice made from it agrees on
    every process). Gathering a 0-d loss instead would stack one value per process and break
    `.item()` on two processes only.

Example:
    for data, target in test_loader:
        output = model(data)
        +output, target = accelerator.gather_for_metrics((output, target))
        test_loss += F.nll_loss(output, target, reduction="sum").item()
        pred = output.argmax(dim=1)
        correct += pred.eq(target).sum().item()

Leaves alone (each reported unless no metric is recognised):
    - a call, made before the loader is prepared, that reaches an evaluation function whose
      metric is gathered for its calls after that point through another function of the file
      (`baseline(model, loader)` calling `evaluate(model, loader)` before the optimizer is built):
      there every process would evaluate all of the loader and the gather would count each sample
      N times (a count or sum N times the one-process value). Reported on that call, with the line
      to move it below (where the loader is prepared);
    - a loop that does not train over a prepared training iterator that is no DataLoader (a
      torchtext `BucketIterator`: each process gets every N-th of its batches, the last round
      completed with the epoch's first ones, which `gather_for_metrics` cannot tell apart):
      reported, metric or not, with an iterator of its own to evaluate over;
    - evaluation loops with no metric accumulation it recognises, or whose metric statements sit
      in nested blocks;
    - a metric that is not a sum over samples once computed from gathered batches: a sum of
      per-batch means (`test_loss += criterion(out, y).item()` with the default
      `reduction="mean"`), one value per batch (`losses.append(loss.item())`), a value from a
      function it cannot see into, or a loss the model returns itself; gathered, each batch holds
      the samples of N batches, so the sum would have N times fewer terms. Divided by the number of
      batches (`test_loss /= len(loader)`, a mean of per-batch values), the divisor shrinks by N as
      well once the loader is prepared, but the mean is over other batches: it equals the one-process
      value only when every batch is full and the per-batch value is a plain mean (not with a
      smaller last batch, nor for a PSNR of each batch), so it is not gathered either; prepared
      without a gather, each process would print the mean over its own batches. The report says
      which of the two it is;
    - a loop whose function divides by `len(loader)` (after prepare: the batches of one process;
      not a `len(loader)` passed as a keyword argument, a progress bar's `total=len(loader)`);
    - a value the metric computes from the gathered ones (`loss = criterion(out, y)` before
      `test_loss += loss.item()`) that the loop also reads for something else (a progress print):
      it would need one copy for the metric and one for this process;
    - loaders iterated by several loops not all of which it can convert;
    - a metric that reads a field of the loader's batch object (`for data in loader:` then
      `pred.eq(data.y)`: PyG's Batch, a collate function's own class): `gather_for_metrics`
      gathers tensors and tuples, lists and dicts of them, not such an object (the field itself,
      `accelerator.gather_for_metrics(data.y)`, can be);
    - an evaluation under a rank-0 check (`if args.rank == 0:`), or in a function called under a
      rank check (`if rank == 0: print(evaluate(model, test_loader))`): only the main process
      evaluates, over the whole loader, as before (gathering there would wait for processes that
      never come).
    Those loaders stay unprepared and keep their `.to(device)`: each process evaluates all of it
    (correct and the same on every process, only N times the work). The training loader cannot
    stay whole: a metric over it that is not gathered (any of the above, a loop over it outside
    `no_grad`, which may train through a call the tool cannot see, or a loop it shares with a test
    loader left unprepared) is reported, as it covers one process's share. The report says how to make
    the metric gatherable: `reduction="sum"` (divided by `len(loader.dataset)`), or a batch mean
    multiplied by the batch size.
    A prepared model called under a rank check with autograd on (a backward may follow, which no
    rewrite makes right on some processes only), in a script with mixed precision (`unwrap_model`
    would also drop the autocast the prepared model's forward runs under), under a sharding
    strategy (`--strategy fsdp`: the unwrapped module is still sharded, and its forward gathers its
    parameters from every process), or in a function that cannot reach the accelerator is
    reported, with the call to write instead.
    An evaluation loop over a loader that a function the migration cannot read builds
    (`train_dl, valid_dl = get_data(opts)` of a module not given) is not gathered (whether that
    loader gives each process a share is decided at run time; AM011 reduces a mean computed over
    it where it decides), and its forwards of the prepared model (`model(src, ...)` in
    `validate(model, valid_dl)`) become `accelerator.unwrap_model(model)(src, ...)`: such a loader
    may give the processes shares of different lengths (torch shards a DataLoader over a datapipe
    by itself: 9 samples as 5 and 4), and DDP's forward broadcasts the model's buffers, a
    collective each process must run as often as the others, so the process with more batches
    would wait forever. Unwrapped, the module computes the same outputs with no collective; under
    mixed precision or a sharding strategy, or where the accelerator cannot be reached, it is
    reported instead.

Fix safety:
    Safe on one process: gathering one process's values returns them unchanged, and nothing that
    is computed changes. On N processes the metrics equal the one-process ones up to float
    summation order. `accelerator.unwrap_model(model)(x)` under no_grad computes what the prepared
    model computes on that process (on one process the prepared model is the module itself).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import libcst as cst

from migrate.analysis import Loop, Scope
from migrate.edits import EditPlan
from migrate.names import call_argument, root_name, target_names
from migrate.roles import Roles
from migrate.positions import start_lines
from migrate.rules.base import accelerator_call, assignment, early_prepare, loader_calls, reference, runs_before_prepare
from migrate.walk import contains, walk

CODE = "AM010"
NAME = "gather-eval-metrics"

# Reductions that turn per-sample tensors into one value when called without a dimension.
_REDUCTIONS = frozenset({"sum", "mean", "max", "min", "prod", "std", "var", "norm", "all", "any", "median", "count_nonzero"})
_SCALAR_METHODS = frozenset({"item"})
_PASS_THROUGH = frozenset({"item", "detach", "cpu", "float", "double", "clone", "cuda", "to"})
_LOSS_NAME = re.compile(r"loss|criterion|cross_entropy|nll|mse|bce|kl_div|l1|hinge|huber", re.IGNORECASE)
_TORCH_REDUCTIONS = frozenset({"torch.sum", "torch.mean"})
_NOT_EXACT = "on N processes each gathered batch holds the samples of N batches, so there would be N times fewer terms"


@dataclass
class _Refusal:
    node: cst.CSTNode
    message: str


@dataclass
class _Line:
    index: int
    stmt: cst.SimpleStatementLine
    small: cst.BaseSmallStatement


@dataclass
class _Plan:
    insert_at: cst.BaseStatement
    names: list[str]
    wraps: list[cst.Call] = field(default_factory=list)
    # The names the gathered values are bound to, when not `names` themselves: the loop also uses
    # this process's values, so the metric reads the gathered ones under these (`renames`).
    targets: list[str] | None = None
    renames: dict[cst.Name, str] = field(default_factory=dict)


def apply(roles: Roles, plan: EditPlan) -> None:
    if roles.home is None or not roles.models or roles.home.prepared:
        return
    reported = _iterators_evaluated(roles, plan)
    _main_process_forwards(roles, plan)
    _unread_loader_forwards(roles, plan)
    # An evaluation function may be called with several loaders (`evaluate(model, train_loader)`
    # and `evaluate(model, val_loader)`): its loop is converted once, for all of them, or not at all.
    loops: dict[int, tuple[Scope, Loop, list[str]]] = {}
    early = early_prepare(roles, plan)
    # calls of an evaluation function that hand it its loader before the loader is prepared
    before_prepare: dict[int, list[cst.Call]] = {}
    for scope, loop, loader in roles.eval_loops:
        if loop.gathers or id(loop) in reported:  # reported: no gather can make it right
            continue
        if runs_before_prepare(roles, scope, loop, early):
            continue  # the loader as built, whole on every process: the same value everywhere, nothing to gather
        if scope is not roles.home and loop.source in scope.params:
            early_calls = loader_calls(roles, scope, loop.source, early)[0]
            if early_calls:
                before_prepare[id(loop)] = early_calls
        loops.setdefault(id(loop), (scope, loop, []))[2].append(loader)
    # prepared for training already: sharded whatever happens here (not those prepared on entry to
    # the training methods only: the instance keeps the user's loader for the others)
    training = set(roles.loaders) - roles.training_only_loaders
    refused: set[str] = set()  # evaluation loaders left unprepared: each process evaluates all of them
    planned: dict[int, _Plan] = {}
    for key, (scope, loop, loaders) in loops.items():
        found = _decide(roles, plan, scope, loop, loaders, training)
        if isinstance(found, _Plan):
            planned[key] = found
        else:
            refused.update(n for n in loaders if n not in training)
    changed = True
    while changed:  # a loader left unprepared by one loop cannot be gathered in another
        changed = False
        for key, found in list(planned.items()):
            scope, loop, loaders = loops[key]
            whole = sorted(n for n in loaders if n in refused)
            if not whole:
                continue
            del planned[key]
            changed = True
            refused.update(n for n in loaders if n not in training)
            for loader in loaders:
                if loader in training:
                    _report_sharded(plan, loop.node, loader, f"the same loop also evaluates `{whole[0]}`, which "
                                    "is left unprepared, and gathering it would count each of its samples N times")
    for key, found in planned.items():
        scope = loops[key][0]
        if found.names:
            targets = found.targets or found.names
            stmt = assignment(targets, "accelerator.gather_for_metrics", [_packed(found.names)], 0)
            plan.insert_before.setdefault(found.insert_at, []).append(stmt)
            plan.renames.update(found.renames)
            plan.change(CODE, found.insert_at, f"metric inputs {', '.join(found.names)} gathered across processes" + (
                f" into {', '.join(targets)} (the loop also uses this process's values)" if found.targets else ""))
        for call in found.wraps:
            plan.calls[call] = lambda updated: accelerator_call("gather_for_metrics", [cst.Arg(updated)])
            plan.change(CODE, call, "model outputs that feed a metric gathered across processes")
        if found.names or found.wraps:  # the accelerator only where an edit uses it
            plan.use_accelerator(scope)
            _before_prepare_calls(roles, plan, scope, loops[key][1], loops[key][2], before_prepare.get(key, []))
    for _, _, loaders in loops.values():
        for loader in loaders:
            if loader not in training and loader not in refused and loader not in plan.eval_loaders:
                plan.eval_loaders.append(loader)


def _decide(roles: Roles, plan: EditPlan, scope: Scope, loop: Loop, loaders: list[str], training: set[str]) -> _Plan | None:
    """The loop's gathers, or None: no metric it recognises, or one it cannot gather (reported;
    over the training loader, which stays sharded, the report says the metric covers one process)."""
    sharded = [n for n in loaders if n in training]
    whole = [n for n in loaders if n not in training]

    def refuse(node: cst.CSTNode, why: str) -> None:
        for loader in sharded:
            _report_sharded(plan, node, loader, why)
        if whole:
            names = ", ".join(f"`{n}`" for n in whole)
            plan.report(CODE, node, f"{why}; {names} {'was' if len(whole) == 1 else 'were'} left unprepared, so "
                        "each process evaluates all of it (correct, N times the work)")

    if not roles.can_reach(scope):
        for loader in sharded:
            _report_sharded(plan, loop.node, loader, "the accelerator cannot reach this function")
        return None
    if _on_rank_zero(loop) or _called_under_rank_check(roles, scope):
        # one process evaluates all of an evaluation loader, as before: nothing to gather
        for loader in sharded:
            _report_sharded(plan, loop.node, loader, "it runs under a rank-0 check, where a gather would wait "
                            "for processes that never join it")
        return None
    found = _Loop(roles, scope, loop).plan()
    if sharded and isinstance(found, _Plan) and not _without_grad(roles, scope, loop):
        found = _Refusal(loop.node, "it is not under `torch.no_grad()` or `torch.inference_mode()`, so it may "
                         "train through a call this tool cannot see into, and gathering its batches would train "
                         "every process on all of them")
    if isinstance(found, _Refusal):
        refuse(found.node, found.message)
        return None
    return found


def _iterators_evaluated(roles: Roles, plan: EditPlan) -> set[int]:
    """A loop that does not train over a prepared training iterator that is no DataLoader (a
    torchtext `BucketIterator`, AM004): each process gets every N-th of its batches, and the last
    round is completed with the epoch's first batches, which `gather_for_metrics` cannot tell apart:
    reported, with a loop of its own to evaluate over. Returns the ids of the loops reported, which
    the gathering below leaves alone."""
    home = roles.home
    assert home is not None
    reported: set[int] = set()
    if not roles.iterable_loaders or plan.target == "accelerate":
        return reported
    for scope in roles.facts.scopes:
        for loop in scope.loops:
            if loop.source is None or roles.is_training_loop(loop):
                continue
            found = roles.origins(scope, loop.source) or set()
            names = sorted(n for s, n in found if s is home and n in roles.iterable_loaders)
            if not names:
                continue
            plan.report(CODE, loop.node, (
                f"this loop iterates the training iterator `{names[0]}` outside training: prepared, it gives each "
                "process every N-th of its batches (and, to end an epoch evenly, some of its first batches again), so "
                "what the loop computes covers one process's share, and `gather_for_metrics` cannot drop the repeated "
                "batches of a source that is no DataLoader. Evaluate over an iterator of its own, built the same way "
                "and not prepared (whole on every process), or over a torch.utils.data.DataLoader"), unconverted=True)
            reported.add(id(loop))
    return reported


def _report_sharded(plan: EditPlan, node: cst.CSTNode, loader: str, why: str) -> None:
    """A metric over the training loader that is not gathered: prepared for training, the loader
    gives each process its share, so the metric would cover one process's samples."""
    plan.report(CODE, node, (
        f"this loop evaluates over the training loader `{loader}`, which is prepared and so gives each process "
        f"its share of the data, but its metric is not gathered ({why}): on N processes the value covers one "
        "process's samples. Gather the per-sample values with `accelerator.gather_for_metrics(...)` before "
        "the metric, or evaluate over a loader of its own"), unconverted=True)


def _before_prepare_calls(
    roles: Roles, plan: EditPlan, function: Scope, loop: Loop, loaders: list[str], calls: list[cst.Call],
) -> None:
    """Calls of an evaluation function whose metric is now gathered, made before its loader is
    prepared (a baseline evaluation before the optimizer is built): there the loader is the one the
    script built, all of it on every process, and the gather would stack N copies of every sample.
    A call that hands the function the loader itself gets `accelerator.prepare_data_loader(loader)`
    instead (a sharded copy: each process evaluates its share, and the gather covers every sample
    once; the loader itself is prepared later, with the training objects); any other is reported."""
    if not calls or roles.prepare_after is None or loop.source is None:
        return
    point = roles.prepare_after.stmt
    line = start_lines(roles.facts.module, [point])[point]
    names = ", ".join(f"`{n}`" for n in loaders)
    param = loop.source
    index = function.params.index(param) - (1 if function.is_method else 0)
    for call in calls:
        arg = call_argument(call, index, param) if index >= 0 and roles.facts.function_called(call) is function else None
        if isinstance(arg, cst.Name) and call not in plan.calls:
            plan.calls[call] = lambda updated, arg=arg, index=index: _shard_argument(updated, arg, index, param)
            plan.change(CODE, call, (
                f"`{arg.value}` is handed to `{function.name}` before it is prepared (all of it on every process), "
                f"and `{function.name}` gathers its metric: it evaluates over a prepared copy "
                f"(`accelerator.prepare_data_loader({arg.value})`), each process its share, so the gather counts "
                "every sample once"))
            continue
        plan.report(CODE, call, (
            f"`{_code(call)}` runs before the prepare call, over {names} as built (all of it on every process), "
            f"but `{function.name}` gathers its metric inputs across processes for its calls after the prepare call "
            "(where each process evaluates its share): here it would count each sample N times on N processes (a "
            "count or a sum N times the one-process value, a ratio of two unchanged). Move the statement that makes "
            f"this call (with the lines that read its result) below `{_code(point)}` (line {line}), where the "
            "migration prepares the loader, so that it evaluates each process's share and its gathered metric "
            "covers every sample once"), unconverted=True)


def _shard_argument(call: cst.Call, original: cst.Name, index: int, param: str) -> cst.Call:
    """`call` with the argument that passes `original` wrapped in `accelerator.prepare_data_loader(...)`."""
    args = list(call.args)
    positional = 0
    for i, arg in enumerate(args):
        matches = (arg.keyword is None and positional == index) or (arg.keyword is not None and arg.keyword.value == param)
        if arg.keyword is None:
            positional += 1
        if matches and isinstance(arg.value, cst.Name) and arg.value.value == original.value:
            args[i] = arg.with_changes(value=accelerator_call("prepare_data_loader", [cst.Arg(arg.value)]))
            return call.with_changes(args=args)
    return call


def _packed(names: list[str]) -> str:
    return f"({', '.join(names)})" if len(names) > 1 else names[0]


_NO_GRAD = frozenset({"torch.no_grad", "torch.inference_mode"})
# Attributes of a tensor (not fields of a batch object): `x.shape[0]`, `x.T`.
_TENSOR_FIELDS = frozenset({"shape", "T", "mT", "H", "data", "device", "dtype", "ndim", "real", "imag", "grad", "is_cuda"})


def _without_grad(roles: Roles, scope: Scope, loop: Loop) -> bool:
    """The loop runs with autograd off: inside `with torch.no_grad():`, with its whole body in one,
    or in a function decorated `@torch.no_grad()`; so it evaluates and trains nothing."""
    def no_grad(expr: cst.BaseExpression) -> bool:
        func = expr.func if isinstance(expr, cst.Call) else expr
        return roles.facts.aliases.qualify(func) in _NO_GRAD

    def within(stmt: cst.CSTNode) -> bool:
        return isinstance(stmt, cst.With) and any(no_grad(item.item) for item in stmt.items)

    body = loop.node.body.body if isinstance(loop.node.body, cst.IndentedBlock) else ()
    if any(within(ref.stmt) for ref in loop.where.path) or (len(body) == 1 and within(body[0])):
        return True
    function = scope.node
    if isinstance(function, cst.FunctionDef) and any(no_grad(d.decorator) for d in function.decorators):
        return True
    return _trains_nothing(roles, scope, loop, within)


_TRAINING_METHODS = frozenset({"backward", "step", "zero_grad"})
# Methods of a model that train nothing (any other method of it may: `model.fit_step(x)`).
_MODEL_METHODS = frozenset({"eval", "train", "forward", "parameters", "named_parameters", "state_dict", "to", "cuda", "cpu"})


def _trains_nothing(roles: Roles, scope: Scope, loop: Loop, within: Callable[[cst.CSTNode], bool]) -> bool:
    """The loop calls the model only inside `with torch.no_grad():` blocks of its own body
    (`with torch.no_grad(): logits = model(x)`, then the metric from `logits`), and nothing in it
    can train: no `backward`, `step` or `zero_grad`, no optimizer, no function of this script
    (which may train through names the loop does not show), and no other call handed the model."""
    found = {"unsafe": False}
    optimizers = set(roles.optimizers)

    class Visitor(cst.CSTVisitor):
        depth = 0

        def visit_With(self, node: cst.With) -> None:
            if within(node):
                self.depth += 1

        def leave_With(self, original_node: cst.With) -> None:
            if within(original_node):
                self.depth -= 1

        def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
            found["unsafe"] = True
            return False

        def visit_Lambda(self, node: cst.Lambda) -> bool:
            found["unsafe"] = True
            return False

        def visit_Name(self, node: cst.Name) -> None:
            if node.value in optimizers:
                found["unsafe"] = True

        def visit_Call(self, node: cst.Call) -> None:
            func = node.func
            ref = reference(func)
            if ref is not None and roles.all_in(scope, ref, roles.models):
                found["unsafe"] = found["unsafe"] or self.depth == 0
            elif isinstance(func, cst.Attribute) and func.attr.value in _TRAINING_METHODS:
                found["unsafe"] = True
            elif isinstance(func, cst.Attribute) and func.attr.value not in _MODEL_METHODS and _is_model_root(func.value):
                found["unsafe"] = True  # a method of the model (`model.fit_step(x)`) may train it
            elif roles.facts.function_called(node) is not None:
                found["unsafe"] = True
            else:
                # another library's function or a loss object: handed the model, it may train it
                for arg in node.args:
                    root = root_name(arg.value)
                    if root is not None and roles.all_in(scope, root, roles.models):
                        found["unsafe"] = True

    def _is_model_root(expr: cst.BaseExpression) -> bool:
        root = root_name(expr)
        return root is not None and roles.all_in(scope, root, roles.models)

    walk(loop.node.body, Visitor())
    return not found["unsafe"]


def _on_rank_zero(loop: Loop) -> bool:
    """The loop runs under `if <rank> == 0:` (`args.rank`, `rank`, `dist.get_rank()`): only the
    main process evaluates, so its loader stays whole and nothing is gathered (a gather that
    the other processes never join would hang)."""
    for ref in loop.where.path:
        test = ref.stmt.test if isinstance(ref.stmt, cst.If) else None
        if not (isinstance(test, cst.Comparison) and len(test.comparisons) == 1):
            continue
        target = test.comparisons[0]
        if not (isinstance(target.operator, cst.Equal) and isinstance(target.comparator, cst.Integer)):
            continue
        if target.comparator.value == "0" and re.search(r"(^|[._])rank\b", _code(test.left)):
            return True
    return False


def _called_under_rank_check(roles: Roles, function: Scope) -> bool:
    """A call of `function` (`evaluate(model, test_loader)`) sits under an `if` on the rank (`if
    rank == 0:`, `if accelerator.is_main_process:`, either branch): some processes evaluate and
    the others do not, so a gather inside it would wait for processes that never join it."""
    if not function.is_function:
        return False
    for scope in roles.facts.scopes:
        for site in scope.calls:
            if roles.runs(site.callee, scope) is function and any(
                    isinstance(ref.stmt, cst.If) and _rank_test(ref.stmt.test) for ref in site.where.path):
                return True
    return False


class _Loop:
    """One evaluation loop: its straight-line statements, what binds each name, and its metrics."""

    def __init__(self, roles: Roles, scope: Scope, loop: Loop) -> None:
        self.roles = roles
        self.scope = scope
        self.loop = loop
        self.lines: list[_Line] = []
        self.opaque: set[str] = set()  # names bound in nested blocks: their kind is not known
        self.compounds: list[tuple[int, cst.BaseStatement]] = []  # nested blocks, by the line they precede
        self.nested_metrics: list[cst.CSTNode] = []
        self.leaves: dict[str, int] = {}  # per-sample name -> index of the line that binds it
        self.derived: dict[str, tuple[int, cst.BaseExpression]] = {}  # per-sample values computed in the loop
        self.wraps: list[cst.Call] = []
        self.recomputed: set[int] = set()  # lines that will run on gathered values
        self.refusal: _Refusal | None = None

    # -- structure ----------------------------------------------------------------------

    def _flatten(self, body: cst.BaseSuite) -> None:
        if not isinstance(body, cst.IndentedBlock):
            return
        for stmt in body.body:
            if isinstance(stmt, cst.SimpleStatementLine):
                for small in stmt.body:
                    self.lines.append(_Line(len(self.lines), stmt, small))
            elif isinstance(stmt, cst.With):
                self._flatten(stmt.body)
            else:
                self.compounds.append((len(self.lines), stmt))
                self.opaque.update(_bound_in(stmt))
                self.nested_metrics.extend(_metric_nodes(stmt))

    def _binding(self, name: str, before: int) -> _Line | None:
        """The last line before `before` that binds `name`."""
        for line in reversed(self.lines[:before]):
            if name in _assigned(line.small):
                return line
        return None

    # -- the plan -------------------------------------------------------------------------

    def plan(self) -> _Plan | _Refusal | None:
        self._flatten(self.loop.node.body)
        metrics = [
            (line, kind, values)
            for line in self.lines
            for kind, values in [_metric(line.small)]
            if kind and not (kind == "weighted" and not self._count(values[1], line.index))
        ]
        if self.nested_metrics:
            return None  # accumulated under a condition: not something it can place a gather for
        if not metrics:
            return None
        for line, kind, values in metrics:
            refusal = self._check_metric(line, kind, values)
            if refusal is not None:
                return refusal
        if self.refusal is not None:
            return self.refusal
        divisor = self._loader_length()
        if divisor is not None:
            return _Refusal(
                divisor,
                f"`len({self.loop.source})` is the number of batches of one process once the loader is "
                f"prepared, while the gathered metrics cover all processes; divide by `len({self.loop.source}.dataset)` "
                "(the number of samples)",
            )
        while True:
            # A per-sample value computed after the gather point is computed from gathered inputs.
            first = min([line.index for line, _, _ in metrics] + sorted(self.recomputed))
            late = [name for name, (index, _) in self.derived.items() if index >= first]
            if not late:
                break
            for name in late:
                index, value = self.derived.pop(name)
                self.recomputed.add(index)
                self._trace(value, index)
        if self.refusal is not None:
            return self.refusal
        for name, (index, _) in self.derived.items():
            self.leaves.setdefault(name, index)
        if any(index >= first for index in self.leaves.values()):
            late_name = next(name for name, index in self.leaves.items() if index >= first)
            return _Refusal(self.lines[first].stmt, f"`{late_name}` is bound after the metric that reads it starts")
        field_read = self._batch_field(first, {line.index for line, _, _ in metrics})
        if field_read is not None:
            name, node = field_read
            return _Refusal(node, (
                f"the metric reads `{_code(node)}`, a field of the batch object `{name}` the loader yields "
                "(not a tensor, nor a tuple, list or dict of tensors), which `accelerator.gather_for_metrics` "
                f"cannot gather whole (the field can be: `accelerator.gather_for_metrics({_code(node)})`, with "
                "the model's outputs)"))
        found = _Plan(insert_at=self.lines[first].stmt, names=list(self.leaves), wraps=self.wraps)
        separated = self._separate(found, first, {line.index for line, _, _ in metrics})
        return separated if separated is not None else found

    def _batch_field(self, first: int, metric_lines: set[int]) -> tuple[str, cst.Attribute] | None:
        """A gathered name that is the loader's whole batch (`for data in loader`), read by the
        metric through a field (`data.y`, PyG's Batch or a collate function's own class): the gather
        would get an object it cannot gather as tensors. Tensor attributes (`x.shape`) do not count."""
        target = self.loop.node.target
        if type(target) is not cst.Name or target.value not in self.leaves:
            return None
        name = target.value
        metric = metric_lines | {i for i in self.recomputed if i >= first}
        found: list[cst.Attribute] = []
        wrapped = set(self.wraps)

        class Visitor(cst.CSTVisitor):
            def visit_Call(self, node: cst.Call) -> bool:
                if node in wrapped:
                    return False  # the model's inputs: its outputs are what is gathered
                # `data.y.sum()`: `data.y` is read; `data.to(device)` is a method call, not a field
                walk(node.func.value if type(node.func) is cst.Attribute else node.func, self)
                for arg in node.args:
                    walk(arg, self)
                return False

            def visit_Attribute(self, node: cst.Attribute) -> bool:
                if type(node.value) is cst.Name and node.value.value == name and node.attr.value not in _TENSOR_FIELDS:
                    found.append(node)
                return True

        visitor = Visitor()
        for line in self.lines[first:]:
            if line.index in metric:
                walk(line.small, visitor)
        return (name, found[0]) if found else None

    # -- the gathered values and this process's ------------------------------------------

    def _separate(self, found: _Plan, first: int, metric_lines: set[int]) -> _Refusal | None:
        """Rebinding the gathered names in place is right only when nothing but the metric reads
        them after the gather (`if i == 0: save(x[:8])` would see N processes' samples, and a
        `view(batch_size, ...)` would fail). Otherwise the gathered values get new names that only
        the metric's lines read (recorded in `found`); a value the metric computes from them that
        something else reads too cannot be split that way: refused. None: nothing to refuse."""
        metric = metric_lines | {i for i in self.recomputed if i >= first}
        gathered = set(found.names)
        computed = {name: line for line in self.lines[first:] if line.index in metric for name in _assigned(line.small)}
        tainted = gathered | set(computed)
        others: list[tuple[str, cst.CSTNode]] = []  # (name, the statement that reads it)
        wrapped = set(self.wraps)
        for line in self.lines[first:]:
            if line.index in metric:
                # a model call wrapped in place runs on this process's inputs
                reads = [n for call in _calls_in(line.small, wrapped) for n in _read_names(call.args)]
            else:
                reads = _read_names([line.small])
            others.extend((n.value, line.small) for n in reads if n.value in tainted)
        for position, stmt in self.compounds:
            if position > first:
                others.extend((name, node) for name, node in _readers(stmt) if name in tainted)
        others.extend((name, node) for name, node in _read_after(self.scope.node, self.loop.node, tainted))
        if not others:
            return None
        for name, node in others:
            if name in computed:
                return _Refusal(node, (
                    f"`{name}` is computed for the metric (`{_code(computed[name].small)}`), which would "
                    f"read the values gathered from every process, and is also read by `{_code(node)}`, "
                    "which needs this process's values; gather the inputs under new names "
                    f"(`{', '.join('gathered_' + n for n in found.names)} = accelerator.gather_for_metrics"
                    f"({_packed(found.names)})`) and compute the metric's own copy of `{name}` from them"))
        rebound = sorted(gathered & set(computed))
        if rebound:
            return _Refusal(computed[rebound[0]].small, (
                f"`{rebound[0]}` is gathered for the metric and rebound by `{_code(computed[rebound[0]].small)}`, "
                "while the rest of the loop reads this process's values; compute the metric from a name "
                f"of its own (not `{rebound[0]}`)"))
        taken = _names_in(self.scope.node)
        fresh: dict[str, str] = {}
        for name in found.names:
            new = f"gathered_{name}"
            suffix = 1
            while new in taken:
                new, suffix = f"gathered_{name}_{suffix}", suffix + 1
            taken.add(new)
            fresh[name] = new
        found.targets = [fresh[name] for name in found.names]
        for line in self.lines[first:]:
            if line.index in metric:
                for node in _read_names([line.small], skip=wrapped):
                    if node.value in fresh:
                        found.renames[node] = fresh[node.value]
        return None

    def _check_metric(self, line: _Line, kind: str, values: list[cst.BaseExpression]) -> _Refusal | None:
        text = _code(line.small)
        if kind == "collect":
            for value in values:
                if self._scalar(value, line.index):
                    return _Refusal(line.stmt, f"`{text}` collects one value per batch; {_NOT_EXACT}: collect "
                                    "per-sample values (e.g. `reduction=\"none\"`) instead")
                self._trace(value, line.index)
            return None
        if kind == "weighted":
            value, count = values
            self._trace(value, line.index)
            self._trace(count, line.index)
            return None
        value = values[0]
        if self._scalar(value, line.index) and not self._additive(value, line.index, self.scope, 0):
            return _Refusal(line.stmt, self._batch_values(line))
        self._trace(value, line.index)
        return None

    # -- tracing back to per-sample values -----------------------------------------------

    def _trace(self, expr: cst.BaseExpression, at: int) -> None:
        """Record the per-sample names and model calls `expr` (evaluated at line `at`) reads."""
        for node in _reads(expr, self._is_model):
            if isinstance(node, cst.Call):
                self.wraps.append(node)
                continue
            name = node.value
            if name in self.opaque:
                self.refusal = self.refusal or _Refusal(self.loop.node, f"`{name}` is bound in a nested block of the loop")
                continue
            binding = self._binding(name, at)
            if binding is None:
                if name in self.loop.batch_names:
                    self.leaves.setdefault(name, -1)
                continue
            value = _assigned_value(binding.small, name)
            if value is None:
                continue
            if self._is_model_output(value) or (name in self.loop.batch_names and not self._scalar_expr(value, binding.index)):
                self.leaves[name] = max(self.leaves.get(name, -1), binding.index)
            elif self._scalar_expr(value, binding.index) or _calls_model(self.roles, self.scope, value):
                self.recomputed.add(binding.index)
                self._trace(value, binding.index)
            else:
                self.derived[name] = (binding.index, value)

    def _is_model_output(self, value: cst.BaseExpression) -> bool:
        """`model(x)`, `model(x).squeeze()`, `model(x)[0]`: a model's per-sample outputs."""
        inner = value
        while True:
            if isinstance(inner, cst.Call) and self._is_model(inner.func):
                return True
            if isinstance(inner, cst.Call) and isinstance(inner.func, cst.Attribute):
                if inner.func.attr.value in _REDUCTIONS | _SCALAR_METHODS:
                    return False
                inner = inner.func.value
            elif isinstance(inner, (cst.Subscript, cst.Attribute)):
                inner = inner.value
            else:
                return False

    def _is_model(self, func: cst.BaseExpression) -> bool:
        ref = reference(func)
        return ref is not None and self.roles.all_in(self.scope, ref, self.roles.models)

    # -- what kind of value -------------------------------------------------------------

    def _scalar(self, expr: cst.BaseExpression, at: int) -> bool:
        return self._scalar_expr(expr, at)

    def _scalar_expr(self, expr: cst.BaseExpression, at: int, depth: int = 0) -> bool:
        """One value per batch (not per sample): a reduction, a loss, `.item()`, an unknown function."""
        if depth > 20:
            return True
        if isinstance(expr, cst.Call):
            func = expr.func
            if self._is_model(func):
                return False
            qualified = self.roles.facts.aliases.qualify(func)
            if qualified in _TORCH_REDUCTIONS and not _has_dim(expr, positional_from=1):
                return True
            if isinstance(func, cst.Attribute):
                method = func.attr.value
                if method in _SCALAR_METHODS or (method in _REDUCTIONS and not _has_dim(expr, positional_from=0)):
                    return True
                if qualified is None and not _is_loss_name(method):
                    return self._scalar_expr(func.value, at, depth + 1)
            if _is_loss_call(expr):
                return not _reduction_is(expr, "none")
            if qualified is not None and qualified.startswith("torch."):
                return any(self._scalar_expr(a.value, at, depth + 1) for a in expr.args)
            if isinstance(func, cst.Name) and func.value in ("float", "int"):
                return True
            return True  # a function of this script or a library: it may reduce
        if isinstance(expr, cst.Name):
            if _is_loss_name(expr.value):
                return True
            binding = self._binding(expr.value, at)
            if binding is None:
                return False
            value = _assigned_value(binding.small, expr.value)
            return value is not None and self._scalar_expr(value, binding.index, depth + 1)
        if isinstance(expr, cst.Attribute) and _is_loss_name(expr.attr.value):
            return True  # `outputs.loss`: the model computed the batch's loss itself
        if isinstance(expr, (cst.Attribute, cst.Subscript)):
            return self._scalar_expr(expr.value, at, depth + 1)
        if isinstance(expr, (cst.BinaryOperation, cst.Comparison)):
            operands = [expr.left, expr.right] if isinstance(expr, cst.BinaryOperation) else [
                expr.left, *[c.comparator for c in expr.comparisons]
            ]
            if not isinstance(getattr(expr, "operator", None), cst.MatrixMultiply) and any(
                    self._per_sample(o, at, depth + 1) for o in operands):
                # element by element with a batch's own values (`(f(x).argmax(1) == y)`, `out - y`):
                # one value per sample, whatever the other side is (a scalar broadcasts)
                return False
            return any(self._scalar_expr(o, at, depth + 1) for o in operands)
        if isinstance(expr, cst.UnaryOperation):
            return self._scalar_expr(expr.expression, at, depth + 1)
        return False

    def _per_sample(self, expr: cst.BaseExpression, at: int, depth: int = 0) -> bool:
        """Known to hold one value per sample: a value of the batch (`y`, `y.to(device)`,
        `batch["label"]`), or a model's output, bound in the loop or drawn from its loader."""
        if depth > 20:
            return False
        if self._is_model_output(expr):
            return True
        if isinstance(expr, cst.Call) and isinstance(expr.func, cst.Attribute) and expr.func.attr.value in (
                "to", "cuda", "float", "long", "int", "double", "half", "detach", "cpu", "view_as", "squeeze"):
            return self._per_sample(expr.func.value, at, depth + 1)
        if isinstance(expr, cst.Subscript) and isinstance(expr.value, cst.Name):
            return self._per_sample(expr.value, at, depth + 1)  # `batch["label"]`
        if isinstance(expr, cst.Name):
            binding = self._binding(expr.value, at)
            if binding is None:
                return expr.value in self.loop.batch_names and expr.value not in self.opaque
            value = _assigned_value(binding.small, expr.value)
            return value is not None and self._per_sample(value, binding.index, depth + 1)
        return False

    def _count(self, expr: cst.BaseExpression, at: int) -> bool:
        """`x.size(0)`, `x.shape[0]`, `len(x)`: the number of samples of a batch."""
        if isinstance(expr, cst.Call):
            func = expr.func
            if isinstance(func, cst.Name) and func.value == "len" and len(expr.args) == 1:
                return not self._scalar_expr(expr.args[0].value, at)
            if isinstance(func, cst.Attribute) and func.attr.value == "size" and len(expr.args) == 1:
                arg = expr.args[0].value
                return isinstance(arg, cst.Integer) and arg.value == "0"
            return False
        if isinstance(expr, cst.Subscript) and isinstance(expr.value, cst.Attribute) and expr.value.attr.value == "shape":
            index = expr.slice[0].slice
            return isinstance(index, cst.Index) and isinstance(index.value, cst.Integer) and index.value.value == "0"
        if isinstance(expr, cst.Name):
            binding = self._binding(expr.value, at)
            value = _assigned_value(binding.small, expr.value) if binding is not None else None
            return value is not None and self._count(value, binding.index)  # type: ignore[union-attr]
        return False

    def _additive(self, expr: cst.BaseExpression, at: int, scope: Scope, depth: int) -> bool:
        """A sum over the samples it is computed from: adding it up per gathered batch is exact."""
        if depth > 20:
            return False
        if self._count(expr, at) and scope is self.scope:
            return True
        if isinstance(expr, (cst.Integer, cst.Float)):
            return False
        if isinstance(expr, cst.Call):
            func = expr.func
            if isinstance(func, cst.Name) and func.value in ("float", "int") and len(expr.args) == 1:
                return self._additive(expr.args[0].value, at, scope, depth + 1)
            if isinstance(func, cst.Attribute) and func.attr.value in _PASS_THROUGH:
                return self._additive(func.value, at, scope, depth + 1)
            if isinstance(func, cst.Attribute) and func.attr.value == "sum" and not _has_dim(expr, positional_from=0):
                return not self._scalar_in(func.value, at, scope)
            qualified = self.roles.facts.aliases.qualify(func)
            if qualified == "torch.sum" and expr.args and not _has_dim(expr, positional_from=1):
                return not self._scalar_in(expr.args[0].value, at, scope)
            helper = self.roles.facts.function_called(expr)
            if helper is not None and not helper.is_method:
                return bool(helper.returns) and all(
                    self._additive(r, 1 << 30, helper, depth + 1) for r in helper.returns
                )
            if _is_loss_call(expr):
                return _reduction_is(expr, "sum") or self._criterion_sums(expr.func, scope)
            return False
        if isinstance(expr, cst.BinaryOperation):
            if isinstance(expr.operator, (cst.Add, cst.Subtract)):
                return self._additive(expr.left, at, scope, depth + 1) and self._additive(expr.right, at, scope, depth + 1)
            if isinstance(expr.operator, cst.Multiply):
                for one, other in ((expr.left, expr.right), (expr.right, expr.left)):
                    if _is_constant(other) and self._additive(one, at, scope, depth + 1):
                        return True
                    if scope is self.scope and self._count(other, at) and self._scalar_expr(one, at):
                        return True  # a batch mean times the batch size
            return False
        if isinstance(expr, cst.UnaryOperation) and isinstance(expr.operator, cst.Minus):
            return self._additive(expr.expression, at, scope, depth + 1)
        if isinstance(expr, cst.Name):
            value = self._value_in(expr.value, at, scope)
            return value is not None and self._additive(value[0], value[1], scope, depth + 1)
        return False

    def _value_in(self, name: str, at: int, scope: Scope) -> tuple[cst.BaseExpression, int] | None:
        if scope is self.scope:
            binding = self._binding(name, at)
            if binding is None:
                return None
            value = _assigned_value(binding.small, name)
            return (value, binding.index) if value is not None else None
        bindings = [b for b in scope.bindings.get(name, []) if b.value is not None]
        return (bindings[-1].value, 1 << 30) if len(bindings) == 1 else None  # type: ignore[return-value]

    def _scalar_in(self, expr: cst.BaseExpression, at: int, scope: Scope) -> bool:
        if scope is self.scope:
            return self._scalar_expr(expr, at)
        return _is_loss_call(expr) if isinstance(expr, cst.Call) else False

    def _criterion_sums(self, func: cst.BaseExpression, scope: Scope) -> bool:
        """`criterion(out, y)` where `criterion = nn.XLoss(reduction="sum")`."""
        if not isinstance(func, cst.Name):
            return False
        found = self.roles.origins(scope, func.value)
        if not found:
            return False
        for origin_scope, name in found:
            values = [b.value for b in origin_scope.bindings.get(name, [])]
            if not values or not all(isinstance(v, cst.Call) and _reduction_is(v, "sum") for v in values):
                return False
        return True

    def _batch_values(self, line: _Line) -> str:
        """Why a sum of one value per batch (a batch mean, a PSNR) is not gathered: what it would
        be on N processes, gathered or not, and what to write for an exact sharded evaluation."""
        text = _code(line.small)
        source = self.loop.source
        target = line.small.target if isinstance(line.small, cst.AugAssign) else None
        accumulator = _code(target) if target is not None else "the sum"
        exact = (
            "For an exact sharded evaluation, sum the values the batch mean averages (`reduction=\"sum\"`, or the "
            "batch mean times how many values it averages: the batch size, or the non-padding tokens of a loss with "
            f"`ignore_index`) and divide by how many there are in all (`len({source}.dataset)` for samples; the "
            "tokens counted the same way, summed over processes with `accelerator.reduce`)"
        )
        head = f"`{text}` adds one value per batch that is not a sum over its samples (a batch mean, or a function it cannot see into)"
        divisor = self._batch_count_divisor(accumulator)
        if divisor is not None:
            return (
                f"{head}, and `{_code(divisor)}` divides `{accumulator}` by the number of batches: a mean of "
                f"per-batch values. Prepared and gathered, each batch would hold the samples of N batches and "
                f"`len({source})` would be N times smaller too, so it would still be a mean over batches, but "
                "over other batches: the one-process value only if every batch is full and the per-batch value is "
                "a plain mean (a smaller last batch, or a function such as a PSNR of the batch, changes it). "
                "Prepared and not gathered, each process would compute the mean over its own batches only, "
                f"a different value on each. {exact}"
            )
        return (
            f"{head}. Prepared and gathered, each batch would hold the samples of N batches, so `{accumulator}` "
            "would add N times fewer terms, each over N times as many samples; prepared and not gathered, each "
            f"process would add up its own batches only. {exact}"
        )

    def _batch_count_divisor(self, accumulator: str) -> cst.CSTNode | None:
        """`acc / len(loader)` or `acc /= n` with `n = len(loader)` in the loop's function: the
        division of the accumulated per-batch values by the number of batches."""
        source = self.loop.source
        scope = self.scope

        def is_count(expr: cst.BaseExpression) -> bool:
            if (
                isinstance(expr, cst.Call)
                and isinstance(expr.func, cst.Name)
                and expr.func.value == "len"
                and len(expr.args) == 1
                and reference(expr.args[0].value) == source
            ):
                return True
            if isinstance(expr, cst.Name):
                values = [b.value for b in scope.bindings.get(expr.value, [])]
                return bool(values) and all(v is not None and is_count(v) for v in values)
            return False

        found: list[cst.CSTNode] = []
        scope_node = scope.node

        class Visitor(cst.CSTVisitor):
            def visit_BinaryOperation(self, node: cst.BinaryOperation) -> None:
                if isinstance(node.operator, cst.Divide) and _code(node.left) == accumulator and is_count(node.right):
                    found.append(node)

            def visit_AugAssign(self, node: cst.AugAssign) -> None:
                if isinstance(node.operator, cst.DivideAssign) and _code(node.target) == accumulator and is_count(node.value):
                    found.append(node)

            def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
                return node is scope_node

        walk(scope_node, Visitor())
        return found[0] if found else None

    def _loader_length(self) -> cst.CSTNode | None:
        """A `len(loader)` of this loop's loader anywhere in its function; not one passed as a
        keyword argument (`tqdm(loader, total=len(loader))`: a progress bar's length, no divisor)."""
        source = self.loop.source
        found: list[cst.CSTNode] = []
        keyword_values: set[int] = set()

        class Visitor(cst.CSTVisitor):
            def visit_Arg(self, node: cst.Arg) -> None:
                if node.keyword is not None:
                    keyword_values.add(id(node.value))

            def visit_Call(self, node: cst.Call) -> None:
                if id(node) in keyword_values:
                    return
                if (
                    isinstance(node.func, cst.Name)
                    and node.func.value == "len"
                    and len(node.args) == 1
                    and reference(node.args[0].value) == source
                ):
                    found.append(node)

            def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
                return node is scope_node

        scope_node = self.scope.node
        walk(scope_node, Visitor())
        return found[0] if found else None


# -- small helpers ----------------------------------------------------------------------------


def _metric(small: cst.BaseSmallStatement) -> tuple[str, list[cst.BaseExpression]]:
    """("sum", [value]) for `acc += value`, ("collect", args) for `acc.append(x)` / `.extend(x)` /
    `metric.add_batch(...)`, ("weighted", [value, count]) for `meter.update(value, count)`."""
    if isinstance(small, cst.AugAssign) and isinstance(small.operator, cst.AddAssign):
        return "sum", [small.value]
    if isinstance(small, cst.Expr) and isinstance(small.value, cst.Call):
        call = small.value
        func = call.func
        if isinstance(func, cst.Attribute):
            method = func.attr.value
            if method in ("append", "extend") and len(call.args) == 1:
                return "collect", [call.args[0].value]
            if method == "add_batch" and call.args:
                return "collect", [a.value for a in call.args]
            if method == "update" and len(call.args) == 2 and not any(a.keyword for a in call.args):
                return "weighted", [call.args[0].value, call.args[1].value]
    return "", []


def _metric_nodes(stmt: cst.BaseStatement) -> list[cst.CSTNode]:
    found: list[cst.CSTNode] = []

    class Visitor(cst.CSTVisitor):
        def visit_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> None:
            found.extend(small for small in node.body if _metric(small)[0])

    walk(stmt, Visitor())
    return found


def _assigned(small: cst.BaseSmallStatement) -> list[str]:
    if isinstance(small, cst.Assign):
        return [n for t in small.targets for n in target_names(t.target)]
    if isinstance(small, cst.AnnAssign):
        return target_names(small.target)
    return []


def _assigned_value(small: cst.BaseSmallStatement, name: str) -> cst.BaseExpression | None:
    """What `name` is bound to: the value, or its element for `a, b = x, y`; a tuple target
    unpacking one call (`_, pred = torch.max(out, 1)`) gives the call."""
    if isinstance(small, cst.AnnAssign):
        return small.value
    if not isinstance(small, cst.Assign):
        return None
    for target in small.targets:
        node = target.target
        if isinstance(node, cst.Name) and node.value == name:
            return small.value
        if isinstance(node, (cst.Tuple, cst.List)):
            names = [e.value.value if isinstance(e.value, cst.Name) else None for e in node.elements]
            if name not in names:
                continue
            value = small.value
            if isinstance(value, (cst.Tuple, cst.List)) and len(value.elements) == len(names):
                return value.elements[names.index(name)].value
            return value
    return None


def _reads(expr: cst.BaseExpression, is_model: Callable[[cst.BaseExpression], bool]) -> list[cst.Name | cst.Call]:
    """Names read in `expr` (not attribute names), in first-seen order, and the model calls in it
    (whose arguments are then not looked into: the call's output is what gets gathered)."""
    found: list[cst.Name | cst.Call] = []

    class Visitor(cst.CSTVisitor):
        def visit_Name(self, node: cst.Name) -> None:
            found.append(node)

        def visit_Attribute(self, node: cst.Attribute) -> bool:
            walk(node.value, self)
            return False

        def visit_Call(self, node: cst.Call) -> bool:
            if is_model(node.func):
                found.append(node)
                return False
            return True

    walk(expr, Visitor())
    return found


def _read_names(nodes: Sequence[cst.CSTNode], skip: set[cst.Call] | frozenset[cst.Call] = frozenset()) -> list[cst.Name]:
    """The Name nodes of `nodes` that read a variable: not attribute or keyword names, not a plain
    assignment target; a call in `skip` is not looked into. (Other stores count as reads: at worst
    the metric reads its gathered values under new names when it did not need to.)"""
    found: list[cst.Name] = []

    class Visitor(cst.CSTVisitor):
        def visit_Name(self, node: cst.Name) -> None:
            found.append(node)

        def visit_Attribute(self, node: cst.Attribute) -> bool:
            walk(node.value, self)
            return False

        def visit_Arg(self, node: cst.Arg) -> bool:
            walk(node.value, self)
            return False

        def visit_AssignTarget(self, node: cst.AssignTarget) -> bool:
            return type(node.target) is not cst.Name

        def visit_Call(self, node: cst.Call) -> bool:
            return node not in skip

    for node in nodes:
        walk(node, Visitor())
    return found


def _readers(stmt: cst.BaseStatement) -> list[tuple[str, cst.CSTNode]]:
    """The names `stmt` reads (as `_read_names`), each with the innermost small statement that
    reads it (the compound statement itself for a read in its header: `if out.sum() > 0:`)."""
    inner: dict[cst.Name, cst.CSTNode] = {}

    class Visitor(cst.CSTVisitor):
        def visit_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> bool:
            for small in node.body:
                inner.update((name, small) for name in _read_names([small]))
            return False

    walk(stmt, Visitor())
    return [(name.value, inner.get(name, stmt)) for name in _read_names([stmt])]


def _calls_in(node: cst.CSTNode, calls: set[cst.Call]) -> list[cst.Call]:
    """The calls of `calls` within `node`."""
    found: list[cst.Call] = []

    class Visitor(cst.CSTVisitor):
        def visit_Call(self, node: cst.Call) -> bool:
            if node in calls:
                found.append(node)
                return False
            return True

    walk(node, Visitor())
    return found


def _read_after(scope: cst.CSTNode | None, loop: cst.For, names: set[str]) -> list[tuple[str, cst.CSTNode]]:
    """Reads of `names` after `loop` in its function (or module), before the name is bound again
    (`print(out.shape)` after the loop reads its last batch), with the statement that reads it."""
    if scope is None:
        return []
    found: list[tuple[str, cst.CSTNode]] = []
    live = set(names)
    after = False
    statement: list[cst.CSTNode] = []

    class Visitor(cst.CSTVisitor):
        def on_visit(self, node: cst.CSTNode) -> bool:
            if node is loop:
                return False
            if isinstance(node, cst.BaseStatement):
                statement.append(node)
            if node is not scope and type(node) in (cst.FunctionDef, cst.ClassDef, cst.Lambda):
                return False
            return super().on_visit(node)

        def on_leave(self, original_node: cst.CSTNode) -> None:
            nonlocal after
            if original_node is loop:
                after = True
            if isinstance(original_node, cst.BaseStatement) and statement and statement[-1] is original_node:
                statement.pop()
            super().on_leave(original_node)

        def visit_Name(self, node: cst.Name) -> None:
            if after and node.value in live:
                found.append((node.value, statement[-1] if statement else node))

        def visit_Attribute(self, node: cst.Attribute) -> bool:
            walk(node.value, self)
            return False

        def visit_Arg(self, node: cst.Arg) -> bool:
            walk(node.value, self)
            return False

        def visit_Assign(self, node: cst.Assign) -> bool:
            walk(node.value, self)
            for target in node.targets:
                if after and type(target.target) is cst.Name:
                    live.discard(target.target.value)
                else:
                    walk(target, self)
            return False

        def visit_For(self, node: cst.For) -> bool:
            if node is loop:
                return False
            walk(node.iter, self)
            if after:
                live.difference_update(target_names(node.target))
            walk(node.body, self)
            if node.orelse is not None:
                walk(node.orelse, self)
            return False

    walk(scope, Visitor())
    return found


def _names_in(node: cst.CSTNode) -> set[str]:
    names: set[str] = set()

    class Visitor(cst.CSTVisitor):
        def visit_Name(self, node: cst.Name) -> None:
            names.add(node.value)

    walk(node, Visitor())
    return names


def _calls_model(roles: Roles, scope: Scope, expr: cst.BaseExpression) -> bool:
    found = False

    class Visitor(cst.CSTVisitor):
        def visit_Call(self, node: cst.Call) -> None:
            nonlocal found
            ref = reference(node.func)
            if ref is not None and roles.all_in(scope, ref, roles.models):
                found = True

    walk(expr, Visitor())
    return found


def _has_dim(call: cst.Call, positional_from: int) -> bool:
    positional = [a for a in call.args if a.keyword is None]
    return len(positional) > positional_from or any(
        a.keyword is not None and a.keyword.value in ("dim", "axis") for a in call.args
    )


def _is_loss_name(name: str) -> bool:
    return bool(_LOSS_NAME.search(name))


def _is_loss_call(call: cst.Call) -> bool:
    func = call.func
    name = func.attr.value if isinstance(func, cst.Attribute) else func.value if isinstance(func, cst.Name) else ""
    return _is_loss_name(name)


def _reduction_is(call: cst.Call, wanted: str) -> bool:
    for arg in call.args:
        if arg.keyword is not None and arg.keyword.value == "reduction":
            return isinstance(arg.value, cst.SimpleString) and arg.value.evaluated_value == wanted
    return False


def _is_constant(expr: cst.BaseExpression) -> bool:
    if isinstance(expr, cst.UnaryOperation) and isinstance(expr.operator, cst.Minus):
        return _is_constant(expr.expression)
    return isinstance(expr, (cst.Integer, cst.Float))


def _bound_in(stmt: cst.BaseStatement) -> set[str]:
    names: set[str] = set()

    class Visitor(cst.CSTVisitor):
        def visit_AssignTarget(self, node: cst.AssignTarget) -> None:
            names.update(target_names(node.target))

    walk(stmt, Visitor())
    return names


def _code(node: cst.CSTNode) -> str:
    text = cst.Module(body=[]).code_for_node(node).strip()
    return text if len(text) <= 60 else text[:57] + "..."


# -- the prepared model's forward on some processes only ----------------------------------------

# Names and attributes that hold "this is the main process" (`accelerator.is_main_process`,
# nanoGPT's `master_process`).
_MAIN_FLAGS = frozenset({"is_main_process", "is_local_main_process", "is_master", "master_process", "is_main"})
_AUTOCAST = re.compile(r"autocast|GradScaler")


def _rank_test(test: cst.BaseExpression) -> bool:
    """`rank == 0`, `args.rank != 0`, `dist.get_rank() == 0`, `local_rank in [-1, 0]`,
    `accelerator.is_main_process`, `master_process`, and `and` / `or` / `not` of those: a test that
    is true on some processes and false on others."""
    if isinstance(test, cst.BooleanOperation):
        return _rank_test(test.left) or _rank_test(test.right)
    if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
        return _rank_test(test.expression)
    if isinstance(test, cst.Comparison) and len(test.comparisons) == 1:
        target = test.comparisons[0]
        operator, comparator = type(target.operator), type(target.comparator)
        if operator in (cst.Equal, cst.NotEqual):
            shaped = comparator is cst.Integer and target.comparator.value == "0"
        else:
            shaped = operator in (cst.In, cst.NotIn) and comparator in (cst.List, cst.Tuple, cst.Set)
        # the left side's code only for a test of the right shape (code generation is the cost here)
        return shaped and re.search(r"(^|[._])rank\b", _code(test.left)) is not None
    if isinstance(test, cst.Attribute):
        return test.attr.value in _MAIN_FLAGS
    return isinstance(test, cst.Name) and test.value in _MAIN_FLAGS


class _RankBranchCalls(cst.CSTVisitor):
    """Calls made inside the body or `else` of an `if` on the rank (not in nested functions), each
    with the innermost rank test and whether autograd is off there (`with torch.no_grad():`)."""

    def __init__(self, roles: Roles, function: cst.CSTNode) -> None:
        self.roles = roles
        self.function = function
        self.tests: list[cst.BaseExpression] = []
        self.no_grad = 0
        self.found: list[tuple[cst.Call, cst.BaseExpression, bool]] = []

    def _is_no_grad(self, expr: cst.BaseExpression) -> bool:
        func = expr.func if isinstance(expr, cst.Call) else expr
        return self.roles.facts.aliases.qualify(func) in _NO_GRAD

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        return node is self.function

    def visit_ClassDef(self, node: cst.ClassDef) -> bool:
        return node is self.function

    def visit_Lambda(self, node: cst.Lambda) -> bool:
        return False

    def visit_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> bool:
        # Outside a rank test nothing is recorded, and such a line holds no `if` or `with`.
        return bool(self.tests)

    def visit_If(self, node: cst.If) -> bool:
        ranked = _rank_test(node.test)
        if ranked:
            self.tests.append(node.test)
        walk(node.body, self)
        if node.orelse is not None:
            walk(node.orelse, self)
        if ranked:
            self.tests.pop()
        return False

    def visit_With(self, node: cst.With) -> None:
        if any(self._is_no_grad(item.item) for item in node.items):
            self.no_grad += 1

    def leave_With(self, node: cst.With) -> None:
        if any(self._is_no_grad(item.item) for item in node.items):
            self.no_grad -= 1

    def visit_Call(self, node: cst.Call) -> None:
        if self.tests:
            self.found.append((node, self.tests[-1], self.no_grad > 0))


def _main_process_forwards(roles: Roles, plan: EditPlan) -> None:
    """`model(x)` (or `evaluate(model, loader)`) under `if rank == 0:`: the prepared model's forward
    on some processes only. Under DDP that forward broadcasts the model's buffers (BatchNorm's
    running statistics), a collective the other processes never join: they go on to their next
    collective (the prepared loader's per-epoch seed, the next step's gradients) and the run hangs
    or aborts. Under `torch.no_grad()` the call goes through `accelerator.unwrap_model(model)`,
    the same module without DDP's forward (this process's own buffers: the same outputs);
    otherwise it is reported."""
    mixed = _mixed_precision(roles, plan)
    for scope in roles.facts.scopes:
        if not scope.is_function and scope is not roles.facts.module_scope:
            continue
        visitor = _RankBranchCalls(roles, scope.node)
        walk(scope.node, visitor)
        if not visitor.found:
            continue
        function = scope.node
        decorated = isinstance(function, cst.FunctionDef) and any(
            visitor._is_no_grad(d.decorator) for d in function.decorators
        )
        reach = roles.can_reach(scope)
        before_prepare = _calls_before_prepare(roles, scope)
        for call, test, no_grad in visitor.found:
            if call in before_prepare:
                continue  # the model is still the user's bare module there: no DDP forward, no collective
            ref = reference(call.func)
            if ref is not None and roles.all_in(scope, ref, roles.models):
                _main_process_forward(plan, scope, call, call.func, ref, test, no_grad or decorated, mixed, reach)
                continue
            callee = roles.facts.function_called(call)
            if callee is None or call in plan.calls:
                continue
            for index, param in enumerate(callee.params[1:] if callee.is_method else callee.params):
                arg = call_argument(call, index, param)
                name = reference(arg) if arg is not None else None
                if name is None or not roles.all_in(scope, name, roles.models):
                    continue
                forwards = _ParamForwards(roles, param)
                walk(callee.node, forwards)
                if not forwards.calls:
                    continue
                # decorated, or every forward in a no_grad block of its own body with no backward there
                callee_no_grad = isinstance(callee.node, cst.FunctionDef) and any(
                    visitor._is_no_grad(d.decorator) for d in callee.node.decorators
                ) or (not forwards.outside and not callee.backwards)
                assert arg is not None
                _main_process_forward(plan, scope, call, arg, name, test, no_grad or decorated or callee_no_grad,
                                      mixed, reach, through=callee.qualname)


def _unread_loader_forwards(roles: Roles, plan: EditPlan) -> None:
    """`model(x)` of the prepared model in an evaluation loop over a loader that a function the
    migration cannot read builds (`roles.unread_eval_loops`): such a loader may give each process
    a share of its own length (torch shards a DataLoader over a datapipe by itself, 9 samples as 5
    and 4), and DDP's forward broadcasts the model's buffers, a collective every process must run
    as often as the others. The call goes through `accelerator.unwrap_model(model)`: the same
    module and outputs, no collective. Under mixed precision (which `unwrap_model` would drop) or
    where the accelerator cannot be reached, it is reported."""
    if not roles.unread_eval_loops:
        return
    mixed = _mixed_precision(roles, plan)
    done: set[int] = set()
    for scope, loop, loader in roles.unread_eval_loops:
        if id(loop) in done:
            continue
        done.add(id(loop))
        before_prepare = _calls_before_prepare(roles, scope)
        for site in scope.calls:
            call = site.call
            ref = reference(call.func)
            if ref is None or call in plan.calls or call in before_prepare or not contains(loop.node, call):
                continue
            if not roles.all_in(scope, ref, roles.models):
                continue
            why = (f"`{_code(call)}` runs the prepared `{ref}`'s forward over `{loader}`, which a function the "
                   "migration cannot read builds: if it gives each process a share of another length (a DataLoader "
                   "over a datapipe, which torch shards by itself), the buffer broadcast of DDP's forward (a "
                   "collective) would wait on the process that ran out, and the run would hang")
            if _sharded(plan):
                plan.report(CODE, call, f"{why}; under a sharding strategy the module itself gathers its parameters "
                            "from every process in its forward, so no rewrite avoids it: build that loader so that "
                            "it gives every process all of it, or the same number of batches")
                continue
            if mixed or not roles.can_reach(scope):
                plan.report(CODE, call, f"{why}: call it as `accelerator.unwrap_model({ref})(...)`" + (
                    " inside `with accelerator.autocast():` (unwrapped, it runs without the prepared model's mixed "
                    "precision)" if mixed else f", with the accelerator handed to `{scope.qualname}`"))
                continue
            plan.calls[call] = lambda updated: updated.with_changes(
                func=accelerator_call("unwrap_model", [cst.Arg(updated.func)]))
            plan.use_accelerator(scope)
            plan.change(CODE, call, f"{why}; `accelerator.unwrap_model({ref})` runs the same module without it")


def _sharded(plan: EditPlan) -> bool:
    """The Accelerator shards the model's parameters (`strategy="fsdp"`, from `--strategy` or a
    hand-written FSDP wrap): its forward gathers them from every process, unwrapped or not."""
    return plan.accelerator_kwargs.get("strategy", "").strip('"').startswith("fsdp")


def _mixed_precision(roles: Roles, plan: EditPlan) -> bool:
    """The prepared model's forward runs under autocast (the Accelerator's, or the script's own)."""
    return "mixed_precision" in plan.accelerator_kwargs or any(
        _AUTOCAST.search(call.qualified) for scope in roles.facts.scopes for call in scope.library_calls
    )


def _calls_before_prepare(roles: Roles, scope: Scope) -> set[cst.Call]:
    """The calls of the training function (`scope` when it is the home) that run before the
    prepare call this migration inserts: a forward there is the bare module's."""
    if scope is not roles.home or roles.prepare_after is None:
        return set()
    order = roles.prepare_after.order
    return {site.call for site in (*scope.calls, *scope.method_calls) if site.where.order <= order}


class _ParamForwards(cst.CSTVisitor):
    """The calls of a function's parameter `param` (`param(x)`: a forward of whatever is passed),
    and how many of them run outside a `with torch.no_grad():` (or `torch.inference_mode()`) block
    of the function's own body."""

    def __init__(self, roles: Roles, param: str) -> None:
        self.roles = roles
        self.param = param
        self.depth = 0
        self.calls = 0
        self.outside = 0

    def _no_grad(self, node: cst.With) -> bool:
        return any(self.roles.facts.aliases.qualify(
            item.item.func if isinstance(item.item, cst.Call) else item.item) in _NO_GRAD for item in node.items)

    def visit_With(self, node: cst.With) -> None:
        self.depth += self._no_grad(node)

    def leave_With(self, original_node: cst.With) -> None:
        self.depth -= self._no_grad(original_node)

    def visit_Call(self, node: cst.Call) -> None:
        if isinstance(node.func, cst.Name) and node.func.value == self.param:
            self.calls += 1
            self.outside += self.depth == 0


def _main_process_forward(
    plan: EditPlan, scope: Scope, call: cst.Call, model: cst.BaseExpression, ref: str,
    test: cst.BaseExpression, no_grad: bool, mixed: bool, reach: bool, through: str | None = None,
) -> None:
    where = f"`{_code(call)}`" + (f" (a forward of `{ref}` in `{through}`)" if through else "")
    hang = (f"{where} runs the prepared `{ref}`'s forward under `if {_code(test)}:`, on some processes only: under DDP "
            "that forward broadcasts the model's buffers (BatchNorm's running statistics), a collective the other "
            "processes never join, so the run hangs or aborts (gloo: a collective mismatch) at their next collective")
    if not no_grad:
        plan.report(CODE, call, f"{hang}; it runs with autograd on, so it was left as it is: evaluate under "
                    f"`torch.no_grad()` through `accelerator.unwrap_model({ref})` (the module without DDP's forward), "
                    "or run it on every process", unconverted=True)
        return
    if _sharded(plan):
        plan.report(CODE, call, f"{hang}; under a sharding strategy `accelerator.unwrap_model({ref})` is still the "
                    "sharded module, whose forward gathers its parameters from every process: evaluate on every "
                    "process, or save the model's state and evaluate a whole copy of it", unconverted=True)
        return
    if mixed:
        plan.report(CODE, call, f"{hang}; `accelerator.unwrap_model({ref})` would avoid it but also drops the mixed "
                    f"precision the prepared model's forward runs under: call it as `accelerator.unwrap_model({ref})` "
                    "inside `with accelerator.autocast():`", unconverted=True)
        return
    if not reach:
        plan.report(CODE, call, f"{hang}; `{scope.qualname}` cannot reach the accelerator: pass "
                    f"`accelerator.unwrap_model({ref})` (the module without DDP's forward) instead", unconverted=True)
        return
    if model is call.func:
        plan.calls[call] = lambda updated: updated.with_changes(
            func=accelerator_call("unwrap_model", [cst.Arg(updated.func)])
        )
    else:
        index = next(i for i, a in enumerate(call.args) if a.value is model)
        plan.calls[call] = lambda updated, index=index: updated.with_changes(args=[
            a.with_changes(value=accelerator_call("unwrap_model", [cst.Arg(a.value)])) if i == index else a
            for i, a in enumerate(updated.args)
        ])
    plan.use_accelerator(scope)
    plan.change(CODE, call, f"the prepared `{ref}` runs under `if {_code(test)}:` on some processes only: "
                f"`accelerator.unwrap_model({ref})` runs it without DDP's forward, whose buffer broadcast (a "
                "collective) the other processes would never join")
