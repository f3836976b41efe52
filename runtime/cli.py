"""The ``accel`` command line: ``accel launch``, ``accel config``, ``accel env`` and ``accel estimate-memory``.

Importing this module must not import torch (``accel --help`` answers instantly); commands import
what they need when they run.
"""

from __future__ import annotations

import argparse
import sys
import textwrap
from typing import NoReturn

from . import memory_estimate
from .launch import add_launch_arguments, launch


class _HelpFormatter(argparse.HelpFormatter):
    """argparse's help, readable at 80 columns: lines are never broken inside a hyphenated word
    (``--master-`` / ``addr``), and an option with an alias shows its value once
    (``--nproc-per-node, --nproc_per_node N``, not the metavar after each spelling)."""

    def _split_lines(self, text: str, width: int) -> list[str]:
        text = self._whitespace_matcher.sub(" ", text).strip()
        return textwrap.wrap(text, width, break_on_hyphens=False, break_long_words=False)

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        text = self._whitespace_matcher.sub(" ", text).strip()
        return textwrap.fill(
            text, width, initial_indent=indent, subsequent_indent=indent,
            break_on_hyphens=False, break_long_words=False,
        )

    def _format_action_invocation(self, action: argparse.Action) -> str:
        if not action.option_strings or action.nargs == 0:
            return super()._format_action_invocation(action)
        value = self._format_args(action, self._get_default_metavar_for_optional(action))
        return f"{', '.join(action.option_strings)} {value}"


class _Parser(argparse.ArgumentParser):
    """An argparse parser whose usage errors are one line (``accel launch: error: ...``), exit 2."""

    def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        kwargs.setdefault("formatter_class", _HelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def commands(parser: argparse.ArgumentParser) -> list[str]:
    """The names of the parser's subcommands."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return list(action.choices)
    return []


def unknown_command(argv: list[str], known: list[str]) -> str | None:
    """The error for a first argument that is no command (``accel lauch``), with the closest one."""
    if not argv or argv[0].startswith("-") or argv[0] in known:
        return None
    import difflib

    close = difflib.get_close_matches(argv[0], known, n=1, cutoff=0.6)
    hint = f"; did you mean `accel {close[0]}`?" if close else f"; the commands are {', '.join(known)}"
    return f"accel: error: unknown command {argv[0]!r}{hint} (see accel --help)"


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
        metavar="FILE",
        help="where to write the config (default: see above)",
    )
    config_parser.add_argument(
        "--default",
        action="store_true",
        help="write the defaults without asking (1 process, fp32, no accumulation, ddp, "
        "30-minute timeout)",
    )
    config_parser.add_argument(
        "--force",
        action="store_true",
        help="replace an existing config file (without it, an existing file is left as it is and "
        "the command exits 1)",
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
        metavar="FILE",
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
    argv = sys.argv[1:] if argv is None else argv
    problem = unknown_command(argv, commands(parser))
    if problem is not None:
        print(problem, file=sys.stderr)
        return 2
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help(sys.stderr)
        return 2
    if args.command == "launch":
        return launch(args)
    if args.command == "config":
        from .envinfo import config_command

        return config_command(args.config_file, args.default, sys.stdin, sys.stdout, force=args.force)
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
