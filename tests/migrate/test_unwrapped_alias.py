"""migrate/roles/unwrapped_alias.py: the model to prepare behind `model_without_ddp`."""

from __future__ import annotations

import libcst as cst

from migrate.analysis import analyze
from migrate.roles.unwrapped_alias import wrapped_model

HAND_WRAPPED = """
import torch
def main(args):
    model = Net()
    model_without_ddp = model
    if args.distributed:
        model = torch.nn.parallel.DistributedDataParallel(model)
        model_without_ddp = model.module
"""


def _main(text: str):  # type: ignore[no-untyped-def]
    facts = analyze(cst.parse_module(text))
    return facts.functions["main"], facts.aliases


def test_the_alias_of_a_hand_wrapped_model_names_the_trained_model() -> None:
    home, aliases = _main(HAND_WRAPPED)
    assert wrapped_model(home, "model_without_ddp", aliases) == "model"


def test_an_alias_without_a_hand_wrapper_or_rebound_otherwise_stays() -> None:
    home, aliases = _main(HAND_WRAPPED.replace("torch.nn.parallel.DistributedDataParallel(model)", "wrap(model)"))
    assert wrapped_model(home, "model_without_ddp", aliases) == "model_without_ddp"
    home, aliases = _main(HAND_WRAPPED.replace("model_without_ddp = model.module", "model_without_ddp = Net()"))
    assert wrapped_model(home, "model_without_ddp", aliases) == "model_without_ddp"
