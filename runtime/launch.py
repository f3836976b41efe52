"""``accel launch``: translate our options to torchrun's and run ``torch.distributed.run`` in-process."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def add_launch_arguments(parser: argparse.ArgumentParser) -> None:
    """Declare ``accel launch``'s options (a subset of torchrun's, same names)."""
    parser.add_argument(
        "--nproc-per-node",
        "--nproc_per_node",
        dest="nproc_per_node",
        default="1",
        help="processes per node: a number, or torchrun's 'gpu' / 'cpu' / 'auto' (default: 1)",
    )
    parser.add_argument(
        "--nnodes",
        default="1",
        help="number of nodes, or a MIN:MAX range for elastic jobs (default: 1)",
    )
    parser.add_argument(
        "--node-rank",
        "--node_rank",
        dest="node_rank",
        type=int,
        default=0,
        help="rank of this node for static rendezvous with --master-addr (default: 0)",
    )
    parser.add_argument(
        "--rdzv-endpoint",
        "--rdzv_endpoint",
        dest="rdzv_endpoint",
        default=None,
        help="HOST:PORT of the rendezvous server (multi-node, c10d rendezvous)",
    )
    parser.add_argument(
        "--rdzv-backend",
        "--rdzv_backend",
        dest="rdzv_backend",
        default=None,
        help="rendezvous backend (default: c10d with --rdzv-endpoint, static otherwise)",
    )
    parser.add_argument(
        "--rdzv-id",
        "--rdzv_id",
        dest="rdzv_id",
        default=None,
        help="job id shared by all nodes of a c10d rendezvous",
    )
    parser.add_argument(
        "--master-addr",
        "--master_addr",
        dest="master_addr",
        default=None,
        help="address of the node with --node-rank 0 (static rendezvous)",
    )
    parser.add_argument(
        "--master-port",
        "--master_port",
        dest="master_port",
        type=int,
        default=None,
        help="free port on the master node (static rendezvous)",
    )
    parser.add_argument(
        "--max-restarts",
        "--max_restarts",
        dest="max_restarts",
        type=int,
        default=0,
        help="restart the worker group this many times after a failure (default: 0)",
    )
    parser.add_argument(
        "-m",
        "--module",
        action="store_true",
        help="treat the script as a Python module name and run it like `python -m`",
    )
    parser.add_argument("script", help="the training script (or module with -m)")
    parser.add_argument(
        "script_args",
        nargs=argparse.REMAINDER,
        help="arguments passed to the script untouched",
    )


def torchrun_argv(args: argparse.Namespace) -> list[str]:
    """torchrun's command line for parsed ``accel launch`` options.

    One node without rendezvous options uses ``--standalone`` (a local rendezvous on a free port).
    """
    argv = ["--nproc-per-node", str(args.nproc_per_node), "--nnodes", str(args.nnodes)]
    rendezvous = any(
        value is not None
        for value in (args.rdzv_endpoint, args.rdzv_backend, args.master_addr, args.master_port)
    )
    if str(args.nnodes) == "1" and not rendezvous:
        argv.append("--standalone")
    else:
        argv += ["--node-rank", str(args.node_rank)]
        if args.rdzv_endpoint is not None:
            argv += ["--rdzv-endpoint", args.rdzv_endpoint]
            argv += ["--rdzv-backend", args.rdzv_backend or "c10d"]
        elif args.rdzv_backend is not None:
            argv += ["--rdzv-backend", args.rdzv_backend]
        if args.rdzv_id is not None:
            argv += ["--rdzv-id", args.rdzv_id]
        if args.master_addr is not None:
            argv += ["--master-addr", args.master_addr]
        if args.master_port is not None:
            argv += ["--master-port", str(args.master_port)]
    argv += ["--max-restarts", str(args.max_restarts)]
    if args.module:
        argv.append("--module")
    return [*argv, args.script, *args.script_args]


def shadowing_module(script: str) -> Path | None:
    """A ``runtime.py`` / ``runtime/`` next to the script that would shadow this package, if any.

    Python puts the script's folder first on ``sys.path``, so such a module would be imported
    by ``from runtime import Accelerator`` instead of ours.
    """
    folder = Path(script).resolve().parent
    ours = Path(__file__).resolve().parent
    for candidate in (folder / "runtime.py", folder / "runtime"):
        if candidate.exists() and candidate.resolve() != ours:
            return candidate
    return None


def launch(args: argparse.Namespace) -> int:
    """Run the job through torchrun's engine; return the exit code for the shell."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import get_args_parser, run

    if not args.module:
        if not Path(args.script).is_file():
            print(f"accel launch: error: script {args.script!r} not found", file=sys.stderr)
            return 2
        shadow = shadowing_module(args.script)
        if shadow is not None:
            print(
                f"accel launch: warning: {shadow} shadows the bundled runtime package; "
                "`from runtime import Accelerator` in the script will import it instead. "
                "Rename it (or move the script).",
                file=sys.stderr,
            )
    torchrun_args = get_args_parser().parse_args(torchrun_argv(args))
    try:
        run(torchrun_args)
    except ChildFailedError as error:
        # torchrun's message names the failing rank, its exit code and the error file, if any.
        print(error.format_msg(), file=sys.stderr)
        first = next(iter(error.failures.values()), None)
        code = first.exitcode if first is not None else 1
        return code if isinstance(code, int) and 0 < code < 256 else 1
    return 0
