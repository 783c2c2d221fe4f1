"""Backends choose their own precision: float32 scores, N×R products and accumulation, whatever autocast says."""

from __future__ import annotations

import functools

import torch
from torch import Tensor


def own_precision(fn):
    """Run a backend (first argument: q) with autocast off; it returns its output in the input's dtype, as the
    fused kernels do inside. Without this, autocast would run the N×R products and scores in bf16/fp16."""

    @functools.wraps(fn)
    def wrapped(q: Tensor, *args, **kwargs):
        try:
            on = torch.is_autocast_enabled(q.device.type)
        except (TypeError, RuntimeError):  # a device type autocast does not know
            on = False
        if not on:
            return fn(q, *args, **kwargs)
        with torch.autocast(q.device.type, enabled=False):
            return fn(q, *args, **kwargs)

    return wrapped
