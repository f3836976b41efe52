"""AM001's search for a device choice (`create_accelerator._DeviceChoice`): what counts, with the
shortcuts it takes (a string without an escape is not evaluated, a dotted name is not entered)."""

from __future__ import annotations

import libcst as cst
import pytest

from migrate.analysis import analyze
from migrate.rules.create_accelerator import _DeviceChoice
from migrate.walk import walk


def _chooses_device(text: str) -> bool:
    module = cst.parse_module(text)
    finder = _DeviceChoice(analyze(module, text).aliases)
    walk(module, finder)
    return finder.found


@pytest.mark.parametrize(("text", "found"), [
    ('import torch\nx = "cuda"\n', True),
    ('import torch\nx = "cuda:1"\n', True),
    ('import torch\nx = "\\x63uda"\n', True),  # an escape spells `cuda`
    ('import torch\nx = b"cuda"\n', False),
    ('import torch\n"""Trains on cuda."""\n', False),
    ('import torch\nx = "cpu"\n', False),
    ('import torch\nok = torch.cuda.is_available()\n', True),
    ('import torch as th\nn = th.backends.mps.is_built\n', True),
    ('import torch\nt = torch.nn.functional.relu\n', False),
    ('import torch\ny = f(x).cuda\n', False),  # an attribute named cuda, not a call
    ('import torch\ny = f(x).cuda()\n', True),
    ('import torch\ny = x.to(torch.float64)\n', False),
    ('import torch\ny = x.to(dev)\n', True),
    ('import torch\ny = torch.zeros(3, device=d)\n', True),
    ('import torch\ny = torch.zeros(3, device="cpu")\n', False),
    ('import torch\nd = torch.device("cpu")\n', True),
    ('import torch\ndef f():\n    if a:\n        y = x.cuda()\n    z = 1\n', True),
])
def test_device_choices(text: str, found: bool) -> None:
    assert _chooses_device(text) is found
