"""Which global random generators a file seeds, and which a value is drawn from.

Unseeded, the global generators start apart on every process: torch's CPU generator takes its
seed from the operating system when the process starts (`torch.initial_seed()` differs from run
to run), and so do numpy's legacy global RNG and Python's `random`. A batch drawn from one of
them without a seed is each process's own, as a sharded loader's would be. Seeded with a value
every process shares (`torch.manual_seed(0)`, `np.random.seed(args.seed)`, `seed_everything(42)`)
they draw alike. A draw on a CUDA device (`device=device`) uses the CUDA generator, which every
process starts from the same fixed default seed; so does a `torch.Generator()` handed in with
`generator=`, and a draw without `device=` in a file that moves torch's default device
(`torch.set_default_device("cuda")`): these draw alike, seeded or not."""

from __future__ import annotations

import weakref

import libcst as cst

from migrate.analysis import Facts, Scope, StmtRef
from migrate.names import dotted_name
from migrate.walk import Visitor, walk

TORCH, NUMPY, RANDOM = "torch", "numpy", "random"

TORCH_DRAWS = frozenset(
    f"torch.{name}" for name in (
        "randn", "rand", "randint", "normal", "randn_like", "rand_like", "randint_like", "randperm",
        "bernoulli", "multinomial", "poisson",
    )
)
# numpy.random / random functions that are not draws.
_NOT_DRAWS = frozenset({
    "seed", "default_rng", "RandomState", "Generator", "SeedSequence", "get_state", "set_state",
    "Random", "SystemRandom", "getstate", "setstate", "PCG64", "MT19937", "Philox", "SFC64", "BitGenerator",
})
# Methods that keep a tensor's values (a move, a cast, a reshape): the draw is still the data.
_KEEPS_VALUES = frozenset({
    "to", "cuda", "float", "double", "half", "long", "int", "bfloat16", "view", "reshape", "unsqueeze",
    "squeeze", "contiguous", "detach", "clone", "pin_memory", "type", "requires_grad_", "astype",
})
# Calls that wrap an array in a tensor.
_AS_TENSOR = frozenset({"torch.from_numpy", "torch.tensor", "torch.as_tensor", "torch.Tensor", "torch.FloatTensor"})
# `torch.initial_seed()`, `torch.seed()` (reseeds from the OS) and the like read or scatter the seed.
_NOT_SEEDS = frozenset({"initial_seed", "seed_worker"})


def draw_generator(facts: Facts, call: cst.Call) -> str | None:
    """The unseeded-apart generator a call draws from: "torch" (`torch.randn(20, 10)`), "numpy"
    (`np.random.rand(...)`), "random" (`random.random()`); None when it is no draw, or draws from a
    generator that starts alike on every process (`generator=g`, or `device=` other than "cpu":
    the CUDA generator's default seed is fixed)."""
    qualified = facts.aliases.qualify(call.func) or ""
    keywords = {a.keyword.value: a.value for a in call.args if a.keyword is not None}
    if "generator" in keywords:
        return None
    if qualified in TORCH_DRAWS:
        if default_device_changed(facts):
            return None  # `torch.set_default_device("cuda")`: a draw without `device=` is on the GPU
        device = keywords.get("device")
        if device is not None and not (type(device) is cst.SimpleString and device.evaluated_value == "cpu"):
            return None
        return TORCH
    head, _, last = qualified.rpartition(".")
    if head == "numpy.random" and last not in _NOT_DRAWS:
        return NUMPY
    if head == "random" and last not in _NOT_DRAWS:
        return RANDOM
    return None


_DEFAULT_DEVICE = frozenset({"torch.set_default_device", "torch.set_default_tensor_type", "torch.device"})


