"""The paper's ablations (DeBERTa Table 4) as configuration switches.

Every variant is the base configuration with a few fields changed, trained by the same pretraining command on
the same data with the same budget; nothing else differs. `VARIANTS` is the registry; `variant_config` applies
one to a base `DebertaConfig`.

* ``full``: the base model (c2p + p2c relative attention, EMD).
* ``no-emd``: MLM decoded from the last layer, without the Enhanced Mask Decoder (``use_emd=False``).
* ``no-c2p`` / ``no-p2c``: one relative term removed (``position_terms``).
* ``no-emd-c2p`` / ``no-emd-p2c``: both.
* ``roberta``: the RoBERTa-style baseline of the same size: absolute positions added at the input
  (``position_biased_input=True``), no relative terms (``relative_attention=False``), hence no EMD.
* ``rtd``: the full network trained with DeBERTaV3's replaced-token detection instead of MLM (the
  ``objective`` is a training choice; compare it with ``full`` at equal compute).

Removing a term also changes the score scale: scores are divided by sqrt(d · (1 + number of position terms))
(REFERENCE.md §1), as the released code does for any ``pos_att_type``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from debertakit.config import DebertaConfig

Objective = Literal["mlm", "rtd", "causal", "mt"]


@dataclass(frozen=True)
class Variant:
    """One ablation: a name, what it removes, the config fields it sets and its training objective."""

    name: str
    description: str
    changes: dict[str, Any] = field(default_factory=dict)
    objective: Objective = "mlm"

    def config(self, base: DebertaConfig) -> DebertaConfig:
        """The base configuration with this variant's changes (validated again)."""
        changes = dict(self.changes)
        if "position_terms" in changes:
            # remove terms from the base's own list, so that a base with p2p keeps it
            drop = set(changes.pop("position_terms"))
            changes["position_terms"] = tuple(t for t in base.position_terms if t not in drop)
        return base.replace(**changes)


VARIANTS: dict[str, Variant] = {
    v.name: v
    for v in (
        Variant("full", "DeBERTa: c2p + p2c relative attention, Enhanced Mask Decoder"),
        Variant("no-emd", "- EMD (MLM decoded from the last layer)", {"use_emd": False}),
        Variant("no-c2p", "- c2p (content-to-position term removed)", {"position_terms": ("c2p",)}),
        Variant("no-p2c", "- p2c (position-to-content term removed)", {"position_terms": ("p2c",)}),
        Variant(
            "no-emd-c2p",
            "- (EMD + c2p)",
            {"use_emd": False, "position_terms": ("c2p",)},
        ),
        Variant(
            "no-emd-p2c",
            "- (EMD + p2c)",
            {"use_emd": False, "position_terms": ("p2c",)},
        ),
        Variant(
            "roberta",
            "RoBERTa-style: absolute positions at the input, no relative terms, no EMD",
            {"position_biased_input": True, "relative_attention": False, "use_emd": False},
        ),
        Variant("rtd", "full network, replaced-token detection (DeBERTaV3) instead of MLM", objective="rtd"),
    )
}

# The paper's Table 4 rows, in its order.
TABLE4 = ("full", "no-emd", "no-c2p", "no-p2c", "no-emd-c2p", "no-emd-p2c", "roberta")


def get_variant(name: str) -> Variant:
    if name not in VARIANTS:
        raise ValueError(f"unknown ablation variant {name!r}; known variants: {list(VARIANTS)}")
    return VARIANTS[name]


def variant_config(base: DebertaConfig, name: str) -> DebertaConfig:
    """``base`` with the named ablation applied, e.g. ``variant_config(cfg, "no-c2p")``."""
    return get_variant(name).config(base)
