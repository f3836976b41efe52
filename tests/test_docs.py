"""The documentation agrees with the code: README size, the generated rules page, every CLI option,
every public Accelerator method, every relative link. Fast and without torch (the runtime is read
with `ast`, `accel`'s parser is built without importing torch)."""

from __future__ import annotations

import argparse
import ast
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
README = ROOT / "README.md"
CLI_PAGE = DOCS / "cli.md"
README_LIMIT = 20_000
PAGES = sorted([README, ROOT / "CONTRIBUTING.md", ROOT / "benchmarks" / "README.md", *DOCS.glob("*.md")])


def relative(path: Path) -> str:
    return str(path.relative_to(ROOT))


# ---------------------------------------------------------------------------------------------
# markdown helpers


_FENCE = re.compile(r"^\s*(```|~~~)")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


def prose_lines(text: str) -> list[str]:
    """The lines of a markdown page outside fenced code blocks."""
    lines, fenced = [], False
    for line in text.splitlines():
        if _FENCE.match(line):
            fenced = not fenced
            lines.append("")
            continue
        lines.append("" if fenced else line)
    return lines


def headings(text: str) -> list[tuple[int, int, str]]:
    """(line index, level, text) of every heading outside code blocks."""
    found = []
    for index, line in enumerate(prose_lines(text)):
        match = _HEADING.match(line)
        if match:
            found.append((index, len(match[1]), match[2]))
    return found


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(text: str) -> set[str]:
    seen: dict[str, int] = {}
    result = set()
    for _, _, heading in headings(text):
        slug = github_anchor(heading)
        count = seen.get(slug, 0)
        result.add(slug if count == 0 else f"{slug}-{count}")
        seen[slug] = count + 1
    return result


def section(text: str, starts_with: str, exact: bool = False) -> str | None:
    """The text under the first heading whose text starts with `starts_with`, down to the next
    heading of the same or a higher level (its subsections included); with `exact`, under the
    heading that is exactly `starts_with`, down to the next heading (its own text only)."""
    lines = text.splitlines()
    found = headings(text)
    for position, (index, level, heading) in enumerate(found):
        if heading == starts_with if exact else heading.startswith(starts_with):
            deepest = 6 if exact else level
            end = next((i for i, lvl, _ in found[position + 1 :] if lvl <= deepest), len(lines))
            return "\n".join(lines[index:end])
    return None


# ---------------------------------------------------------------------------------------------
# README


def test_readme_is_a_front_page_of_at_most_20000_characters() -> None:
    size = len(README.read_text(encoding="utf-8"))
    assert size <= README_LIMIT, (
        f"README.md has {size} characters, over the {README_LIMIT} of a front page: move reference "
        "text to the docs/ page it belongs to and link it from README.md"
    )


def test_readme_test_command_is_where_ci_reads_it() -> None:
    # .ci/run takes the first line starting with `python3 -m venv` after the test-command marker
    lines = README.read_text(encoding="utf-8").splitlines()
    marker = next((i for i, line in enumerate(lines) if "<!-- test-command" in line), None)
    assert marker is not None, "README.md lost the `<!-- test-command` marker that .ci/run looks for"
    command = next((line for line in lines[marker + 1 :] if line.startswith("python3 -m venv")), "")
    assert "pip install -e '.[test]'" in command and "python -m pytest" in command, command
    assert "<!-- test-command" in (ROOT / ".ci" / "run").read_text(encoding="utf-8")


def test_readme_rule_table_lists_every_rule() -> None:
    from migrate.cli import _rule_table

    text = README.read_text(encoding="utf-8")
    missing = [
        f"| {code} | {name} | ... |" for code, name, _, _ in _rule_table() if not code.startswith("AM1") and f"| {code} | {name} |" not in text
    ]
    assert not missing, "README.md's rule table (in A short tour) lacks rows; add " + ", ".join(missing)


# ---------------------------------------------------------------------------------------------
# rules


def test_rules_page_is_generated_from_the_docstrings_without_torch() -> None:
    import subprocess

    from migrate.docs_rules import COMMAND

    # the generator's own process: what it prints, and that it never imported torch
    code = "import sys, migrate.docs_rules as d; sys.stdout.write(d.render()); sys.exit(3 if 'torch' in sys.modules else 0)"
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr or "migrate.docs_rules imported torch"
    page = DOCS / "rules.md"
    assert page.is_file() and page.read_text(encoding="utf-8") == run.stdout, (
        f"docs/rules.md is not what the rule docstrings generate; regenerate it with `{COMMAND}`"
    )


def test_every_rule_code_and_safety_check_is_on_the_rules_page() -> None:
    from migrate.cli import _known_codes

    text = (DOCS / "rules.md").read_text(encoding="utf-8")
    titles = {heading.split()[0] for _, level, heading in headings(text) if level == 3}
    codes = _known_codes()
    assert len(codes) >= 17  # the rules, AM900 and 4 safety checks: the registry really was read
    missing = sorted(codes - titles)
    assert not missing, f"docs/rules.md has no section for {missing}; regenerate it with `python -m migrate.docs_rules > docs/rules.md`"


