"""AM102 device-type-kept: a string device rebound to a torch.device is caught where it is used as a
string, and the rewrite keeps such a device a string (`accelerator.device.type`)."""

from __future__ import annotations

from pathlib import Path

import libcst as cst
import pytest

from migrate.engine import migrate_source
from migrate.safety import CheckContext
from migrate.safety import device_type

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"


def violations(before: str, after: str) -> list[tuple[int, str]]:
    context = CheckContext("x.py", cst.parse_module(before), cst.parse_module(after), before, after, None)
    return [(v.line, v.message) for v in device_type.check(context)]


STRING = 'device = "cuda" if torch.cuda.is_available() else "cpu"\n'
DEVICE = "accelerator = Accelerator()\ndevice = accelerator.device\n"
AS_TYPE = "accelerator = Accelerator()\ndevice = accelerator.device.type\n"

STRING_USES = {
    "in": 'kind = "cuda" if "cuda" in device else "cpu"\n',
    "equality": 'use_amp = device == "cuda"\n',
    "inequality": 'if device != "cpu":\n    pass\n',
    "pin_memory": 'loader = DataLoader(data, pin_memory=device == "cuda")\n',
    "device_type keyword": "ctx = torch.autocast(device_type=device, dtype=torch.bfloat16)\n",
    "autocast positional": "ctx = torch.autocast(device)\n",
    "string method": 'gpu = device.startswith("cuda")\n',
    "f-string": 'path = f"ckpt-{device}.pt"\n',
    "concatenation": 'name = "run-" + device\n',
    "percent formatting": 'name = "run-%s" % device\n',
    "dict key": "batch_sizes = {device: 32}\n",
    "lookup": "size = batch_sizes[device]\n",
    "isinstance str": "ok = isinstance(device, str)\n",
}

DEVICE_USES = {
    "to": "x = x.to(device)\n",
    "device keyword": "z = torch.zeros(3, device=device)\n",
    "map_location": "state = torch.load(path, map_location=device)\n",
    "torch.device": "d = torch.device(device)\n",
}


@pytest.mark.parametrize("use", list(STRING_USES))
def test_string_use_of_a_rebound_string_device_fails(use: str) -> None:
    code = STRING_USES[use]
    found = violations(STRING + code, DEVICE + code)
    assert [line for line, _ in found] == [3]
    assert "accelerator.device.type" in found[0][1]


@pytest.mark.parametrize("use", list(STRING_USES))
def test_string_use_of_a_device_kept_a_string_passes(use: str) -> None:
    code = STRING_USES[use]
    assert violations(STRING + code, AS_TYPE + code) == []


@pytest.mark.parametrize("use", list(DEVICE_USES))
def test_device_uses_of_a_rebound_string_device_pass(use: str) -> None:
    code = DEVICE_USES[use]
    assert violations(STRING + code, DEVICE + code) == []


def test_a_torch_device_in_the_input_may_stay_one() -> None:
    before = 'device = torch.device("cuda" if torch.cuda.is_available() else "cpu")\nok = device == "cuda"\n'
    assert violations(before, DEVICE + 'ok = device == "cuda"\n') == []


def test_string_device_chosen_in_an_if_block() -> None:
    before = 'if torch.cuda.is_available():\n    device = "cuda"\nelse:\n    device = "cpu"\npin = device == "cuda"\n'
    assert [line for line, _ in violations(before, DEVICE + 'pin = device == "cuda"\n')] == [3]


def test_inside_a_function_and_through_a_parameter() -> None:
    helper = 'def make_loader(data, device):\n    return DataLoader(data, pin_memory=device == "cuda")\n\n\n'
    before = helper + "def main():\n    device = \"cuda\"\n    make_loader(d, device)\n"
    after = helper + "def main():\n    accelerator = Accelerator()\n    device = accelerator.device\n    make_loader(d, device)\n"
    assert [line for line, _ in violations(before, after)] == [2]
    kept = after.replace("accelerator.device\n", "accelerator.device.type\n")
    assert violations(before, kept) == []


def test_a_different_function_with_the_same_name_is_its_own_scope() -> None:
    before = 'def a():\n    device = "cuda"\n\n\ndef b(device):\n    return device == "cuda"\n\n\nb(torch.device("cuda"))\n'
    after = 'def a():\n    device = accelerator.device\n\n\ndef b(device):\n    return device == "cuda"\n\n\nb(torch.device("cuda"))\n'
    assert violations(before, after) == []


def test_every_golden_output_passes() -> None:
    outputs = sorted(FIXTURES.glob("*/*.out.py"))
    for out in outputs:
        source = out.with_name(out.name.replace(".out.py", ".in.py")).read_text()
        assert violations(source, out.read_text()) == [], out


def test_the_rewrite_keeps_a_string_device_used_as_string_a_string() -> None:
    source = (FIXTURES / "create_accelerator" / "string_device_used_as_string.in.py").read_text()
    new = migrate_source(source, "train.py").new_text
    assert new is not None
    assert "device = accelerator.device.type\n" in new
    assert 'pin_memory=device == "cuda"' in new
    assert violations(source, new) == []


def test_the_rewrite_binds_a_string_device_only_moved_to_accelerator_device() -> None:
    source = (FIXTURES / "pipeline" / "clip_warmup_scheduler.in.py").read_text()
    assert 'device = "cuda" if torch.cuda.is_available() else "cpu"' in source
    new = migrate_source(source, "train.py").new_text
    assert new is not None and ".device.type" not in new
