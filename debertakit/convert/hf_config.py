"""Hugging Face ``config.json`` <-> `DebertaConfig`.

Hugging Face reads several DeBERTa fields with getattr defaults that are not in its config classes
(REFERENCE.md §3): ``position_buckets`` (-1), ``share_att_key`` (False), ``norm_rel_ebd`` ("none"),
``conv_kernel_size`` (0), ``conv_act`` ("tanh"), ``conv_groups`` (1), ``embedding_size`` (hidden_size). A missing
field must mean what it means there, so those defaults are written out here once.
"""

from __future__ import annotations

from typing import Any

from debertakit.config import DebertaConfig

# Defaults of transformers' DebertaConfig / DebertaV2Config class fields (identical for both families except
# the sizes, which every config.json carries).
_HF_CLASS_DEFAULTS = {
    "hidden_act": "gelu",
    "hidden_dropout_prob": 0.1,
    "attention_probs_dropout_prob": 0.1,
    "max_position_embeddings": 512,
    "type_vocab_size": 0,
    "initializer_range": 0.02,
    "layer_norm_eps": 1e-7,
    "relative_attention": False,
    "max_relative_positions": -1,
    "pad_token_id": 0,
    "position_biased_input": True,
    "pos_att_type": None,
    "pooler_dropout": 0.0,
    "pooler_hidden_act": "gelu",
}
# Fields the modelling code reads with getattr(config, name, default).
_HF_GETATTR_DEFAULTS = {
    "position_buckets": -1,
    "share_att_key": False,
    "norm_rel_ebd": "none",
    "conv_kernel_size": 0,
    "conv_act": "tanh",
    "conv_groups": 1,
    "embedding_size": None,
    "cls_dropout": None,
    "talking_head": False,
}
# Fields we translate; everything else in config.json is kept in `DebertaConfig.extra` for round trips.
_CONSUMED = (
    set(_HF_CLASS_DEFAULTS)
    | set(_HF_GETATTR_DEFAULTS)
    | {
        "model_type",
        "vocab_size",
        "hidden_size",
        "num_hidden_layers",
        "num_attention_heads",
        "intermediate_size",
        "pooler_hidden_size",
        "num_labels",
        "id2label",
        "label2id",
        "architectures",
        "legacy",
        "attention_head_size",
    }
)
_OURS_PREFIX = "debertakit_"  # our own fields in config.json (Hugging Face ignores them)

HF_ARCHITECTURES = {
    "base": "Model",
    "masked_lm": "ForMaskedLM",
    "replaced_token_detection": "Model",  # no such class in transformers; AutoModel loads the backbone
    "sequence_classification": "ForSequenceClassification",
    "token_classification": "ForTokenClassification",
    "question_answering": "ForQuestionAnswering",
    "multiple_choice": "ForMultipleChoice",
}


def head_from_architectures(d: dict[str, Any]) -> str | None:
    """The head named by our own field or by ``architectures`` (None when neither says)."""
    if d.get(_OURS_PREFIX + "head"):
        return d[_OURS_PREFIX + "head"]
    for arch in d.get("architectures") or []:
        for head, suffix in HF_ARCHITECTURES.items():
            if head != "replaced_token_detection" and arch.endswith(suffix) and "Deberta" in arch:
                return head
    return None