def test_docstring_sections_render_as_markdown() -> None:
    from migrate.docs_rules import render_doc

    doc = """Summary line.

    What it does:
        Text with `code`:
        - an item
          continued
        After the list.

    Example:
        a = 1    ->    b = 2

    Fix: inline text.
    """
    assert render_doc(doc) == (
        "**What it does**\n\nText with `code`:\n\n- an item\n  continued\n\nAfter the list.\n\n"
        "**Example**\n\n```text\na = 1    ->    b = 2\n```\n\n**Fix**\n\ninline text."
    )


# ---------------------------------------------------------------------------------------------
# CLI options


def typer_commands() -> list[tuple[str, list[str]]]:
    """(command line, option strings) of `accel-migrate` and each of its subcommands."""
    import typer

    from migrate.cli import app
    from migrate.subcommands import commands

    found = []

    def options(command, name: str) -> list[str]:  # type: ignore[no-untyped-def]
        context = command.context_class(command, info_name=name, **(command.context_settings or {}))
        return [
            opt
            for param in command.get_params(context)
            if param.param_type_name == "option"
            for opt in [*param.opts, *param.secondary_opts]
        ]

    main = typer.main.get_command(app)
    found.append(("accel-migrate [OPTIONS]", options(main, "accel-migrate")))
    group = typer.main.get_command(commands)
    for name, command in sorted(group.commands.items()):
        found.append((f"accel-migrate {name}", options(command, name)))
    return found


def argparse_commands() -> list[tuple[str, list[str]]]:
    """(command line, option strings) of `accel` and each of its subcommands."""
    from runtime.cli import build_parser

    parser = build_parser()
    found = [("accel", [s for a in parser._actions for s in a.option_strings])]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in sorted(action.choices.items()):
                found.append((f"accel {name}", [s for a in sub._actions for s in a.option_strings]))
    return found


def documented(section_text: str, option: str) -> bool:
    """The option appears in backticks, alone or followed by its value (`--steps K`)."""
    return re.search(r"`" + re.escape(option) + r"(?=[`\s=\[])", section_text) is not None


def test_cli_enumeration_sees_the_real_commands() -> None:
    commands = dict(typer_commands() + argparse_commands())
    assert {"--diff", "--jobs", "-j", "--help"} <= set(commands["accel-migrate [OPTIONS]"])
    assert "--nproc-per-node" in commands["accel-migrate verify"]
    assert {"--nproc-per-node", "--nproc_per_node", "-m"} <= set(commands["accel launch"])
    assert "--default" in commands["accel config"]
    assert not documented("`--diffs` and `--diff-x`", "--diff")
    assert documented("| `--steps K` |", "--steps") and documented("`-h`, `--help`", "-h")


def heading_for(command: str) -> str:
    """How a command's section heading in docs/cli.md starts."""
    if command in ("accel-migrate", "accel"):
        return command
    return f"Migrating: `{command}" if command.endswith("[OPTIONS]") else f"`{command}"


@pytest.mark.parametrize("command, options", typer_commands() + argparse_commands(), ids=lambda v: v if isinstance(v, str) else "")
def test_every_cli_option_is_in_docs_cli(command: str, options: list[str]) -> None:
    text = CLI_PAGE.read_text(encoding="utf-8")
    start = heading_for(command)
    body = section(text, start, exact=command in ("accel-migrate", "accel"))
    assert body is not None, (
        f"docs/cli.md has no section for `{command}`: add a heading `### {start}...` (under "
        f"`## {command.split()[0]}`) with a table of its options"
    )
    missing = [opt for opt in options if not documented(body, opt)]
    assert not missing, (
        f"docs/cli.md, in the section whose heading starts with {start!r}, does not document {', '.join(missing)} of `{command}`: "
        f"add each, in backticks, to that section's option table (a row `| `{missing[0]} VALUE` | what it "
        "does |`; aliases such as `--x_y` in the same row)"
    )


# ---------------------------------------------------------------------------------------------
# runtime API


def _runtime_classes() -> dict[str, ast.ClassDef]:
    classes: dict[str, ast.ClassDef] = {}
    for path in (ROOT / "runtime").glob("*.py"):
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.ClassDef):
                classes.setdefault(node.name, node)
    return classes


def accelerator_public_names() -> list[str]:
    """Public methods, properties and class attributes of runtime.Accelerator, with those of its
    base classes defined in runtime/ (`ProcessView`: process_index, device...)."""
    classes = _runtime_classes()
    names: list[str] = []
    pending = [classes["Accelerator"]]
    while pending:
        cls = pending.pop()
        for node in cls.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not node.name.startswith("_"):
                names.append(node.name)
            elif isinstance(node, ast.Assign):
                names += [t.id for t in node.targets if isinstance(t, ast.Name) and not t.id.startswith("_")]
        pending += [classes[b.id] for b in cls.bases if isinstance(b, ast.Name) and b.id in classes]
    return sorted(set(names))


