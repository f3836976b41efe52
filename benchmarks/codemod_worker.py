"""Time one pass over a list of files in this process (imports excluded); prints JSON.

    python -m benchmarks.codemod_worker MODE LISTFILE
MODE: read (read + decode: the I/O floor), floor (read + libcst parse_module + .code round-trip),
engine (read + accel-migrate's engine, nothing written: migrate.runner.migrate_text).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path


def main() -> None:
    mode, listfile = sys.argv[1], sys.argv[2]
    paths = [Path(p) for p in Path(listfile).read_text().splitlines() if p]
    if mode == "floor":
        import libcst

        def one(text: str, path: str) -> bool:
            try:
                return libcst.parse_module(text).code == text
            except Exception:  # noqa: BLE001 - a file libcst cannot parse costs what it costs
                return False
    elif mode == "engine":
        from migrate.engine import Options
        from migrate.runner import migrate_text

        options = Options()

        def one(text: str, path: str) -> bool:
            return migrate_text(text, path, options).parsed
    else:
        def one(text: str, path: str) -> bool:
            return "torch" in text

    start = time.perf_counter()
    hits = 0
    for path in paths:
        text = path.read_bytes().decode("utf-8", errors="replace")
        hits += bool(one(text, str(path)))
    print(json.dumps({"seconds": time.perf_counter() - start, "files": len(paths), "hits": hits}))


if __name__ == "__main__":
    main()
