"""The ``accel`` command line: ``accel launch [options] script.py [script args]``."""

from __future__ import annotations

import argparse
import sys

from .launch import add_launch_arguments, launch


def build_parser() -> argparse.ArgumentParser:
    """The ``accel`` parser with its subcommands."""
    parser = argparse.ArgumentParser(
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
        "standalone rendezvous on a free port. Everything after SCRIPT goes to the script.",
    )
    add_launch_arguments(launch_parser)
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
    parser.error(f"unknown command {args.command!r}")
    return 2


if __name__ == "__main__":
    sys.exit(main())
