"""Dropout with masks drawn from 16-bit random numbers: one 64-bit draw gives the masks of three elements.

On CPU, drawing the dropout mask dominates dropout itself: on the (4, 12, 512, 512) attention probabilities of
a training step ``F.dropout`` took 100.8 ms, of which the ``bernoulli_`` mask was 82.4 ms; this module's mask
took 33.0 ms (``python benchmarks/profile_cpu.py dropout``, 2 threads). An element is dropped when its 16-bit
number falls below ``round(p · 2**16)``: the probability is rounded to a multiple of 2**-16 (0.1 becomes
0.100006), and the kept elements are scaled by ``1 / (1 - rounded p)`` so the expectation is exact. The masks
come from the default generator of the device, so ``torch.manual_seed`` makes them reproducible and activation
checkpointing replays them.

On an accelerator `dropout` calls PyTorch's fused dropout instead, with the same rounded probability and scale:
there a mask costs no more than the rest, and the 16-bit rule in PyTorch operations is about seven kernels and
35 bytes of memory traffic per element (forward and backward; the op recorder of
``benchmarks/triton_host_cost.py``) against two kernels and about 10 bytes.
"""

from __future__ import annotations

import math
import sys

import torch
from torch import Tensor, nn

_LEVELS = 1 << 16


def drop_threshold(p: float) -> int:
    """An element is dropped when its 16-bit random number (0 … 2**16 - 1) is below this: ``round(p · 2**16)``."""
    _check_p(p)
    return round(p * _LEVELS)


def kept_scale(threshold: int) -> float:
    """Scale of the kept elements for a drop threshold: ``1 / (1 - rounded p)``, so the expectation is exact."""
    return 1.0 / (1.0 - threshold / _LEVELS)


def rounded_p(p: float) -> float:
    """The dropout probability actually applied: ``p`` rounded to a multiple of 2**-16."""
    return drop_threshold(p) / _LEVELS


def _check_p(p: float) -> None:
    if not 0.0 <= p < 1.0:
        raise ValueError(f"dropout probability must be in [0, 1), got {p}")
    if round(p * _LEVELS) == _LEVELS:  # would drop everything and scale the rest by 1 / 0
        raise ValueError(f"dropout probability {p} rounds to 1 at 16-bit resolution; expected p < 1 - 2**-17")


def keep_mask(
    shape: tuple[int, ...] | torch.Size,
    p: float,
    device: torch.device | str,
    generator: torch.Generator | None = None,
) -> tuple[Tensor, float]:
    """(bool mask of the kept elements, scale ``1 / (1 - rounded p)`` for them), drawn from ``generator`` (the
    device's default generator when None)."""
    drop_t = drop_threshold(p)
    threshold = drop_t - _LEVELS // 2  # int16 values are uniform over [-2**15, 2**15)
    n = math.prod(shape)
    # random_() on int64 draws from [0, 2**63): the low 48 bits are uniform, the top 16 are not
    words = torch.empty((n + 2) // 3, dtype=torch.int64, device=device).random_(generator=generator)
    parts = words.view(torch.int16).view(-1, 4)
    parts = parts[:, :3] if sys.byteorder == "little" else parts[:, 1:]
    keep = (parts >= threshold).view(-1)[:n].view(tuple(shape))
    return keep, kept_scale(drop_t)


class _MaskedScale(torch.autograd.Function):
    """x ⊙ keep · scale, saving only the 1-byte mask for the backward."""

    @staticmethod
    def forward(ctx, x: Tensor, keep: Tensor, scale: float) -> Tensor:
        ctx.save_for_backward(keep)
        ctx.scale = scale
        return x.masked_fill(~keep, 0).mul_(scale)

    @staticmethod
    def backward(ctx, grad: Tensor):
        (keep,) = ctx.saved_tensors
        return grad.masked_fill(~keep, 0).mul_(ctx.scale), None, None


def dropout(x: Tensor, p: float, training: bool = True) -> Tensor:
    """Functional form: ``x`` unchanged when not training or ``p == 0``. Masks from 16-bit draws on the CPU,
    PyTorch's fused dropout at the same rounded probability elsewhere (see the module docstring)."""
    if not training or p == 0.0:
        return x
    if x.device.type != "cpu":
        return torch.nn.functional.dropout(x, rounded_p(p), training=True)
    keep, scale = keep_mask(x.shape, p, x.device)
    return _MaskedScale.apply(x, keep, scale)


class Dropout(nn.Module):
    """`nn.Dropout` with 16-bit masks (see the module docstring)."""

    def __init__(self, p: float = 0.1):
        super().__init__()
        _check_p(p)
        self.p = p

    def forward(self, x: Tensor) -> Tensor:
        return dropout(x, self.p, self.training)

    def extra_repr(self) -> str:
        return f"p={self.p}"
