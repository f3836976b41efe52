"""Migrate the files of one unit together: the entry's roles followed into the modules it imports.

Pure: texts in, FileResults out (the runner reads and writes). For each file the single-file engine
runs first (`migrate.runner.migrate_text`): that is what a file gets when nothing can be done
across modules. Then, for each entry point (a module with a `__main__` guard that imports modules
of the unit), the joined view of `merge.py` is planned by the rules once, every module holding an
edited node is rewritten, and the unit is checked: every rewritten file compiles and passes the
safety checks, and a second run over the rewritten unit changes nothing. Only then do the entry's
files take the cross-module results; otherwise they keep their single-file results and the entry
gets an AM013 diagnostic saying why (see `migrate/crossmodule/__init__.py`). A unit left as it is
(all or nothing) drops the rewrites of its files and, with them, the notes on those rewrites: a file
that loses its rewrite keeps only the diagnostics that leave training code unconverted.

When the view edits only the entry (its own loop, the optimizer from another module's factory), the
entry takes the view's result if the unit trains through it (the entry alone would see no
optimizer), unless another module holds a `.backward()` the view left as it is (a step it did not
understand). When no other module trains, the entry keeps its own file result, unless the view
saw more (fewer diagnostics: a loader returned by another module's `get_loader`, which the entry
alone reports as "not a recognised DataLoader", prepared in the view). An entry that trains through the unit (it calls a function of another module that trains, or that
module holds the backward or builds the optimizer) and gets neither a change nor a diagnostic is
never left silent: it gets AM013 naming what it calls where and why that was not migrated. A
module the single-file engine called "a library module" or "backward without an optimizer" is
told which of the run's files calls it instead.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import libcst as cst

from migrate.analysis import Facts, analyze
from migrate.cleanup import remove_unused
from migrate.crossmodule import CODE
from migrate import already_distributed
from migrate.crossmodule.merge import Conflict, merged_facts
from migrate.imports import add_imports
from migrate.positions import start_lines
from migrate.project import ImportedName, ModuleIndex
from migrate.results import Change, Diagnostic, FileResult
from migrate.rewriter import Rewriter
from migrate.roles import find_roles
from migrate.statement_code import StatementCode
from migrate.suppression import drop_skipped, skip_lines
from migrate.walk import LEAVES, NOT_NODES, AllFound, child_getter

# What the single-file engine says of a module whose training objects come from elsewhere.
_LIBRARY = ("a library module", "no optimizer is built in this file")


@dataclass
class Source:
    path: Path  # absolute: the index's key
    display: str  # as given on the command line
    text: str


@dataclass
class _Parsed:
    source: Source
    module: cst.Module
    skipped: set[int]
    facts: Facts | None = None
    # the joined view of an entry may have renamed call sites in `facts` (`merge.py`): analysed
    # again before any other use
    renamed: bool = False


class _Parses:
    """The unit's parsed modules, each parsed once (on first use) for the single-file pass, the
    joined view and the checks: a parse is most of what a file costs. Each module's analysis is
    made once too (`_parse`) and shared by every entry reaching it and by the second run of the
    checks (`facts`: the analyses of trees taken over from a first run)."""

    def __init__(self, by_path: dict[Path, Source], trees: dict[Path, cst.Module] | None = None,
                 facts: dict[Path, Facts] | None = None, first: _Parses | None = None,
                 same: frozenset[Path] = frozenset()) -> None:
        self.by_path = by_path
        self.trees: dict[Path, cst.Module | None] = dict(trees or {})  # None: a syntax error
        self.items: dict[Path, _Parsed | None] = {}  # None: a syntax error or `# accel-migrate: skip`
        self.facts: dict[Path, Facts] = dict(facts or {})
        # the checks' second run: the files in `same` have the first run's text, and their trees
        # are the first run's (parsed by whichever run asks first; the other run takes that tree)
        self._first, self._same = first, same

    def tree(self, path: Path) -> cst.Module | None:
        if path not in self.trees:
            if self._first is not None and path in self._same:
                self.trees[path] = self._first.tree(path)
                return self.trees[path]
            try:
                self.trees[path] = cst.parse_module(self.by_path[path].text)
            except cst.ParserSyntaxError:
                self.trees[path] = None  # the single-file result reports the syntax error
        return self.trees[path]


class _Results(dict[Path, FileResult]):
    """Each file's single-file result, computed on first use: a file that takes the cross-module
    result of its unit never needs its own."""

    def __init__(self, by_path: dict[Path, Source], parses: _Parses, options) -> None:  # type: ignore[no-untyped-def]
        super().__init__()
        self._by_path, self._parses, self._options = by_path, parses, options

    def __missing__(self, path: Path) -> FileResult:
        from migrate.runner import migrate_text

        source = self._by_path[path]
        # the module's analysis made for the unit is the single-file run's too, unless a view renamed
        # its call sites or the roles of a run marked a hidden step's loops in it
        item = self._parses.items.get(path)
        facts = item.facts if item is not None and item.facts is not None and not item.renamed \
            and not item.facts.stepped else None
        result = self[path] = migrate_text(source.text, source.display, self._options, self._parses.tree(path), facts)
        if facts is not None and facts.stepped:  # changed by this run's roles: the unit's next use gets them fresh
            item.facts = analyze(item.module, item.source.text)  # type: ignore[union-attr]
        return result


@dataclass
class _Outcome:
    results: dict[Path, FileResult] = field(default_factory=dict)  # files with cross-module edits
    trees: dict[Path, cst.Module] = field(default_factory=dict)  # their rewritten trees (what the checks read)
    reason: str | None = None  # why nothing was migrated across modules (None: it was)
    line: int = 1  # entry line the reason is about
    # the reason leaves training code unconverted (`Diagnostic.unconverted`); False only when
    # nothing was left to do (a unit migrated already)
    unconverted: bool = True
    # Only the entry is edited (the view found the optimizer in another module's factory or method):
    # taken only when the entry trains through the unit, where its own file result is a refusal.
    entry_only: bool = False
    # Left whole even when the entry trains by itself (processes started by MPI: the entry's own
    # migration would crash at N processes), with each finding of another module reported there.
    whole: bool = False
    elsewhere: list[tuple[Path, Diagnostic]] = field(default_factory=list)


def migrate_unit(sources: list[Source], index: ModuleIndex, options) -> list[FileResult]:  # type: ignore[no-untyped-def]
    by_path = {s.path: s for s in sources}
    parsed = _Parses(by_path)
    results = _Results(by_path, parsed, options)
    if CODE in options.ignore:  # not `enabled`: `--select AM003` still wants AM003 across modules
        return [results[s.path] for s in sources]
    claimed: dict[Path, Path] = {}  # module -> the entry whose cross-module edits it took
    for entry in _entries(index, by_path):
        members = _reached(index, entry, by_path)
        outcome = _migrate_entry(entry, members, by_path, index, parsed, options)
        clash = [p for p in outcome.results if p in claimed and p != entry]
        if outcome.entry_only and not _trains_through(entry, members, by_path) and (
                outcome.reason is not None or not _better_informed(outcome, results[entry], entry)):
            continue  # nothing else of the unit trains: the entry's own file result is as informed
        if outcome.reason is None and clash:
            outcome = _Outcome(reason=(
                f"{by_path[clash[0]].display} is also migrated with {by_path[claimed[clash[0]]].display}, "
                "which edits it for its own training; migrate this entry point in a run of its own"))
        if outcome.reason is None:
            for path, result in outcome.results.items():
                results[path] = result
                claimed[path] = entry
            _tell_callees(results, members, entry, by_path, index, migrated=True)
            continue
        if outcome.whole or _trains_through(entry, members, by_path):
            if outcome.line == 1:
                outcome.line = min(n.line for names in index.modules[entry].imports.values() for n in names)
            for path in members:
                if path not in claimed:  # all or nothing: no file of the unit keeps a partial rewrite
                    if results[path].new_text is not None:
                        # notes on the rewrite it no longer gets (`the migrated script saves ...`) go with
                        # it; what leaves training code unconverted stays
                        results[path].diagnostics = [d for d in results[path].diagnostics if d.unconverted]
                    results[path].new_text = None
                    results[path].changes = []
            result = results[entry]
            result.parsed = True
            message = _not_followed(outcome.reason)
            if outcome.unconverted:
                read = [item.facts for item in (parsed.items.get(p) for p in members) if item is not None and item.facts]
                said = already_distributed.note(read, str(entry)) if read and read[0] is parsed.items[entry].facts else None
                message = message if said is None else f"{message}. {said}"
            result.diagnostics = sorted(
                {*result.diagnostics, Diagnostic(CODE, outcome.line, message, unconverted=outcome.unconverted)},
                key=lambda d: (d.line, d.code, d.message),
            )
            for path, diagnostic in outcome.elsewhere:
                if path != entry and path not in claimed:
                    results[path].parsed = True
                    results[path].diagnostics = sorted({*results[path].diagnostics, diagnostic},
                                                       key=lambda d: (d.line, d.code, d.message))
            _tell_callees(results, members, entry, by_path, index)
    return [results[s.path] for s in sources]


def _entries(index: ModuleIndex, by_path: dict[Path, Source]) -> list[Path]:
    return [p for p in sorted(by_path) if index.modules[p].has_main_guard and index.modules[p].imports]


def _reached(index: ModuleIndex, entry: Path, by_path: dict[Path, Source]) -> list[Path]:
    return [p for p in index.reached(entry) if p in by_path]


def _parse(path: Path, parsed: _Parses) -> _Parsed | None:
    if path not in parsed.items:
        source = parsed.by_path[path]
        module = parsed.tree(path)
        skip_file, skipped = skip_lines(source.text)
        parsed.items[path] = None if module is None or skip_file else _Parsed(
            source, module, skipped, parsed.facts.get(path))
    item = parsed.items[path]
    if item is not None and (item.facts is None or item.renamed):
        item.facts, item.renamed = analyze(item.module, item.source.text), False
    return item


def _migrate_entry(
    entry: Path, members: list[Path], by_path: dict[Path, Source], index: ModuleIndex,
    parsed: _Parses, options,  # type: ignore[no-untyped-def]
    check: bool = True,
) -> _Outcome:
    """`check=False`: the outcome is not checked (`_check`); the checks' second run checks only
    an outcome that would change a rewritten file again."""
    from migrate.engine import plan_edits

    modules: list[_Parsed] = []
    for path in members:
        item = _parse(path, parsed)
        if item is None:
            why = "has a syntax error" if parsed.tree(path) is None and "accel-migrate: skip" not in by_path[path].text else "is skipped (`# accel-migrate: skip`)"
            return _Outcome(reason=f"{by_path[path].display} {why}, so the modules it belongs to cannot be followed")
        modules.append(item)
    head, rest = modules[0], modules[1:]
    imported = [
        (by_path[target].display, name)
        for target, names in index.modules[entry].imports.items()
        if target in by_path
        for name in names
    ]
    module_imports = [(by_path[t].display, n) for t, n in _module_imports(index, entry, by_path)]
    assert head.facts is not None
    # the view renames the entry's call sites of a function imported under another name
    head.renamed = any(name.name is not None and name.local != name.name for _, name in imported)
    view = merged_facts(head.facts, [(m.source.display, m.facts) for m in rest if m.facts is not None],
                        imported, head.source.display)
    if isinstance(view, Conflict):
        wrapper = _package_wrapper(view, entry, by_path, index)
        if wrapper is not None:
            return wrapper
        return _Outcome(reason=(
            f"`{view.name}` is defined in both {view.first} and {view.second}, and the cross-module "
            "analysis follows functions by name; rename one of them"))
    lines = _StartLines({m.source.path: m.module for m in modules})
    hidden = _attribute_call(head, rest, module_imports, lines)
    if hidden is not None:
        return hidden  # a training step the roles cannot see: a rewrite of the rest would be partial
    roles = find_roles(view)
    if roles.hidden_steps:  # the loops running it are marked in the modules' own facts
        for m in modules:
            if m.facts is not None:
                m.facts.stepped = True
    home = roles.home
    if home is not None and not any(home is s for s in head.facts.scopes):
        where = next(m for m in rest if m.facts is not None and any(home is s for s in m.facts.scopes))
        if home.is_method and home.parent is not None:
            built = any(site.callee == home.parent.name for scope in head.facts.scopes for site in scope.calls)
            if not built:
                return _Outcome(reason=(
                    f"the optimizer is built in `{home.parent.name}.{home.name}` "
                    f"({where.source.display}:{lines.line(where.source.path, home.node)}), a class of another module "
                    "that this script does not build itself; the cross-module analysis follows a trainer class "
                    f"the script builds (`{home.parent.name}(...).run()`): build it here, or prepare by hand"))
            # else a trainer class the script builds and runs (`TrainLoop(model=model, ...).run_loop()`): its
            # method that builds the optimizer creates `self.accelerator` and prepares, as in one file
        else:
            return _factory(head, where, home, lines)
    plan = plan_edits(roles, options)
    rerouted = _reroute_forwarded_imports(head, plan, index.modules[entry].forwarded, index, by_path)
    if rerouted is not None:
        return rerouted

    for m in modules:
        if m.skipped:
            table = lines.table(m.source.path)
            drop_skipped(plan, lambda n, t=table: t.get(n, -1), m.skipped)
    located = _Located(modules, plan)
    owner = located.owner
    edited = {id(owner(node)) for node in plan.targets()} | ({id(head)} if plan.create_at is not None else set())
    changed_modules = [m for m in modules if id(m) in edited]
    entry_only = not any(m is not head for m in changed_modules)
    if not plan.changes or entry_only and any(s.backwards for m in rest if m.facts for s in m.facts.scopes):
        # a backward in another module that the view left as it is: its training step was not understood
        return _why_not(roles, plan, head, rest, owner, lines)

    outcome = _Outcome(entry_only=entry_only)
    reported = {id(owner(f.node)) for f in plan.findings}
    for m in modules:
        if m is not head and id(m) not in edited and id(m) not in reported:
            continue  # neither rewritten nor told anything (a module with findings keeps them)
        mine = [r for r in plan.changes if owner(r.node) is m], [f for f in plan.findings if owner(f.node) is m]
        counts: dict[int, int] = {}  # line counts the start-line pass goes past, for the rewrite's code
        line = lines.of(m.source.path, {x.node for group in mine for x in group}, counts)
        rewritten = _rewrite(m, plan, located.touched(m), counts)
        if rewritten is None:
            return _Outcome(reason=f"the rewrite of {m.source.display} would not compile (please report this)")
        new_module, new_text = rewritten
        outcome.trees[m.source.path] = new_module
        changes = sorted({Change(r.code, line[r.node], r.message) for r in mine[0]},
                         key=lambda c: (c.line, c.code, c.message))
        diagnostics = sorted({Diagnostic(f.code, line[f.node], f.message, unconverted=f.unconverted) for f in mine[1]},
                             key=lambda d: (d.line, d.code, d.message))
        outcome.results[m.source.path] = FileResult(
            m.source.display, m.source.text, new_text=new_text if new_text != m.source.text else None,
            changes=changes, diagnostics=diagnostics, parsed=True)
    failure = _check(outcome, parsed, options) if check else None
    if failure is not None:
        return _Outcome(reason=failure)
    return outcome


def _rewrite(m: _Parsed, plan, touched: set[cst.CSTNode],  # type: ignore[no-untyped-def]
             counts: dict[int, int] | None = None) -> tuple[cst.Module, str] | None:
    """`touched`: the module's planned edits and the nodes on the way to them (`_Located.touched`);
    `counts`: statement line counts from a start-line pass over the module (`start_lines`)."""
    rewriter = Rewriter(plan, touched)
    new_module = m.module.visit(rewriter)
    if plan.removes_boilerplate or rewriter.rebound:
        new_module = remove_unused(m.module, new_module, rewriter.rebound)
    # the entry may create nothing (a trainer class of another module creates the Accelerator):
    # each file takes only the imports its rewritten code reads
    code = StatementCode(m.module, m.source.text, counts)
    new_text = code(new_module)
    wanted = {
        item for item in plan.imports
        if re.search(rf"\b{re.escape(item[1])}\b", new_text) and not re.search(rf"\b{re.escape(item[1])}\b", m.source.text)
    }
    if wanted:
        new_module = add_imports(new_module, wanted)
        new_text = code(new_module)  # only the added import lines are generated again
    try:
        compile(new_text, m.source.display, "exec", dont_inherit=True)
    except SyntaxError:
        return None
    return new_module, new_text


def _check(outcome: _Outcome, parsed: _Parses, options) -> str | None:  # type: ignore[no-untyped-def]
    """Every rewritten file passes the safety checks (idempotence judged on the whole unit)."""
    from migrate.safety import idempotent
    from migrate.safety.fallback import first_failure, map_line, output_tree
    from migrate.safety.registry import CHECKS

    by_path = parsed.by_path
    checks = [c for c in CHECKS if c.code not in options.ignore and c.code != idempotent.CODE]
    outputs: dict[Path, cst.Module] = {}  # the second run below reads the trees the checks parsed
    for path, result in outcome.results.items():
        if result.new_text is None:
            continue
        module = parsed.tree(path)
        assert module is not None  # it was rewritten
        tree = output_tree(outcome.trees.get(path))
        try:
            outputs[path] = tree if tree is not None else cst.parse_module(result.new_text)
        except cst.ParserSyntaxError:
            pass  # first_failure reports it
        failure = first_failure(module, result.old_text, result.path, options, result.new_text, checks,
                                after=outputs.get(path))
        if failure is not None:
            check, violations = failure
            line = map_line(result.old_text, result.new_text, violations[0].line)
            return (f"the cross-module rewrite of {result.path} fails the {check.code} {check.name} check at "
                    f"line {line} ({violations[0].message})")
    if idempotent.CODE in options.ignore:
        return None
    # a second run over the rewritten unit must plan nothing more
    again = [Source(p, s.display, outcome.results[p].new_text or s.text if p in outcome.results else s.text)
             for p, s in by_path.items()]
    from migrate.project import build_index

    index = build_index({s.path: s.text for s in again})
    again_by_path = {s.path: s for s in again}
    unchanged = {p: t for p, t in parsed.trees.items() if p not in outcome.results or outcome.results[p].new_text is None}
    facts = {p: item.facts for p, item in parsed.items.items()
             if p in unchanged and item is not None and item.facts is not None and not item.renamed}
    same = frozenset(p for p in by_path if p not in outcome.results or outcome.results[p].new_text is None)
    second_parses = _Parses(again_by_path, {**unchanged, **outputs}, facts, parsed, same)
    for entry in _entries(index, again_by_path):
        reached = _reached(index, entry, again_by_path)
        if not any(p in outcome.results for p in reached):
            continue  # an entry's run edits only the modules it reaches: none of this unit's rewritten files
        second = _migrate_entry(entry, reached, again_by_path, index, second_parses, options, check=False)
        # only this unit's rewritten files must stay as they are: an entry the first run refused (it
        # shares a module with the entry migrated) may well be migrated by a second run
        again_changed = [r.path for p, r in second.results.items() if r.changed and p in outcome.results]
        # the second run's own check (a third run over its rewrite) is made only where it decides:
        # an outcome that fails it is a refusal, which changes nothing
        if second.reason is None and again_changed and _check(second, second_parses, options) is None:
            changed = again_changed[0]
            return (f"a second run over the rewritten unit would change {changed} again (AM103 idempotent); "
                    "please report this")
    return None


def _module_imports(index: ModuleIndex, entry: Path, by_path: dict[Path, Source]) -> list[tuple[Path, ImportedName]]:
    return [(t, n) for t, names in index.modules[entry].imports.items() if t in by_path for n in names if n.name is None]


class _Located:
    """Which module of the unit each planned edit, change and finding belongs to (`owner`; None:
    in no module of the unit), and each module's planned edits with the nodes on the way to them
    (`touched`: where the rewriter descends, as `migrate.walk.with_ancestors` finds them). One
    read-only walk per module, in the unit's order, until every node asked about is found; nodes
    are told apart by `id` (a libcst node's hash is Python code)."""

    def __init__(self, modules: list[_Parsed], plan) -> None:  # type: ignore[no-untyped-def]
        targets = plan.targets()
        target_ids = {id(node) for node in targets}
        left = target_ids | {id(r.node) for r in plan.changes} | {id(f.node) for f in plan.findings}
        self._owners: dict[int, _Parsed] = {}
        self._touched: dict[int, set[cst.CSTNode]] = {}
        for m in modules:
            if not left:
                break
            found = self._walk(m, target_ids, left)
            if found:
                self._touched[id(m)] = found

    def _walk(self, m: _Parsed, target_ids: set[int], left: set[int]) -> set[cst.CSTNode]:
        owners, found, path = self._owners, set(), []  # type: ignore[var-annotated]

        def visit(node: cst.CSTNode) -> None:
            key = id(node)
            if key in target_ids:
                found.add(node)
                found.update(path)
            if key in left:
                left.discard(key)
                owners[key] = m
                if not left:  # every target is found too: the rest of the module is not needed
                    raise AllFound
            path.append(node)
            for value in child_getter(type(node))(node):
                kind = type(value)
                if kind is tuple or kind is list:
                    for child in value:  # type: ignore[attr-defined]
                        if type(child) in LEAVES and not child.lpar and id(child) not in left:
                            continue  # a name or literal without parentheses: nothing below it
                        visit(child)
                elif kind not in NOT_NODES:
                    if kind in LEAVES and not value.lpar and id(value) not in left:  # type: ignore[attr-defined]
                        continue
                    visit(value)  # type: ignore[arg-type]
            path.pop()

        try:
            visit(m.module)
        except AllFound:
            pass
        return found

    def owner(self, node: cst.CSTNode) -> _Parsed | None:
        return self._owners.get(id(node))

    def touched(self, m: _Parsed) -> set[cst.CSTNode]:
        return self._touched.get(id(m), set())




class _StartLines:
    """Start lines of nodes of the unit's modules, by path. Most questions are about a few nodes (the
    line a refusal names, the lines of a file's changes): each is a start-line pass that stops at the
    last node asked for. A module with `# accel-migrate: skip` lines gets its whole table (every
    planned edit is looked up in it), which then answers every later question about that module."""

    def __init__(self, modules: dict[Path, cst.Module]) -> None:
        self._modules = modules
        self._tables: dict[Path, dict[cst.CSTNode, int]] = {}

    def table(self, path: Path) -> dict[cst.CSTNode, int]:
        if path not in self._tables:
            self._tables[path] = start_lines(self._modules[path])
        return self._tables[path]

    def of(self, path: Path, nodes: Iterable[cst.CSTNode], counts: dict[int, int] | None = None) -> dict[cst.CSTNode, int]:
        """`counts`: receives the statement line counts the pass goes past (`start_lines`)."""
        table = self._tables.get(path)
        return table if table is not None else start_lines(self._modules[path], nodes, counts)

    def line(self, path: Path, node: cst.CSTNode) -> int:
        return self.of(path, [node])[node]


def _why_not(roles, plan, head: _Parsed, rest: list[_Parsed], owner, lines) -> _Outcome:  # type: ignore[no-untyped-def]
    """What the joined view found, and what stopped the migration, for the entry's diagnostic."""
    findings = [f for f in plan.findings if owner(f.node) is not None]
    if roles.home is None:
        for m in rest:
            for scope in m.facts.functions.values() if m.facts else ():
                if _builds_optimizer(scope) and any(site.callee == scope.name for s in head.facts.scopes for site in s.calls):
                    return _factory(head, m, scope, lines)
        return _Outcome(reason="no optimizer is built in the entry or in a function it calls; build the optimizer "
                               "in the script that builds the model")
    if findings:
        first = findings[0]
        where = owner(first.node)
        outcome = _Outcome(reason=f"{where.source.display}:{lines.line(where.source.path, first.node)}: {first.code} {first.message}",
                           unconverted=not roles.accelerator_exists or any(f.unconverted for f in findings))
        if roles.started_by_mpi:
            outcome.whole = True
            outcome.elsewhere = [(owner(f.node).source.path, Diagnostic(
                f.code, lines.line(owner(f.node).source.path, f.node), f.message, unconverted=f.unconverted))
                for f in findings]
        return outcome
    # with an Accelerator already there (a migrated unit run again), there is nothing left to convert
    return _Outcome(reason="the roles found nothing to rewrite in the other modules of the run",
                    unconverted=not roles.accelerator_exists)


def _reroute_forwarded_imports(head: _Parsed, plan, forwarded: dict[str, tuple[Path, Path]],  # type: ignore[no-untyped-def]
                               index: ModuleIndex, by_path: dict[Path, Source]) -> _Outcome | None:
    """A function the entry reaches through a package's dispatching wrapper (`migrate/forwarding.py`)
    whose calls the migration changes (`build_loader(config, accelerator=accelerator)`): the wrapper
    would not hand the new argument on (it takes no `accelerator`), so the entry imports the function
    itself from its module instead (`from data.build import build_loader`), which is what the
    wrapper ran for these calls. Only a plain `from pkg import name` line is rewritten; any other
    import of it refuses the unit (None: nothing to do, or done in `plan`)."""
    if not forwarded:
        return None
    changed_calls = {*plan.new_args, *plan.calls}
    for local, (package, module) in forwarded.items():
        if not any(isinstance(c.func, cst.Name) and c.func.value == local for c in changed_calls):
            continue
        name = next(n.name for n in index.modules[head.source.path].imports.get(module, []) if n.local == local)
        dotted = next((n for n in index.modules[module].names if "." in n), None)
        statement = next((stmt for stmt in head.module.body if _imports_only(stmt, local)), None)
        if dotted is None or statement is None:
            return _Outcome(reason=(
                f"`{local}` is reached through the wrapper in {by_path[package].display}, which would not hand on "
                f"the `accelerator` argument its migrated calls pass to {by_path[module].display}: import it "
                f"from that module on a line of its own, and run again"))
        alias = "" if name == local else f" as {local}"
        plan.replace_stmt[statement] = [statement.with_changes(
            body=[cst.parse_statement(f"from {dotted} import {name}{alias}\n").body[0]])]
        plan.change(CODE, statement, (
            f"`{local}` is imported from {dotted}, the module whose function the wrapper in "
            f"{by_path[package].display} runs for this script's calls: the migrated calls pass it "
            "`accelerator`, which the wrapper would not hand on"))
    return None


def _imports_only(statement: cst.CSTNode, local: str) -> bool:
    """`from pkg import local` (absolute, one name, no `as`), alone on its line."""
    if not (isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1):
        return False
    node = statement.body[0]
    return (isinstance(node, cst.ImportFrom) and not node.relative and not isinstance(node.names, cst.ImportStar)
            and len(node.names) == 1 and node.names[0].asname is None
            and isinstance(node.names[0].name, cst.Name) and node.names[0].name.value == local)


def _factory(head: _Parsed, where: _Parsed, builder, lines) -> _Outcome:  # type: ignore[no-untyped-def]
    """The optimizer comes from a function of another module (`create_optimizer(args, model)`)."""
    assert head.facts is not None
    calls = [site.where.stmt for scope in head.facts.scopes for site in scope.calls if site.callee == builder.name]
    at = lines.of(head.source.path, calls)
    return _Outcome(line=min((at[c] for c in calls), default=1), reason=(
        f"the optimizer is built in `{builder.name}` ({where.source.display}:{lines.line(where.source.path, builder.node)}) "
        "and handed back to this script; the cross-module analysis prepares objects built in the entry's "
        "own code: build the optimizer here (`optimizer = torch.optim.X(model.parameters(), ...)`, the "
        f"parameter groups may still come from {where.source.display}), or prepare it by hand"))


def _package_wrapper(view: Conflict, entry: Path, by_path: dict[Path, Source], index: ModuleIndex) -> _Outcome | None:
    """`build_loader` of a package's `__init__.py` wraps the `build_loader` of one of its modules,
    imported under another name (`from .build import build_loader as _build_loader`): what the
    wrapper returns depends on its branches, so the loaders the entry gets are not followed."""
    paths = {source.display: path for path, source in by_path.items()}
    for package, module in ((view.first, view.second), (view.second, view.first)):
        init, other = paths.get(package), paths.get(module)
        if init is None or other is None or init.name != "__init__.py":
            continue
        aliased = [n for n in index.modules[init].imports.get(other, []) if n.name == view.name and n.local != n.name]
        if not aliased:
            continue
        dotted = next((n for n in index.modules[other].names if "." in n), other.stem)
        imported = [n.line for n in index.modules[entry].imports.get(init, []) if n.name == view.name]
        return _Outcome(line=min(imported, default=1), reason=(
            f"`{view.name}` of {package} wraps `{view.name}` of {module} (imported as `{aliased[0].local}` at "
            f"{package}:{aliased[0].line}) and the objects it returns depend on its branches, so the loaders it "
            f"builds are not followed: import the function that builds them (`from {dotted} import {view.name}`), "
            f"or make {package} re-export it (`from .{other.stem} import {view.name}`), and run again"))
    return None


def _attribute_call(head: _Parsed, rest: list[_Parsed], module_imports, lines) -> _Outcome | None:  # type: ignore[no-untyped-def]
    """`engine.train_one_epoch(...)` after `import engine`: a call the joined view cannot follow."""
    assert head.facts is not None
    for _, name in module_imports:
        for scope in head.facts.scopes:
            for call in scope.library_calls:
                function = call.qualified.split(".", 1)[1] if call.qualified.startswith(f"{name.local}.") else ""
                if function and "." not in function and _trains(function, rest):
                    line = lines.line(head.source.path, call.where.stmt)
                    return _Outcome(line=line, reason=(
                        f"line {line} calls `{call.qualified}`, a function of another module of the run that "
                        "trains, through the module object; the cross-module analysis follows names imported "
                        f"with `from {name.local} import {function}`: import it that way and run again"))
    return None


def _trains(name: str, modules: list[_Parsed]) -> bool:
    for m in modules:
        scope = m.facts.functions.get(name) if m.facts else None
        if scope is not None and (scope.backwards or scope.steps or _builds_optimizer(scope)):
            return True
    return False


def _builds_optimizer(scope) -> bool:  # type: ignore[no-untyped-def]
    return any(call.qualified.startswith("torch.optim.") and call.qualified.split(".")[-1][:1].isupper()
               for call in scope.library_calls)


def _better_informed(outcome: _Outcome, alone: FileResult, entry: Path) -> bool:
    """The view saw what the entry alone could not: a loader returned by another module's
    `get_loader` (a module without training code of its own), prepared in the view, left as "not a
    recognised DataLoader" by the entry alone. Taken when the view's entry has fewer diagnostics."""
    joined = outcome.results.get(entry)
    return joined is not None and joined.new_text is not None and len(joined.diagnostics) < len(alone.diagnostics)


def _trains_through(entry: Path, members: list[Path], by_path: dict[Path, Source]) -> bool:
    """A module the entry reaches holds training code (see `migrate/prefilter.py`): the entry's
    training is split over the unit, so the unit is migrated whole or not at all."""
    from migrate.prefilter import worth_parsing

    return any(worth_parsing(by_path[p].text) for p in members[1:])


def _not_followed(reason: str) -> str:
    return (f"this script trains through other modules of the run; it and they were left as they are "
            f"(a unit is migrated whole or not at all): {reason}")


def _tell_callees(results: dict[Path, FileResult], members: list[Path], entry: Path, by_path: dict[Path, Source],
                  index: ModuleIndex, migrated: bool = False) -> None:
    """A module called from the entry is not "a library module": say which file imports it."""
    for path in members[1:]:
        result = results[path]
        importers = [p for p in index.importers(path) if p in members]
        if not importers or not any(any(w in d.message for w in _LIBRARY) for d in result.diagnostics):
            continue
        caller = by_path[importers[0]]
        line = index.modules[importers[0]].imports[path][0].line
        result.diagnostics = [
            Diagnostic(CODE, d.line, (
                f"not a library module: imported by {caller.display}:{line}, and migrated with the script "
                f"{by_path[entry].display}" + ("" if migrated else
                " (its AM013 diagnostic says what could not be followed across modules)")))
            if any(w in d.message for w in _LIBRARY) else d
            for d in result.diagnostics
        ]


def not_given(
    given: list[FileResult], read: list[FileResult], sources: list[Source], companions: list[Source],
    index: ModuleIndex, options,  # type: ignore[no-untyped-def]
) -> list[FileResult]:
    """The results of the given files of a unit that also holds modules read but not given
    (`migrate.project.local_imports`): those are never written, so when the unit's training takes
    an edit in one of them, none of the given scripts that reach it is written either (a script
    rewritten without its training step would train differently, or not at all), and each gets
    AM013 naming the modules to give too."""
    from migrate.runner import migrate_text

    # A module is edited for the unit when its result differs from what it gets on its own.
    claimed = {
        c.path: c for c, r in zip(companions, read) if r.changed and r.new_text != migrate_text(c.text, c.display, options).new_text
    }
    if not claimed:
        return given
    for source, result in zip(sources, given):
        needed = [claimed[p].display for p in index.reached(source.path) if p in claimed]
        if not needed:
            continue
        result.new_text = None
        result.changes = []
        names = index.modules[source.path].imports.values()
        line = min((n.line for imported in names for n in imported), default=1)
        folder = os.path.commonpath([os.path.dirname(source.path), *(os.path.dirname(p) for p in claimed)])
        if not os.path.relpath(folder).startswith(".."):
            folder = os.path.relpath(folder)
        message = (
            f"this script trains through {', '.join(f'`{n}`' for n in needed)}, which need edits too but were not given "
            f"(they were read to follow the training, and are never written), so nothing was written: migrate them "
            f"together, e.g. `accel-migrate {folder}`"
        )
        result.diagnostics = sorted({*result.diagnostics, Diagnostic(CODE, line, message, unconverted=True)}, key=lambda d: (d.line, d.code, d.message))
    return given
