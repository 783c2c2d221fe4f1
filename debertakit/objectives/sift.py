"""SiFT: scale-invariant fine-tuning (DeBERTa paper §5.2; REFERENCE.md §1).

Virtual adversarial training whose perturbation lives on the *layer-normalised* word embeddings: the output of
the backbone's embedding LayerNorm (`model.deberta.embeddings.norm`), before the padding mask and the dropout.
Normalised embeddings have a fixed scale whatever the model size, so one perturbation size fits all models.

For a batch with clean logits z (computed by the ordinary training forward):

1. δ₀ ~ N(0, σ²) per element, clipped to [-2σ, 2σ] (σ = `init_std`, 1e-2);
2. one ascent step on the divergence: g = ∂ D(z, f(x; δ₀)) / ∂δ₀, δ₁ = δ₀ + η · g / (‖g‖∞ + 1e-6), the
   infinity norm taken over the hidden dimension of each token (as the released code does), η = `step_size`
   (1e-4);
3. the added loss is λ · D(z, f(x; δ₁)) (λ = `weight`, 5), with gradients to the parameters through both
   the clean and the perturbed logits.

D is the symmetric KL divergence KL(p‖q) + KL(q‖p) between the softmax distributions p (clean) and q
(perturbed), averaged over the rows (sequences, or real tokens for token classification); for QA the mean of
the start and end divergences; for regression (one output) the squared difference of the scores.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

MODEL_INPUTS = ("input_ids", "token_type_ids", "attention_mask")


@contextmanager
def perturb_embeddings(model: nn.Module, delta: Tensor | None = None) -> Iterator[dict[str, Tensor]]:
    """Add a perturbation to the output of the embedding LayerNorm while the context is open.

    Args:
        model: a task model (its backbone under `deberta`).
        delta: (B, N, H) perturbation; None leaves it to be set through the yielded dict (`state["delta"]`)
            before the forward pass.

    Yields:
        A dict whose `"delta"` entry is added to the normalised embeddings at every forward inside the context.
    """
    state: dict[str, Tensor] = {} if delta is None else {"delta": delta}
    norm = model.deberta.embeddings.norm

    def hook(module: nn.Module, args: tuple, out: Tensor) -> Tensor:
        d = state.get("delta")
        if d is None:
            raise RuntimeError("perturb_embeddings: no delta set before the forward pass")
        if d.shape != out.shape:
            raise ValueError(
                f"perturbation of shape {tuple(d.shape)}; the normalised embeddings are {tuple(out.shape)}"
            )
        return out + d.to(out.dtype)

    handle = norm.register_forward_hook(hook)
    try:
        yield state
    finally:
        handle.remove()


def task_logits(model: nn.Module, batch: dict[str, Tensor]) -> Tensor | tuple[Tensor, Tensor]:
    """The logits of a task model for the model inputs of `batch` (no labels): a tensor, or (start, end) for QA."""
    out = model(**{k: v for k, v in batch.items() if k in MODEL_INPUTS})
    if hasattr(out, "start_logits"):
        return out.start_logits, out.end_logits
    return out.logits


def symmetric_kl(clean: Tensor, perturbed: Tensor, mask: Tensor | None = None) -> Tensor:
    """Mean over rows of KL(p‖q) + KL(q‖p), p = softmax(clean), q = softmax(perturbed) over the last dimension.

    Args:
        clean: (..., C) logits.
        perturbed: (..., C) logits, same shape.
        mask: (...) bool, rows to average over (default all).
    """
    lp = F.log_softmax(clean.float(), -1)
    lq = F.log_softmax(perturbed.float(), -1)
    per_row = ((lp.exp() - lq.exp()) * (lp - lq)).sum(-1)  # KL(p||q) + KL(q||p)
    if mask is None:
        return per_row.mean()
    mask = mask.bool()
    return per_row[mask].sum() / mask.sum().clamp(min=1)


def _masked(logits: Tensor, mask: Tensor | None) -> Tensor:
    """Padded positions leave the span softmax (as in the span loss)."""
    if mask is None:
        return logits.float()
    return logits.float().masked_fill(~mask.bool(), torch.finfo(torch.float32).min)


def divergence(
    clean: Tensor | tuple[Tensor, Tensor],
    perturbed: Tensor | tuple[Tensor, Tensor],
    kind: str,
    attention_mask: Tensor | None = None,
) -> Tensor:
    """D(clean, perturbed) for one task kind (see the module docstring)."""
    if kind == "qa":
        (cs, ce), (ps, pe) = clean, perturbed
        if attention_mask is not None:
            # the softmax runs over the tokens of each window; a padded position has probability 0 on both sides
            keep = attention_mask.bool()
            cs, ce, ps, pe = (_masked(t, keep) for t in (cs, ce, ps, pe))
        return (symmetric_kl(cs, ps) + symmetric_kl(ce, pe)) / 2
    if kind == "regression" or (kind == "classification" and clean.shape[-1] == 1):
        return F.mse_loss(perturbed.float().view(-1), clean.float().view(-1))
    if kind == "ner":
        return symmetric_kl(clean, perturbed, attention_mask)
    if kind in ("classification", "multiple_choice"):
        return symmetric_kl(clean, perturbed)
    raise ValueError(f"unknown task kind {kind!r} for SiFT")


@dataclass
class SiFT:
    """The SiFT loss term, with the official defaults.

    Args:
        weight: λ, the weight of the adversarial term (5).
        init_std: σ of the initial perturbation (1e-2), clipped to ±2σ.
        step_size: η, the ascent step on the normalised gradient (1e-4).
    """

    weight: float = 5.0
    init_std: float = 1e-2
    step_size: float = 1e-4

    def __post_init__(self) -> None:
        for name in ("weight", "init_std", "step_size"):
            if getattr(self, name) < 0:
                raise ValueError(f"SiFT {name}={getattr(self, name)}; expected >= 0")

    def initial_delta(self, like: Tensor) -> Tensor:
        """δ₀ ~ N(0, σ²) clipped to ±2σ, float32, shaped like the normalised embeddings."""
        d = torch.randn(like.shape, device=like.device, dtype=torch.float32) * self.init_std
        return d.clamp(-2 * self.init_std, 2 * self.init_std)

    def ascent(self, delta: Tensor, grad: Tensor) -> Tensor:
        """δ + η · g / (max |g| over the hidden dimension + 1e-6)."""
        return delta + self.step_size * grad / (grad.abs().amax(-1, keepdim=True) + 1e-6)

    def loss(
        self,
        model: nn.Module,
        batch: dict[str, Tensor],
        clean_logits: Tensor | tuple[Tensor, Tensor],
        kind: str,
    ) -> Tensor:
        """λ · D(clean, perturbed) after one ascent step; gradients reach the parameters through both sides.

        Args:
            model: the task model being trained (its backbone under `deberta`).
            batch: the batch of the clean forward (`input_ids`, `attention_mask`, ...; labels are ignored).
            clean_logits: the logits of the clean forward, still attached to the graph.
            kind: the task kind ("classification", "regression", "ner", "qa", "multiple_choice").
        """
        mask = batch.get("attention_mask")
        token_mask = mask if kind in ("ner", "qa") else None
        target = _detach(clean_logits)
        ids = batch["input_ids"]
        hidden = model.deberta.embeddings.norm.normalized_shape[0]
        # (B, N, H); (B·choices, N, H) for multiple choice, whose backbone sees the choices as rows
        shape = (ids.reshape(-1, ids.shape[-1]).shape[0], ids.shape[-1], hidden)
        delta = self.initial_delta(torch.empty(shape, device=ids.device, dtype=torch.float32))
        with perturb_embeddings(model, delta.requires_grad_(True)) as state:
            perturbed = task_logits(model, batch)
            adv = divergence(target, perturbed, kind, token_mask)
            (grad,) = torch.autograd.grad(adv, state["delta"])
            state["delta"] = self.ascent(state["delta"].detach(), grad).detach()
            perturbed = task_logits(model, batch)
        return self.weight * divergence(clean_logits, perturbed, kind, token_mask)


def _detach(logits: Tensor | tuple[Tensor, Tensor]) -> Tensor | tuple[Tensor, Tensor]:
    if isinstance(logits, tuple):
        return tuple(t.detach() for t in logits)
    return logits.detach()
