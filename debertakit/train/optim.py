"""AdamW with DeBERTa's settings and the warmup + linear-decay schedule (REFERENCE.md §1)."""

from __future__ import annotations

import torch
from torch import nn
from torch.optim.lr_scheduler import LambdaLR


def decay_groups(params: list[nn.Parameter], module: nn.Module, weight_decay: float) -> list[dict]:
    """Two groups: weight decay on matrices, none on biases and normalisation weights.

    A parameter is excluded from decay when it is 1-D (biases, LayerNorm weights and biases) — the released
    recipe's ``no_decay = ["bias", "LayerNorm.weight"]`` by shape instead of by name.
    """
    names = {id(p): n for n, p in module.named_parameters(remove_duplicate=False)}
    decay, no_decay = [], []
    for p in params:
        if not p.requires_grad:
            continue
        is_norm = "norm" in names.get(id(p), "").lower()
        (no_decay if p.dim() < 2 or is_norm else decay).append(p)
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]


def build_optimizer(
    params: list[nn.Parameter],
    module: nn.Module,
    lr: float,
    *,
    weight_decay: float = 0.01,
    betas: tuple[float, float] = (0.9, 0.999),
    eps: float = 1e-6,
) -> torch.optim.AdamW:
    """AdamW (β 0.9/0.999, ε 1e-6, weight decay 0.01 except biases and norms)."""
    if lr <= 0:
        raise ValueError(f"learning rate {lr} must be > 0")
    return torch.optim.AdamW(decay_groups(params, module, weight_decay), lr=lr, betas=betas, eps=eps)


def warmup_linear(optimizer: torch.optim.Optimizer, warmup_steps: int, total_steps: int) -> LambdaLR:
    """Linear warmup from 0 to the peak over ``warmup_steps``, then linear decay to 0 at ``total_steps``."""
    if total_steps < 1:
        raise ValueError(f"total_steps={total_steps} must be >= 1")
    if not 0 <= warmup_steps <= total_steps:
        raise ValueError(f"warmup_steps={warmup_steps} must be in [0, total_steps={total_steps}]")

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        return max(0.0, (total_steps - step) / max(1, total_steps - warmup_steps))

    return LambdaLR(optimizer, factor)
