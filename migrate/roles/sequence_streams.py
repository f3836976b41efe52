"""Truncated backpropagation through time over one batchified tensor whose rows are the streams.

A language model trained with truncated BPTT batchifies its corpus into one tensor of
independent streams, `ids` of shape (batch_size, num_tokens), and its training loop takes
consecutive slices of every row along time (`inputs = ids[:, i:i + seq_length]`), carrying the
recurrent state from one slice to the next (`outputs, states = model(inputs, states)`, the state
built per epoch as `torch.zeros(num_layers, batch_size, hidden_size)` or `model.init_hidden(bsz)`).
No DataLoader feeds such a step, and a prepared one would hand each process every N-th slice and
break the carried chain. The streams are the samples: each process can take its own share of
them, whole and in order (`Accelerator.share_streams`, AM004 writes the edit), and the carried
state built from the batch size is sized from the shared tensor (`ids.size(0)`) instead.

The word language model's layout is the same with the axes swapped: `batchify(data, bsz)` gives
(num_tokens, batch_size), the loop hands the tensor and its index to a function of the file,
`data, targets = get_batch(train_data, i)`, which slices `source[i:i + seq_len]` along time; its
columns are the streams (`share_streams(train_data, dim=1)`, the state sized from
`train_data.size(1)`). Read otherwise, the tensor may only be read along time (`len(t)`,
`t.size(0)`, `t.shape[0]`, or handed to that function again), and the function reads its
parameter only so. The training loop may run in a function of the module (`def train(): ...`)
that only statements of the module call, all after the prepare call (AM004 checks the order).

Found here (`sequence_streams`), beside the report of a step no DataLoader feeds: the tensor is
bound once, outside any loop (batchified anew per epoch, it might differ per process), in the scope
of the Accelerator's prepare call and of the training loop, and read only
along its later axes (`ids[:, i:j]`, `ids.size(1)`, `ids.shape[1]`), so the number of steps is the
same on every process; the carried state is bound outside the step loop from one batch-size value
(a name or attribute chain) that the tensor's own binding also reads, as a direct argument of a call
(`torch.zeros(num_layers, batch_size, hidden)`), and that value is read nowhere else in the file
(a loss scaled by it, or a view sized by it, would still count the whole batch; an options object
`args` whose `args.batch_size` it is is never handed whole to a function or class); the loss is a mean
(a torch loss left to its default reduction), so DistributedDataParallel's average of the
processes' means over equal shares is the mean over all streams; the file has one training step
and a model to prepare. Anything else keeps the report, with its advice.
"""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst

from migrate.analysis import Binding, Loop, Scope, Site, StmtRef
from migrate.names import dotted_name
from migrate.roles.model import Finding, Roles
from migrate.walk import Visitor, walk


@dataclass(eq=False)
class SharedStreams:
    scope: Scope  # where the tensor is bound and the model is prepared (the loop runs there or in `runs`)
    tensor: str  # the batchified tensor (`ids`)
    binding: Binding  # its one binding
    dim: int  # the axis of its streams: 0 for (batch_size, num_tokens), 1 for (num_tokens, batch_size)
    runs: list[StmtRef]  # the statements of `scope` calling the function that trains, when it is one
    size: str  # the batch-size value the state was built from, as written (`batch_size`)
    calls: list[tuple[cst.Call, list[int]]]  # state-building calls, and the positions of `size` in their args
    states: list[Binding]  # the carried state's bindings outside the step loop
    finding: Finding  # the report of a step no DataLoader feeds, when the share cannot be written


