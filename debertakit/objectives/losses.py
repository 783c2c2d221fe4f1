"""Plain loss functions used by the task models; training objectives (MLM, RTD + GDES, SiFT, causal LM) build
on them."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

IGNORE_INDEX = -100


def masked_lm_loss(logits: Tensor, labels: Tensor) -> Tensor:
    """Cross-entropy over labelled positions (label -100 = not a target), computed in float32."""
    return F.cross_entropy(
        logits.float().reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=IGNORE_INDEX
    )


def sequence_loss(logits: Tensor, labels: Tensor) -> Tensor:
    """Regression (one output: mean squared error), single-label classification (integer labels:
    cross-entropy) or soft / multi-label targets (float labels with one column per class: BCE)."""
    if logits.shape[-1] == 1:
        return F.mse_loss(logits.float().view(-1), labels.float().view(-1))
    if labels.dtype.is_floating_point and labels.shape == logits.shape:
        return F.binary_cross_entropy_with_logits(logits.float(), labels)
    return F.cross_entropy(logits.float(), labels.view(-1).long(), ignore_index=IGNORE_INDEX)


def token_loss(logits: Tensor, labels: Tensor) -> Tensor:
    return F.cross_entropy(
        logits.float().reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=IGNORE_INDEX
    )


def span_loss(
    start_logits: Tensor, end_logits: Tensor, start: Tensor, end: Tensor, token_mask: Tensor | None = None
) -> Tensor:
    """Mean of start and end cross-entropies; targets outside the input are ignored and padded positions
    cannot be predicted (they are left out of the softmax)."""
    n = start_logits.shape[1]
    if token_mask is not None:
        hide = ~token_mask.bool()
        start_logits = start_logits.float().masked_fill(hide, torch.finfo(torch.float32).min)
        end_logits = end_logits.float().masked_fill(hide, torch.finfo(torch.float32).min)
    start, end = start.view(-1).clamp(0, n), end.view(-1).clamp(0, n)
    s = F.cross_entropy(start_logits.float(), start, ignore_index=n)
    e = F.cross_entropy(end_logits.float(), end, ignore_index=n)
    return (s + e) / 2


def replaced_token_loss(logits: Tensor, labels: Tensor, token_mask: Tensor | None) -> Tensor:
    """Binary cross-entropy of "this token was replaced" over real (non-padding) tokens."""
    if token_mask is None:
        token_mask = torch.ones_like(labels, dtype=torch.bool)
    keep = token_mask.bool() & (labels != IGNORE_INDEX)
    return F.binary_cross_entropy_with_logits(logits[keep].float(), labels[keep].float())