def default_device_changed(facts: Facts) -> bool:
    """The file may move torch's default device off the CPU: `torch.set_default_device(...)`,
    `torch.set_default_tensor_type(...)`, or `with torch.device("cuda"):`."""
    known = _DEFAULT_DEVICE_CHANGED.get(facts)
    if known is not None:
        return known
    found: list[bool] = []

    class Defaults(Visitor):
        def visit_Call(self, node: cst.Call) -> None:
            qualified = facts.aliases.qualify(node.func) or ""
            if qualified in _DEFAULT_DEVICE and qualified != "torch.device":
                found.append(True)

        def visit_WithItem(self, node: cst.WithItem) -> None:
            if type(node.item) is cst.Call and facts.aliases.qualify(node.item.func) == "torch.device":
                found.append(True)

    walk(facts.module, Defaults())
    _DEFAULT_DEVICE_CHANGED[facts] = bool(found)
    return bool(found)


_DEFAULT_DEVICE_CHANGED: weakref.WeakKeyDictionary[Facts, bool] = weakref.WeakKeyDictionary()


def drawn_from(facts: Facts, scope: Scope, value: cst.BaseExpression, before: StmtRef, depth: int = 0) -> str | None:
    """The generator (see `draw_generator`) a value used at `before` is drawn from, following its
    moves and casts (`torch.randn(20, 5).to(rank)`), `torch.from_numpy(...)`, and a name's latest
    binding in `scope` above `before`, and rows indexed by a draw (`data[idx]` with `idx =
    torch.randint(0, n, (b,))`); None when it is not (only) a draw."""
    if depth > 4:
        return None
    while type(value) is cst.Call and type(value.func) is cst.Attribute and value.func.attr.value in _KEEPS_VALUES:
        value = value.func.value
    if type(value) is cst.Name:
        bound = [b for b in scope.bindings.get(value.value, []) if b.where.order < before.order]
        if not bound:
            return None
        latest = max(bound, key=lambda b: b.where.order)
        if latest.value is None or latest.is_loop_target:
            return None
        return drawn_from(facts, scope, latest.value, latest.where, depth + 1)
    if type(value) is cst.Subscript and len(value.slice) == 1 and type(value.slice[0].slice) is cst.Index:
        # rows picked by drawn indices (`data[torch.randint(0, n, (b,))]`): a sample of its own
        return drawn_from(facts, scope, value.slice[0].slice.value, before, depth + 1)
    if type(value) is not cst.Call:
        return None
    if (facts.aliases.qualify(value.func) or "") in _AS_TENSOR and len(value.args) >= 1 and value.args[0].keyword is None:
        return drawn_from(facts, scope, value.args[0].value, before, depth + 1)
    return draw_generator(facts, value)


def seeded_generators(facts: Facts) -> set[str]:
    """The global generators the file seeds with a value (any call whose name says seed, with an
    argument: `torch.manual_seed(s)`, `np.random.seed(0)`, `random.seed(s)`; a seed function of a
    library or of the script, `seed_everything(42)`, `set_seed(args.seed)`, seeds all three). A
    seed that reads the rank (`torch.manual_seed(seed + rank)`) seeds the processes apart: not counted."""
    found: set[str] = set()

    class Seeds(Visitor):
        def visit_Call(self, node: cst.Call) -> None:
            name = dotted_name(node.func)
            if name is None or "seed" not in name.rpartition(".")[2].lower() or not node.args:
                return
            last = name.rpartition(".")[2]
            if last in _NOT_SEEDS:
                return
            shown = "".join(cst.Module([]).code_for_node(a) for a in node.args).lower()
            if any(word in shown for word in ("rank", "process_index", "device_specific")):
                return  # `manual_seed(seed + rank)` seeds the processes apart
            qualified = facts.aliases.qualify(node.func) or name
            if qualified.startswith("torch."):
                found.add(TORCH)
            elif qualified.startswith("numpy."):
                found.add(NUMPY)
            elif qualified.startswith("random."):
                found.add(RANDOM)
            else:
                found.update((TORCH, NUMPY, RANDOM))

    walk(facts.module, Seeds())
    return found