def sequence_streams(
    roles: Roles, scope: Scope, site: Site, tensor: str, binding: Binding, carried: str | None, finding: Finding,
    helper: Scope | None = None,
) -> SharedStreams | None:
    """The streams of `tensor` AM004 can share out (see the module docstring), or None. With
    `helper`, the function of the file the loop hands the tensor and its index to (`get_batch(
    train_data, i)`, slicing `source[i:i + seq_len]`): the tensor is (num_tokens, batch_size)."""
    home = roles.home
    if carried is None or not site.loops or home is None or not roles.models:
        return None
    if sum(len(s.backwards) for s in roles.facts.scopes) != 1:
        return None
    runs: list[StmtRef] = []
    if scope is not home:
        # a function that trains (`def train(): ...`), called only by statements of home, reading the tensor as a global
        if not scope.is_function or scope.is_method or scope.parent is not roles.facts.module_scope \
                or home is not roles.facts.module_scope or tensor in scope.bindings or tensor in scope.params:
            return None
        callers = [(caller, call) for caller in roles.facts.scopes for call in caller.calls
                   if call.callee == scope.name and roles.facts.resolve(call.callee, caller) is scope]
        if not callers or any(caller is not home for caller, _ in callers):
            return None
        if _count(roles.facts.module, scope.name, {scope.node}) != len(callers):
            return None  # handed on as a value (`run(train)`): called from where it cannot be seen
        runs = [call.where for _, call in callers]
    if len(home.bindings.get(tensor, [])) != 1 or binding.value is None or binding.is_loop_target:
        return None
    if home.bindings[tensor][0] is not binding:
        return None
    if binding.where.in_loop:
        return None  # batchified anew in a loop (reshuffled per epoch, say): the processes may not hold the same streams
    loop = site.loops[-1]
    states = [b for b in scope.bindings.get(carried, []) if not _in_loop(b, loop)]
    if not states or any(b.value is None or b.is_loop_target or (not runs and b.where.order < binding.where.order)
                         for b in states):
        return None
    # the batch-size value: read by every initial state as a direct argument of a call, and by the tensor's binding
    read_by_tensor = _chains(binding.value)
    candidates: set[str] | None = None
    for state in states:
        assert state.value is not None
        args = {dotted_name(a.value) for call in _calls(state.value) for a in call.args} - {None}
        found = args & read_by_tensor
        candidates = found if candidates is None else candidates & found
    if not candidates or len(candidates) != 1:
        return None
    size = next(iter(candidates))
    assert size is not None
    calls: list[tuple[cst.Call, list[int]]] = []
    in_states = 0
    for state in states:
        assert state.value is not None
        in_states += _count(state.value, size)
        for call in _calls(state.value):
            positions = [k for k, a in enumerate(call.args) if not a.star and dotted_name(a.value) == size]
            if positions:
                calls.append((call, positions))
    if sum(len(p) for _, p in calls) != in_states:
        return None  # read inside an expression (`batch_size // 2`): not the state's row count alone
    root = size.split(".")[0]
    others = _other_values(roles, scope, root)
    targets = sum(len(s.bindings.get(size, [])) for s in roles.facts.scopes
                  if s.node not in others) if "." not in size else 0
    if _count(roles.facts.module, size, others) != in_states + _count(binding.value, size) + targets:
        return None  # the batch size feeds something else, which would still count every stream
    if "." in size and not _only_attributes_read(roles, root, others):
        return None  # `args` handed whole to something that may read its batch size too
    skip = _other_values(roles, home, tensor)
    if helper is None and not _time_reads_only(roles.facts.module, tensor, skip):
        return None
    if helper is not None and not _time_first_reads_only(roles.facts.module, tensor, skip, helper):
        return None
    if not _mean_loss(roles, scope, site):
        return None
    return SharedStreams(home, tensor, binding, 0 if helper is None else 1, runs, size, calls, states, finding)


def _in_loop(binding: Binding, loop: Loop) -> bool:
    return binding.where.stmt is loop.node or any(ref.stmt is loop.node for ref in binding.where.path)


def _calls(node: cst.CSTNode) -> list[cst.Call]:
    found: list[cst.Call] = []

    class Calls(Visitor):
        def on_visit(self, n: cst.CSTNode) -> bool:
            if isinstance(n, cst.Lambda):
                return False
            if type(n) is cst.Call:
                found.append(n)
            return True

    walk(node, Calls())
    return found


def _chains(node: cst.CSTNode) -> set[str]:
    """The names and attribute chains `node` reads (`batch_size`, `args.batch_size`)."""
    found: set[str] = set()

    class Chains(Visitor):
        def on_visit(self, n: cst.CSTNode) -> bool:
            if type(n) in (cst.Name, cst.Attribute):
                shown = dotted_name(n)  # type: ignore[arg-type]
                if shown is not None:
                    found.add(shown)
            if type(n) is cst.Arg:
                walk(n.value, self)  # not the keyword's name
                return False
            return not isinstance(n, cst.Lambda)

    walk(node, Chains())
    return found


