"""Resolve dotted names through a module's import aliases.

`import torch as th`, `from torch import nn, optim`, `import torch.nn as nn` and
`from torch.utils.data import DataLoader` all bind local names to torch objects. The analysis only
needs to know, for a handful of call targets, which qualified name they refer to; a full
ScopeProvider/QualifiedNameProvider costs 6-8 parses, so this resolves the few aliases itself.
"""

from __future__ import annotations

import libcst as cst


# Standard modules a star import passes on (`from utils import *` where utils did `import sys`): a
# project module does not define its own `sys`, so `sys.stdout.write` there is the standard one.
_STAR_MODULES = frozenset({"sys", "os", "shutil"})


class ImportAliases:
    """Map local names to the qualified names their imports bind."""

    def __init__(self) -> None:
        self._aliases: dict[str, str] = {}
        self._star = False  # a `from module import *` (of anything but the standard modules above)

    def record_import(self, node: cst.Import) -> None:
        for alias in node.names:
            dotted = dotted_name(alias.name)
            if dotted is None:
                continue
            if alias.asname is not None:
                local = alias.asname.name
                if type(local) is cst.Name:
                    self._aliases[local.value] = dotted
            else:
                # `import torch.nn` binds `torch`, which resolves to itself.
                head = dotted.split(".", 1)[0]
                self._aliases[head] = head

    def record_import_from(self, node: cst.ImportFrom) -> None:
        if type(node.names) is cst.ImportStar:
            self._star = True
            return
        if node.relative or node.module is None:
            return
        module = dotted_name(node.module)
        if module is None:
            return
        for alias in node.names:
            if type(alias.name) is not cst.Name:
                continue
            local = alias.name.value
            if alias.asname is not None and type(alias.asname.name) is cst.Name:
                local = alias.asname.name.value
            self._aliases[local] = f"{module}.{alias.name.value}"

    def qualify(self, expr: cst.BaseExpression) -> str | None:
        """The qualified name `expr` refers to, or None when it is not an imported name."""
        dotted = dotted_name(expr)
        if dotted is None:
            return None
        head, _, rest = dotted.partition(".")
        target = self._aliases.get(head)
        if target is None and self._star and head in _STAR_MODULES:
            target = head
        if target is None:
            return None
        return f"{target}.{rest}" if rest else target

    @property
    def star(self) -> bool:
        """The module star-imports a module other than the standard ones (`from utils import *`)."""
        return self._star

    def local_names_for(self, qualified: str) -> list[str]:
        """Local names bound directly to `qualified` (e.g. every alias of `torch`)."""
        return [local for local, target in self._aliases.items() if target == qualified]


def dotted_name(expr: cst.BaseExpression) -> str | None:
    """`a.b.c` for a chain of Name/Attribute nodes, else None."""
    if type(expr) is cst.Name:
        return expr.value
    if type(expr) is cst.Attribute:
        base = dotted_name(expr.value)
        return None if base is None else f"{base}.{expr.attr.value}"
    return None


def root_name(expr: cst.BaseExpression) -> str | None:
    """The Name at the root of `a.b[0].c(...)`-style chains (`a`), or None."""
    while True:
        if type(expr) is cst.Name:
            return expr.value
        if type(expr) is cst.Attribute:
            expr = expr.value
        elif type(expr) is cst.Subscript:
            expr = expr.value
        else:
            return None


def target_names(target: cst.BaseExpression) -> list[str]:
    """Every plain name bound by an assignment/for target (`x`, `(a, (b, c))`, `[a, *b]`)."""
    if type(target) is cst.Name:
        return [target.value]
    if type(target) in (cst.Tuple, cst.List):
        names: list[str] = []
        for element in target.elements:
            names.extend(target_names(element.value))
        return names
    if type(target) is cst.StarredElement:
        return target_names(target.value)
    return []


def call_argument(call: cst.Call, index: int, name: str) -> cst.BaseExpression | None:
    """The argument a call passes for parameter `name` at position `index`; None when absent or
    hidden behind `*args`/`**kwargs`."""
    positional = 0
    for arg in call.args:
        if arg.star:
            return None
        if arg.keyword is None:
            if positional == index:
                return arg.value
            positional += 1
        elif arg.keyword.value == name:
            return arg.value
    return None


def instance_attribute(expr: cst.BaseExpression, receiver: str = "self") -> str | None:
    """`self.model` (the receiver named `receiver`) as the name roles track it by: "self.model".

    One spelling for instance state across the analysis, the roles and the rules, whatever the
    method calls its first parameter."""
    if type(expr) is cst.Attribute and type(expr.value) is cst.Name and expr.value.value == receiver:
        return f"self.{expr.attr.value}"
    return None
