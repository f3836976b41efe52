"""Report formats: text lines, JSON (versioned schema), GitHub workflow annotations and SARIF 2.1.0.

Pure functions of a Report: they return strings, the CLI decides where they go.

JSON schema, version 1 (`schema_version` changes only when a field is removed or changes meaning):

    {
      "schema_version": 1,
      "tool": {"name": "accel-migrate", "version": "0.1.0"},
      "mode": "write" | "check" | "diff",
      "exit_code": 0 | 1 | 2 | 123,
      "summary": {"files": int, "changed": int, "unchanged": int, "skipped": int, "failed": int,
                  "excluded": int, "diagnostics": int, "changes_by_rule": {"AM003": int, ...},
                  "outcomes": {"migrated": int, "partial": int, "refused": int, "unchanged": int,
                               "no-training-code": int, "failed": int}},
      "files": [{
        "path": str, "kind": "python" | "notebook",
        "status": "changed" | "unchanged" | "skipped" | "failed",
        "outcome": "migrated" | "partial" | "refused" | "unchanged" | "no-training-code" | "failed",
        "written_to": str | null,
        "changes": [{"code": str, "line": int, "cell": int | null, "message": str}],
        "diagnostics": [{"code": str, "line": int, "cell": int | null, "severity": str, "message": str,
                         "unconverted": bool}],
        "error": null | {"line": int, "column": int, "cell": int | null, "message": str},
        "diff": str | null
      }]
    }

`skipped`: not parsed (the text never mentions torch). `status` says what happened to the file's text,
`outcome` what happened to its training code (`FileResult.outcome`); a diagnostic's `unconverted` says
that its rule left training code unconverted there (the outcome is then partial or refused).
`line`/`column` 0: no position. In a notebook
`cell` is the cell's 1-based position in the notebook and `line` the line within that cell.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from migrate.diff import result_diff
from migrate.results import NOT_CONVERTED, OUTCOMES, FileResult

SCHEMA_VERSION = 1
SARIF_SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"


def version() -> str:
    from migrate import __version__

    return __version__


def _where(path: str, line: int, cell: int | None, column: int = 0) -> str:
    where = f"{path}:cell {cell}" if cell is not None else path
    if line:
        where += f":{line}"
        if column:
            where += f":{column}"
    return where


def text_lines(result: FileResult, write: bool, verbose: bool, quiet: bool) -> list[tuple[str, str]]:
    """(style, line) pairs for stderr: style is error, warning, info or change."""
    lines: list[tuple[str, str]] = []
    if result.error is not None:
        error = result.error
        lines.append(("error", f"{_where(result.path, error.line, error.cell, error.column)}: error: {error.message}"))
        return lines
    if quiet:
        return lines
    if result.changed:
        verb = "migrated" if write else "would migrate"
        written = f" -> {result.written_to}" if result.written_to and result.written_to != result.path else ""
        lines.append(("info", f"{verb} {result.path}{written}"))
    if verbose:
        for change in result.changes:
            lines.append(("change", f"{_where(result.path, change.line, change.cell)}: {change.code} {change.message}"))
    lines += [("warning", line) for line in diagnostic_lines(result)]
    return lines


def diagnostic_lines(result: FileResult) -> list[str]:
    """One `path:line: CODE severity: message` line per diagnostic (also printed by `accel launch --migrate`)."""
    return [
        f"{_where(result.path, d.line, d.cell)}: {d.code} {d.severity}: {d.message}" for d in result.diagnostics
    ]


def counts(report) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    """The run's counts: the one source of the text summary and of JSON's `summary`.

    files: every path reported (a missing one counts as failed), each counted once under its
    status: changed + unchanged + skipped + failed == files. excluded: paths the excludes left
    out (not among the files). diagnostics: over all files. outcomes: each file counted once
    under its outcome (`FileResult.outcome`), every outcome present.
    """
    return {
        "files": len(report.results),
        "changed": report.count("changed"),
        "unchanged": report.count("unchanged"),
        "skipped": report.count("skipped"),
        "failed": report.count("failed"),
        "excluded": len(report.excluded),
        "diagnostics": report.diagnostics,
        "changes_by_rule": report.rule_counts(),
        "outcomes": {name: sum(1 for r in report.results if r.outcome == name) for name in OUTCOMES},
    }


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'s' if n != 1 else ''}"


def summary(report, write: bool) -> str:  # type: ignore[no-untyped-def]
    """`1 file migrated, 1 unchanged, 2 skipped (no training code), 1 failed; 3 diagnostics. ...`"""
    c = counts(report)
    verb = "migrated" if write else "would be migrated"
    parts = [f"{_plural(c['changed'], 'file')} {verb}", f"{c['unchanged']} unchanged",
             f"{c['skipped']} skipped (no training code)"]
    if c["failed"]:
        parts.append(f"{c['failed']} failed")
    line = ", ".join(parts) + f"; {_plural(c['diagnostics'], 'diagnostic')}. {_plural(c['files'], 'file')} seen"
    if c["excluded"]:
        line += f", {_plural(c['excluded'], 'path')} excluded"
    line += "."
    if c["changes_by_rule"]:
        line += " Changes by rule: " + ", ".join(f"{code} x{n}" for code, n in c["changes_by_rule"].items()) + "."
    return line + "\n" + outcome_line(report, write)


NAMED = 20  # refused and partial files named in the outcome line; the JSON report gives every file's


def outcome_line(report, write: bool) -> str:  # type: ignore[no-untyped-def]
    """`Outcomes: 2 migrated, 1 partial (a.py), 1 refused (b.py), 3 unchanged, 4 no-training-code.`
    (the non-zero outcomes, the partial and refused files named), then, when nothing is written
    and training code was left unconverted, why `--check` fails."""
    parts = []
    for name in OUTCOMES:
        files = [r.path for r in report.results if r.outcome == name]
        if not files:
            continue
        part = f"{len(files)} {name}"
        if name in NOT_CONVERTED:
            shown = ", ".join(files[:NAMED]) + (f" and {len(files) - NAMED} more" if len(files) > NAMED else "")
            part += f" ({shown})"
        parts.append(part)
    line = "Outcomes: " + ", ".join(parts) + "."
    if not write and any(r.outcome in NOT_CONVERTED for r in report.results):
        line += (" Refused or partial training code fails --check and --diff (exit 1): convert it as its "
                 "diagnostics say, or accept it with `# accel-migrate: skip` on the diagnostic's line.")
    return line


def to_json(report, mode: str, exit_code: int, with_diff: bool) -> str:  # type: ignore[no-untyped-def]
    files = []
    for r in report.results:
        files.append(
            {
                "path": r.path,
                "kind": r.kind,
                "status": r.status,
                "outcome": r.outcome,
                "written_to": r.written_to,
                "changes": [{"code": c.code, "line": c.line, "cell": c.cell, "message": c.message} for c in r.changes],
                "diagnostics": [
                    {"code": d.code, "line": d.line, "cell": d.cell, "severity": d.severity, "message": d.message,
                     "unconverted": d.unconverted}
                    for d in r.diagnostics
                ],
                "error": None
                if r.error is None
                else {"line": r.error.line, "column": r.error.column, "cell": r.error.cell, "message": r.error.message},
                "diff": result_diff(r) if with_diff and r.changed else None,
            }
        )
    document = {
        "schema_version": SCHEMA_VERSION,
        "tool": {"name": "accel-migrate", "version": version()},
        "mode": mode,
        "exit_code": exit_code,
        "summary": counts(report),
        "files": files,
    }
    return json.dumps(document, indent=2) + "\n"


def _escape_data(value: str) -> str:
    return value.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _escape_property(value: str) -> str:
    return _escape_data(value).replace(":", "%3A").replace(",", "%2C")


def _annotation(kind: str, path: str, line: int, message: str, title: str, column: int = 0) -> str:
    props = [f"file={_escape_property(path)}"]
    if line:
        props.append(f"line={line}")
    if column:
        props.append(f"col={column}")
    props.append(f"title={_escape_property(title)}")
    return f"::{kind} {','.join(props)}::{_escape_data(message)}"


def _cell_prefix(cell: int | None) -> str:
    return f"cell {cell}: " if cell is not None else ""


def to_github(report, write: bool) -> str:  # type: ignore[no-untyped-def]
    """Workflow commands: errors for unprocessable files and for diagnostics of training code left
    unconverted (they fail --check), warnings for the other diagnostics and pending changes."""
    out = []
    for r in report.results:
        if r.error is not None:
            line = r.error.line if r.error.cell is None else 1
            out.append(
                _annotation(
                    "error", r.path, line, _cell_prefix(r.error.cell) + r.error.message, "accel-migrate", r.error.column
                )
            )
            continue
        for d in r.diagnostics:
            line = d.line if d.cell is None else 1
            kind = "error" if d.unconverted else "warning"
            out.append(_annotation(kind, r.path, line, _cell_prefix(d.cell) + d.message, f"accel-migrate {d.code}"))
        if not write:
            for c in r.changes:
                line = c.line if c.cell is None else 1
                message = _cell_prefix(c.cell) + f"would change: {c.message} (run accel-migrate to apply)"
                out.append(_annotation("warning", r.path, line, message, f"accel-migrate {c.code}"))
    return "".join(line + "\n" for line in out)


def _uri(path: str) -> str:
    """Relative to the working directory (code scanning resolves it against the checkout)."""
    absolute = os.path.abspath(path)
    try:
        relative = os.path.relpath(absolute)
    except ValueError:  # pragma: no cover - another drive on Windows
        return Path(absolute).as_uri()
    return Path(absolute).as_uri() if relative.startswith("..") else Path(relative).as_posix()


def to_sarif(report, write: bool, rules: list[tuple[str, str, str, str]], exit_code: int) -> str:  # type: ignore[no-untyped-def]
    """SARIF 2.1.0: rules as tool.driver.rules (code, name, summary, doc); results with locations."""
    index = {code: i for i, (code, _, _, _) in enumerate(rules)}
    driver_rules = [
        {
            "id": code,
            "name": name,
            "shortDescription": {"text": summary},
            "fullDescription": {"text": doc.strip() or summary},
            "help": {"text": doc.strip() or summary},
        }
        for code, name, summary, doc in rules
    ]
    results = []
    notifications = []
    for r in report.results:
        uri = _uri(r.path)
        if r.error is not None:
            notifications.append(
                {
                    "level": "error",
                    "message": {"text": _cell_prefix(r.error.cell) + r.error.message},
                    "locations": [_location(uri, r.error.line if r.error.cell is None else 0, r.error.column)],
                }
            )
            continue
        for d in r.diagnostics:
            level = "error" if d.unconverted else "warning"  # training code left unconverted fails --check
            results.append(_result(d.code, index, level, _cell_prefix(d.cell) + d.message, uri, d.line, d.cell))
        for c in r.changes:
            verb = "changed" if write else "would change"
            results.append(
                _result(c.code, index, "note", _cell_prefix(c.cell) + f"{verb}: {c.message}", uri, c.line, c.cell)
            )
    document = {
        "$schema": SARIF_SCHEMA,
        "version": "2.1.0",
        "runs": [
            {
                "tool": {
                    "driver": {
                        "name": "accel-migrate",
                        "version": version(),
                        "rules": driver_rules,
                    }
                },
                "invocations": [
                    {
                        "executionSuccessful": exit_code in (0, 1),
                        "exitCode": exit_code,
                        "toolExecutionNotifications": notifications,
                    }
                ],
                "results": results,
            }
        ],
    }
    return json.dumps(document, indent=2) + "\n"


def _location(uri: str, line: int, column: int = 0) -> dict[str, Any]:
    physical: dict[str, Any] = {"artifactLocation": {"uri": uri}}
    if line:
        region: dict[str, Any] = {"startLine": line}
        if column:
            region["startColumn"] = column
        physical["region"] = region
    return {"physicalLocation": physical}


def _result(code, index, level, message, uri, line, cell):  # type: ignore[no-untyped-def]
    result: dict[str, Any] = {
        "ruleId": code,
        "level": level,
        "message": {"text": message},
        "locations": [_location(uri, line if cell is None else 0)],
    }
    if code in index:
        result["ruleIndex"] = index[code]
    return result
