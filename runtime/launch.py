"""``accel launch``: translate our options to torchrun's and run ``torch.distributed.run`` in-process.

What this adds to torchrun (everything else is torchrun's own machinery):

- our options ``--mixed-precision``, ``--gradient-accumulation-steps``, ``--cpu``, ``--timeout``,
  ``--strategy`` and ``--config-file`` reach the script's ``Accelerator`` as ``ACCEL_*`` environment variables (see
  ``runtime/settings.py`` for the precedence); the config file also supplies launch defaults
  (``num_processes``, ``num_machines``, ``machine_rank``, ``main_process_ip``, ``main_process_port``);
- every worker runs through ``runtime/worker_entry.py``, which records a failing rank's exception
  in torchrun's error file (as ``@record`` does) with the traceback starting at the user's code;
- the failure summary (torchrun's own, titled with the user's script) names as "Root Cause" the
  rank that failed first, not a rank that only failed because its peer was gone: failures that
  are consequences (torchrun's SIGTERM, gloo "connection closed by peer") come after real ones
  (an exception, SIGKILL, SIGSEGV), then by the exact time of the error file. The other failures
  are cut to one line, and a last line says ``rank R failed first: <error> (at file, line N)``;
- ``--migrate`` runs an unmodified single-device script: it is migrated in this process into a
  temporary copy, which the workers run as if it were the script; a migration with diagnostics
  is refused (``runtime/launch_migrated.py`` says what blocks and why);
- usage errors (``--nproc-per-node 0``, a missing script) are one line and exit status 2, before
  torch is imported; Ctrl-C (or SIGTERM) to the launcher stops every worker (torchrun's signal
  handling) and exits 128 + the signal number (130), without a traceback;
- ``--max-restarts K`` restarts a failed worker group with a rendezvous store that holds none of
  the previous attempt's keys (see ``launch`` and ``runtime.state._rendezvous``);
- on one node a busy default port (29500) is replaced by a free one; a busy port given explicitly
  is an error before any worker starts.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import socket
import sys
from pathlib import Path
from typing import Any

from . import settings

DEFAULT_MASTER_PORT = 29500
"""torchrun's default ``--master-port``."""

WORKER_ENTRY = Path(__file__).resolve().with_name("worker_entry.py")

LAUNCH_CONFIG_KEYS = {  # config-file key -> accel launch option (dest)
    "num_processes": "nproc_per_node",
    "num_machines": "nnodes",
    "machine_rank": "node_rank",
    "main_process_ip": "master_addr",
    "main_process_port": "master_port",
    "rdzv_backend": "rdzv_backend",
    "max_restarts": "max_restarts",
}
LAUNCH_DEFAULTS: dict[str, Any] = {
    "nproc_per_node": "1",
    "nnodes": "1",
    "node_rank": 0,
    "max_restarts": 0,
}


