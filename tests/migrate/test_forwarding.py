"""`migrate.forwarding.forwarded`: which imported function a package's wrapper hands a script's
calls on to, and every shape it must not follow (the unit is then refused with AM013)."""

from __future__ import annotations

import pytest

from migrate.forwarding import forwarded

WRAPPER = '''
from .build import build_loader as _build_loader
from .simmim import build_simmim


def build_loader(config, simmim=False, mode="train"):
    """Pick the builder."""
    if simmim:
        return build_simmim(config)
    elif mode == "train" and not simmim:
        return _build_loader(config)
    return None
'''


@pytest.mark.parametrize(("script", "expected"), [
    ("build_loader(cfg)\n", "_build_loader"),
    ("a = build_loader(cfg)\nb = build_loader(other, simmim=False)\n", "_build_loader"),
    ("build_loader(cfg, simmim=True)\n", "build_simmim"),
    ("build_loader(cfg)\nbuild_loader(cfg, simmim=True)\n", None),  # two calls, two functions
    ("build_loader(cfg, mode='eval')\n", None),  # the chain ends in `return None`
    ("build_loader(cfg, simmim=flag)\n", None),  # a branch decided by a value the call does not fix
    ("build_loader(cfg, True)\n", None),  # a positional flag is not handed on as the builder's argument
    ("build_loader(*args)\n", None),
    ("fn = build_loader\nfn(cfg)\n", None),  # used other than by calling it
    ("x = 1\n", None),  # never called
])
def test_a_wrapper_is_followed_only_for_calls_it_plainly_hands_on(script: str, expected: str | None) -> None:
    assert forwarded(WRAPPER, "build_loader", f"from data import build_loader\n{script}", "build_loader") == expected


@pytest.mark.parametrize("package", [
    # arguments handed on reordered, changed, or by keyword
    "from .b import f as _f\ndef g(a, b):\n    return _f(b, a)\n",
    "from .b import f as _f\ndef g(a):\n    return _f(a + 1)\n",
    "from .b import f as _f\ndef g(a):\n    return _f(a=a)\n",
    # a statement before the return, a decorator, *args
    "from .b import f as _f\ndef g(a):\n    a.freeze()\n    return _f(a)\n",
    "import functools\nfrom .b import f as _f\n@functools.cache\ndef g(a):\n    return _f(a)\n",
    "from .b import f as _f\ndef g(*a):\n    return _f(*a)\n",
    # a branch on something other than a parameter's literal
    "import os\nfrom .b import f as _f\ndef g(a):\n    if os.environ.get('X'):\n        return _f(a)\n",
    "this is not python(",
])
def test_anything_but_a_plain_dispatch_is_not_followed(package: str) -> None:
    assert forwarded(package, "g", "from pkg import g\ng(cfg)\n", "g") is None


def test_a_plain_forward_without_branches_is_followed() -> None:
    package = "from .b import f as _f\ndef g(a, b):\n    return _f(a, b)\n"
    assert forwarded(package, "g", "from pkg import g as h\nh(x, y)\n", "h") == "_f"
