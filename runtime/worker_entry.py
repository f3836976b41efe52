"""Worker entry point of ``accel launch``: run the user's script under torchelastic's ``@record``.

torchrun starts every worker as ``python <this file> SCRIPT ARGS`` (or ``... -m MODULE ARGS``).
This file puts the script's folder first on ``sys.path`` (as ``python SCRIPT`` does), then runs it
as ``__main__`` inside a function decorated with
``torch.distributed.elastic.multiprocessing.errors.record``. An uncaught exception is therefore
written to the error file torchrun gives each worker, and torchrun's failure summary shows the
failing rank's exception and traceback instead of "To enable traceback see ...".

It is run by path, not with ``-m``, so that the launch folder can't shadow anything; it imports
nothing from the ``runtime`` package itself.
"""

from __future__ import annotations

import os
import runpy
import sys


def _usage() -> None:
    sys.stderr.write("usage: worker_entry.py SCRIPT [ARGS...] | -m MODULE [ARGS...]\n")
    raise SystemExit(2)


def main(argv: list[str]) -> None:
    """Run ``argv`` (``SCRIPT ARGS`` or ``-m MODULE ARGS``) like ``python`` would, under ``@record``."""
    from torch.distributed.elastic.multiprocessing.errors import record

    if not argv:
        _usage()
    if argv[0] == "-m":
        if len(argv) < 2:
            _usage()
        module, args = argv[1], argv[2:]
        sys.argv = [module, *args]
        sys.path[0] = os.getcwd()  # what `python -m` puts first

        @record
        def run_module() -> None:
            runpy.run_module(module, run_name="__main__", alter_sys=True)

        run_module()
    else:
        script, args = argv[0], argv[1:]
        sys.argv = [script, *args]
        sys.path[0] = os.path.dirname(os.path.abspath(script))  # what `python SCRIPT` puts first

        @record
        def run_script() -> None:
            runpy.run_path(script, run_name="__main__")

        run_script()


if __name__ == "__main__":
    # sys.path[0] is this file's folder (runtime/): replace it before anything else is imported.
    sys.path[0] = os.getcwd()
    main(sys.argv[1:])