def add_launch_arguments(parser: argparse.ArgumentParser) -> None:
    """Declare ``accel launch``'s options (a subset of torchrun's, same names)."""
    parser.add_argument(
        "--nproc-per-node",
        "--nproc_per_node",
        dest="nproc_per_node",
        default=None,
        metavar="N",
        help="processes per node: a number, or torchrun's 'gpu' / 'cpu' / 'auto' "
        "(default: the config file's num_processes, else 1)",
    )
    parser.add_argument(
        "--nnodes",
        default=None,
        metavar="NODES",
        help="number of nodes, or a MIN:MAX range for elastic jobs "
        "(default: the config file's num_machines, else 1)",
    )
    parser.add_argument(
        "--node-rank",
        "--node_rank",
        dest="node_rank",
        type=int,
        default=None,
        metavar="RANK",
        help="rank of this node for static rendezvous with --master-addr (default: 0)",
    )
    parser.add_argument(
        "--rdzv-endpoint",
        "--rdzv_endpoint",
        dest="rdzv_endpoint",
        default=None,
        metavar="HOST:PORT",
        help="HOST:PORT of the rendezvous server (multi-node, c10d rendezvous)",
    )
    parser.add_argument(
        "--rdzv-backend",
        "--rdzv_backend",
        dest="rdzv_backend",
        default=None,
        metavar="BACKEND",
        help="rendezvous backend (default: c10d with --rdzv-endpoint, static otherwise)",
    )
    parser.add_argument(
        "--rdzv-id",
        "--rdzv_id",
        dest="rdzv_id",
        default=None,
        metavar="ID",
        help="job id shared by all nodes of a c10d rendezvous",
    )
    parser.add_argument(
        "--master-addr",
        "--master_addr",
        dest="master_addr",
        default=None,
        metavar="HOST",
        help="address of the node with --node-rank 0 (static rendezvous)",
    )
    parser.add_argument(
        "--master-port",
        "--master_port",
        dest="master_port",
        type=int,
        default=None,
        metavar="PORT",
        help=f"free port on the master node (static rendezvous; default: {DEFAULT_MASTER_PORT}, "
        "replaced by a free port on one node when it is busy)",
    )
    parser.add_argument(
        "--max-restarts",
        "--max_restarts",
        dest="max_restarts",
        type=int,
        default=None,
        metavar="N",
        help="restart the worker group this many times after a failure (default: 0)",
    )
    ours = parser.add_argument_group("runtime settings (passed to the script's Accelerator)")
    ours.add_argument(
        "--mixed-precision",
        "--mixed_precision",
        dest="mixed_precision",
        choices=settings.MIXED_PRECISION_CHOICES,
        default=None,
        help="sets ACCEL_MIXED_PRECISION: no / fp16 / bf16 (an explicit "
        "Accelerator(mixed_precision=...) in the script still wins)",
    )
    ours.add_argument(
        "--gradient-accumulation-steps",
        "--gradient_accumulation_steps",
        dest="gradient_accumulation_steps",
        type=_positive_int,
        default=None,
        metavar="N",
        help="sets ACCEL_GRADIENT_ACCUMULATION_STEPS: micro-steps per optimizer step",
    )
    ours.add_argument(
        "--cpu",
        action="store_true",
        default=None,
        help="sets ACCEL_CPU=1: run on the CPU (gloo) even where CUDA is available",
    )
    ours.add_argument(
        "--timeout",
        type=float,
        default=None,
        metavar="SECONDS",
        help="sets ACCEL_TIMEOUT: collective timeout in seconds; a rank waiting longer for its "
        f"peers fails instead of hanging (default: {settings.DEFAULT_TIMEOUT_SECONDS:g})",
    )
    ours.add_argument(
        "--strategy",
        type=settings._parse_strategy,
        default=None,
        metavar="{" + ",".join(settings.STRATEGY_CHOICES) + "}",
        help="sets ACCEL_STRATEGY: how the model is spread over the processes: ddp (default), "
        "zero1 (optimizer state sharded), fsdp / fsdp-zero3 (parameters, gradients and optimizer "
        "state sharded), fsdp-zero2 (parameters kept whole between forward and backward)",
    )
    ours.add_argument(
        "--config-file",
        "--config_file",
        dest="config_file",
        default=None,
        metavar="FILE",
        help="YAML config written by `accel config` (sets ACCEL_CONFIG_FILE; default: "
        "$ACCEL_CONFIG_FILE, else ~/.cache/accel/default_config.yaml if it exists)",
    )
    parser.add_argument(
        "--migrate",
        action="store_true",
        help="run an unmodified single-device script: migrate it into a temporary copy first "
        "(its changes and diagnostics are printed) and run the copy; refused with exit status 2 "
        "when the migration leaves a place it could not rewrite safely. The script itself is "
        "never written",
    )
    parser.add_argument(
        "-m",
        "--module",
        action="store_true",
        help="treat the script as a Python module name and run it like `python -m`",
    )
    parser.add_argument("script", metavar="SCRIPT", help="the training script (or module with -m)")
    parser.add_argument(
        "script_args",
        nargs=argparse.REMAINDER,
        metavar="ARGS",
        help="arguments passed to the script untouched",
    )


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text}")
    return value


def apply_config_defaults(args: argparse.Namespace, config: dict[str, Any]) -> argparse.Namespace:
    """Fill options not given on the command line from the config file, then built-in defaults."""
    for key, dest in LAUNCH_CONFIG_KEYS.items():
        if getattr(args, dest, None) is None and config.get(key) is not None:
            value = config[key]
            setattr(args, dest, str(value) if dest in ("nproc_per_node", "nnodes") else value)
    for dest, default in LAUNCH_DEFAULTS.items():
        if getattr(args, dest, None) is None:
            setattr(args, dest, default)
    return args


