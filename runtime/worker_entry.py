"""Worker entry point of ``accel launch``: run the user's script, record its failure for torchrun.

torchrun starts every worker as ``python <this file> SCRIPT ARGS`` (or ``... -m MODULE ARGS``).
This file puts the script's folder first on ``sys.path`` (as ``python SCRIPT`` does), then runs it
as ``__main__``. ``accel launch --migrate`` starts ``... --migrated COPY SCRIPT ARGS``: the code of
COPY (the migrated temporary copy) runs as if it were SCRIPT, so that everything a script derives
from where it lives keeps working: ``__file__`` and ``sys.argv[0]`` are SCRIPT, and ``sys.path``
starts with COPY's folder (other migrated files of the run) then SCRIPT's (its unmodified sibling
modules). The working directory is the launcher's, as always. It does what torchelastic's
``@record`` does, with the traceback trimmed to the user's frames:

- an uncaught exception is written to the error file torchrun gives each worker (torch's own
  ``ErrorHandler``), so torchrun's failure summary shows the failing rank's exception instead of
  "To enable traceback see ...";
- the traceback, in the error file and on the worker's stderr, starts at the user's script: the
  frames of this file, of ``@record``-style wrapping and of ``runpy`` are dropped, so the last
  lines name the user's file and line;
- ``KeyboardInterrupt`` (Ctrl-C reaches every worker of the launcher's process group) ends the
  worker quietly with status 130, the shell's code for SIGINT; the launcher reports it once.

It is run by path, not with ``-m``, so that the launch folder can't shadow anything; it imports
nothing from the ``runtime`` package itself.
"""

from __future__ import annotations

import os
import runpy
import sys
import types
from collections.abc import Callable
from types import TracebackType

_INTERNAL_FILES = {os.path.abspath(__file__), "<frozen runpy>", os.path.abspath(runpy.__file__)}


def _usage() -> None:
    sys.stderr.write("usage: worker_entry.py SCRIPT [ARGS...] | -m MODULE [ARGS...] | --migrated COPY SCRIPT [ARGS...]\n")
    raise SystemExit(2)


def user_frames(tb: TracebackType | None) -> TracebackType | None:
    """``tb`` without its leading frames from this file and ``runpy`` (None if nothing is left)."""
    while tb is not None:
        filename = tb.tb_frame.f_code.co_filename
        if filename not in _INTERNAL_FILES and os.path.abspath(filename) not in _INTERNAL_FILES:
            break
        tb = tb.tb_next
    return tb


def run_recorded(target: Callable[[], object]) -> None:
    """Run ``target`` like ``@record`` would; exit 1 after recording an exception, 130 on Ctrl-C."""
    from torch.distributed.elastic.multiprocessing.errors import get_error_handler

    handler = get_error_handler()
    handler.initialize()
    try:
        target()
    except SystemExit as exit_:
        if exit_.code in (0, None):
            return
        raise
    except KeyboardInterrupt:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(130)  # interpreter teardown could block on a peer that is being stopped too
    except Exception as error:
        # format_exc (used by record_exception) reads the handled exception's __traceback__.
        error.__traceback__ = user_frames(error.__traceback__)
        handler.record_exception(error)
        sys.excepthook(type(error), error, error.__traceback__)
        sys.exit(1)


def run_as(copy: str, script: str) -> None:
    """Run the code of ``copy`` as ``__main__`` with ``__file__`` set to ``script``.

    Compiled under ``copy``'s name, so tracebacks show the lines that actually ran.
    """
    with open(copy, "rb") as source:
        code = compile(source.read(), copy, "exec", dont_inherit=True)
    main_module = types.ModuleType("__main__")
    main_module.__file__ = os.path.abspath(script)  # as `python SCRIPT` sets it (Python 3.9+)
    main_module.__cached__ = None  # as for `python SCRIPT`: no bytecode file, no spec
    main_module.__spec__ = None
    previous = sys.modules.get("__main__")
    sys.modules["__main__"] = main_module
    try:
        exec(code, main_module.__dict__)
    finally:
        if previous is not None:
            sys.modules["__main__"] = previous


def main(argv: list[str]) -> None:
    """Run ``argv`` (``SCRIPT ARGS`` or ``-m MODULE ARGS``) like ``python`` would, recorded."""
    if not argv:
        _usage()
    if argv[0] == "-m":
        if len(argv) < 2:
            _usage()
        module, args = argv[1], argv[2:]
        sys.argv = [module, *args]
        sys.path[0] = os.getcwd()  # what `python -m` puts first
        run_recorded(lambda: runpy.run_module(module, run_name="__main__", alter_sys=True))
    elif argv[0] == "--migrated":
        if len(argv) < 3:
            _usage()
        copy, script, args = argv[1], argv[2], argv[3:]
        sys.argv = [script, *args]
        sys.path[0:1] = [os.path.dirname(os.path.abspath(copy)), os.path.dirname(os.path.abspath(script))]
        run_recorded(lambda: run_as(copy, script))
    else:
        script, args = argv[0], argv[1:]
        sys.argv = [script, *args]
        sys.path[0] = os.path.dirname(os.path.abspath(script))  # what `python SCRIPT` puts first
        run_recorded(lambda: runpy.run_path(script, run_name="__main__"))


if __name__ == "__main__":
    # sys.path[0] is this file's folder (runtime/): replace it before anything else is imported.
    sys.path[0] = os.getcwd()
    main(sys.argv[1:])
