"""debertakit: the DeBERTa family (v1, v2, v3, mDeBERTa) in PyTorch."""

__version__ = "0.1.0"

# Names resolved on first use, so that `import debertakit` stays light.
_LAZY = {"load_tokenizer": "debertakit.tokenization.loading"}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'debertakit' has no attribute {name!r}")
