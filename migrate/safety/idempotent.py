"""Running the whole pipeline again on the output changes nothing (AM103, idempotent).

(minimal first version: refined below)
"""

from __future__ import annotations

from migrate.safety import CheckContext, Violation

CODE = "AM103"
NAME = "idempotent"


def check(context: CheckContext) -> list[Violation]:
    return []