def test_every_public_name_of_the_runtime_package_is_in_docs_runtime() -> None:
    tree = ast.parse((ROOT / "runtime" / "__init__.py").read_text(encoding="utf-8"))
    exports = next(
        node.value for node in tree.body
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "_EXPORTS" for t in node.targets)
    )
    names = [key.value for key in exports.keys]  # type: ignore[union-attr]
    assert "Accelerator" in names
    text = (DOCS / "runtime.md").read_text(encoding="utf-8")
    missing = [name for name in names if f"`{name}`" not in text]
    assert not missing, f"docs/runtime.md does not name {', '.join(missing)} (exported by runtime/__init__.py): add it"


def test_every_public_accelerator_method_is_in_docs_runtime() -> None:
    names = accelerator_public_names()
    assert {"prepare", "backward", "save_state", "device"} <= set(names)
    text = (DOCS / "runtime.md").read_text(encoding="utf-8")
    missing = [n for n in names if not re.search(r"`(?:accelerator\.|@accelerator\.)?" + re.escape(n) + r"[`(]", text)]
    assert not missing, (
        f"docs/runtime.md does not name {', '.join(missing)} (public on runtime.Accelerator): add a "
        "row to its Properties or Methods table, e.g. `| `name(args)` | what it does |`"
    )


# ---------------------------------------------------------------------------------------------
# links


_LINK = re.compile(r"(?<!\\)\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def links(text: str) -> list[str]:
    found = []
    for line in prose_lines(text):
        line = re.sub(r"`[^`]*`", "", line)  # inline code is not a link
        found += _LINK.findall(line)
    return found


@pytest.mark.parametrize("page", PAGES, ids=relative)
def test_relative_links_point_to_existing_files_and_headings(page: Path) -> None:
    problems = []
    for target in links(page.read_text(encoding="utf-8")):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):
            continue  # https:, mailto: ...
        path_part, _, fragment = target.partition("#")
        resolved = (page.parent / path_part).resolve() if path_part else page
        if not resolved.exists():
            problems.append(f"{target}: no file {resolved.relative_to(ROOT) if resolved.is_relative_to(ROOT) else resolved}")
        elif fragment and resolved.suffix == ".md" and fragment not in anchors(resolved.read_text(encoding="utf-8")):
            problems.append(f"{target}: no heading with anchor #{fragment} in {relative(resolved)}")
    assert not problems, f"{relative(page)} has broken links (link only pages that exist):\n" + "\n".join(problems)


def test_link_checker_finds_broken_links(tmp_path: Path) -> None:
    assert links("see [a](docs/cli.md#x) and `[b](not-a-link.md)`\n```\n[c](code.md)\n```") == ["docs/cli.md#x"]
    assert github_anchor("On N processes: `--nproc-per-node N`") == "on-n-processes---nproc-per-node-n"
    assert section("# A\n## B\nb\n### C\nc\n## D\nd", "B") == "## B\nb\n### C\nc"
    assert section("## Bx\nbx\n## B\nb\n### C\nc", "B", exact=True) == "## B\nb"


# ---------------------------------------------------------------------------------------------
# configuration


def test_every_setting_key_and_variable_is_in_docs_configuration() -> None:
    from migrate.config import KEYS
    from runtime.launch import LAUNCH_CONFIG_KEYS
    from runtime.settings import CONFIG_FILE_ENV, SPECS

    text = (DOCS / "configuration.md").read_text(encoding="utf-8")
    toml = section(text, "accel-migrate: `[tool.accel-migrate]`") or ""
    runtime = section(text, "The runtime") or ""
    wanted = [(toml, f"{key} =", "its `[tool.accel-migrate]` example (`key = value  # ...`)") for key in KEYS]
    wanted += [(runtime, f"`{spec.env}`", "its settings table") for spec in SPECS]
    wanted += [(runtime, f"`{spec.config_key}`", "its settings table") for spec in SPECS]
    wanted += [(runtime, f"`{key}`", "its table of launch defaults") for key in LAUNCH_CONFIG_KEYS]
    wanted += [(runtime, f"`{CONFIG_FILE_ENV}`", "the text about the config file")]
    assert len(wanted) > 20
    missing = [f"{needle} (in {where})" for body, needle, where in wanted if needle not in body]
    assert not missing, "docs/configuration.md does not document: " + "; ".join(missing)


def test_every_docs_page_is_in_the_index() -> None:
    index = DOCS / "README.md"
    linked = {target.partition("#")[0] for target in links(index.read_text(encoding="utf-8"))}
    pages = sorted(p.name for p in DOCS.glob("*.md") if p != index)
    assert len(pages) >= 8
    missing = [name for name in pages if name not in linked]
    assert not missing, (
        f"docs/README.md (the index) does not link {', '.join(missing)}: add a row "
        f"`| [{missing[0]}]({missing[0]}) | what is in it |` to its table (and one to README.md's Documentation table)"
    )
