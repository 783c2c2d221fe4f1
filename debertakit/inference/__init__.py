"""Inference helpers (fill-mask)."""

from debertakit.inference.fill_mask import fill_mask

__all__ = ["fill_mask"]
