"""debertakit: the DeBERTa family (v1, v2, v3, mDeBERTa) in PyTorch."""

__version__ = "0.1.0"
