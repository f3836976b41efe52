"""Where the Accelerator's settings come from: explicit arguments > environment > config file > defaults.

``accel launch --mixed-precision bf16 ...`` passes its options to the workers as ``ACCEL_*``
environment variables, and ``--config-file`` (or the default config written by ``accel config``)
as ``ACCEL_CONFIG_FILE``. The Accelerator resolves each setting independently:

1. an argument passed explicitly to ``Accelerator(...)``;
2. the environment variable (``ACCEL_MIXED_PRECISION``, ``ACCEL_GRADIENT_ACCUMULATION_STEPS``,
   ``ACCEL_CPU``, ``ACCEL_SPLIT_BATCHES``, ``ACCEL_EVEN_BATCHES``, ``ACCEL_TIMEOUT``,
   ``ACCEL_STRATEGY``);
3. the YAML config file named by ``ACCEL_CONFIG_FILE`` (keys ``mixed_precision``,
   ``gradient_accumulation_steps``, ``use_cpu``, ``split_batches``, ``even_batches``, ``timeout``,
   ``strategy``);
4. the built-in default.

A plain ``python train.py`` does not read the default config file (``ACCEL_CONFIG_FILE`` is unset),
so a config in the home directory never changes a script that was not launched with ``accel launch``
(the same rule as HF Accelerate, whose config only applies through ``accelerate launch``).

This module imports only the standard library; PyYAML is imported when a config file is read or
written.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import AccelError

CONFIG_FILE_ENV = "ACCEL_CONFIG_FILE"
"""Environment variable naming the config file the Accelerator (and ``accel launch``) reads."""

MIXED_PRECISION_CHOICES = ("no", "fp16", "bf16")

STRATEGY_CHOICES = ("ddp", "zero1", "fsdp", "fsdp-zero2", "fsdp-zero3")
"""Strategy names (see runtime/strategy.py): ``fsdp`` is ``fsdp-zero3`` (reshard after forward)."""

DEFAULT_TIMEOUT_SECONDS = 1800.0
"""The collective timeout (30 minutes): a rank that waits longer fails instead of hanging."""


class SettingsError(AccelError):
    """A setting from the environment or a config file has an invalid value."""


def _parse_bool(raw: Any) -> bool:
    if isinstance(raw, bool):
        return raw
    text = str(raw).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off", ""):
        return False
    raise ValueError("expected true/false (or 1/0, yes/no)")


def _parse_positive_int(raw: Any) -> int:
    if isinstance(raw, bool):
        raise ValueError("expected a positive integer")
    value = int(str(raw).strip())
    if value < 1:
        raise ValueError("expected a positive integer")
    return value


def _parse_precision(raw: Any) -> str:
    text = str(raw).strip().lower()
    if text not in MIXED_PRECISION_CHOICES:
        raise ValueError(f"expected one of {', '.join(MIXED_PRECISION_CHOICES)}")
    return text


def _parse_strategy(raw: Any) -> str:
    text = str(raw).strip().lower().replace("_", "-")
    if text not in STRATEGY_CHOICES:
        raise ValueError(f"expected one of {', '.join(STRATEGY_CHOICES)}")
    return text


def _parse_seconds(raw: Any) -> float:
    value = float(str(raw).strip())
    if not value > 0:
        raise ValueError("expected a positive number of seconds")
    return value


@dataclass(frozen=True)
class SettingSpec:
    """One resolvable setting: its name, environment variable, config-file key, parser, default."""

    name: str
    env: str
    config_key: str
    parse: Callable[[Any], Any]
    default: Any
    help: str


SPECS: tuple[SettingSpec, ...] = (
    SettingSpec("mixed_precision", "ACCEL_MIXED_PRECISION", "mixed_precision", _parse_precision,
                "no", "no / fp16 / bf16"),
    SettingSpec("gradient_accumulation_steps", "ACCEL_GRADIENT_ACCUMULATION_STEPS",
                "gradient_accumulation_steps", _parse_positive_int, 1, "micro-steps per optimizer step"),
    SettingSpec("cpu", "ACCEL_CPU", "use_cpu", _parse_bool, False, "force the CPU (and gloo)"),
    SettingSpec("split_batches", "ACCEL_SPLIT_BATCHES", "split_batches", _parse_bool, False,
                "slice each global batch across processes"),
    SettingSpec("even_batches", "ACCEL_EVEN_BATCHES", "even_batches", _parse_bool, True,
                "pad the last round so every process gets the same number of batches"),
    SettingSpec("timeout", "ACCEL_TIMEOUT", "timeout", _parse_seconds, DEFAULT_TIMEOUT_SECONDS,
                "collective timeout in seconds"),
    SettingSpec("strategy", "ACCEL_STRATEGY", "strategy", _parse_strategy, "ddp",
                "ddp / zero1 / fsdp (= fsdp-zero3) / fsdp-zero2"),
)
SPEC_BY_NAME = {spec.name: spec for spec in SPECS}


def default_config_path(environ: Mapping[str, str] | None = None) -> Path:
    """Where ``accel config`` writes by default: ``$XDG_CACHE_HOME/accel/default_config.yaml``.

    Without ``XDG_CACHE_HOME`` this is ``~/.cache/accel/default_config.yaml`` (``~`` from ``HOME``).
    """
    env = os.environ if environ is None else environ
    cache = env.get("XDG_CACHE_HOME") or os.path.join(env.get("HOME") or str(Path.home()), ".cache")
    return Path(cache) / "accel" / "default_config.yaml"


def active_config_path(environ: Mapping[str, str] | None = None) -> Path | None:
    """The config file a launch uses: ``ACCEL_CONFIG_FILE`` if set, else the default one if it exists."""
    env = os.environ if environ is None else environ
    named = env.get(CONFIG_FILE_ENV)
    if named:
        return Path(named)
    default = default_config_path(env)
    return default if default.is_file() else None


def read_config_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Load a YAML config file into a dict (an empty file is an empty dict)."""
    path = Path(path)
    if not path.is_file():
        raise SettingsError(
            f"config file {str(path)!r} does not exist.",
            "a YAML file written by `accel config` (or by hand).",
            f"run `accel config --config-file {path}`, or point {CONFIG_FILE_ENV} / --config-file "
            "at an existing file.",
        )
    try:
        import yaml
    except ImportError:  # pragma: no cover - PyYAML is part of the runtime extra
        raise SettingsError(
            f"reading the config file {str(path)!r} needs PyYAML, which is not installed.",
            "PyYAML, installed with the runtime extra.",
            "pip install 'accel-migrate[runtime]' (or pip install pyyaml).",
        ) from None
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as error:
        raise SettingsError(
            f"config file {str(path)!r} is not valid YAML: {error}",
            "a YAML mapping of setting names to values.",
            "fix the file, or rewrite it with `accel config`.",
        ) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise SettingsError(
            f"config file {str(path)!r} holds a {type(data).__name__}, not a mapping.",
            "a YAML mapping such as `mixed_precision: bf16`.",
            "rewrite it with `accel config`.",
        )
    return data