def port_is_free(port: int, host: str = "") -> bool:
    """Whether a TCP server could listen on ``port`` now (as torch's TCPStore does)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def free_port() -> int:
    """A port the OS reports free right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("", 0))
        return int(sock.getsockname()[1])


def choose_master_port(args: argparse.Namespace) -> str | None:
    """Settle ``args.master_port`` for a static rendezvous on one node; return a note or None.

    Without ``--master-port`` the default 29500 is used, or a free port when 29500 is busy. A busy
    port given explicitly raises ``LaunchError``. Several nodes must agree on the port, so there
    nothing is replaced.
    """
    single_node = str(args.nnodes) == "1"
    static = args.rdzv_endpoint is None and args.master_addr is not None
    if not (single_node and static):
        return None
    if args.master_port is None:
        if port_is_free(DEFAULT_MASTER_PORT):
            args.master_port = DEFAULT_MASTER_PORT
            return None
        args.master_port = free_port()
        return (
            f"accel launch: port {DEFAULT_MASTER_PORT} is in use; using free port "
            f"{args.master_port} instead."
        )
    if not port_is_free(int(args.master_port)):
        raise LaunchError(
            f"--master-port {args.master_port} is already in use on this machine.",
            "a free port for the rendezvous of a one-node job.",
            "omit --master-port (a free port is chosen) or pick another port.",
        )
    return None


def torchrun_argv(args: argparse.Namespace) -> list[str]:
    """torchrun's command line for parsed ``accel launch`` options.

    One node without rendezvous options uses ``--standalone`` (a local rendezvous on a free port).
    The workers run ``runtime/worker_entry.py SCRIPT ARGS`` (``-m MODULE ARGS`` with ``-m``,
    ``--migrated COPY SCRIPT ARGS`` with ``--migrate``), which runs the script under
    torchelastic's ``@record``.
    """
    args = apply_config_defaults(args, {})
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
    copy = getattr(args, "migrated_copy", None)
    if args.module:
        target = ["-m", args.script]
    elif copy is not None:  # --migrate: the copy's code runs as the script (see worker_entry)
        target = ["--migrated", str(copy), args.script]
    else:
        target = [args.script]
    return [*argv, str(WORKER_ENTRY), *target, *args.script_args]


def runtime_environment(args: argparse.Namespace, config_path: Path | None) -> dict[str, str]:
    """The ``ACCEL_*`` variables that carry our options to the workers' Accelerator."""
    env: dict[str, str] = {}
    if config_path is not None:
        env[settings.CONFIG_FILE_ENV] = str(config_path.resolve())
    for name in ("mixed_precision", "gradient_accumulation_steps", "timeout", "strategy"):
        value = getattr(args, name, None)
        if value is not None:
            env[settings.SPEC_BY_NAME[name].env] = str(value)
    if getattr(args, "cpu", None):
        env[settings.SPEC_BY_NAME["cpu"].env] = "1"
    return env


# Messages of a collective that failed because a peer process was gone: a consequence, never the
# root cause, when another rank failed too.
PEER_LOST_MARKERS = (
    "connection closed by peer",
    "connection reset by peer",
    "broken pipe",
    "remote worker crashing",
    "remote worker hanging",
    "remote process exited",  # NCCL
)


def order_failures_by_time(failures: dict[int, Any]) -> None:
    """Give every failure the exact time it happened, as far as it is known.

    torchrun stamps failures with whole seconds and breaks ties by rank. The error file written
    by the worker entry carries the exact time of the exception (its mtime); a failure without
    an error file is placed at the end of the second it was observed in.
    """
    for failure in failures.values():
        error_file = getattr(failure, "error_file", None)
        if error_file and os.path.isfile(error_file):
            failure.timestamp = os.path.getmtime(error_file)
        else:
            failure.timestamp = int(failure.timestamp) + 0.999999


def is_consequence(failure: Any) -> bool:
    """Whether a failure merely followed another rank's: torchrun's SIGTERM, or a peer-gone error.

    A rank killed by another signal (SIGKILL from the OOM killer, SIGSEGV, ...) leaves no error
    file and is only observed after its peers' "connection closed" errors were written, so time
    alone would blame a peer.
    """
    error_file = getattr(failure, "error_file", None)
    if not (error_file and os.path.isfile(error_file)):
        return failure.exitcode in (-signal.SIGTERM, -signal.SIGINT)
    return any(marker in failure_text(failure).lower() for marker in PEER_LOST_MARKERS)


