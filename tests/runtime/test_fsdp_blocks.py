"""The default wrap policy of the fsdp strategies (runtime/fsdp.py) on models whose repeated
layers sit in containers: `fully_shard` refuses a module without a `forward` of its own
(`nn.ModuleList`), so the policy picks the layers inside it."""

from __future__ import annotations

from torch import nn

from runtime.fsdp import default_blocks


def test_transformer_layers_not_their_lists() -> None:
    model = nn.Transformer(d_model=8, nhead=2, num_encoder_layers=2, num_decoder_layers=2, dim_feedforward=16)
    blocks = default_blocks(model)
    assert not any(isinstance(b, (nn.ModuleList, nn.ModuleDict)) for b in blocks)
    assert [type(b).__name__ for b in blocks] == ["TransformerEncoderLayer"] * 2 + ["TransformerDecoderLayer"] * 2
    assert all(b is layer for b, layer in zip(blocks, [*model.encoder.layers, *model.decoder.layers]))


def test_direct_children_skip_a_container() -> None:
    # no repeated block: each direct child with parameters, a ModuleDict's modules looked into no deeper
    model = nn.Module()
    model.embed = nn.Embedding(10, 4)
    model.heads = nn.ModuleDict({"a": nn.Linear(4, 2)})
    assert default_blocks(model) == [model.embed]
