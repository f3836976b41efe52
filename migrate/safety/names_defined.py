"""Every name the output reads is defined, and no import still in use was removed (AM104, names-defined).

(minimal first version: refined below)
"""

from __future__ import annotations

from migrate.safety import CheckContext, Violation

CODE = "AM104"
NAME = "names-defined"


def check(context: CheckContext) -> list[Violation]:
    return []
