"""A libcst transformer without libcst's per-node name lookups.

`CSTTransformer` finds each node's `leave_<Type>` method by formatting the name and looking it up
again for every node it leaves, and before and after each field of every node it enters it looks
up `visit_<Type>_<field>` / `leave_<Type>_<field>` the same way (two lookups per field). The
rewrite passes (`rewriter.py`, `cleanup.py`) enter only the nodes on the way to an edit, but leave
every child of those, so these lookups were most of their cost beyond rebuilding the nodes.

`Transformer` looks `leave_<Type>` up once per transformer class and node type, and has no
per-field hooks: a subclass must not define `visit_<Type>_<field>` or `leave_<Type>_<field>`
methods (none does; `__init_subclass__` checks it). Like libcst's, its `on_visit` calls
`visit_<Type>` methods; the rewrite passes override it to prune the descent.
"""

from __future__ import annotations

from collections.abc import Callable

import libcst as cst


class Transformer(cst.CSTTransformer):
    """A `CSTTransformer` whose `visit_<Type>` / `leave_<Type>` lookups are cached per node type."""

    _visits: dict[type, Callable[..., object] | None]
    _leaves: dict[type, Callable[..., object] | None]

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        cls._visits, cls._leaves = {}, {}
        for name in vars(cls):  # libcst's own stubs of the per-field hooks do nothing
            prefix, _, rest = name.partition("_")
            if prefix in ("visit", "leave") and "_" in rest:
                raise TypeError(f"{cls.__name__}.{name}: Transformer has no per-field hooks")

    def on_visit(self, node: cst.CSTNode) -> bool:
        node_type = type(node)
        try:
            method = self._visits[node_type]
        except KeyError:
            method = self._visits[node_type] = getattr(type(self), "visit_" + node_type.__name__, None)
        return method is None or method(self, node) is not False

    def on_leave(self, original_node: cst.CSTNode, updated_node: cst.CSTNode):  # type: ignore[no-untyped-def]
        node_type = type(original_node)
        try:
            method = self._leaves[node_type]
        except KeyError:
            method = self._leaves[node_type] = getattr(type(self), "leave_" + node_type.__name__, None)
        return updated_node if method is None else method(self, original_node, updated_node)

    def on_visit_attribute(self, node: cst.CSTNode, attribute: str) -> None:
        pass

    def on_leave_attribute(self, original_node: cst.CSTNode, attribute: str) -> None:
        pass
