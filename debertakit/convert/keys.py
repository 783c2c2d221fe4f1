"""Parameter names: Hugging Face (and the official repository's v1 layout) <-> ours, both directions from one
table with ``{}`` layer placeholders, plus the v1 ``in_proj`` de-interleaving (REFERENCE.md §2)."""

from __future__ import annotations

import re

import torch
from torch import Tensor

from debertakit.config import DebertaConfig

# (Hugging Face name relative to the backbone, our name relative to the backbone)
BACKBONE_KEYS: list[tuple[str, str]] = [
    ("embeddings.word_embeddings.weight", "embeddings.word.weight"),
    ("embeddings.token_type_embeddings.weight", "embeddings.token_type.weight"),
    ("embeddings.embed_proj.weight", "embeddings.proj.weight"),
    ("embeddings.LayerNorm.weight", "embeddings.norm.weight"),
    ("embeddings.LayerNorm.bias", "embeddings.norm.bias"),
    ("encoder.rel_embeddings.weight", "encoder.rel_embeddings.weight"),
    ("encoder.LayerNorm.weight", "encoder.rel_norm.weight"),
    ("encoder.LayerNorm.bias", "encoder.rel_norm.bias"),
    ("encoder.conv.conv.weight", "encoder.conv.conv.weight"),
    ("encoder.conv.conv.bias", "encoder.conv.conv.bias"),
    ("encoder.conv.LayerNorm.weight", "encoder.conv.norm.weight"),
    ("encoder.conv.LayerNorm.bias", "encoder.conv.norm.bias"),
]
_LAYER = "encoder.layer.{}."
_OUR_LAYER = "encoder.layers.{}."
LAYER_KEYS: list[tuple[str, str]] = [
    ("attention.self.query_proj.{w}", "attention.query.{w}"),
    ("attention.self.key_proj.{w}", "attention.key.{w}"),
    ("attention.self.value_proj.{w}", "attention.value.{w}"),
    ("attention.self.pos_key_proj.{w}", "attention.pos_key.{w}"),
    ("attention.self.pos_query_proj.{w}", "attention.pos_query.{w}"),
    ("attention.output.dense.{w}", "attention.out.{w}"),
    ("attention.output.LayerNorm.{w}", "attn_norm.{w}"),
    ("intermediate.dense.{w}", "ffn_in.{w}"),
    ("output.dense.{w}", "ffn_out.{w}"),
    ("output.LayerNorm.{w}", "ffn_norm.{w}"),
]
V1_LAYER_KEYS: list[tuple[str, str]] = [
    ("attention.self.q_bias", "attention.query.bias"),
    ("attention.self.v_bias", "attention.value.bias"),
    ("attention.self.pos_proj.weight", "attention.pos_key.weight"),
    ("attention.self.pos_q_proj.weight", "attention.pos_query.weight"),
    ("attention.self.pos_q_proj.bias", "attention.pos_query.bias"),
]
V1_IN_PROJ = "attention.self.in_proj.weight"

