"""DebertaConfig: presets, validation rules (one test per rule, asserting the message), Hugging Face
config.json translation including the fields transformers reads with getattr defaults."""

from __future__ import annotations

import pytest

from debertakit.config import PRESETS, DebertaConfig
from debertakit.convert import from_hf_config, to_hf_config

RELEASED = {
    # name: (hidden, layers, heads, ffn, vocab, layout, buckets, conv)
    "deberta-base": (768, 12, 12, 3072, 50265, "v1", 0, 0),
    "deberta-large": (1024, 24, 16, 4096, 50265, "v1", 0, 0),
    "deberta-xlarge": (1024, 48, 16, 4096, 50265, "v1", 0, 0),
    "deberta-v2-xlarge": (1536, 24, 24, 6144, 128100, "v2", 256, 3),
    "deberta-v2-xxlarge": (1536, 48, 24, 6144, 128100, "v2", 256, 3),
    "deberta-v3-xsmall": (384, 12, 6, 1536, 128100, "v2", 256, 0),
    "deberta-v3-small": (768, 6, 12, 3072, 128100, "v2", 256, 0),
    "deberta-v3-base": (768, 12, 12, 3072, 128100, "v2", 256, 0),
    "deberta-v3-large": (1024, 24, 16, 4096, 128100, "v2", 256, 0),
    "mdeberta-v3-base": (768, 12, 12, 3072, 251000, "v2", 256, 0),
}


@pytest.mark.parametrize("name", sorted(RELEASED))
def test_released_presets(name):
    c = DebertaConfig.preset("microsoft/" + name)
    h, layers, heads, ffn, vocab, layout, buckets, conv = RELEASED[name]
    assert (c.hidden_size, c.num_layers, c.num_heads, c.intermediate_size, c.vocab_size) == (
        h,
        layers,
        heads,
        ffn,
        vocab,
    )
    assert (c.attention_layout, c.position_buckets, c.conv_kernel_size) == (layout, buckets, conv)
    assert c.relative_attention and not c.position_biased_input and c.type_vocab_size == 0
    assert (
        c.layer_norm_eps == 1e-7 and c.max_position_embeddings == 512 and c.position_terms == ("c2p", "p2c")
    )
    assert c.share_att_key == (layout == "v2") and c.norm_rel_ebd == (
        "layer_norm" if layout == "v2" else "none"
    )


def test_every_preset_builds():
    for name in PRESETS:
        assert DebertaConfig.preset(name).head_dim >= 1


def test_unknown_preset():
    with pytest.raises(ValueError, match="unknown preset 'deberta-huge'; known presets"):
        DebertaConfig.preset("deberta-huge")


@pytest.mark.parametrize(
    "changes, message",
    [
        (dict(hidden_size=30, num_heads=4), r"hidden_size=30 is not a multiple of num_heads=4"),
        (
            dict(position_buckets=600, max_relative_positions=512),
            r"position_buckets=600 > max_relative_positions=512",
        ),
        (dict(position_terms=("c2p", "p2x")), r"unknown attention term\(s\) \['p2x'\]"),
        (dict(position_terms=("c2p", "c2p")), r"repeats a term"),
        (dict(num_layers=0), r"num_layers=0 must be >= 1"),
        (dict(hidden_dropout=1.0), r"hidden_dropout=1.0 must be in \[0, 1\)"),
        (dict(pad_token_id=500, vocab_size=100), r"pad_token_id=500 must be in \[0, vocab_size=100\)"),
        (dict(attention_layout="v1", share_att_key=True), r"share_att_key=True is a v2/v3 feature"),
        (
            dict(attention_layout="v1", share_att_key=False, position_buckets=8),
            r"v1 layout has no log buckets",
        ),
        (dict(conv_kernel_size=2), r"conv_kernel_size=2 must be 0 \(none\) or a positive odd number"),
        (dict(max_relative_positions=0), r"max_relative_positions=0 must be >= 1"),
        (dict(num_labels=2, label_names=("a",)), r"label_names has 1 names but num_labels=2"),
        (dict(position_buckets=1), r"position_buckets=1 must be 0 or >= 2"),
    ],
)
def test_config_rules(changes, message):
    with pytest.raises(ValueError, match=message):
        DebertaConfig.preset("tiny-v3").replace(**changes)


def test_replace_unknown_field():
    with pytest.raises(ValueError, match=r"no field\(s\) \['hidden'\]"):
        DebertaConfig().replace(hidden=3)


def test_derived_values():
    c = DebertaConfig.preset("deberta-v3-base")
    assert c.rel_span == 256 and c.score_scale_factor == 3 and c.head_dim == 64 and c.emd_enabled
    v1 = DebertaConfig.preset("deberta-base")
    assert v1.rel_span == 512
    assert DebertaConfig(position_terms=("c2p", "p2c", "p2p")).score_scale_factor == 4
    assert not DebertaConfig(position_biased_input=True).emd_enabled


def test_json_round_trip(tmp_path):
    c = DebertaConfig.preset("tiny-v2", label_names=("neg", "pos"))
    c.save(tmp_path / "c.json")
    assert DebertaConfig.load(tmp_path / "c.json") == c


def test_hf_missing_fields_take_transformers_getattr_defaults():
    d = {
        "model_type": "deberta-v2",
        "vocab_size": 100,
        "hidden_size": 32,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "intermediate_size": 64,
        "conv_kernel_size": 3,
        "relative_attention": True,
        "pos_att_type": "p2c|c2p",
    }
    c = from_hf_config(d)
    assert c.conv_act == "tanh"  # transformers: getattr(config, "conv_act", "tanh")
    assert c.position_buckets == 0 and not c.share_att_key and c.norm_rel_ebd == "none"
    assert c.position_biased_input  # the transformers class default
    assert c.max_relative_positions == 512  # -1 -> max_position_embeddings
    assert c.position_terms == ("c2p", "p2c") and c.c2p and c.p2c


def test_hf_v1_config():
    d = {
        "model_type": "deberta",
        "vocab_size": 50265,
        "hidden_size": 768,
        "num_hidden_layers": 12,
        "num_attention_heads": 12,
        "intermediate_size": 3072,
        "relative_attention": True,
        "max_relative_positions": -1,
        "position_biased_input": False,
        "pos_att_type": ["c2p", "p2c"],
        "type_vocab_size": 0,
        "layer_norm_eps": 1e-7,
    }
    c = from_hf_config(d)
    assert c == DebertaConfig.preset("deberta-base").replace(extra={})


@pytest.mark.parametrize(
    "preset", ["deberta-base", "deberta-v2-xlarge", "deberta-v3-base", "mdeberta-v3-base"]
)
def test_hf_config_round_trip(preset):
    c = DebertaConfig.preset(preset)
    back = from_hf_config(to_hf_config(c, "masked_lm"))
    assert back == c


def test_hf_config_rejects_foreign_model_type():
    with pytest.raises(ValueError, match="model_type='bert'; expected 'deberta' or 'deberta-v2'"):
        from_hf_config({"model_type": "bert"})


def test_p2p_cannot_be_written_for_transformers():
    with pytest.raises(ValueError, match="p2p"):
        to_hf_config(DebertaConfig(position_terms=("c2p", "p2c", "p2p")))
