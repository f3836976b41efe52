"""`[tool.accel-migrate]` in pyproject.toml: finding it, reading it and checking every key.

The file used is the nearest pyproject.toml that has a `[tool.accel-migrate]` table, searched from
the common parent of the paths given on the command line upwards (as ruff does, so a sub-project's
pyproject.toml without the table does not hide the repository's). Command-line options override it.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

TARGETS = ("runtime", "accelerate")
MIXED_PRECISION = ("no", "fp16", "bf16")
# The runtime's strategy names (runtime/settings.py); "fsdp" is ZeRO-3-like, "fsdp-zero2" keeps the
# gathered parameters from forward to backward.
STRATEGIES = ("ddp", "zero1", "fsdp", "fsdp-zero2", "fsdp-zero3")
OUTPUT_FORMATS = ("text", "json", "github", "sarif")
SECTION = "accel-migrate"


class ConfigError(Exception):
    """The configuration is invalid; the message names the file and the key."""


@dataclass
class FileConfig:
    """The settings read from one pyproject.toml (None: not set there)."""

    path: Path | None = None
    values: dict[str, Any] = field(default_factory=dict)

    @property
    def root(self) -> Path | None:
        return self.path.parent if self.path is not None else None


def _string(value: Any, choices: tuple[str, ...] | None = None) -> str:
    if not isinstance(value, str):
        raise TypeError("must be a string")
    if choices is not None and value not in choices:
        raise TypeError(f"must be one of {', '.join(choices)}, not {value!r}")
    return value


def _string_list(value: Any) -> list[str]:
    if isinstance(value, str):
        return [part.strip() for part in value.split(",") if part.strip()]
    if isinstance(value, list) and all(isinstance(item, str) for item in value):
        return [item.strip() for item in value if item.strip()]
    raise TypeError("must be a list of strings")


def _jobs(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise TypeError("must be a positive integer")
    return value


# key in the file -> (name in FileConfig.values, parser)
KEYS = {
    "target": ("target", lambda v: _string(v, TARGETS)),
    "select": ("select", _string_list),
    "ignore": ("ignore", _string_list),
    "exclude": ("exclude", _string_list),
    "extend-exclude": ("extend_exclude", _string_list),
    "force-exclude": ("force_exclude", lambda v: _bool(v)),
    "annotate": ("annotate", lambda v: _bool(v)),
    "mixed-precision": ("mixed_precision", lambda v: _string(v, MIXED_PRECISION)),
    "strategy": ("strategy", lambda v: _string(v, STRATEGIES)),
    "jobs": ("jobs", _jobs),
    "output-format": ("output_format", lambda v: _string(v, OUTPUT_FORMATS)),
}


def _bool(value: Any) -> bool:
    if not isinstance(value, bool):
        raise TypeError("must be true or false")
    return value


def find_pyproject(paths: list[Path]) -> Path | None:
    """The nearest pyproject.toml with a [tool.accel-migrate] table above the paths' common parent."""
    start = common_parent(paths)
    for directory in (start, *start.parents):
        candidate = directory / "pyproject.toml"
        if candidate.is_file():
            try:
                data = _load(candidate)
            except ConfigError:
                raise
            if SECTION in data.get("tool", {}):
                return candidate
    return None


def common_parent(paths: list[Path]) -> Path:
    """The deepest directory containing every path (a file counts as its directory)."""
    if not paths:
        return Path.cwd()
    dirs = []
    for path in paths:
        absolute = Path(os.path.abspath(path))
        dirs.append(str(absolute if absolute.is_dir() else absolute.parent))
    return Path(os.path.commonpath(dirs))


def _load(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as handle:
            return tomllib.load(handle)
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(f"{path}: invalid TOML: {error}") from None
    except OSError as error:
        raise ConfigError(f"{path}: cannot read: {error.strerror}") from None


def load_config(path: Path) -> FileConfig:
    """Read and check the [tool.accel-migrate] table of one file (an empty config when it has none)."""
    table = _load(path).get("tool", {}).get(SECTION, {})
    if not isinstance(table, dict):
        raise ConfigError(f"{path}: [tool.{SECTION}] must be a table")
    values: dict[str, Any] = {}
    for key, value in table.items():
        if key not in KEYS:
            known = ", ".join(sorted(KEYS))
            raise ConfigError(f"{path}: unknown key {key!r} in [tool.{SECTION}]; known keys: {known}")
        name, parse = KEYS[key]
        try:
            values[name] = parse(value)
        except TypeError as error:
            raise ConfigError(f"{path}: [tool.{SECTION}] {key} {error}") from None
    return FileConfig(path=path, values=values)


def discover_config(paths: list[Path], explicit: Path | None = None) -> FileConfig:
    if explicit is not None:
        if not explicit.is_file():
            raise ConfigError(f"{explicit}: no such file")
        return load_config(explicit)
    found = find_pyproject(paths)
    return load_config(found) if found is not None else FileConfig()
