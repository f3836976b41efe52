"""The ordered list of output checks the engine runs on every changed file (see `migrate/safety`).

Order matters only for speed and for which diagnostic a file shows first: checks that read the
output alone come first, the idempotence check (which reruns the whole pipeline) last.
"""

from __future__ import annotations

from types import ModuleType

from migrate.safety import CHECKS, Check
from migrate.safety import accelerator_bound, device_type, idempotent, names_defined


def _check(module: ModuleType) -> Check:
    return Check(code=module.CODE, name=module.NAME, run=module.check, doc=module.__doc__ or "")


CHECKS[:] = [
    _check(accelerator_bound),
    _check(device_type),
    _check(names_defined),
    _check(idempotent),
]

BY_CODE: dict[str, Check] = {check.code: check for check in CHECKS}