def root_cause(failures: dict[int, Any]) -> int:
    """The rank whose failure caused the others: root causes before consequences, then by time."""
    return min(failures, key=lambda rank: (is_consequence(failures[rank]), failures[rank].timestamp))


def failure_text(failure: Any) -> str:
    """The whole recorded message of a torchelastic ``ProcessFailure`` (traceback included)."""
    message = failure.message
    if isinstance(message, dict):
        extra = message.get("extraInfo", {})
        return str(extra.get("py_callstack") or message.get("message", ""))
    return str(message)


def failure_message(failure: Any) -> str:
    """The one-line error of a torchelastic ``ProcessFailure``."""
    if failure.exitcode < 0 and not (failure.error_file and os.path.isfile(failure.error_file)):
        try:
            name = signal.Signals(-failure.exitcode).name
        except ValueError:
            name = "unknown signal"
        return f"killed by signal {-failure.exitcode} ({name})"
    message = failure.message
    if isinstance(message, dict):
        message = message.get("message", "")
    return str(message).strip().splitlines()[-1] if str(message).strip() else "no error message"


_FRAME = re.compile(r'File "([^"]+)", line (\d+)')


def user_location(failure: Any) -> str | None:
    """``file, line N`` of the innermost frame of the traceback outside torch and this package."""
    library_dirs = [str(Path(torch_dir).resolve()) for torch_dir in _library_dirs()]
    location = None
    for path, line in _FRAME.findall(failure_text(failure)):
        resolved = str(Path(path).resolve()) if not path.startswith("<") else path
        if path.startswith("<") or any(resolved.startswith(d + os.sep) for d in library_dirs):
            continue
        location = f"{path}, line {line}"
    return location


def _library_dirs() -> list[str]:
    import sysconfig

    dirs = {Path(__file__).resolve().parent}
    for key in ("purelib", "platlib", "stdlib"):
        dirs.add(Path(sysconfig.get_paths()[key]))
    return [str(d) for d in dirs]


def report_failure(error: Any, script: str) -> tuple[int, Any]:
    """Print torchrun's summary with the right root cause; return ``(rank, failure)`` of it.

    The summary's title names the user's script, not the worker entry; the other failures are
    cut to their last line (the root cause keeps its traceback, which starts at the user's code).
    """
    failures = error.failures
    order_failures_by_time(failures)
    rank = root_cause(failures)
    first = failures[rank]
    for other_rank, failure in failures.items():
        if other_rank != rank:
            failure.message = failure_message(failure)
    error.name = script
    error.get_first_failure = lambda: (rank, first)  # what format_msg asks for the root cause
    print(error.format_msg(), file=sys.stderr)
    location = user_location(first)
    where = f" (at {location})" if location else ""
    print(f"accel launch: rank {rank} failed first: {failure_message(first)}{where}", file=sys.stderr)
    return rank, first


def exit_code(failure: Any) -> int:
    """The launcher's exit status for the root-cause failure (128 + N for a signal, as shells do)."""
    code = failure.exitcode
    if isinstance(code, int) and code < 0:
        return 128 + (-code) if -code < 128 else 1
    return code if isinstance(code, int) and 0 < code < 256 else 1


NPROC_WORDS = ("gpu", "cpu", "xpu", "auto")


def usage_problem(args: argparse.Namespace) -> str | None:
    """The first invalid launcher option (after config defaults), as one line; None when all are valid.

    Checked before torch is imported, so that a typo is answered at once and without a traceback.
    """
    nproc = str(args.nproc_per_node)
    if nproc not in NPROC_WORDS and not (nproc.isdigit() and int(nproc) >= 1):
        return (
            f"--nproc-per-node {nproc}: expected a positive number of processes or one of "
            f"{', '.join(NPROC_WORDS)}"
        )
    nnodes = str(args.nnodes)
    match = re.fullmatch(r"(\d+)(?::(\d+))?", nnodes)
    if not match or int(match.group(1)) < 1 or (match.group(2) and int(match.group(2)) < int(match.group(1))):
        return f"--nnodes {nnodes}: expected a positive number, or MIN:MAX with 1 <= MIN <= MAX"
    if int(args.max_restarts) < 0:
        return f"--max-restarts {args.max_restarts}: expected 0 or more restarts"
    if int(args.node_rank) < 0:
        return f"--node-rank {args.node_rank}: expected 0 or more"
    if args.timeout is not None and not args.timeout > 0:
        return f"--timeout {args.timeout:g}: expected a positive number of seconds"
    if not args.module and not Path(args.script).is_file():
        return f"script {args.script!r} not found"
    return None


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


