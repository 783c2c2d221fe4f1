"""Inference helpers: fill-mask, and CUDA graphs for serving small batches (`CudaGraphModel`)."""

from debertakit.inference.fill_mask import fill_mask
from debertakit.inference.graphs import CudaGraphModel

__all__ = ["CudaGraphModel", "fill_mask"]