def _other_values(roles: Roles, scope: Scope, name: str) -> set[cst.CSTNode]:
    """The functions (other than `scope` and those enclosing it) that bind `name` or take it as a
    parameter (`def batchify(data, bsz)`): there it is another value, whose uses are not counted."""
    enclosing: set[int] = set()
    parent: Scope | None = scope
    while parent is not None:
        enclosing.add(id(parent))
        parent = parent.parent
    return {s.node for s in roles.facts.scopes if id(s) not in enclosing and s.is_function
            and (name in s.bindings or name in s.params)}


def _count(node: cst.CSTNode, chain: str, skip: set[cst.CSTNode] | None = None) -> int:
    """How many times the name or attribute chain `chain` appears in `node` (any Name node:
    keywords and parameters too, so that a count is never too low), outside the functions `skip`."""
    count = 0
    skipped = skip or set()

    class Uses(Visitor):
        def on_visit(self, n: cst.CSTNode) -> bool:
            nonlocal count
            if n in skipped:
                return False
            if type(n) is cst.Attribute:
                if dotted_name(n) == chain:
                    count += 1
                    return False
                if "." not in chain and n.attr.value == chain:
                    count += 1  # `self.batch_size`: another value of the same name, counted
                walk(n.value, self)
                return False
            if type(n) is cst.Name and n.value == chain:
                count += 1
            return True

    walk(node, Uses())
    return count


def _only_attributes_read(roles: Roles, root: str, skip: set[cst.CSTNode]) -> bool:
    """`root` (`args`) appears only as the base of attribute reads (`args.batch_size`) or as a
    binding target: never handed whole to a function or class that could read its batch size."""
    bare = 0

    class Bare(Visitor):
        def on_visit(self, n: cst.CSTNode) -> bool:
            nonlocal bare
            if n in skip:
                return False
            if type(n) is cst.Attribute:
                if type(n.value) is cst.Name:
                    return False  # `args.x`: read through an attribute
                walk(n.value, self)
                return False
            if type(n) is cst.Arg:
                walk(n.value, self)  # not the keyword's name
                return False
            if type(n) is cst.Name and n.value == root:
                bare += 1
            return True

    walk(roles.facts.module, Bare())
    targets = sum(len(s.bindings.get(root, [])) + (root in s.params) for s in roles.facts.scopes if s.node not in skip)
    return bare == targets


def _time_reads_only(module: cst.Module, tensor: str, skip: set[cst.CSTNode]) -> bool:
    """Every appearance of `tensor` but one (its binding) reads it along a later axis: `t[:, ...]`,
    `t.size(k)` or `t.shape[k]` with a literal k >= 1."""
    allowed = 0

    class Reads(Visitor):
        def on_visit(self, n: cst.CSTNode) -> bool:
            nonlocal allowed
            if n in skip:
                return False
            if type(n) is cst.Subscript and type(n.value) is cst.Name and n.value.value == tensor:
                first = n.slice[0].slice
                if len(n.slice) >= 2 and type(first) is cst.Slice and first.lower is None and first.upper is None \
                        and first.step is None:
                    allowed += 1
            elif type(n) is cst.Call and type(n.func) is cst.Attribute and type(n.func.value) is cst.Name \
                    and n.func.value.value == tensor and n.func.attr.value == "size":
                if len(n.args) == 1 and _axis(n.args[0].value):
                    allowed += 1
            elif type(n) is cst.Subscript and type(n.value) is cst.Attribute and type(n.value.value) is cst.Name \
                    and n.value.value.value == tensor and n.value.attr.value == "shape":
                if len(n.slice) == 1 and type(n.slice[0].slice) is cst.Index and _axis(n.slice[0].slice.value):
                    allowed += 1
            return True

    walk(module, Reads())
    return _count(module, tensor, skip) == allowed + 1