class LaunchError(Exception):
    """``accel launch`` cannot start the job (message: what happened, what was expected, fix)."""

    def __init__(self, happened: str, expected: str, fix: str) -> None:
        super().__init__(f"{happened}\n  expected: {expected}\n  fix: {fix}")


def launch(args: argparse.Namespace) -> int:
    """Run the job through torchrun's engine; return the exit code for the shell.

    0 on success; 2 for a usage error (one line, before torch is imported); the root-cause
    rank's exit code (128 + N when it was killed by signal N) when a rank fails; 128 + N when
    the launcher itself gets signal N (130 for Ctrl-C), after torchrun has stopped every worker.
    """
    try:
        config_path = (
            Path(args.config_file) if args.config_file else settings.active_config_path()
        )
        config = settings.read_config_file(config_path) if config_path is not None else {}
        apply_config_defaults(args, config)
        problem = usage_problem(args)
        if problem is not None:
            print(f"accel launch: error: {problem}", file=sys.stderr)
            return 2
        note = choose_master_port(args)
    except (LaunchError, settings.SettingsError) as error:
        print(f"accel launch: error: {error}", file=sys.stderr)
        return 2
    if note:
        print(note, file=sys.stderr)
    if args.migrate and args.module:
        print("accel launch: error: --migrate needs a script file, not -m MODULE", file=sys.stderr)
        return 2
    if not args.module:
        shadow = shadowing_module(args.script)
        if shadow is not None and args.migrate:
            print(
                f"accel launch: error: {shadow} shadows the bundled runtime package, which the migrated "
                "copy imports (`from runtime import Accelerator`); rename it (or move the script)",
                file=sys.stderr,
            )
            return 2
        if shadow is not None:
            print(
                f"accel launch: warning: {shadow} shadows the bundled runtime package; "
                "`from runtime import Accelerator` in the script will import it instead. "
                "Rename it (or move the script).",
                file=sys.stderr,
            )
    migrated = None
    if args.migrate:
        from .launch_migrated import MigrationRefused, migrate_for_launch

        try:
            migrated = migrate_for_launch(Path(args.script), sys.stderr)
        except MigrationRefused as error:
            print(f"accel launch: error: {error}", file=sys.stderr)
            return 2
        args.migrated_copy = None if migrated is None else migrated.copy
    code = _run(args, config_path)
    if migrated is not None:
        if code == 0:
            migrated.remove()
        else:
            print(
                f"accel launch: the migrated copy is kept in {migrated.folder} (the traceback's line "
                "numbers are its lines); remove it when done",
                file=sys.stderr,
            )
    return code


def _run(args: argparse.Namespace, config_path: Path | None) -> int:
    """torchrun's engine over the settled options; the exit code for the shell."""
    if int(args.max_restarts) > 0:
        # With the c10d rendezvous (--standalone included) torchrun shares its TCPStore with the
        # workers by default, and a restarted worker group then finds the previous attempt's keys
        # in it: init_process_group connects to dead peers (gloo "connectFullMesh ... Connection
        # refused") or waits forever (pytorch/pytorch#135712). Unshared, rank 0 of every attempt
        # hosts a fresh store on a new port.
        os.environ.setdefault("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")

    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import get_args_parser, run

    try:
        torchrun_args = get_args_parser().parse_args(torchrun_argv(args))
        os.environ.update(runtime_environment(args, config_path))
        run(torchrun_args)
    except KeyboardInterrupt:  # before torchrun installed its signal handlers: no worker yet
        print("accel launch: interrupted", file=sys.stderr)
        return 128 + signal.SIGINT
    except ChildFailedError as error:
        _, first = report_failure(error, args.script)
        return exit_code(first)
    except SignalException as error:  # torchrun has already stopped every worker
        name = signal.Signals(error.sigval).name
        print(f"accel launch: stopped by {name}; every worker was stopped", file=sys.stderr)
        return 128 + int(error.sigval)
    return 0