def write_config_file(path: str | os.PathLike[str], config: Mapping[str, Any]) -> Path:
    """Write ``config`` as YAML to ``path`` (creating its folder); return the path."""
    import yaml

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(dict(config), sort_keys=False), encoding="utf-8")
    return path


def _parse(spec: SettingSpec, raw: Any, source: str) -> Any:
    try:
        return spec.parse(raw)
    except (TypeError, ValueError) as error:
        raise SettingsError(
            f"{source} sets {spec.name} to {raw!r}, which is invalid: {error}.",
            f"{spec.name}: {spec.help}.",
            f"correct or remove {source}.",
        ) from None


def resolve(
    explicit: Mapping[str, Any], environ: Mapping[str, str] | None = None
) -> tuple[dict[str, Any], dict[str, str]]:
    """Resolve every setting in ``SPECS``; return ``(values, sources)``.

    ``explicit`` maps setting names to the arguments given to the Accelerator (``None`` means not
    given). ``sources`` says for each setting where its value came from: ``"argument"``, the
    environment variable's name, ``"config file <path>"`` or ``"default"``.
    """
    env = os.environ if environ is None else environ
    config: dict[str, Any] | None = None
    config_path = env.get(CONFIG_FILE_ENV) or None
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for spec in SPECS:
        given = explicit.get(spec.name)
        if given is not None:
            values[spec.name], sources[spec.name] = given, "argument"
            continue
        raw = env.get(spec.env)
        if raw is not None and raw != "":
            values[spec.name] = _parse(spec, raw, f"environment variable {spec.env}")
            sources[spec.name] = spec.env
            continue
        if config_path is not None:
            if config is None:
                config = read_config_file(config_path)
            if config.get(spec.config_key) is not None:
                values[spec.name] = _parse(
                    spec, config[spec.config_key], f"key {spec.config_key!r} of {config_path}"
                )
                sources[spec.name] = f"config file {config_path}"
                continue
        values[spec.name], sources[spec.name] = spec.default, "default"
    return values, sources
