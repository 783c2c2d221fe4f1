"""debertakit: the DeBERTa family (v1, v2, v3, mDeBERTa) in PyTorch.

import debertakit
model = debertakit.load_pretrained("path/to/deberta-v3-base")          # Hugging Face-format directory
model = debertakit.build_model(debertakit.DebertaConfig.preset("deberta-v3-base"), head="masked_lm")
debertakit.save_pretrained(model, "out/")                              # transformers loads it too
clf = debertakit.pipeline("classify", model="runs/sst2/best")              # a fine-tuned model directory
"""

from debertakit.config import DebertaConfig
from debertakit.convert import load_pretrained, save_pretrained
from debertakit.model import build_model

__version__ = "0.1.0"
__all__ = [
    "DebertaConfig",
    "FinetuneConfig",
    "build_model",
    "finetune",
    "load_pretrained",
    "load_tokenizer",
    "pipeline",
    "save_pretrained",
]

# Names resolved on first use, so that `import debertakit` stays light.
_LAZY = {
    "load_tokenizer": "debertakit.tokenization.loading",
    "pipeline": "debertakit.predict",
    "finetune": "debertakit.train.finetune",
    "FinetuneConfig": "debertakit.train.finetune",
}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'debertakit' has no attribute {name!r}")
