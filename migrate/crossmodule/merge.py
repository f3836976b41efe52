"""One view of an entry module and the modules it reaches: the facts the roles read, joined.

The roles (`migrate/roles/`) follow names through a module's own functions: a parameter's
origins are the arguments at the module's call sites of that function, which `Facts.resolve`
finds from where each call runs. Joining the facts of several modules so that an imported function is one more
function of the entry lets the roles cross the module boundary without knowing about modules:

- `functions`/`classes`: the entry's own, then the names it imports from the run's modules
  (`from engine import train_one_epoch`), then every other top-level function and class of the
  reached modules (a helper `engine.py` calls within itself). A name imported under another name
  (`import ... as step`) has its call sites renamed to the function's own name in the joined view;
- `scopes`: every scope of every module, so call sites in `main.py` are found for a function of
  `engine.py`, and a function of `engine.py` still resolves its globals in `engine.py`'s module
  scope (each scope keeps its own parent);
- `module`, `module_scope`, `import_block_end`: the entry's (the entry is the script that runs);
- `aliases`: the entry's import aliases, then those of the other modules for local names the entry
  does not bind. Qualified names of calls were resolved per module by the analysis already.

Because the other modules' functions are functions of the view, the roles' optimizer factories
(a function returning the optimizer it builds over an argument's `.parameters()`) are found across
modules too: `optimizer = create_optimizer(args, model)` in the entry is the optimizer over `model`.

A name defined at the top level of two modules that both reach the view would make the roles
confuse the two; such a unit is refused (`Conflict`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from migrate.analysis import Facts, Scope
from migrate.names import ImportAliases
from migrate.project import ImportedName


@dataclass(frozen=True)
class Conflict:
    name: str
    first: str  # display paths of the two modules defining it
    second: str


def merged_facts(
    entry: Facts, others: list[tuple[str, Facts]], imported: list[tuple[str, ImportedName]], entry_path: str
) -> Facts | Conflict:
    """`others`: (display path, facts) of the modules reached from the entry; `imported`: (display
    path of the module, name) for each name the entry imports from one of them."""
    facts_of = dict(others)
    functions: dict[str, Scope] = dict(entry.functions)
    classes: dict[str, Scope] = dict(entry.classes)
    owner: dict[str, str] = {name: entry_path for name in [*functions, *classes]}
    renamed: dict[str, str] = {}
    for path, item in imported:
        source = facts_of.get(path)
        if source is None or item.name is None:
            continue
        for table, defined in ((functions, source.functions), (classes, source.classes)):
            scope = defined.get(item.name)
            if scope is None:
                continue
            if item.local in entry.functions or item.local in entry.classes:
                return Conflict(item.local, entry_path, path)
            table[item.name] = scope
            owner[item.name] = path
            if item.local != item.name:
                renamed[item.local] = item.name
    for path, source in others:
        for table, defined in ((functions, source.functions), (classes, source.classes)):
            for name, scope in defined.items():
                if name in owner and (table.get(name) is not scope):
                    if _called_across(name, path, owner[name], entry, others, entry_path):
                        return Conflict(name, owner[name], path)
                    continue
                table.setdefault(name, scope)
                owner.setdefault(name, path)
    if renamed:
        _rename_calls(entry.scopes, renamed)
    aliases = ImportAliases()
    for _, source in reversed(others):
        aliases._aliases.update(source.aliases._aliases)
    aliases._aliases.update(entry.aliases._aliases)
    scopes = [*entry.scopes, *(s for _, source in others for s in source.scopes)]
    return replace(entry, aliases=aliases, scopes=scopes, functions=functions, classes=classes)


def _called_across(name: str, path: str, first: str, entry: Facts, others: list[tuple[str, Facts]], entry_path: str) -> bool:
    """The name is called in a module whose own definition is not the one the view keeps."""
    modules = [(entry_path, entry), *others]
    for where, facts in modules:
        if where == first:
            continue
        if any(site.callee == name for scope in facts.scopes for site in scope.calls):
            return True
    return False


def _rename_calls(scopes: list[Scope], renamed: dict[str, str]) -> None:
    for scope in scopes:
        for site in scope.calls:
            site.callee = renamed.get(site.callee, site.callee)
        for loop in scope.loops:
            loop.callees = {renamed.get(c, c) for c in loop.callees}