def from_hf_config(d: dict[str, Any]) -> DebertaConfig:
    """A Hugging Face DeBERTa / DeBERTa-v2 ``config.json`` dict -> `DebertaConfig`."""
    model_type = d.get("model_type")
    if model_type not in ("deberta", "deberta-v2"):
        raise ValueError(f"config.json has model_type={model_type!r}; expected 'deberta' or 'deberta-v2'")
    g = {**_HF_CLASS_DEFAULTS, **_HF_GETATTR_DEFAULTS, **d}
    if g["talking_head"]:
        raise ValueError("talking_head=True is not supported (no released DeBERTa checkpoint uses it)")
    hidden, heads = d["hidden_size"], d["num_attention_heads"]
    if g.get("attention_head_size") not in (None, hidden // heads):
        raise ValueError(
            f"attention_head_size={g['attention_head_size']} != hidden_size / num_attention_heads"
        )
    v1 = model_type == "deberta"
    conv = 0 if v1 else g["conv_kernel_size"]
    terms = g["pos_att_type"] or []
    if isinstance(terms, str):
        terms = [t.strip() for t in terms.lower().split("|") if t.strip()]
    max_rel = g["max_relative_positions"]
    if max_rel < 1:
        max_rel = g["max_position_embeddings"]
    norm = [t.strip() for t in str(g["norm_rel_ebd"]).lower().split("|")]
    id2label = d.get("id2label")
    num_labels = d.get("num_labels") or (len(id2label) if id2label else 2)
    label_names = None
    if id2label and len(id2label) == num_labels:
        label_names = tuple(id2label[k] for k in sorted(id2label, key=lambda k: int(k)))
        if all(n == f"LABEL_{i}" for i, n in enumerate(label_names)):
            label_names = None
    return DebertaConfig(
        vocab_size=d["vocab_size"],
        hidden_size=hidden,
        num_layers=d["num_hidden_layers"],
        num_heads=heads,
        intermediate_size=d["intermediate_size"],
        embedding_size=g["embedding_size"] if g["embedding_size"] not in (None, hidden) else None,
        max_position_embeddings=g["max_position_embeddings"],
        type_vocab_size=g["type_vocab_size"],
        pad_token_id=g["pad_token_id"] if g["pad_token_id"] is not None else 0,
        hidden_act=g["hidden_act"],
        hidden_dropout=g["hidden_dropout_prob"],
        attention_dropout=g["attention_probs_dropout_prob"],
        layer_norm_eps=g["layer_norm_eps"],
        initializer_range=g["initializer_range"],
        attention_layout="v1" if v1 else "v2",
        position_biased_input=g["position_biased_input"],
        relative_attention=g["relative_attention"],
        position_terms=tuple(terms),
        max_relative_positions=max_rel,
        position_buckets=0 if v1 else max(g["position_buckets"], 0),
        share_att_key=False if v1 else bool(g["share_att_key"]),
        norm_rel_ebd="none" if v1 or "layer_norm" not in norm else "layer_norm",
        conv_kernel_size=conv,
        # without a conv branch its settings mean nothing: keep our defaults so equal models compare equal
        conv_groups=g["conv_groups"] if conv else 1,
        conv_act=g["conv_act"] if conv else "gelu",
        pooler_hidden_size=d.get("pooler_hidden_size")
        if d.get("pooler_hidden_size") not in (None, hidden)
        else None,
        pooler_dropout=g["pooler_dropout"],
        pooler_hidden_act=g["pooler_hidden_act"],
        cls_dropout=g["cls_dropout"],
        num_labels=num_labels,
        label_names=label_names,
        use_emd=d.get(_OURS_PREFIX + "use_emd", True),
        causal=d.get(_OURS_PREFIX + "causal", False),
        extra={k: v for k, v in d.items() if k not in _CONSUMED and not k.startswith(_OURS_PREFIX)},
    )


def to_hf_config(cfg: DebertaConfig, head: str = "base") -> dict[str, Any]:
    """`DebertaConfig` -> a ``config.json`` dict that transformers' AutoConfig / AutoModel read."""
    v1 = cfg.attention_layout == "v1"
    if cfg.p2p:
        # transformers ignores "p2p" in pos_att_type, so a model using it would load there silently wrong
        raise ValueError(
            "a model with the p2p term cannot be written in Hugging Face form (transformers has no p2p)"
        )
    family = "Deberta" if v1 else "DebertaV2"
    d: dict[str, Any] = dict(cfg.extra)
    d.update(
        model_type="deberta" if v1 else "deberta-v2",
        architectures=[family + HF_ARCHITECTURES[head]],
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.hidden_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        intermediate_size=cfg.intermediate_size,
        hidden_act=cfg.hidden_act,
        hidden_dropout_prob=cfg.hidden_dropout,
        attention_probs_dropout_prob=cfg.attention_dropout,
        max_position_embeddings=cfg.max_position_embeddings,
        type_vocab_size=cfg.type_vocab_size,
        initializer_range=cfg.initializer_range,
        layer_norm_eps=cfg.layer_norm_eps,
        relative_attention=cfg.relative_attention,
        max_relative_positions=cfg.max_relative_positions,
        pad_token_id=cfg.pad_token_id,
        position_biased_input=cfg.position_biased_input,
        pos_att_type=[t for t in ("p2c", "c2p") if t in cfg.position_terms],
        pooler_hidden_size=cfg.pooler_dim,
        pooler_dropout=cfg.pooler_dropout,
        pooler_hidden_act=cfg.pooler_hidden_act,
        legacy=False,  # the released MLM head layout (lm_predictions.lm_head), REFERENCE.md §2
    )
    if cfg.embedding_size is not None:
        d["embedding_size"] = cfg.embedding_size
    if cfg.cls_dropout is not None:
        d["cls_dropout"] = cfg.cls_dropout
    if not v1:
        d.update(
            position_buckets=cfg.position_buckets if cfg.position_buckets > 0 else -1,
            share_att_key=cfg.share_att_key,
            norm_rel_ebd=cfg.norm_rel_ebd,
            conv_kernel_size=cfg.conv_kernel_size,
            conv_groups=cfg.conv_groups,
            conv_act=cfg.conv_act,
        )
    if head in ("sequence_classification", "token_classification"):
        names = cfg.label_names or tuple(f"LABEL_{i}" for i in range(cfg.num_labels))
        d["id2label"] = {str(i): n for i, n in enumerate(names)}
        d["label2id"] = {n: i for i, n in enumerate(names)}
    d[_OURS_PREFIX + "head"] = head
    d[_OURS_PREFIX + "use_emd"] = cfg.use_emd
    if cfg.causal:
        d[_OURS_PREFIX + "causal"] = True
    return d