# Head names at the top level of the checkpoint: (Hugging Face, ours) per head kind.
HEAD_KEYS: dict[str, list[tuple[str, str]]] = {
    "masked_lm": [
        ("lm_predictions.lm_head.dense.weight", "lm_head.dense.weight"),
        ("lm_predictions.lm_head.dense.bias", "lm_head.dense.bias"),
        ("lm_predictions.lm_head.LayerNorm.weight", "lm_head.norm.weight"),
        ("lm_predictions.lm_head.LayerNorm.bias", "lm_head.norm.bias"),
        ("lm_predictions.lm_head.bias", "lm_head.bias"),
    ],
    "replaced_token_detection": [
        ("mask_predictions.dense.weight", "rtd_head.dense.weight"),
        ("mask_predictions.dense.bias", "rtd_head.dense.bias"),
        ("mask_predictions.LayerNorm.weight", "rtd_head.norm.weight"),
        ("mask_predictions.LayerNorm.bias", "rtd_head.norm.bias"),
        ("mask_predictions.classifier.weight", "rtd_head.classifier.weight"),
        ("mask_predictions.classifier.bias", "rtd_head.classifier.bias"),
    ],
    "sequence_classification": [
        ("pooler.dense.weight", "classification_head.pooler.dense.weight"),
        ("pooler.dense.bias", "classification_head.pooler.dense.bias"),
        ("classifier.weight", "classification_head.classifier.weight"),
        ("classifier.bias", "classification_head.classifier.bias"),
    ],
    "token_classification": [
        ("classifier.weight", "token_head.classifier.weight"),
        ("classifier.bias", "token_head.classifier.bias"),
    ],
    "question_answering": [
        ("qa_outputs.weight", "qa_head.qa_outputs.weight"),
        ("qa_outputs.bias", "qa_head.qa_outputs.bias"),
    ],
    "base": [],
}
HEAD_KEYS["multiple_choice"] = HEAD_KEYS["sequence_classification"]
# Hugging Face's default ("legacy") MLM head: the same math with other names; its decoder weight is tied to
# the word embeddings and its decoder bias to cls.predictions.bias.
LEGACY_MLM_KEYS = [
    ("cls.predictions.transform.dense.weight", "lm_head.dense.weight"),
    ("cls.predictions.transform.dense.bias", "lm_head.dense.bias"),
    ("cls.predictions.transform.LayerNorm.weight", "lm_head.norm.weight"),
    ("cls.predictions.transform.LayerNorm.bias", "lm_head.norm.bias"),
    ("cls.predictions.bias", "lm_head.bias"),
]
LEGACY_TIED = ("cls.predictions.decoder.weight", "cls.predictions.decoder.bias")
ABS_POSITIONS = "embeddings.position_embeddings.weight"
BACKBONE_PREFIXES = ("deberta.", "bert.")  # task checkpoints / the official repository's wrappers

# Top-level names that belong to some head; a checkpoint carrying another head's weights (a v3 discriminator
# loaded for classification, say) is normal: they are left out with a note, not an error.
KNOWN_HEAD_PREFIXES = (
    "lm_predictions.",
    "mask_predictions.",
    "cls.",
    "pooler.",
    "classifier.",
    "qa_outputs.",
)


def _layer_pairs(cfg: DebertaConfig) -> list[tuple[str, str]]:
    v1 = cfg.attention_layout == "v1"
    pairs = []
    for hf, ours in LAYER_KEYS:
        if v1 and hf.startswith("attention.self."):
            continue  # v1 projections have their own names (and the fused in_proj)
        for w in ("weight", "bias"):
            pairs.append((_LAYER + hf.format(w=w), _OUR_LAYER + ours.format(w=w)))
    if v1:
        pairs += [(_LAYER + hf, _OUR_LAYER + ours) for hf, ours in V1_LAYER_KEYS]
    return pairs


def _template_regex(template: str) -> re.Pattern:
    return re.compile("^" + re.escape(template).replace(r"\{\}", r"(\d+)") + "$")


def _build_map(pairs: list[tuple[str, str]], reverse: bool) -> list[tuple[re.Pattern, str]]:
    return [(_template_regex(b if reverse else a), a if reverse else b) for a, b in pairs]


