"""``accel env`` and ``accel config``: environment report for bug reports, and the config writer.

Both import torch / PyYAML only when they run, never when ``runtime.cli`` is imported.
"""

from __future__ import annotations

import os
import platform
import sys
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any, TextIO

from . import settings


def _version(distribution: str) -> str:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return "not installed"


def environment_report(config_path: Path | None = None) -> str:
    """Versions, hardware, the active config file and ``ACCEL_*`` variables, as Markdown-ish text."""
    import torch

    lines = [
        "- accel-migrate version: " + _version("accel-migrate"),
        f"- Platform: {platform.platform()}",
        f"- Python version: {platform.python_version()} ({sys.executable})",
        f"- PyTorch version: {torch.__version__} (CUDA build: {torch.version.cuda or 'none'})",
        "- numpy version: " + _version("numpy"),
        "- PyYAML version: " + _version("PyYAML"),
        "- HF accelerate version: " + _version("accelerate"),
        f"- CPU count: {os.cpu_count()}",
        f"- torch.distributed available: {torch.distributed.is_available()}"
        f" (gloo: {torch.distributed.is_available() and torch.distributed.is_gloo_available()},"
        f" nccl: {torch.distributed.is_available() and torch.distributed.is_nccl_available()})",
    ]
    if torch.cuda.is_available():
        names = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        lines.append(f"- CUDA devices ({len(names)}): " + ", ".join(names))
    else:
        lines.append("- CUDA devices: none")
    path = config_path if config_path is not None else settings.active_config_path()
    if path is None:
        lines.append(
            f"- Config file: none (default location {settings.default_config_path()}; "
            "write one with `accel config`)"
        )
    else:
        lines.append(f"- Config file: {path}")
        try:
            for key, value in settings.read_config_file(path).items():
                lines.append(f"    {key}: {value}")
        except settings.SettingsError as error:
            lines.append(f"    (unreadable: {error.happened})")
    accel_vars = sorted((k, v) for k, v in os.environ.items() if k.startswith("ACCEL_"))
    lines.append("- ACCEL_* environment: " + (", ".join(f"{k}={v}" for k, v in accel_vars) or "none"))
    return "\n".join(lines)


QUESTIONS: tuple[tuple[str, str, Callable[[str], Any], Any], ...] = (
    # (config key, question, parser, default)
    ("use_cpu", "Run on the CPU only, even where a GPU is available? [yes/NO]", settings._parse_bool, False),
    ("num_processes", "How many processes per machine (node)? [1]", settings._parse_positive_int, 1),
    ("num_machines", "How many machines (nodes)? [1]", settings._parse_positive_int, 1),
    ("mixed_precision", "Mixed precision (no/fp16/bf16)? [no]", settings._parse_precision, "no"),
    ("gradient_accumulation_steps", "Gradient accumulation steps? [1]", settings._parse_positive_int, 1),
    ("strategy", "Strategy across processes (ddp/zero1/fsdp/fsdp-zero2)? [ddp]", settings._parse_strategy, "ddp"),
    ("timeout", f"Collective timeout in seconds? [{settings.DEFAULT_TIMEOUT_SECONDS:g}]",
     settings._parse_seconds, settings.DEFAULT_TIMEOUT_SECONDS),
)
MULTI_NODE_QUESTIONS: tuple[tuple[str, str, Callable[[str], Any], Any], ...] = (
    ("machine_rank", "Rank of this machine (0 for the main one)? [0]", int, 0),
    ("main_process_ip", "IP address of the main machine? [127.0.0.1]", str, "127.0.0.1"),
    ("main_process_port", "Port on the main machine? [29500]", int, 29500),
)


def default_config() -> dict[str, Any]:
    """The config ``accel config --default`` writes: one process, fp32, no accumulation."""
    return {key: default for key, _, _, default in QUESTIONS}


def ask_config(stdin: TextIO, stdout: TextIO) -> dict[str, Any]:
    """Ask the questions on ``stdout``, read answers from ``stdin``; an empty answer takes the default."""
    config: dict[str, Any] = {}

    def ask(questions: tuple[tuple[str, str, Callable[[str], Any], Any], ...]) -> None:
        for key, question, parse, default in questions:
            while True:
                stdout.write(question + " ")
                stdout.flush()
                answer = stdin.readline()
                if answer == "":  # end of input: take the default
                    config[key] = default
                    stdout.write("\n")
                    break
                answer = answer.strip()
                if not answer:
                    config[key] = default
                    break
                try:
                    config[key] = parse(answer)
                    break
                except ValueError as error:
                    stdout.write(f"  invalid answer {answer!r}: {error}; try again\n")

    ask(QUESTIONS)
    if config["num_machines"] > 1:
        ask(MULTI_NODE_QUESTIONS)
    return config


def config_command(
    config_file: str | None, use_defaults: bool, stdin: TextIO, stdout: TextIO, force: bool = False,
    stderr: TextIO = sys.stderr,
) -> int:
    """``accel config``: write the config file; return the exit code.

    An existing file is replaced only with ``force`` (checked before any question is asked):
    otherwise the command says so and exits 1, the file untouched.
    """
    path = Path(config_file) if config_file else Path(
        os.environ.get(settings.CONFIG_FILE_ENV) or settings.default_config_path()
    )
    if path.exists() and not force:
        stderr.write(
            f"accel config: error: {path} already exists; pass --force to overwrite it, "
            "or --config-file to write another file\n"
        )
        return 1
    config = default_config() if use_defaults else ask_config(stdin, stdout)
    settings.write_config_file(path, config)
    stdout.write(f"accel config: wrote {path}\n")
    return 0