def _time_first_reads_only(module: cst.Module, tensor: str, skip: set[cst.CSTNode], helper: Scope) -> bool:
    """(num_tokens, batch_size): every appearance of `tensor` but its binding reads its first (time)
    axis, `t.size(0)`, `t.shape[0]`, `len(t)`, or hands it to `helper` as its first argument,
    and `helper` reads its parameter only so too, or as one slice of its first axis (`source[i:j]`)."""
    if not isinstance(helper.node, cst.FunctionDef) or not helper.params:
        return False
    source = helper.params[0]
    if source in helper.bindings:
        return False

    def time_reads(root: cst.CSTNode, name: str, skipped: set[cst.CSTNode], handed: bool) -> int:
        allowed = 0

        class Reads(Visitor):
            def on_visit(self, n: cst.CSTNode) -> bool:
                nonlocal allowed
                if n in skipped:
                    return False
                if type(n) is cst.Call and len(n.args) >= 1 and type(n.args[0].value) is cst.Name \
                        and n.args[0].value.value == name and not n.args[0].star and n.args[0].keyword is None:
                    func = n.func
                    if handed and type(func) is cst.Name and func.value == helper.name:
                        allowed += 1
                    elif type(func) is cst.Name and func.value == "len" and len(n.args) == 1:
                        allowed += 1
                elif type(n) is cst.Call and type(n.func) is cst.Attribute and type(n.func.value) is cst.Name \
                        and n.func.value.value == name and n.func.attr.value == "size":
                    if len(n.args) == 1 and type(n.args[0].value) is cst.Integer and n.args[0].value.value == "0":
                        allowed += 1
                elif type(n) is cst.Subscript and type(n.value) is cst.Attribute and type(n.value.value) is cst.Name \
                        and n.value.value.value == name and n.value.attr.value == "shape":
                    part = n.slice[0].slice if len(n.slice) == 1 else None
                    if type(part) is cst.Index and type(part.value) is cst.Integer and part.value.value == "0":
                        allowed += 1
                elif not handed and type(n) is cst.Subscript and type(n.value) is cst.Name and n.value.value == name:
                    if len(n.slice) == 1 and type(n.slice[0].slice) is cst.Slice and n.slice[0].slice.step is None:
                        allowed += 1
                return True

        walk(root, Reads())
        return allowed

    inside = helper.node.body
    if time_reads(inside, source, set(), handed=False) != _count(inside, source):
        return False
    return _count(module, tensor, skip) == time_reads(module, tensor, skip, handed=True) + 1


def _axis(node: cst.BaseExpression) -> bool:
    return type(node) is cst.Integer and int(node.value) >= 1  # type: ignore[attr-defined]


_MEAN_LOSSES = frozenset({"cross_entropy", "nll_loss", "mse_loss", "l1_loss", "smooth_l1_loss"})


def _mean_loss(roles: Roles, scope: Scope, site: Site) -> bool:
    """The backward's loss is one call of a torch loss left to its default (mean) reduction:
    `criterion(outputs, targets)` with `criterion = nn.CrossEntropyLoss()`, or `F.cross_entropy(...)`."""
    receiver = site.receiver
    if type(receiver) is cst.Name:
        before = [b for b in scope.bindings.get(receiver.value, []) if b.where.order < site.where.order]
        if not before:
            return False
        value = max(before, key=lambda b: b.where.order).value
    else:
        value = receiver
    if type(value) is not cst.Call or _reduction_set(value):
        return False
    qualified = roles.facts.aliases.qualify(value.func) or ""
    head, _, last = qualified.rpartition(".")
    if head == "torch.nn.functional":
        return last in _MEAN_LOSSES
    if type(value.func) is not cst.Name:
        return False
    made = [b for s in roles.facts.scopes for b in s.bindings.get(value.func.value, [])]
    if len(made) != 1 or type(made[0].value) is not cst.Call or _reduction_set(made[0].value):
        return False
    qualified = roles.facts.aliases.qualify(made[0].value.func) or ""
    head, _, last = qualified.rpartition(".")
    return head in ("torch.nn", "torch.nn.modules.loss") and last.endswith("Loss") and last not in (
        "CTCLoss", "MarginRankingLoss", "TripletMarginLoss", "CosineEmbeddingLoss")


def _reduction_set(call: cst.Call) -> bool:
    return any(a.keyword is not None and a.keyword.value in ("reduction", "size_average", "reduce") for a in call.args)
