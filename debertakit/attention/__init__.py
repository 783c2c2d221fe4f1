"""Disentangled attention: the relative-position spec, masks/geometry, and the backends behind one signature."""

from debertakit.attention.eager import PositionTerms, eager_attention, score_components
from debertakit.attention.geometry import Geometry, packed_geometry
from debertakit.attention.registry import Backend, Request, available_backends, get_backend, register
from debertakit.attention.relative import RelativeIndex, log_bucket, scale_for

# importing a backend registers it
from debertakit.attention import chunked, flex  # noqa: E402, F401  isort: skip

try:  # the `triton` backend registers itself when Triton imports; without it the other backends still work
    import triton  # noqa: F401
except Exception:  # ImportError, or a broken install
    pass
else:
    from debertakit.attention import triton_backend  # noqa: F401

__all__ = [
    "Backend",
    "Geometry",
    "PositionTerms",
    "RelativeIndex",
    "Request",
    "available_backends",
    "eager_attention",
    "get_backend",
    "log_bucket",
    "packed_geometry",
    "register",
    "scale_for",
    "score_components",
]
