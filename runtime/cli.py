"""The ``accel`` command line: ``accel launch``, ``accel config``, ``accel env`` and ``accel estimate-memory``.

Importing this module must not import torch (``accel --help`` answers instantly); commands import
what they need when they run.
"""

from __future__ import annotations

import argparse
import sys
from typing import NoReturn

from . import memory_estimate
from .launch import add_launch_arguments, launch


class _Parser(argparse.ArgumentParser):
    """An argparse parser whose usage errors are one line (``accel launch: error: ...``), exit 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    """The ``accel`` parser with its subcommands."""
    parser = _Parser(
        prog="accel",
        description="Run training scripts written against the bundled Accelerate-compatible "
        "runtime on one or many processes.",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    launch_parser = commands.add_parser(
        "launch",
        help="run a script on N processes per node through torchrun's engine",
        description="Run SCRIPT on N processes per node (and optionally several nodes) through "
        "torch.distributed.run, in this process. One node without rendezvous options uses a "
        "standalone rendezvous on a free port. Everything after SCRIPT goes to the script. "
        "Options not given fall back to the config file (see `accel config`).",
    )
    add_launch_arguments(launch_parser)
    config_parser = commands.add_parser(
        "config",
        help="write a YAML config file (interactive, or --default)",
        description="Ask a few questions (Enter takes the default shown in brackets) and write "
        "a YAML config that `accel launch` and the Accelerator read. Location: --config-file, "
        "else $ACCEL_CONFIG_FILE, else $XDG_CACHE_HOME/accel/default_config.yaml "
        "(~/.cache/accel/default_config.yaml).",
    )
    config_parser.add_argument(
        "--config-file",
        "--config_file",
        dest="config_file",
        default=None,
        help="where to write the config (default: see above)",
    )
    config_parser.add_argument(
        "--default",
        action="store_true",
        help="write the defaults without asking (1 process, fp32, no accumulation, 1800 s timeout)",
    )
    env_parser = commands.add_parser(
        "env",
        help="print versions, hardware and the active config (for bug reports)",
        description="Print the accel-migrate, Python, PyTorch and related versions, CPU and CUDA "
        "hardware, the active config file and ACCEL_* variables. Paste it into bug reports.",
    )
    env_parser.add_argument(
        "--config-file",
        "--config_file",
        dest="config_file",
        default=None,
        help="config file to show (default: $ACCEL_CONFIG_FILE, else the default location)",
    )
    estimate_parser = commands.add_parser(
        "estimate-memory",
        help="bytes per rank of params, grads and optimizer state for each strategy",
        description="Build the model with MODULE:CALLABLE on the meta device (nothing is allocated) "
        "and print the parameter, gradient and optimizer-state bytes of the fullest rank under "
        "ddp, zero1, fsdp-zero2 and fsdp-zero3, for each number of processes and precision.",
    )
    memory_estimate.add_arguments(estimate_parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``accel`` console script; returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if args.command is None:
        parser.print_help(sys.stderr)
        return 2
    if args.command == "launch":
        return launch(args)
    if args.command == "config":
        from .envinfo import config_command

        return config_command(args.config_file, args.default, sys.stdin, sys.stdout)
    if args.command == "env":
        from pathlib import Path

        from .envinfo import environment_report

        print(environment_report(Path(args.config_file) if args.config_file else None))
        return 0
    if args.command == "estimate-memory":
        return memory_estimate.command(args, sys.stdout, sys.stderr)
    parser.error(f"unknown command {args.command!r}")
    return 2


if __name__ == "__main__":
    sys.exit(main())
