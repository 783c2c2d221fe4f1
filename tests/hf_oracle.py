"""Tiny random Hugging Face DeBERTa models: the numerical oracle of the parity tests."""

from __future__ import annotations

import pytest

transformers = pytest.importorskip("transformers")

# name -> (model_type, config kwargs). Covers v1 (clamped, with and without absolute positions / token types),
# v2 with the conv branch, v2 without shared keys, v3, mDeBERTa-like vocabulary, embed_proj, single terms.
_TINY = dict(
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=48,
    max_position_embeddings=64,
)
VARIANTS: dict[str, tuple[str, dict]] = {
    "v1": (
        "deberta",
        dict(
            vocab_size=96, relative_attention=True, position_biased_input=False, pos_att_type=["c2p", "p2c"]
        ),
    ),
    "v1-clamped-abs-types": (
        "deberta",
        dict(
            vocab_size=96,
            relative_attention=True,
            position_biased_input=True,
            type_vocab_size=2,
            max_relative_positions=8,
            pos_att_type="p2c|c2p",
        ),
    ),
    "v2-conv": (
        "deberta-v2",
        dict(
            vocab_size=96,
            relative_attention=True,
            position_biased_input=False,
            pos_att_type=["p2c", "c2p"],
            position_buckets=8,
            max_relative_positions=16,
            share_att_key=True,
            norm_rel_ebd="layer_norm",
            conv_kernel_size=3,
            conv_act="gelu",
        ),
    ),
    "v2-separate-keys": (
        "deberta-v2",
        dict(
            vocab_size=96,
            relative_attention=True,
            position_biased_input=False,
            pos_att_type="p2c|c2p",
            max_relative_positions=12,
            share_att_key=False,
            conv_kernel_size=3,
        ),  # conv_act missing -> tanh
    ),
    "v3": (
        "deberta-v2",
        dict(
            vocab_size=96,
            relative_attention=True,
            position_biased_input=False,
            pos_att_type=["p2c", "c2p"],
            position_buckets=8,
            max_relative_positions=16,
            share_att_key=True,
            norm_rel_ebd="layer_norm",
        ),
    ),
    "mdeberta-vocab-embed-proj": (
        "deberta-v2",
        dict(
            vocab_size=2000,
            embedding_size=24,
            relative_attention=True,
            position_biased_input=False,
            pos_att_type=["p2c", "c2p"],
            position_buckets=8,
            max_relative_positions=16,
            share_att_key=True,
            norm_rel_ebd="layer_norm",
        ),
    ),
    "v3-c2p-only": (
        "deberta-v2",
        dict(
            vocab_size=96,
            relative_attention=True,
            position_biased_input=False,
            pos_att_type=["c2p"],
            position_buckets=8,
            max_relative_positions=16,
            share_att_key=True,
            norm_rel_ebd="layer_norm",
        ),
    ),
    "v2-p2c-only-no-share": (
        "deberta-v2",
        dict(
            vocab_size=96,
            relative_attention=True,
            position_biased_input=False,
            pos_att_type=["p2c"],
            position_buckets=8,
            max_relative_positions=16,
            share_att_key=False,
        ),
    ),
}

HF_CLASSES = {
    "base": "Model",
    "masked_lm": "ForMaskedLM",
    "sequence_classification": "ForSequenceClassification",
    "token_classification": "ForTokenClassification",
    "question_answering": "ForQuestionAnswering",
    "multiple_choice": "ForMultipleChoice",
}


def hf_model(variant: str, head: str = "base", **extra):
    model_type, kw = VARIANTS[variant]
    family = "Deberta" if model_type == "deberta" else "DebertaV2"
    config_cls = getattr(transformers, family + "Config")
    kw = {
        **_TINY,
        **kw,
        "hidden_dropout_prob": 0.0,
        "attention_probs_dropout_prob": 0.0,
        "legacy": False,
        "num_labels": 3,
        **extra,
    }
    cfg = config_cls(**kw)
    model = getattr(transformers, family + HF_CLASSES[head])(cfg)
    return model.eval()
