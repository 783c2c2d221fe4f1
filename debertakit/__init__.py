"""debertakit: the DeBERTa family (v1, v2, v3, mDeBERTa) in PyTorch.

import debertakit
model = debertakit.load_pretrained("path/to/deberta-v3-base")          # Hugging Face-format directory
model = debertakit.build_model(debertakit.DebertaConfig.preset("deberta-v3-base"), head="masked_lm")
debertakit.save_pretrained(model, "out/")                              # transformers loads it too
"""

from debertakit.config import DebertaConfig
from debertakit.convert import load_pretrained, save_pretrained
from debertakit.model import build_model

__version__ = "0.1.0"
__all__ = ["DebertaConfig", "build_model", "load_pretrained", "load_tokenizer", "save_pretrained"]

# Names resolved on first use.
_LAZY = {"load_tokenizer": "debertakit.tokenization.loading"}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'debertakit' has no attribute {name!r}")