def hf_to_ours(
    state: dict[str, Tensor], cfg: DebertaConfig, head: str
) -> tuple[dict[str, Tensor], list[str], list[str]]:
    """Rename a Hugging Face / official state dict to ours.

    Returns:
        (our state dict, unknown keys, keys of other heads left out)
    """
    backbone_map = _build_map(BACKBONE_KEYS + _layer_pairs(cfg), reverse=False)
    head_pairs = HEAD_KEYS[head] + (LEGACY_MLM_KEYS if head == "masked_lm" else [])
    head_map = dict(head_pairs)
    out: dict[str, Tensor] = {}
    unknown, other_heads = [], []
    for key, value in state.items():
        bare = _strip_prefix(key)
        if key in head_map:
            out[head_map[key]] = value
        elif bare == ABS_POSITIONS:
            # absolute positions: at the input (position_biased_input) or, for the MLM, the EMD's table
            if cfg.position_biased_input:
                out["deberta.embeddings.position.weight"] = value
            elif head == "masked_lm":
                out["emd.position_embeddings.weight"] = value
            else:
                other_heads.append(key)
        elif bare.endswith(V1_IN_PROJ) and cfg.attention_layout == "v1":
            layer = bare.split(".")[2]
            q, k, v = split_v1_in_proj(value, cfg.num_heads)
            for name, t in (("query", q), ("key", k), ("value", v)):
                out[f"deberta.encoder.layers.{layer}.attention.{name}.weight"] = t
        elif key in LEGACY_TIED and head == "masked_lm":
            continue  # tied to the word embeddings / lm_head.bias
        else:
            ours = _match(bare, backbone_map)
            if ours is not None:
                out["deberta." + ours] = value
            elif key.startswith(KNOWN_HEAD_PREFIXES):
                other_heads.append(key)
            else:
                unknown.append(key)
    return out, unknown, other_heads


def ours_to_hf(state: dict[str, Tensor], cfg: DebertaConfig, head: str) -> dict[str, Tensor]:
    """Our state dict -> Hugging Face names (task checkpoints carry the ``deberta.`` prefix; the base model
    does not, as transformers writes them)."""
    prefix = "" if head in ("base",) else "deberta."
    backbone_map = _build_map(BACKBONE_KEYS + _layer_pairs(cfg), reverse=True)
    head_map = {ours: hf for hf, ours in HEAD_KEYS[head]}
    out: dict[str, Tensor] = {}
    pending_v1: dict[str, dict[str, Tensor]] = {}
    for key, value in state.items():
        if key in head_map:
            out[head_map[key]] = value
        elif key == "emd.position_embeddings.weight":
            out["deberta." + ABS_POSITIONS] = value
        elif key == "deberta.embeddings.position.weight":
            out[prefix + ABS_POSITIONS] = value
        elif cfg.attention_layout == "v1" and re.match(
            r"^deberta\.encoder\.layers\.\d+\.attention\.(query|key|value)\.weight$", key
        ):
            layer, name = key.split(".")[3], key.split(".")[5]
            pending_v1.setdefault(layer, {})[name] = value
        else:
            hf = _match(key.removeprefix("deberta."), backbone_map)
            if hf is None:
                raise ValueError(f"no Hugging Face name for parameter {key!r} (head {head!r})")
            out[prefix + hf] = value
    for layer, qkv in pending_v1.items():
        out[f"{prefix}encoder.layer.{layer}.{V1_IN_PROJ}"] = merge_v1_in_proj(
            qkv["query"], qkv["key"], qkv["value"], cfg.num_heads
        )
    return out


def _strip_prefix(key: str) -> str:
    for p in BACKBONE_PREFIXES:
        if key.startswith(p):
            return key[len(p) :]
    return key


def _match(key: str, table: list[tuple[re.Pattern, str]]) -> str | None:
    for pattern, target in table:
        m = pattern.match(key)
        if m:
            return target.replace("{}", m.group(1)) if m.groups() else target
    return None


def split_v1_in_proj(w: Tensor, n_heads: int) -> tuple[Tensor, Tensor, Tensor]:
    """v1's fused (3·H·D, hidden) projection interleaves q, k, v per head: rows [q_h0, k_h0, v_h0, q_h1, ...]."""
    three_hd, hidden = w.shape
    d = three_hd // (3 * n_heads)
    w = w.view(n_heads, 3, d, hidden)
    return tuple(w[:, i].reshape(n_heads * d, hidden).clone() for i in range(3))


def merge_v1_in_proj(q: Tensor, k: Tensor, v: Tensor, n_heads: int) -> Tensor:
    hd, hidden = q.shape
    d = hd // n_heads
    return torch.stack([t.view(n_heads, d, hidden) for t in (q, k, v)], dim=1).reshape(3 * hd, hidden)
