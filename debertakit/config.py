"""`DebertaConfig`: one typed configuration for every DeBERTa variant, validated when it is built.

The released sizes are presets (data, see `PRESETS`). Hugging Face `config.json` translation lives in
`debertakit.convert.hf_config`, not here: the model reads only these typed fields.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

PositionTerm = Literal["c2p", "p2c", "p2p"]
Activation = Literal["gelu", "relu", "tanh", "gelu_new", "gelu_fast", "gelu_pytorch_tanh", "silu", "sigmoid"]
_TERM_ORDER = ("c2p", "p2c", "p2p")


@dataclass
class DebertaConfig:
    """Every field the model reads. Defaults are deberta-v3-base.

    Attention layouts (REFERENCE.md §2):
      * ``"v1"``: the released v1 checkpoints: the key projection has no bias, c2p uses a position-key
        projection without bias, p2c a position-query projection with bias, plain clamped relative positions.
      * ``"v2"``: v2 / v3 / mDeBERTa: separate q/k/v projections with biases; with ``share_att_key`` the
        relative table is projected by the content query/key projections.
    """

    # sizes
    vocab_size: int = 128100
    hidden_size: int = 768
    num_layers: int = 12
    num_heads: int = 12
    intermediate_size: int = 3072
    embedding_size: int | None = None  # None: same as hidden_size (no embed_proj)
    max_position_embeddings: int = 512
    type_vocab_size: int = 0
    pad_token_id: int = 0

    # regularisation and numerics
    hidden_act: Activation = "gelu"
    hidden_dropout: float = 0.1
    attention_dropout: float = 0.1
    layer_norm_eps: float = 1e-7
    initializer_range: float = 0.02

    # positions
    attention_layout: Literal["v1", "v2"] = "v2"
    position_biased_input: bool = False  # add absolute positions at the input (RoBERTa style)
    relative_attention: bool = True
    position_terms: tuple[PositionTerm, ...] = ("c2p", "p2c")
    max_relative_positions: int = 512  # k: relative distances are clamped (or bucketed) to [-k, k)
    position_buckets: int = 256  # 0: no log buckets
    share_att_key: bool = True
    norm_rel_ebd: Literal["none", "layer_norm"] = "layer_norm"

    # v2 convolution branch beside layer 0 (0: none)
    conv_kernel_size: int = 0
    conv_groups: int = 1
    conv_act: Activation = "gelu"

    # heads
    pooler_hidden_size: int | None = None  # None: hidden_size
    pooler_dropout: float = 0.0
    pooler_hidden_act: Activation = "gelu"
    cls_dropout: float | None = None  # None: hidden_dropout
    num_labels: int = 2
    label_names: tuple[str, ...] | None = None
    use_emd: bool = True  # Enhanced Mask Decoder for MLM; only active when position_biased_input is False

    # execution
    causal: bool = False
    attention_backend: str = "auto"
    gradient_checkpointing: bool = False

    extra: dict[str, Any] = field(default_factory=dict)  # unknown config.json fields, kept for round trips

    def __post_init__(self) -> None:
        terms = tuple(self.position_terms)
        # the order of the terms carries no meaning: keep one canonical order so equal configs compare equal
        if len(set(terms)) == len(terms) and set(terms) <= set(_TERM_ORDER):
            terms = tuple(t for t in _TERM_ORDER if t in terms)
        self.position_terms = terms
        if isinstance(self.label_names, list):
            self.label_names = tuple(self.label_names)
        self._validate()

    # ------------------------------------------------------------------ validation
    def _validate(self) -> None:
        def fail(msg: str) -> None:
            raise ValueError(f"DebertaConfig: {msg}")

        for name in ("vocab_size", "hidden_size", "num_layers", "num_heads", "intermediate_size"):
            if getattr(self, name) < 1:
                fail(f"{name}={getattr(self, name)} must be >= 1")
        if self.hidden_size % self.num_heads != 0:
            fail(
                f"hidden_size={self.hidden_size} is not a multiple of num_heads={self.num_heads} "
                f"(num_heads x head size must equal hidden_size)"
            )
        if self.embedding_size is not None and self.embedding_size < 1:
            fail(f"embedding_size={self.embedding_size} must be >= 1 or None")
        if not 0 <= self.pad_token_id < self.vocab_size:
            fail(f"pad_token_id={self.pad_token_id} must be in [0, vocab_size={self.vocab_size})")
        for name in ("hidden_dropout", "attention_dropout", "pooler_dropout"):
            if not 0.0 <= getattr(self, name) < 1.0:
                fail(f"{name}={getattr(self, name)} must be in [0, 1)")
        if self.cls_dropout is not None and not 0.0 <= self.cls_dropout < 1.0:
            fail(f"cls_dropout={self.cls_dropout} must be in [0, 1) or None")
        if self.attention_layout not in ("v1", "v2"):
            fail(f"attention_layout={self.attention_layout!r}; expected 'v1' or 'v2'")
        unknown = [t for t in self.position_terms if t not in _TERM_ORDER]
        if unknown:
            fail(
                f"unknown attention term(s) {unknown} in position_terms; expected a subset of {list(_TERM_ORDER)}"
            )
        if len(set(self.position_terms)) != len(self.position_terms):
            fail(f"position_terms={self.position_terms} repeats a term")
        if self.relative_attention:
            if self.max_relative_positions < 1:
                fail(f"max_relative_positions={self.max_relative_positions} must be >= 1")
            if self.position_buckets < 0:
                fail(f"position_buckets={self.position_buckets} must be >= 0 (0 = no buckets)")
            if self.position_buckets > 0 and self.position_buckets > self.max_relative_positions:
                fail(
                    f"position_buckets={self.position_buckets} > max_relative_positions="
                    f"{self.max_relative_positions}: buckets cannot exceed the maximum distance"
                )
            if self.position_buckets > 0 and self.position_buckets < 2:
                fail(f"position_buckets={self.position_buckets} must be 0 or >= 2")
        if self.attention_layout == "v1":
            if self.share_att_key:
                fail("share_att_key=True is a v2/v3 feature; the v1 layout has separate position projections")
            if self.position_buckets:
                fail(f"position_buckets={self.position_buckets}: the v1 layout has no log buckets (use 0)")
            if self.norm_rel_ebd != "none":
                fail(
                    f"norm_rel_ebd={self.norm_rel_ebd!r}: the v1 layout has no LayerNorm on the relative table"
                )
            if self.conv_kernel_size:
                fail(f"conv_kernel_size={self.conv_kernel_size}: the v1 layout has no conv branch (use 0)")
        if self.conv_kernel_size < 0 or (self.conv_kernel_size and self.conv_kernel_size % 2 == 0):
            fail(f"conv_kernel_size={self.conv_kernel_size} must be 0 (none) or a positive odd number")
        if self.conv_kernel_size and self.hidden_size % self.conv_groups != 0:
            fail(f"hidden_size={self.hidden_size} is not divisible by conv_groups={self.conv_groups}")
        if self.max_position_embeddings < 1:
            fail(f"max_position_embeddings={self.max_position_embeddings} must be >= 1")
        if self.type_vocab_size < 0:
            fail(f"type_vocab_size={self.type_vocab_size} must be >= 0")
        if self.num_labels < 1:
            fail(f"num_labels={self.num_labels} must be >= 1")
        if self.label_names is not None and len(self.label_names) != self.num_labels:
            fail(f"label_names has {len(self.label_names)} names but num_labels={self.num_labels}")
        if not isinstance(self.attention_backend, str) or not self.attention_backend:
            fail(f"attention_backend={self.attention_backend!r} must be a backend name or 'auto'")

    # ------------------------------------------------------------------ derived values
    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def embedding_dim(self) -> int:
        return self.embedding_size or self.hidden_size

    @property
    def pooler_dim(self) -> int:
        return self.pooler_hidden_size or self.hidden_size

    @property
    def c2p(self) -> bool:
        return self.relative_attention and "c2p" in self.position_terms

    @property
    def p2c(self) -> bool:
        return self.relative_attention and "p2c" in self.position_terms

    @property
    def p2p(self) -> bool:
        return self.relative_attention and "p2p" in self.position_terms

    @property
    def rel_span(self) -> int:
        """Half the number of rows of the relative table (REFERENCE.md §2: 256 with buckets, else k)."""
        return self.position_buckets if self.position_buckets > 0 else self.max_relative_positions

    @property
    def score_scale_factor(self) -> int:
        """sf = 1 + number of position terms; scores are divided by sqrt(head_dim * sf) (REFERENCE.md §1)."""
        n_terms = sum((self.c2p, self.p2c, self.p2p))
        return 1 + n_terms

    @property
    def emd_enabled(self) -> bool:
        return self.use_emd and not self.position_biased_input

    # ------------------------------------------------------------------ (de)serialisation
    def replace(self, **changes: Any) -> DebertaConfig:
        """A copy with some fields changed (validated again)."""
        bad = [k for k in changes if k not in {f.name for f in dataclasses.fields(self)}]
        if bad:
            raise ValueError(f"DebertaConfig has no field(s) {bad}; fields are {sorted(self.to_dict())}")
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["position_terms"] = list(self.position_terms)
        if self.label_names is not None:
            d["label_names"] = list(self.label_names)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> DebertaConfig:
        names = {f.name for f in dataclasses.fields(cls)}
        bad = sorted(set(d) - names)
        if bad:
            raise ValueError(f"DebertaConfig has no field(s) {bad}")
        d = dict(d)
        if "position_terms" in d:
            d["position_terms"] = tuple(d["position_terms"])
        return cls(**d)

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=2) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> DebertaConfig:
        return cls.from_dict(json.loads(Path(path).read_text()))

    @classmethod
    def preset(cls, name: str, **overrides: Any) -> DebertaConfig:
        """A released size (REFERENCE.md §3) or a tiny test size, e.g. ``preset("deberta-v3-base")``."""
        key = name.split("/")[-1]
        if key not in PRESETS:
            raise ValueError(f"unknown preset {name!r}; known presets: {sorted(PRESETS)}")
        return cls(**{**PRESETS[key], **overrides})


# ---------------------------------------------------------------------------------------------------- presets
# Published configurations (REFERENCE.md §3). All released models: relative attention, no absolute positions
# at the input, no token types, LayerNorm eps 1e-7, gelu, dropout 0.1, 512 absolute positions.
_V1 = dict(
    vocab_size=50265,
    attention_layout="v1",
    position_buckets=0,
    share_att_key=False,
    norm_rel_ebd="none",
    max_relative_positions=512,
)
_V2 = dict(
    vocab_size=128100,
    attention_layout="v2",
    position_buckets=256,
    share_att_key=True,
    norm_rel_ebd="layer_norm",
)
_V2_CONV = dict(_V2, conv_kernel_size=3, conv_act="gelu")


def _size(hidden: int, layers: int, heads: int, ffn: int) -> dict[str, int]:
    return dict(hidden_size=hidden, num_layers=layers, num_heads=heads, intermediate_size=ffn)


PRESETS: dict[str, dict[str, Any]] = {
    "deberta-base": {**_V1, **_size(768, 12, 12, 3072)},
    "deberta-large": {**_V1, **_size(1024, 24, 16, 4096)},
    "deberta-xlarge": {**_V1, **_size(1024, 48, 16, 4096)},
    "deberta-v2-xlarge": {**_V2_CONV, **_size(1536, 24, 24, 6144)},
    "deberta-v2-xxlarge": {**_V2_CONV, **_size(1536, 48, 24, 6144)},
    "deberta-v3-xsmall": {**_V2, **_size(384, 12, 6, 1536)},
    "deberta-v3-small": {**_V2, **_size(768, 6, 12, 3072)},
    "deberta-v3-base": {**_V2, **_size(768, 12, 12, 3072)},
    "deberta-v3-large": {**_V2, **_size(1024, 24, 16, 4096)},
    "mdeberta-v3-base": {**_V2, **_size(768, 12, 12, 3072), "vocab_size": 251000},
    # tiny sizes for tests and CPU experiments
    "tiny-v1": {**_V1, **_size(32, 2, 4, 64), "vocab_size": 128, "max_relative_positions": 16},
    "tiny-v2": {
        **_V2_CONV,
        **_size(32, 2, 4, 64),
        "vocab_size": 128,
        "position_buckets": 8,
        "max_relative_positions": 32,
    },
    "tiny-v3": {
        **_V2,
        **_size(32, 2, 4, 64),
        "vocab_size": 128,
        "position_buckets": 8,
        "max_relative_positions": 32,
    },
    "small-v3": {
        **_V2,
        **_size(256, 4, 4, 1024),
        "vocab_size": 8000,
        "position_buckets": 64,
        "max_relative_positions": 128,
    },
}
